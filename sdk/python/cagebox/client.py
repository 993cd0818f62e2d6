"""The cagebox client: Cagebox (the daemon) and Sandbox (one sandbox).

Every request names its route as "METHOD /path/{param}", exactly as the
daemon's route table (internal/daemon/server.go, Routes()) spells it; a Go
test (sdk/sdk_test.go) checks that every route is used here or listed in
sdk/ABSENT.md.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from .errors import CageboxError, InternalError, NotFound
from . import _tar
from ._transport import LineStream, Transport
from ._ws import WebSocket
from .pty import Pty

DEFAULT_HOME = "/var/lib/cagebox"

Duration = Union[str, int, float, datetime.timedelta, None]
Size = Union[str, int, None]
Env = Union[Mapping[str, str], Sequence[str], None]


class Record(dict):
    """A JSON object from the API: a dict whose keys are also attributes
    (``sb.info.status`` or ``sb.info["status"]``). The fields are those of
    the wire types in api/types.go."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @staticmethod
    def of(v: Any) -> Any:
        if isinstance(v, dict):
            return Record({k: Record.of(x) for k, x in v.items()})
        if isinstance(v, list):
            return [Record.of(x) for x in v]
        return v


# -- argument helpers -------------------------------------------------------


def duration(d: Duration) -> Optional[str]:
    """A Go duration string from seconds (int/float), a timedelta or a
    string ("90s", "10m"); None stays None."""
    if d is None or d == "":
        return None
    if isinstance(d, str):
        return d
    if isinstance(d, datetime.timedelta):
        d = d.total_seconds()
    if isinstance(d, bool) or not isinstance(d, (int, float)):
        raise TypeError(f"duration: want seconds, a timedelta or a string such as '10m', not {d!r}")
    if d < 0:
        raise ValueError(f"duration: {d} is negative")
    s = format(float(d), "f").rstrip("0").rstrip(".")
    return (s or "0") + "s"


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*$", re.I)


def size(v: Size) -> Optional[int]:
    """Bytes from an int or a string such as "512M" or "2G" (binary units,
    as the CLI reads them)."""
    if v is None or v == "" or v == 0:
        return None
    if isinstance(v, bool):
        raise TypeError("size: want bytes or a string such as '512M'")
    if isinstance(v, int):
        return v
    m = _SIZE.match(str(v))
    if not m:
        raise ValueError(f"size: {v!r} is not a size such as 512M or 2G")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def env_list(env: Env) -> Optional[List[str]]:
    if env is None:
        return None
    if isinstance(env, Mapping):
        return [f"{k}={v}" for k, v in env.items()]
    if isinstance(env, str):
        raise TypeError("env: want a mapping or a list of KEY=VALUE strings, not a string")
    return list(env)


def argv_of(cmd: Union[str, Sequence[str]]) -> List[str]:
    """A string runs through /bin/sh -c; a list is the argv itself."""
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    argv = list(cmd)
    if not argv:
        raise ValueError("exec: the command is empty")
    return argv


def policy_doc(doc: Any) -> Any:
    """A policy document for JSON bodies: a dict, or JSON text."""
    if doc is None or isinstance(doc, dict):
        return doc
    if isinstance(doc, (str, bytes)):
        try:
            return json.loads(doc)
        except ValueError:
            raise ValueError("policy: give a dict or JSON text here (YAML is taken by sb.policy.set and cb.policies)") from None
    raise TypeError(f"policy: want a dict or JSON text, not {type(doc).__name__}")


def doc_bytes(doc: Any) -> "tuple[bytes, str]":
    """A policy document as a request body: dicts as JSON, text as is
    (YAML or JSON)."""
    if isinstance(doc, dict):
        return json.dumps(doc).encode(), "application/json"
    if isinstance(doc, str):
        doc = doc.encode()
    if isinstance(doc, bytes):
        ct = "application/json" if doc.lstrip().startswith(b"{") else "application/yaml"
        return doc, ct
    raise TypeError(f"policy: want a dict, JSON or YAML text, not {type(doc).__name__}")


def _drop_none(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None and v != [] and v != ""}


def _secret_bindings(secrets: Any) -> Optional[List[Dict[str, Any]]]:
    """secrets: a list of bindings (dicts with the SecretBinding fields), or
    a mapping ENV_NAME -> stored secret name (str) or -> binding dict."""
    if secrets is None:
        return None
    if isinstance(secrets, Mapping):
        out = []
        for name, b in secrets.items():
            if isinstance(b, str):
                out.append({"name": name, "secret": b})
            else:
                out.append(dict(b, name=name))
        return out
    return [dict(b) for b in secrets]


# -- exec -------------------------------------------------------------------


@dataclass
class ExecResult:
    """How a command ended, with all it wrote."""

    exit_code: Optional[int]
    signal: str = ""
    timed_out: bool = False
    oom_killed: bool = False
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")


@dataclass
class Output:
    """A piece of a command's output: stream is "stdout" or "stderr"."""

    stream: str
    data: bytes


def _stdin_chunks(stdin: Any) -> Optional[Iterable[bytes]]:
    if stdin is None:
        return None
    if isinstance(stdin, str):
        return [stdin.encode()]
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        return [bytes(stdin)]
    if hasattr(stdin, "read"):
        def read() -> Iterator[bytes]:
            while True:
                b = stdin.read(64 << 10)
                if not b:
                    return
                yield b.encode() if isinstance(b, str) else b
        return read()
    return stdin  # an iterable of bytes


