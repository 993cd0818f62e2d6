"""Interactive terminals: Sandbox.pty() (GET /v1/sandboxes/{id}/pty, a
WebSocket). Binary messages are the terminal's bytes both ways; text
messages are JSON control: {"type":"resize",...} from us, one
{"type":"exit",...} from the daemon before it closes."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, Optional, Union

from ._ws import NORMAL_CLOSURE, OP_BINARY, Closed, WebSocket, WebSocketError
from .errors import CageboxError


class Pty:
    """A command on a terminal in a sandbox. read() (or iterating) gives
    its output, write() types into it (b"\\x03" is Ctrl-C), resize() sets
    its size, wait() returns its exit code once it has ended. Use it as a
    context manager, or close() it: closing hangs up, and the daemon then
    kills the command.

    Over HTTPS read and write from one thread (an SSL socket is not safe to
    use from two at once); over the unix socket or plain HTTP a reader
    thread and a writer thread are fine."""

    def __init__(self, ws: WebSocket):
        self._ws = ws
        self.result: Optional[Dict[str, Any]] = None  # the exit message
        self._done = False

    def read(self) -> bytes:
        """The next piece of output; b"" once the command has ended."""
        while not self._done:
            try:
                op, data = self._ws.recv()
            except Closed as c:
                self._done = True
                self._ws.close()
                if self.result is None:
                    why = c.reason or f"close code {c.code}"
                    raise CageboxError(f"terminal ended without an exit status: {why}") from None
                return b""
            except (OSError, WebSocketError) as err:
                self._done = True
                self._ws.close()
                raise CageboxError(f"terminal: {err}") from None
            if op == OP_BINARY:
                return data
            try:
                msg = json.loads(data)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("type") == "exit":
                self.result = msg
        return b""

    def __iter__(self) -> Iterator[bytes]:
        while True:
            b = self.read()
            if not b:
                return
            yield b

    def write(self, data: Union[bytes, str]) -> None:
        """Types data into the terminal."""
        if isinstance(data, str):
            data = data.encode()
        try:
            self._ws.send_binary(bytes(data))
        except (OSError, WebSocketError) as err:
            raise CageboxError(f"terminal: write: {err}") from None

    def resize(self, rows: int, cols: int) -> None:
        """Sets the terminal's size (the command gets SIGWINCH)."""
        try:
            self._ws.send_text(json.dumps({"type": "resize", "rows": int(rows), "cols": int(cols)}))
        except (OSError, WebSocketError) as err:
            raise CageboxError(f"terminal: resize: {err}") from None

    def wait(self) -> int:
        """Reads (and drops) the rest of the output and returns the exit
        code (128+n after signal n; see .result for signal, timed_out,
        oom_killed, error)."""
        for _ in self:
            pass
        assert self.result is not None
        return int(self.result.get("exit_code", 0))

    @property
    def exit_code(self) -> Optional[int]:
        return None if self.result is None else int(self.result.get("exit_code", 0))

    def close(self) -> None:
        """Hangs up (the command is killed if it still runs)."""
        self._done = True
        self._ws.close(NORMAL_CLOSURE)

    def __enter__(self) -> "Pty":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
