"""HTTP/1.1 to the daemon: its unix socket, or TCP (http:// or https://)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import threading
import urllib.parse
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Tuple

from .errors import CageboxError, ConnectionFailed, error_for

_PARAM = re.compile(r"\{([a-z_]+)\}")
_MAX_ERROR_BODY = 64 << 10


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]):
        super().__init__("cagebox", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


def route_path(route: str, params: Dict[str, str]) -> Tuple[str, str]:
    """Splits "METHOD /v1/x/{id}" and fills the path's parameters (escaped)."""
    method, template = route.split(" ", 1)

    def fill(m: "re.Match[str]") -> str:
        v = params.get(m.group(1))
        if not v:
            raise ValueError(f"{route}: {m.group(1)} is empty")
        return urllib.parse.quote(str(v), safe="")

    return method, _PARAM.sub(fill, template)


class Transport:
    """One daemon endpoint. A connection per request: the unix socket is
    cheap, and streams (exec, events) hold theirs for as long as they run."""

    def __init__(self, socket_path: Optional[str] = None, base_url: Optional[str] = None,
                 api_key: Optional[str] = None, ca_cert: Optional[str] = None, timeout: Optional[float] = 300.0):
        self.timeout = timeout
        self.socket_path = socket_path
        self._key = api_key or ""
        self._ssl: Optional[ssl.SSLContext] = None
        self._host = ""
        self._port = 0
        self._https = False
        if base_url is not None:
            u = urllib.parse.urlsplit(base_url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise ValueError(f"daemon URL {base_url!r}: want http://HOST:PORT or https://HOST:PORT")
            if u.username or u.password or u.path not in ("", "/") or u.query or u.fragment:
                raise ValueError("daemon URL: want the scheme, host and port only")
            self._https = u.scheme == "https"
            self._host = u.hostname
            self._port = u.port or (443 if self._https else 80)
            if ca_cert and not self._https:
                raise ValueError(f"a CA certificate ({ca_cert}) verifies an https:// daemon; {base_url} is plain HTTP")
            if self._https:
                ctx = ssl.create_default_context()
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2
                if ca_cert:
                    ctx.load_verify_locations(cafile=ca_cert)
                self._ssl = ctx
            self.where = f"{u.scheme}://{u.netloc}"
        elif socket_path:
            self.where = socket_path
        else:
            raise ValueError("give a unix socket path or a daemon URL")

    # -- connections ------------------------------------------------------

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return _UnixConnection(self.socket_path, timeout)
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _headers(self, content_type: Optional[str], extra: Optional[Dict[str, str]]) -> Dict[str, str]:
        h = {"Accept": "application/json", "User-Agent": "cagebox-python"}
        if self._key:
            h["Authorization"] = "Bearer " + self._key
        if content_type:
            h["Content-Type"] = content_type
        if extra:
            h.update(extra)
        return h

    def _fail(self, err: BaseException) -> ConnectionFailed:
        hint = ""
        if self.socket_path is not None and isinstance(err, (FileNotFoundError, ConnectionRefusedError)):
            hint = " (is `cagebox daemon` running with this --home? set CAGEBOX_HOME, or CAGEBOX_HOST for TCP)"
        return ConnectionFailed(f"cagebox daemon at {self.where}: {err}{hint}")

    @staticmethod
    def _error(resp: http.client.HTTPResponse) -> CageboxError:
        body = resp.read(_MAX_ERROR_BODY)
        try:
            e = json.loads(body)
            if isinstance(e, dict) and e.get("error"):
                return error_for(resp.status, str(e.get("kind") or ""), str(e["error"]))
        except ValueError:
            pass
        text = body.decode("utf-8", "replace").strip()
        return error_for(resp.status, "", f"{resp.status} {resp.reason}: {text}")

    # -- requests ---------------------------------------------------------

    def open(self, route: str, params: Optional[Dict[str, str]] = None, query: Optional[Dict[str, Any]] = None,
             body: Any = None, content_type: Optional[str] = None, headers: Optional[Dict[str, str]] = None,
             timeout: Any = "default") -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Sends a request and returns the open connection and its 2xx
        response (the caller reads and closes both); raises the API error
        otherwise."""
        method, path = route_path(route, params or {})
        q = {k: v for k, v in (query or {}).items() if v is not None and v != ""}
        if q:
            path += "?" + urllib.parse.urlencode(q, doseq=True)
        conn = self._connect(self.timeout)
        try:
            if timeout != "default":
                # Streams: connect within the call timeout, then wait as
                # long as the stream lasts (or `timeout` of silence).
                conn.connect()
                conn.sock.settimeout(timeout)
            conn.request(method, path, body=body, headers=self._headers(content_type, headers))
            resp = conn.getresponse()
        except CageboxError:
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            raise self._fail(err) from None
        if resp.status >= 300:
            try:
                raise self._error(resp)
            finally:
                conn.close()
        return conn, resp

    def call(self, route: str, params: Optional[Dict[str, str]] = None, query: Optional[Dict[str, Any]] = None,
             json_body: Any = None, raw: Any = None, content_type: Optional[str] = None,
             headers: Optional[Dict[str, str]] = None, decode: bool = True, timeout: Any = "default") -> Any:
        """One request, the whole answer read: decoded JSON, the raw bytes
        (decode=False), or None for an empty body."""
        body = raw
        if json_body is not None:
            body = json.dumps(json_body).encode()
            content_type = "application/json"
        conn, resp = self.open(route, params, query, body, content_type, headers, timeout=timeout)
        try:
            data = resp.read()
        except (OSError, http.client.HTTPException) as err:
            raise self._fail(err) from None
        finally:
            conn.close()
        if not decode:
            return data
        if not data.strip():
            return None
        return json.loads(data)

    def lines(self, route: str, params: Optional[Dict[str, str]] = None, query: Optional[Dict[str, Any]] = None,
              timeout: Optional[float] = None) -> "LineStream":
        """A GET whose answer is ndjson, read line by line as it comes."""
        conn, resp = self.open(route, params, query, timeout=timeout)
        return LineStream(conn, resp, self._fail)

    def duplex(self, route: str, params: Dict[str, str], first: bytes,
               rest: Optional[Iterable[bytes]]) -> "LineStream":
        """A POST whose body is `first` then, if given, `rest` (sent
        chunked from a thread while the answer streams back), answered
        with ndjson."""
        method, path = route_path(route, params)
        conn = self._connect(self.timeout)
        writer: Optional[threading.Thread] = None
        try:
            conn.connect()  # within the call timeout; the exec itself may take as long as it takes
            conn.sock.settimeout(None)
            conn.putrequest(method, path, skip_accept_encoding=True)
            hdrs = self._headers("application/octet-stream", None)
            if rest is None:
                hdrs["Content-Length"] = str(len(first))
            else:
                hdrs["Transfer-Encoding"] = "chunked"
            for k, v in hdrs.items():
                conn.putheader(k, v)
            conn.endheaders()
            if rest is None:
                conn.send(first)
            else:
                sock = conn.sock

                def chunk(b: bytes) -> None:
                    if b:
                        sock.sendall(b"%x\r\n%s\r\n" % (len(b), b))

                chunk(first)

                def feed() -> None:
                    # Errors here mean the daemon stopped reading (the
                    # process ended); the answer says how it went.
                    try:
                        for b in rest:
                            if isinstance(b, str):
                                b = b.encode()
                            chunk(bytes(b))
                        sock.sendall(b"0\r\n\r\n")
                    except (OSError, ValueError):
                        pass

                if self._https:
                    # An SSL socket is not safe to read and write from two
                    # threads: over HTTPS stdin is sent whole, then the
                    # answer is read.
                    feed()
                else:
                    writer = threading.Thread(target=feed, name="cagebox-stdin", daemon=True)
                    writer.start()
            resp = conn.getresponse()
        except CageboxError:
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            raise self._fail(err) from None
        if resp.status >= 300:
            try:
                raise self._error(resp)
            finally:
                conn.close()
        return LineStream(conn, resp, self._fail)


class LineStream:
    """The lines of a streamed answer, decoded from JSON. Close it (or use
    it as a context manager) to hang up early."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
                 fail: Callable[[BaseException], CageboxError]):
        self._conn, self._resp, self._fail = conn, resp, fail
        self.closed = False
        self.eof = False  # the daemon ended the answer (not a hang-up of ours)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        try:
            while True:
                try:
                    line = self._resp.readline(16 << 20)
                except (OSError, http.client.HTTPException, ValueError) as err:
                    if self.closed:
                        return
                    raise self._fail(err) from None
                if not line:
                    self.eof = True
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        # Shut the socket down first: a reader blocked in another thread
        # returns at once.
        try:
            if self._conn.sock is not None:
                self._conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._conn.close()

    def __enter__(self) -> "LineStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