class ExecStream:
    """A running command's output as it comes: iterate for Output pieces;
    ``result`` is set once the iteration ends (the exit frame). Close it to
    hang up (the daemon then kills the command)."""

    def __init__(self, lines: LineStream):
        self._lines = lines
        self.result: Optional[ExecResult] = None

    def __iter__(self) -> Iterator[Output]:
        import base64

        for f in self._lines:
            s = f.get("stream")
            if s in ("stdout", "stderr"):
                yield Output(s, base64.b64decode(f.get("data") or ""))
            elif s == "exit":
                self.result = ExecResult(exit_code=f.get("exit_code"), signal=f.get("signal") or "",
                                         timed_out=bool(f.get("timed_out")), oom_killed=bool(f.get("oom_killed")))
                self._lines.close()
                return
            elif s == "error":
                raise InternalError(f.get("error") or "exec failed", status=500, kind="internal")
        if self.result is None and self._lines.eof:
            raise CageboxError("exec stream ended without an exit frame (did the daemon stop?)")

    def wait(self) -> ExecResult:
        """Reads the rest and returns the result, output collected."""
        out, err = bytearray(), bytearray()
        for o in self:
            (out if o.stream == "stdout" else err).extend(o.data)
        if self.result is None:
            raise CageboxError("exec stream closed before the exit frame")
        self.result.stdout, self.result.stderr = bytes(out), bytes(err)
        return self.result

    def close(self) -> None:
        self._lines.close()

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- sandbox parts ------------------------------------------------------------


class Files:
    """A sandbox's files (sb.files)."""

    def __init__(self, sb: "Sandbox"):
        self._sb = sb

    def write(self, path: str, data: Union[bytes, str], mode: int = 0o644) -> None:
        """Writes a file (parent directories are made), replacing it."""
        if isinstance(data, str):
            data = data.encode()
        self._sb._t.call("PUT /v1/sandboxes/{id}/files", {"id": self._sb.id},
                         query={"path": path, "mode": format(mode, "o")}, raw=bytes(data),
                         content_type="application/octet-stream")

    def read(self, path: str) -> bytes:
        """Reads a file (at most 64 MiB)."""
        return self._sb._t.call("GET /v1/sandboxes/{id}/files", {"id": self._sb.id}, query={"path": path}, decode=False)

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def list(self, path: str = "/") -> List[Record]:
        """Lists a directory: records with name, size, mode, mod_time, is_dir."""
        return Record.of(self._sb._t.call("GET /v1/sandboxes/{id}/dir", {"id": self._sb.id}, query={"path": path}))

    def archive_get(self, path: str) -> bytes:
        """The directory (or file) at path as a tar archive (the guest's
        word: extract it with download_dir's checks, not tarfile's
        extractall)."""
        return self._sb._t.call("GET /v1/sandboxes/{id}/archive", {"id": self._sb.id}, query={"path": path},
                                decode=False)

    def archive_put(self, path: str, archive: Any) -> None:
        """Extracts a tar archive (bytes or a binary file) under the
        directory path (made if missing). The daemon refuses (Invalid)
        entries that would land outside it, device nodes, and archives over
        1 GiB of files or 100000 entries."""
        if isinstance(archive, (bytes, bytearray, memoryview)):
            archive = bytes(archive)
        self._sb._t.call("PUT /v1/sandboxes/{id}/archive", {"id": self._sb.id}, query={"path": path},
                         raw=archive, content_type="application/x-tar")

    def upload_dir(self, local: str, remote: str) -> None:
        """Copies the local directory's contents (or a file) under the
        sandbox directory remote: modes and symlinks kept; device nodes,
        FIFOs and sockets skipped."""
        with tempfile.TemporaryFile() as tmp:
            _tar.write_tree(tmp, local)
            tmp.seek(0)
            self.archive_put(remote, tmp)

    def download_dir(self, remote: str, local: str) -> int:
        """Copies the sandbox directory's contents (or a file) under the
        local directory (made if missing); returns the number of entries.
        The archive is treated as hostile: nothing lands outside local (no
        absolute names, no .., nothing through a symlink), device nodes are
        refused, size and entries are bounded (_tar.UnsafeArchive)."""
        conn, resp = self._sb._t.open("GET /v1/sandboxes/{id}/archive", {"id": self._sb.id}, query={"path": remote})
        try:
            return _tar.safe_extract(resp, local)
        finally:
            conn.close()


