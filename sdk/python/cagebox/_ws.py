"""A minimal WebSocket client (RFC 6455) over the SDK's transport, standard
library only: the opening handshake, masked client frames, fragmented
messages, ping/pong and the closing handshake. It carries the terminal of
Sandbox.pty(); it is not a general-purpose client (no extensions, no
subprotocols)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import struct
import threading
import urllib.parse
from typing import Any, Dict, Optional, Tuple

from ._transport import Transport, route_path
from .errors import CageboxError, error_for

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_MAX_HEADERS = 64 << 10
_MAX_MESSAGE = 16 << 20

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA

NORMAL_CLOSURE = 1000


class WebSocketError(CageboxError):
    """The WebSocket broke: a protocol violation, or the connection ended
    without a closing handshake."""


class Closed(Exception):
    """Raised by recv() once the peer's close frame has arrived."""

    def __init__(self, code: int, reason: str):
        super().__init__(f"closed ({code}) {reason}".strip())
        self.code, self.reason = code, reason


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


def encode_frame(opcode: int, payload: bytes, fin: bool = True, mask: Optional[bytes] = None) -> bytes:
    """One client frame (always masked: RFC 6455 5.3)."""
    mask = mask if mask is not None else os.urandom(4)
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    return head + mask + _xor(payload, mask)