class Policy:
    """A running sandbox's live egress policy (sb.policy). Every change is
    one atomic replace and applies to the sandbox's next request."""

    def __init__(self, sb: "Sandbox"):
        self._sb = sb

    def _p(self) -> Dict[str, str]:
        return {"id": self._sb.id}

    def get(self) -> Record:
        """The policy in force: generation, policy (the document), ref, frozen."""
        return Record.of(self._sb._t.call("GET /v1/sandboxes/{id}/policy", self._p()))

    def set(self, doc: Any, if_generation: Optional[int] = None) -> Record:
        """Replaces the document (a dict, or JSON or YAML text); with
        if_generation a concurrent change makes it fail with Conflict."""
        body, ct = doc_bytes(doc)
        hdrs = {"If-Match": str(if_generation)} if if_generation else None
        return Record.of(self._sb._t.call("PUT /v1/sandboxes/{id}/policy", self._p(), raw=body, content_type=ct, headers=hdrs))

    def patch(self, op: str, rule: Optional[Dict[str, Any]] = None, name: Optional[str] = None,
              index: Optional[int] = None) -> Record:
        """One rule edit: op "add" (rule at index, default first), "remove"
        (the rule named name) or "move" (name to index)."""
        body = _drop_none({"op": op, "rule": rule, "name": name})
        if index is not None:
            body["index"] = index
        return Record.of(self._sb._t.call("PATCH /v1/sandboxes/{id}/policy", self._p(), json_body=body))

    def _add(self, action: str, host: str, path: Optional[str], method: Optional[str], ports: Optional[Sequence[int]],
             name: Optional[str], at: Optional[int], when: Optional[str], timeout: Duration = None) -> Record:
        rule = _drop_none({"name": name, "host": host, "action": action, "ports": list(ports) if ports else None,
                           "paths": [path] if path else None, "methods": [method] if method else None,
                           "when": when, "timeout": duration(timeout)})
        return self.patch("add", rule=rule, index=at)

    def allow(self, host: str, path: Optional[str] = None, method: Optional[str] = None,
              ports: Optional[Sequence[int]] = None, name: Optional[str] = None, at: Optional[int] = None,
              when: Optional[str] = None) -> Record:
        """Allows a host (first in the rules unless at says where)."""
        return self._add("allow", host, path, method, ports, name, at, when)

    def deny(self, host: str, path: Optional[str] = None, method: Optional[str] = None,
             ports: Optional[Sequence[int]] = None, name: Optional[str] = None, at: Optional[int] = None,
             when: Optional[str] = None) -> Record:
        """Denies a host (first in the rules unless at says where)."""
        return self._add("deny", host, path, method, ports, name, at, when)

    def hold(self, host: str, path: Optional[str] = None, method: Optional[str] = None,
             ports: Optional[Sequence[int]] = None, name: Optional[str] = None, at: Optional[int] = None,
             when: Optional[str] = None, timeout: Duration = None) -> Record:
        """Holds requests to a host until an approval (cb.approvals) or the timeout (default 60s)."""
        return self._add("hold", host, path, method, ports, name, at, when, timeout)

    def remove_rule(self, name: str) -> Record:
        return self.patch("remove", name=name)

    def move_rule(self, name: str, index: int) -> Record:
        return self.patch("move", name=name, index=index)

    def usage(self) -> List[Record]:
        """What the sandbox used of each budget."""
        return Record.of(self._sb._t.call("GET /v1/sandboxes/{id}/policy/usage", self._p()))

    def history(self) -> List[Record]:
        """Every generation of the policy: who changed it, when, the document."""
        return Record.of(self._sb._t.call("GET /v1/sandboxes/{id}/policy/history", self._p()))


class Sandbox:
    """A handle on one sandbox. ``info`` is the record as last seen
    (create, inspect, pause, ...). As a context manager it removes the
    sandbox on exit."""

    def __init__(self, cb: "Cagebox", info: Dict[str, Any]):
        self._cb = cb
        self._t = cb._t
        self.info: Record = Record.of(info)
        self.id: str = self.info["id"]
        self.files = Files(self)
        self.policy = Policy(self)

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.get('status', '?')}>"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.remove()
        except NotFound:
            pass

    @property
    def status(self) -> str:
        return self.info.get("status", "")

    def _update(self, v: Any) -> "Sandbox":
        if isinstance(v, dict):
            self.info = Record.of(v)
        return self

    def inspect(self) -> Record:
        """Fetches the sandbox's record (status, runtime, resources, network, policy, secrets)."""
        self._update(self._t.call("GET /v1/sandboxes/{id}", {"id": self.id}))
        return self.info

    def exec(self, cmd: Union[str, Sequence[str]], stdin: Any = None, timeout: Duration = None, env: Env = None,
             cwd: Optional[str] = None, user: Optional[str] = None,
             on_stdout: Optional[Callable[[bytes], Any]] = None,
             on_stderr: Optional[Callable[[bytes], Any]] = None) -> ExecResult:
        """Runs a command (a string runs through /bin/sh -c; a list is the
        argv) and waits for it. Output is passed to on_stdout/on_stderr as it
        comes and collected in the result. stdin: bytes, str, a binary file or
        an iterable of bytes. timeout: the daemon kills the command after it
        (result.timed_out). A non-zero exit is not an exception: look at
        result.exit_code."""
        out, err = bytearray(), bytearray()
        with self.exec_stream(cmd, stdin=stdin, timeout=timeout, env=env, cwd=cwd, user=user) as st:
            for o in st:
                if o.stream == "stdout":
                    out.extend(o.data)
                    if on_stdout:
                        on_stdout(o.data)
                else:
                    err.extend(o.data)
                    if on_stderr:
                        on_stderr(o.data)
            res = st.result
        if res is None:
            raise CageboxError("exec stream closed before the exit frame")
        res.stdout, res.stderr = bytes(out), bytes(err)
        return res

    def exec_stream(self, cmd: Union[str, Sequence[str]], stdin: Any = None, timeout: Duration = None,
                    env: Env = None, cwd: Optional[str] = None, user: Optional[str] = None) -> ExecStream:
        """Starts a command and returns its output as an iterator of Output
        pieces (see ExecStream). It returns when the command first writes
        (or ends): the daemon answers only then, so that a command that
        cannot start still gets its 4xx. Closing the stream hangs up; the
        daemon then kills the command."""
        chunks = _stdin_chunks(stdin)
        req = _drop_none({"argv": argv_of(cmd), "env": env_list(env), "cwd": cwd, "user": user,
                          "timeout": duration(timeout)})
        if chunks is not None:
            req["stdin"] = True
        first = json.dumps(req).encode() + b"\n"
        return ExecStream(self._t.duplex("POST /v1/sandboxes/{id}/exec", {"id": self.id}, first, chunks))

    def pty(self, cmd: Union[str, Sequence[str], None] = None, rows: int = 24, cols: int = 80, env: Env = None,
            cwd: Optional[str] = None, user: Optional[str] = None, timeout: Duration = None) -> Pty:
        """Starts a command on a terminal (default: the user's login shell
        in the sandbox, else /bin/sh; a string is an
        argv of one word, a list the argv) and returns the Pty: read()
        or iterate for output, write() to type (b"\x03" is Ctrl-C),
        resize(rows, cols), wait() for the exit code."""
        argv: Optional[List[str]] = None
        if cmd is not None:
            argv = [cmd] if isinstance(cmd, str) else list(cmd)
        q = {"argv": argv, "rows": rows, "cols": cols, "env": env_list(env), "cwd": cwd, "user": user,
             "timeout": duration(timeout)}
        return Pty(WebSocket.connect(self._t, "GET /v1/sandboxes/{id}/pty", {"id": self.id}, q))

    def pause(self, to_disk: bool = False) -> "Sandbox":
        """Freezes every process (memory kept). to_disk=True hibernates a
        microVM instead: saved whole to disk, its VMM ended (status
        hibernated); resume() restores it. Runtimes that cannot refuse it."""
        q = {"to_disk": "true"} if to_disk else None
        return self._update(self._t.call("POST /v1/sandboxes/{id}/pause", {"id": self.id}, query=q))

    def resume(self) -> "Sandbox":
        return self._update(self._t.call("POST /v1/sandboxes/{id}/resume", {"id": self.id}))

    def stop(self, grace: Duration = None) -> "Sandbox":
        """Stops the processes (SIGTERM, then SIGKILL after grace, default 5s); the sandbox stays until removed."""
        return self._update(self._t.call("POST /v1/sandboxes/{id}/stop", {"id": self.id}, query={"grace": duration(grace)}))

    def remove(self, wait: bool = True) -> None:
        """Destroys the sandbox. wait=False returns once the removal is recorded."""
        self._t.call("DELETE /v1/sandboxes/{id}", {"id": self.id}, query=None if wait else {"wait": "false"})

    def snapshot(self, name: Optional[str] = None) -> Record:
        """Saves the running sandbox for new sandboxes to start from
        (cb.create(from_snapshot=NAME)): a microVM's memory, devices and
        disks (its processes go on in each), or a container's or gVisor
        sandbox's writable layer, taken frozen (they boot afresh on its
        files). name: 1-63 of [a-z0-9-] (default: the daemon picks one)."""
        return Record.of(self._t.call("POST /v1/sandboxes/{id}/snapshots", {"id": self.id},
                                      json_body=_drop_none({"name": name})))

    def fork(self, count: int = 1, labels: Optional[Dict[str, str]] = None,
             timeout: Duration = None) -> List["Sandbox"]:
        """Copies the running sandbox count times (1-16): each copy is a
        sandbox of its own in the same tenant, with fresh secret
        placeholders bound to the same stored secrets and the parent's
        live policy. labels go on every copy (with
        cagebox.dev/fork.parent=ID); timeout is each copy's lifetime."""
        body = _drop_none({"count": count if count != 1 else None, "labels": labels or None,
                           "timeout": duration(timeout)})
        res = self._t.call("POST /v1/sandboxes/{id}/fork", {"id": self.id}, json_body=body)
        return [Sandbox(self._cb, sb) for sb in res.get("sandboxes") or []]

    def unbind(self, name: str) -> "Sandbox":
        """Removes a secret binding: its placeholder is refused from the next request on."""
        return self._update(self._t.call("DELETE /v1/sandboxes/{id}/secrets/{name}", {"id": self.id, "name": name}))

    def publish(self, port: int, public: bool = False, ttl: Duration = None) -> Record:
        """Publishes a guest port through the daemon's ingress listener
        (https://PORT-ID.DOMAIN/). The answer's ``token`` (header
        X-Cagebox-Access) is in it only; publishing again rotates it, and
        the old token and its signed URLs stop working. public=True: no
        token needed. ttl: unpublish after this long."""
        body = _drop_none({"port": port, "ttl": duration(ttl)})
        if public:
            body["public"] = True
        return Record.of(self._t.call("POST /v1/sandboxes/{id}/ports", {"id": self.id}, json_body=body))

    def ports(self) -> List[Record]:
        """The published ports (without tokens)."""
        return Record.of(self._t.call("GET /v1/sandboxes/{id}/ports", {"id": self.id}))

    def unpublish(self, port: int) -> None:
        self._t.call("DELETE /v1/sandboxes/{id}/ports/{port}", {"id": self.id, "port": str(port)})

    def port_url(self, port: int, ttl: Duration = None) -> Record:
        """A signed URL of a published port (``url``, ``expires_at``):
        whoever holds it reaches the port until it expires (default 1h)."""
        body = _drop_none({"ttl": duration(ttl)})
        return Record.of(self._t.call("POST /v1/sandboxes/{id}/ports/{port}/url", {"id": self.id, "port": str(port)}, json_body=body))

    def add_webhook(self, name: str, port: int, verify: str, secret: str, path: str = "/") -> Record:
        """Adds a webhook: a stable URL (the answer's ``url``, shown this
        once) whose deliveries the daemon verifies with the vault secret
        ``secret`` by the scheme ``verify`` (github, stripe, slack or
        hmac:SPEC) and delivers to the guest's ``port`` and ``path``, queued
        while the sandbox sleeps. The guest never needs the secret."""
        body = {"name": name, "port": port, "verify": verify, "secret": secret, "path": path}
        return Record.of(self._t.call("POST /v1/sandboxes/{id}/webhooks", {"id": self.id}, json_body=body))

    def webhooks(self) -> List[Record]:
        """The sandbox's webhooks (without URLs or tokens; ``pending``:
        deliveries not yet delivered)."""
        return Record.of(self._t.call("GET /v1/sandboxes/{id}/webhooks", {"id": self.id}))

    def remove_webhook(self, name: str) -> None:
        """Removes a webhook and its queued deliveries."""
        self._t.call("DELETE /v1/sandboxes/{id}/webhooks/{name}", {"id": self.id, "name": name})

    def add_relay(self, kind: str, port: int, token_secret: Optional[str] = None, path: str = "/", intents: Optional[int] = None,
                  name: Optional[str] = None, url: Optional[str] = None, headers: Optional[Sequence[str]] = None) -> Record:
        """Adds a relay: the daemon holds a connection for the sandbox
        (kind ``discord``: the bot's Discord Gateway WebSocket, its token the
        vault secret ``token_secret``, opened only to identify or resume;
        kind ``websocket``: ``url``, with ``headers`` "Name: value" where
        {secret} stands for ``token_secret``'s value) and POSTs each event
        to the guest's ``port`` and ``path``, queued while the sandbox
        sleeps and waking it. The guest never has the secret. Needs the
        daemon's --ingress."""
        body = _drop_none({"name": name, "kind": kind, "port": port, "path": path, "token_secret": token_secret, "intents": intents,
                           "url": url, "headers": list(headers) if headers else None})
        return Record.of(self._t.call("POST /v1/sandboxes/{id}/relays", {"id": self.id}, json_body=body))

    def relays(self) -> List[Record]:
        """The sandbox's relays, each with its connection's ``state``
        (connected, session_id, seq, reconnects, received) and ``pending``."""
        return Record.of(self._t.call("GET /v1/sandboxes/{id}/relays", {"id": self.id}))

    def remove_relay(self, name: str) -> None:
        """Stops a relay and drops its queued events."""
        self._t.call("DELETE /v1/sandboxes/{id}/relays/{name}", {"id": self.id, "name": name})

    def events(self, after: int = 0) -> List[Record]:
        """This sandbox's stored audit events (up to 1000 after seq `after`)."""
        return self._cb.events(sandbox=self.id, after=after)

    def follow_events(self, after: int = 0, timeout: Optional[float] = None) -> "EventStream":
        """This sandbox's events, stored then live (see Cagebox.follow_events)."""
        return self._cb.follow_events(sandbox=self.id, after=after, timeout=timeout)

    def request_access(self, host: str, reason: Optional[str] = None, timeout: Duration = None) -> Record:
        """Asks an operator to let the sandbox reach host: a pending
        approval (cb.approvals) this call waits on (timeout: default and at
        most 10m). Returns approval, allowed, by, reason; allowed, the host
        is allowed for the rest of the session."""
        body = _drop_none({"host": host, "reason": reason, "timeout": duration(timeout)})
        return Record.of(self._t.call("POST /v1/sandboxes/{id}/access", {"id": self.id}, json_body=body, timeout=None))

    def approvals(self, state: Optional[str] = "pending") -> List[Record]:
        return self._cb.approvals.list(state=state, sandbox=self.id)

    def freeze(self) -> Record:
        """Cuts the sandbox off the network (every request refused) until thaw."""
        return self._cb.freeze(sandbox=self.id)

    def thaw(self) -> Record:
        return self._cb.thaw(sandbox=self.id)