def _xor(data: bytes, mask: bytes) -> bytes:
    if not data:
        return b""
    # Whole-buffer XOR through big integers: far faster than a byte loop.
    m = (mask * (len(data) // 4 + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(m, "big")).to_bytes(len(data), "big")


class WebSocket:
    """A client WebSocket on a connected socket. send() may be called from
    several threads; recv() from one at a time. Over HTTPS, call send()
    and recv() from the same thread (an SSL socket is not safe to read and
    write from two threads at once)."""

    def __init__(self, sock: socket.socket, buffered: bytes = b""):
        self._sock = sock
        self._buf = bytearray(buffered)
        self._wlock = threading.Lock()
        self.close_sent = False
        self.closed: Optional[Closed] = None

    # -- opening handshake -------------------------------------------------

    @classmethod
    def connect(cls, t: Transport, route: str, params: Dict[str, str], query: Optional[Dict[str, Any]] = None,
                timeout: Optional[float] = None) -> "WebSocket":
        method, path = route_path(route, params)
        q = {k: v for k, v in (query or {}).items() if v is not None and v != ""}
        if q:
            path += "?" + urllib.parse.urlencode(q, doseq=True)
        conn = t._connect(t.timeout)
        try:
            conn.connect()
        except OSError as err:
            conn.close()
            raise t._fail(err) from None
        sock = conn.sock
        conn.sock = None  # the socket is ours from now on
        try:
            key = base64.b64encode(os.urandom(16)).decode()
            host = conn.host if conn.port in (80, 443) or t.socket_path is not None else f"{conn.host}:{conn.port}"
            headers = t._headers(None, {"Host": host, "Upgrade": "websocket", "Connection": "Upgrade",
                                        "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13"})
            req = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            sock.sendall(req.encode("latin-1"))
            status, reason, hdrs, rest = _read_response_head(sock)
            if status != 101:
                raise _http_error(sock, status, reason, hdrs, rest)
            if hdrs.get("upgrade", "").lower() != "websocket" or hdrs.get("sec-websocket-accept") != accept_key(key):
                raise WebSocketError("the daemon's WebSocket handshake is malformed (Sec-WebSocket-Accept)")
            sock.settimeout(timeout)
            return cls(sock, rest)
        except CageboxError:
            sock.close()
            raise
        except OSError as err:
            sock.close()
            raise t._fail(err) from None

    # -- frames -------------------------------------------------------------

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self._sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise WebSocketError("the connection ended without a WebSocket close")
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _frame(self) -> Tuple[bool, int, bytes]:
        b0, b1 = self._read(2)
        fin, opcode = bool(b0 & 0x80), b0 & 0x0F
        if b0 & 0x70:
            raise WebSocketError("WebSocket frame with reserved bits set (no extension was negotiated)")
        if b1 & 0x80:
            raise WebSocketError("the server sent a masked WebSocket frame")
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self._read(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", self._read(8))
        if opcode >= 0x8 and (n > 125 or not fin):
            raise WebSocketError("malformed WebSocket control frame")
        if n > _MAX_MESSAGE:
            raise WebSocketError(f"WebSocket frame of {n} bytes is over {_MAX_MESSAGE}")
        return fin, opcode, self._read(n)

    def send(self, opcode: int, payload: bytes) -> None:
        frame = encode_frame(opcode, payload)
        with self._wlock:
            if self.close_sent:
                raise WebSocketError("the WebSocket is closing")
            if opcode == OP_CLOSE:
                self.close_sent = True
            self._sock.sendall(frame)

    def send_binary(self, data: bytes) -> None:
        self.send(OP_BINARY, data)

    def send_text(self, text: str) -> None:
        self.send(OP_TEXT, text.encode("utf-8"))

    def recv(self) -> Tuple[int, bytes]:
        """The next data message as (OP_TEXT or OP_BINARY, payload). Pings
        are answered; a close frame is answered and raises Closed."""
        if self.closed is not None:
            raise self.closed
        opcode, parts, size = -1, [], 0
        while True:
            fin, op, payload = self._frame()
            if op == OP_PING:
                try:
                    self.send(OP_PONG, payload)
                except (OSError, WebSocketError):
                    pass
                continue
            if op == OP_PONG:
                continue
            if op == OP_CLOSE:
                code, reason = NORMAL_CLOSURE if not payload else struct.unpack("!H", payload[:2])[0], ""
                if len(payload) > 2:
                    reason = payload[2:].decode("utf-8", "replace")
                if not self.close_sent:
                    try:
                        self.send(OP_CLOSE, payload[:2])
                    except (OSError, WebSocketError):
                        pass
                self.closed = Closed(code if payload else 1005, reason)
                raise self.closed
            if op == OP_CONT:
                if opcode < 0:
                    raise WebSocketError("WebSocket continuation frame without a message")
            elif op in (OP_TEXT, OP_BINARY):
                if opcode >= 0:
                    raise WebSocketError("new WebSocket message inside a fragmented one")
                opcode = op
            else:
                raise WebSocketError(f"unknown WebSocket opcode {op}")
            size += len(payload)
            if size > _MAX_MESSAGE:
                raise WebSocketError(f"WebSocket message over {_MAX_MESSAGE} bytes")
            parts.append(payload)
            if fin:
                return opcode, b"".join(parts)

    def close(self, code: int = NORMAL_CLOSURE, reason: str = "") -> None:
        """Sends a close frame (once) and closes the socket."""
        try:
            self.send(OP_CLOSE, struct.pack("!H", code) + reason.encode("utf-8")[:123])
        except (OSError, WebSocketError):
            pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def _read_response_head(sock: socket.socket) -> Tuple[int, str, Dict[str, str], bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            raise WebSocketError("the daemon closed the connection during the WebSocket handshake")
        buf += chunk
        if len(buf) > _MAX_HEADERS:
            raise WebSocketError("the daemon's handshake answer is too long")
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise WebSocketError(f"malformed status line {lines[0]!r}")
    hdrs: Dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return int(parts[1]), parts[2] if len(parts) > 2 else "", hdrs, rest


def _http_error(sock: socket.socket, status: int, reason: str, hdrs: Dict[str, str], rest: bytes) -> CageboxError:
    """The API error of a refused upgrade (a JSON body, as for any call)."""
    want = int(hdrs.get("content-length", "0") or 0) if hdrs.get("content-length", "").isdigit() else 64 << 10
    want = min(want, 64 << 10)
    body = rest
    try:
        sock.settimeout(10)
        while len(body) < want:
            chunk = sock.recv(4096)
            if not chunk:
                break
            body += chunk
    except OSError:
        pass
    try:
        e = json.loads(body[:want] or b"{}")
        if isinstance(e, dict) and e.get("error"):
            return error_for(status, str(e.get("kind") or ""), str(e["error"]))
    except ValueError:
        pass
    text = body[:want].decode("utf-8", "replace").strip()
    return error_for(status, "", f"{status} {reason}: {text}")