class EventStream:
    """Audit events as they come (iterate; each is a Record with seq, time,
    tenant, sandbox, kind, data). Close it to stop. ``last_seq`` is the last
    event seen: follow again with after=last_seq to resume."""

    def __init__(self, lines: LineStream, after: int):
        self._lines = lines
        self.last_seq = after

    def __iter__(self) -> Iterator[Record]:
        for e in self._lines:
            self.last_seq = max(self.last_seq, int(e.get("seq") or 0))
            yield Record.of(e)

    def close(self) -> None:
        self._lines.close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- tenant-wide parts ----------------------------------------------------------


class Secrets:
    """The caller's tenant's stored secrets (cb.secrets). Values are
    write-only: answers carry a preview, never the value."""

    def __init__(self, t: Transport):
        self._t = t

    def put(self, name: str, value: str, hosts: Sequence[str], inject: Optional[str] = None,
            allow_env: bool = False) -> Record:
        """Stores (or replaces) a secret usable only on requests to hosts."""
        body = _drop_none({"name": name, "value": value, "hosts": list(hosts), "inject": inject})
        body["hosts"] = list(hosts)
        if allow_env:
            body["allow_env"] = True
        return Record.of(self._t.call("POST /v1/secrets", json_body=body))

    def list(self) -> List[Record]:
        return Record.of(self._t.call("GET /v1/secrets"))

    def get(self, name: str) -> Record:
        return Record.of(self._t.call("GET /v1/secrets/{name}", {"name": name}))

    def rotate(self, name: str, value: str, allow_env: Optional[bool] = None) -> Record:
        """Replaces the value (version + 1); the next request uses it."""
        body: Dict[str, Any] = {"value": value}
        if allow_env is not None:
            body["allow_env"] = allow_env
        return Record.of(self._t.call("PUT /v1/secrets/{name}", {"name": name}, json_body=body))

    def revoke(self, name: str) -> Record:
        """Revokes: every request needing it is refused from now on."""
        return Record.of(self._t.call("POST /v1/secrets/{name}/revoke", {"name": name}))

    def delete(self, name: str) -> None:
        self._t.call("DELETE /v1/secrets/{name}", {"name": name})


class NamedPolicies:
    """The tenant's named policies (cb.policies); sandboxes created with
    policy_ref follow their edits."""

    def __init__(self, t: Transport):
        self._t = t

    def create(self, name: str, doc: Any) -> Record:
        body, ct = doc_bytes(doc)
        return Record.of(self._t.call("POST /v1/policies", query={"name": name}, raw=body, content_type=ct))

    def list(self) -> List[Record]:
        return Record.of(self._t.call("GET /v1/policies"))

    def get(self, name: str) -> Record:
        return Record.of(self._t.call("GET /v1/policies/{name}", {"name": name}))

    def update(self, name: str, doc: Any, if_generation: Optional[int] = None) -> Record:
        """Replaces it and the policy of every running sandbox following it."""
        body, ct = doc_bytes(doc)
        hdrs = {"If-Match": str(if_generation)} if if_generation else None
        return Record.of(self._t.call("PUT /v1/policies/{name}", {"name": name}, raw=body, content_type=ct, headers=hdrs))

    def delete(self, name: str) -> None:
        self._t.call("DELETE /v1/policies/{name}", {"name": name})


class Approvals:
    """Held requests (cb.approvals)."""

    def __init__(self, t: Transport):
        self._t = t

    def list(self, state: Optional[str] = "pending", sandbox: Optional[str] = None) -> List[Record]:
        """state: pending (default), allowed, denied, expired, or None for all."""
        return Record.of(self._t.call("GET /v1/approvals", query={"state": state, "sandbox": sandbox}))

    def decide(self, approval_id: str, decision: str, remember: bool = False, reason: Optional[str] = None) -> Record:
        body = _drop_none({"decision": decision, "reason": reason})
        if remember:
            body["remember"] = True
        return Record.of(self._t.call("POST /v1/approvals/{id}", {"id": approval_id}, json_body=body))

    def webhook_key(self, tenant: Optional[str] = None) -> Record:
        """The key this tenant's approval webhooks are signed with ({"tenant", "key"}; tenant: the admin's choice)."""
        return Record.of(self._t.call("GET /v1/approvals/webhook-key", query={"tenant": tenant}))

    def approve(self, approval_id: str, remember: bool = False, reason: Optional[str] = None) -> Record:
        """Lets the held request through; remember=True makes it a rule for the session."""
        return self.decide(approval_id, "allow", remember, reason)

    def deny(self, approval_id: str, remember: bool = False, reason: Optional[str] = None) -> Record:
        """Refuses it (the guest gets a 403 naming the rule)."""
        return self.decide(approval_id, "deny", remember, reason)


class Tenants:
    """Tenants and their API keys (cb.tenants; admin only)."""

    def __init__(self, t: Transport):
        self._t = t

    def create(self, name: str, min_isolation: Optional[str] = None, untrusted: bool = False) -> Record:
        body = _drop_none({"name": name, "min_isolation": min_isolation})
        if untrusted:
            body["untrusted"] = True
        return Record.of(self._t.call("POST /v1/tenants", json_body=body))

    def list(self) -> List[Record]:
        return Record.of(self._t.call("GET /v1/tenants"))

    def create_key(self, tenant: str) -> Record:
        """A new API key; its ``key`` is in this answer only."""
        return Record.of(self._t.call("POST /v1/tenants/{id}/keys", {"id": tenant}))


_size = size


class Volumes:
    """Named volumes (cb.volumes): data that outlives sandboxes, mounted
    with create(mounts=[{"type": "volume", "src": NAME, "dst": "/data", "rw": True}])."""

    def __init__(self, t: Transport):
        self._t = t

    def create(self, name: str, size: Size = None) -> Record:
        """An empty volume of size bytes or e.g. "4G" (default 1 GiB)."""
        return Record.of(self._t.call("POST /v1/volumes", json_body=_drop_none({"name": name, "size_bytes": _size(size)})))

    def list(self) -> List[Record]:
        """Each volume with attached_to: the sandboxes that mount it."""
        return Record.of(self._t.call("GET /v1/volumes"))

    def remove(self, name: str) -> None:
        """Deletes it and its data (Conflict while a sandbox mounts it)."""
        self._t.call("DELETE /v1/volumes/{name}", {"name": name})


class Snapshots:
    """Saved sandboxes (cb.snapshots), made by Sandbox.snapshot() and
    Sandbox.fork(), started from with cb.create(from_snapshot=NAME)."""

    def __init__(self, t: Transport):
        self._t = t

    def list(self) -> List[Record]:
        """The tenant's snapshots (the admin: all), each with size_bytes,
        digest, kind ("memory" or "filesystem") and in_use."""
        return Record.of(self._t.call("GET /v1/snapshots"))

    def get(self, name: str) -> Record:
        return Record.of(self._t.call("GET /v1/snapshots/{name}", {"name": name}))

    def remove(self, name: str) -> None:
        """Deletes it (Conflict while a sandbox started from it exists)."""
        self._t.call("DELETE /v1/snapshots/{name}", {"name": name})


def _mounts(mounts: Any) -> Optional[List[Dict[str, Any]]]:
    """Mounts as dicts {type, src, dst, rw, exec} or strings in the CLI's
    --mount syntax (type=bind|volume,src=...,dst=...[,ro|rw][,exec])."""
    if not mounts:
        return None
    out = []
    for m in mounts:
        if isinstance(m, str):
            d: Dict[str, Any] = {}
            for part in m.split(","):
                k, eq, v = part.strip().partition("=")
                k = {"source": "src", "target": "dst", "destination": "dst"}.get(k, k)
                if eq:
                    d[k] = v
                elif k in ("rw", "exec"):
                    d[k] = True
                elif k not in ("ro", "noexec"):
                    raise ValueError(f"mount {m!r}: unknown option {k!r}")
            m = d
        out.append(dict(m))
    return out


class Tools:
    """Named tools (cb.tools): a registered command each execute runs in a
    fresh sandbox (cb.execute)."""

    def __init__(self, t: Transport):
        self._t = t

    def add(self, name: str, argv: Sequence[str], description: Optional[str] = None,
            input_file: Optional[str] = None, image: Optional[str] = None, runtime: Optional[str] = None,
            runtime_floor: Optional[str] = None, allow: Optional[Sequence[str]] = None,
            policy_ref: Optional[str] = None, secrets: Any = None, env: Env = None, timeout: Duration = None,
            memory: Size = None, cpus: Optional[float] = None, input_schema: Optional[Dict[str, Any]] = None,
            replace: bool = False) -> Record:
        """Registers a tool (replace=True: over one of that name). The
        input arrives on the command's stdin, or as the file input_file
        names. Secrets bind stored secrets only (inline values are refused)."""
        body = _drop_none({
            "name": name, "description": description, "argv": list(argv), "input_file": input_file,
            "image": image, "runtime": runtime, "runtime_floor": runtime_floor,
            "allow": list(allow) if allow else None, "policy_ref": policy_ref,
            "secrets": _secret_bindings(secrets), "env": env_list(env), "timeout": duration(timeout),
            "memory_bytes": size(memory), "cpus": cpus or None, "input_schema": input_schema,
        })
        return Record.of(self._t.call("POST /v1/tools", query={"replace": "true" if replace else None}, json_body=body))

    def list(self) -> List[Record]:
        return Record.of(self._t.call("GET /v1/tools"))

    def get(self, name: str) -> Record:
        return Record.of(self._t.call("GET /v1/tools/{name}", {"name": name}))

    def remove(self, name: str) -> None:
        self._t.call("DELETE /v1/tools/{name}", {"name": name})

    def execute(self, name: str, input: str = "", max_output: Optional[int] = None) -> Record:
        """Runs the tool once: a record with exit_code, stdout, stderr,
        timed_out, duration_ms, sandbox, runtime, pooled and egress (the
        gateway's decisions)."""
        body: Dict[str, Any] = {"input": input}
        if max_output:
            body["max_output"] = max_output
        return Record.of(self._t.call("POST /v1/tools/{name}/execute", {"name": name}, json_body=body))


# -- the daemon -----------------------------------------------------------------


class Cagebox:
    """A client of one cagebox daemon.

    With no arguments it resolves the daemon the way the CLI does:
    CAGEBOX_HOST (e.g. ``https://cagebox.example.com:7070``) with
    CAGEBOX_API_KEY and optionally CAGEBOX_CA_CERT; otherwise the unix
    socket ``$CAGEBOX_HOME/cagebox.sock`` (home default /var/lib/cagebox),
    where every call acts as the admin tenant.

    ``timeout`` bounds each ordinary call in seconds (streams, exec and
    follow, are not bounded by it).
    """

    def __init__(self, host: Optional[str] = None, api_key: Optional[str] = None, ca_cert: Optional[str] = None,
                 home: Optional[str] = None, socket: Optional[str] = None, timeout: Optional[float] = 300.0):
        if host is None and socket is None and home is None:
            host = os.environ.get("CAGEBOX_HOST") or None
        if host:
            key = api_key if api_key is not None else os.environ.get("CAGEBOX_API_KEY", "")
            ca = ca_cert if ca_cert is not None else (os.environ.get("CAGEBOX_CA_CERT") or None)
            self._t = Transport(base_url=host, api_key=key, ca_cert=ca, timeout=timeout)
        else:
            if socket is None:
                socket = os.path.join(home or os.environ.get("CAGEBOX_HOME") or DEFAULT_HOME, "cagebox.sock")
            self._t = Transport(socket_path=socket, timeout=timeout)
        self.secrets = Secrets(self._t)
        self.policies = NamedPolicies(self._t)
        self.approvals = Approvals(self._t)
        self.tenants = Tenants(self._t)
        self.tools = Tools(self._t)
        self.volumes = Volumes(self._t)
        self.snapshots = Snapshots(self._t)

    def __repr__(self) -> str:
        return f"<Cagebox {self._t.where}>"

    def health(self) -> Record:
        """version, tenant (who the caller is), sandboxes."""
        return Record.of(self._t.call("GET /v1/health"))

    def runtimes(self) -> List[Record]:
        return Record.of(self._t.call("GET /v1/runtimes"))

    def images(self) -> List[Record]:
        return Record.of(self._t.call("GET /v1/images"))

    def pull_image(self, ref: str, name: Optional[str] = None, force: bool = False, max_bytes: Optional[int] = None,
                   max_files: Optional[int] = None) -> Record:
        """Pulls an OCI image into the daemon's cache (admin only):
        [REGISTRY/]REPO[:TAG][@sha256:HEX]; name defaults to one derived
        from ref. Answers when it is installed (not bounded by the call
        timeout: large images take minutes)."""
        body = _drop_none({"ref": ref, "name": name, "max_bytes": max_bytes or None, "max_files": max_files or None})
        if force:
            body["force"] = True
        return Record.of(self._t.call("POST /v1/images/pull", json_body=body, timeout=None))

    def import_image(self, archive: Any, name: Optional[str] = None, force: bool = False,
                     max_bytes: Optional[int] = None, max_files: Optional[int] = None) -> Record:
        """Installs a `docker save` archive or a tar of an OCI image layout
        (admin only). archive: a file path, bytes, or a binary file object
        (streamed)."""
        q = {"name": name, "force": "true" if force else None, "max_bytes": max_bytes or None,
             "max_files": max_files or None}
        if isinstance(archive, (str, os.PathLike)):
            with open(archive, "rb") as f:
                return Record.of(self._t.call("POST /v1/images/import", query=q, raw=f, content_type="application/x-tar",
                                              headers={"Content-Length": str(os.fstat(f.fileno()).st_size)},
                                              timeout=None))
        return Record.of(self._t.call("POST /v1/images/import", query=q, raw=archive, content_type="application/x-tar",
                                      timeout=None))

    def metrics(self) -> str:
        """The daemon's metrics in the Prometheus text format (admin only)."""
        return self._t.call("GET /metrics", decode=False).decode("utf-8")

    def pools(self) -> Record:
        """The warm pools (admin only): pools, memory_budget, memory_used."""
        return Record.of(self._t.call("GET /v1/pools"))

    def create(self, runtime: Optional[str] = None, image: Optional[str] = None, allow: Optional[Sequence[str]] = None,
               secrets: Any = None, env: Env = None, memory: Size = None, cpus: Optional[float] = None,
               pids: Optional[int] = None, disk: Size = None, timeout: Duration = None, idle_timeout: Duration = None,
               idle_action: Optional[str] = None, policy: Any = None, policy_ref: Optional[str] = None,
               mounts: Any = None, read_only_root: bool = False, audit: Optional[Sequence[str]] = None,
               publish: Optional[Sequence[Any]] = None, from_snapshot: Optional[str] = None) -> Sandbox:
        """Creates and starts a sandbox.

        runtime: a name from cb.runtimes() or "auto" (default: the daemon's
        choice); image: default "default"; allow: hosts reachable over
        HTTP(S) (nothing is, otherwise); secrets: bindings (list of
        SecretBinding dicts, or {ENV_NAME: stored_secret_name}); env: a
        mapping or KEY=VALUE list; memory/disk: bytes or "512M"; timeout,
        idle_timeout: seconds or "10m"; idle_action: "destroy", "pause" or
        "hibernate" (microVMs);
        policy: a policy document (dict or JSON text); policy_ref: follow a
        named policy; mounts: host paths below the daemon's --mount-root
        and volumes, as dicts {type, src, dst, rw, exec} or "--mount"
        strings (read-only, nosuid, nodev, noexec unless rw/exec);
        read_only_root: only rw mounts and a size-bounded /tmp are writable;
        audit: syscall audit classes ("exec", "net", "file", "priv" or
        "all"), streamed as syscall.* events; publish: guest ports to
        publish through the ingress listener (ints, or dicts {port, public,
        ttl}); the answer's ``ports`` carry their tokens, once;
        from_snapshot: start from one of the tenant's snapshots (its
        runtime, image, resources, env, policy and bindings; what else is
        given replaces the snapshot's).
        """
        if isinstance(allow, str):
            allow = [allow]
        req = _drop_none({
            "runtime": runtime, "image": image, "memory_bytes": size(memory), "cpus": cpus or None,
            "pids": pids or None, "disk_bytes": size(disk), "timeout": duration(timeout),
            "idle_timeout": duration(idle_timeout), "idle_action": idle_action, "env": env_list(env),
            "policy": policy_doc(policy), "allow": list(allow) if allow else None, "policy_ref": policy_ref,
            "secrets": _secret_bindings(secrets), "mounts": _mounts(mounts),
            "audit": list(audit) if audit else None,
            "publish": [p if isinstance(p, dict) else {"port": int(p)} for p in publish] if publish else None,
            "from_snapshot": from_snapshot,
        })
        if read_only_root:
            req["read_only_root"] = True
        return Sandbox(self, self._t.call("POST /v1/sandboxes", json_body=req))

    def sandboxes(self) -> List[Sandbox]:
        """Every sandbox the caller's tenant owns (the admin: all)."""
        return [Sandbox(self, s) for s in self._t.call("GET /v1/sandboxes") or []]

    def sandbox(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox (NotFound if there is none)."""
        return Sandbox(self, self._t.call("GET /v1/sandboxes/{id}", {"id": sandbox_id}))

    def events(self, sandbox: Optional[str] = None, after: int = 0) -> List[Record]:
        """Stored audit events (of one sandbox), at most 1000 after seq `after`."""
        return Record.of(self._t.call("GET /v1/events", query={"sandbox": sandbox, "after": after or None}))

    def follow_events(self, sandbox: Optional[str] = None, after: int = 0,
                      timeout: Optional[float] = None) -> EventStream:
        """The stored events after seq `after`, then new ones as they
        happen, as an iterator. timeout: seconds of silence after which the
        iteration raises ConnectionFailed (default: wait for ever; close the
        stream from another thread to stop)."""
        q = {"follow": "1", "sandbox": sandbox, "after": after or None}
        return EventStream(self._t.lines("GET /v1/events", query=q, timeout=timeout), after)

    def freeze(self, sandbox: Optional[str] = None, tenant: Optional[str] = None, all: bool = False) -> Record:
        """Cuts sandboxes off the network: one, a tenant's (admin) or all (admin)."""
        return Record.of(self._t.call("POST /v1/freeze", json_body=self._scope(sandbox, tenant, all)))

    def thaw(self, sandbox: Optional[str] = None, tenant: Optional[str] = None, all: bool = False) -> Record:
        return Record.of(self._t.call("POST /v1/thaw", json_body=self._scope(sandbox, tenant, all)))

    @staticmethod
    def _scope(sandbox: Optional[str], tenant: Optional[str], all: bool) -> Dict[str, Any]:
        body = _drop_none({"sandbox": sandbox, "tenant": tenant})
        if all:
            body["all"] = True
        return body

    def execute(self, name: str, input: str = "", max_output: Optional[int] = None) -> Record:
        """Runs the named tool once with input (see Tools.execute)."""
        return self.tools.execute(name, input, max_output)
