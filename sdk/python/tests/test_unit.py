"""Tests of the SDK's own logic, with no daemon."""

import datetime
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cagebox  # noqa: E402
from cagebox import client, errors  # noqa: E402
from cagebox._transport import route_path  # noqa: E402


class TestHelpers(unittest.TestCase):
    def test_duration(self):
        for given, want in [(None, None), ("10m", "10m"), (30, "30s"), (1.5, "1.5s"), (0.25, "0.25s"),
                            (datetime.timedelta(minutes=2), "120s"), (0, "0s")]:
            self.assertEqual(client.duration(given), want, given)
        with self.assertRaises(ValueError):
            client.duration(-1)
        with self.assertRaises(TypeError):
            client.duration([1])

    def test_size(self):
        for given, want in [(None, None), (1024, 1024), ("512M", 512 << 20), ("2g", 2 << 30), ("1.5GiB", 3 << 29),
                            ("64k", 64 << 10), ("100", 100)]:
            self.assertEqual(client.size(given), want, given)
        with self.assertRaises(ValueError):
            client.size("lots")

    def test_argv_and_env(self):
        self.assertEqual(client.argv_of("echo hi"), ["/bin/sh", "-c", "echo hi"])
        self.assertEqual(client.argv_of(["ls", "-l"]), ["ls", "-l"])
        with self.assertRaises(ValueError):
            client.argv_of([])
        self.assertEqual(client.env_list({"A": "1", "B": "x=y"}), ["A=1", "B=x=y"])
        self.assertEqual(client.env_list(["A=1"]), ["A=1"])
        with self.assertRaises(TypeError):
            client.env_list("A=1")

    def test_route_path_escapes(self):
        self.assertEqual(route_path("GET /v1/sandboxes/{id}", {"id": "a/b c"}), ("GET", "/v1/sandboxes/a%2Fb%20c"))
        self.assertEqual(route_path("DELETE /v1/sandboxes/{id}/secrets/{name}", {"id": "sb-1", "name": "T"}),
                         ("DELETE", "/v1/sandboxes/sb-1/secrets/T"))
        with self.assertRaises(ValueError):
            route_path("GET /v1/secrets/{name}", {"name": ""})

    def test_error_kinds(self):
        for status, kind, cls in [(404, "not_found", cagebox.NotFound), (400, "invalid", cagebox.Invalid),
                                  (401, "unauthorized", cagebox.Unauthorized), (403, "denied", cagebox.Denied),
                                  (409, "conflict", cagebox.Conflict), (503, "unavailable", cagebox.Unavailable),
                                  (500, "internal", cagebox.InternalError), (504, "internal", cagebox.InternalError),
                                  (404, "", cagebox.NotFound), (418, "", cagebox.InternalError)]:
            e = errors.error_for(status, kind, "msg")
            self.assertIs(type(e), cls, (status, kind))
            self.assertIsInstance(e, cagebox.CageboxError)
            self.assertEqual((e.status, str(e)), (status, "msg"))

    def test_policy_doc(self):
        self.assertEqual(client.policy_doc('{"version": 1}'), {"version": 1})
        with self.assertRaises(ValueError):
            client.policy_doc("version: 1")
        self.assertEqual(client.doc_bytes("version: 1\n")[1], "application/yaml")
        self.assertEqual(client.doc_bytes({"version": 1})[1], "application/json")

    def test_record(self):
        r = client.Record.of({"a": {"b": [{"c": 1}]}})
        self.assertEqual(r.a.b[0].c, 1)
        with self.assertRaises(AttributeError):
            r.nope


class TestResolution(unittest.TestCase):
    def setUp(self):
        self.saved = {k: os.environ.pop(k, None) for k in ("CAGEBOX_HOST", "CAGEBOX_API_KEY", "CAGEBOX_CA_CERT", "CAGEBOX_HOME")}

    def tearDown(self):
        for k, v in self.saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v

    def test_default_socket(self):
        self.assertEqual(cagebox.Cagebox()._t.socket_path, "/var/lib/cagebox/cagebox.sock")
        os.environ["CAGEBOX_HOME"] = "/srv/cb"
        self.assertEqual(cagebox.Cagebox()._t.socket_path, "/srv/cb/cagebox.sock")
        self.assertEqual(cagebox.Cagebox(home="/h")._t.socket_path, "/h/cagebox.sock")

    def test_host_from_env(self):
        os.environ["CAGEBOX_HOST"] = "http://127.0.0.1:7070"
        os.environ["CAGEBOX_API_KEY"] = "cbk_test"
        t = cagebox.Cagebox()._t
        self.assertIsNone(t.socket_path)
        self.assertEqual((t.where, t._key), ("http://127.0.0.1:7070", "cbk_test"))

    def test_bad_urls(self):
        for u in ["ftp://x:1", "http://", "http://u:p@h:1", "http://h:1/path", "http://h:1?q=1"]:
            with self.assertRaises(ValueError, msg=u):
                cagebox.Cagebox(host=u)
        with self.assertRaises(ValueError):
            cagebox.Cagebox(host="http://127.0.0.1:1", ca_cert="/ca.pem")

    def test_key_not_shown(self):
        cb = cagebox.Cagebox(host="http://127.0.0.1:1", api_key="cbk_SECRETVALUE")
        self.assertNotIn("SECRETVALUE", repr(cb) + repr(cb._t) + str(cb.tools))
        with self.assertRaises(cagebox.ConnectionFailed) as ctx:
            cb.health()
        self.assertNotIn("SECRETVALUE", str(ctx.exception) + repr(ctx.exception))

    def test_unreachable(self):
        cb = cagebox.Cagebox(socket="/nonexistent/cagebox.sock")
        with self.assertRaises(cagebox.ConnectionFailed) as ctx:
            cb.health()
        self.assertIn("cagebox daemon", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()


class TestBuildBackend(unittest.TestCase):
    """The in-tree PEP 517 backend that makes `pip install ./sdk/python` work offline."""

    def test_wheel_and_sdist(self):
        import base64
        import hashlib
        import importlib.util
        import tarfile
        import tempfile
        import zipfile

        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        spec = importlib.util.spec_from_file_location("cagebox_build", os.path.join(root, "_build", "cagebox_build.py"))
        backend = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(backend)
        self.assertEqual(backend.get_requires_for_build_wheel(), [])
        self.assertEqual(backend.VERSION, cagebox.__version__)
        with open(os.path.join(root, "pyproject.toml")) as f:
            self.assertIn(f'version = "{cagebox.__version__}"', f.read())
        with tempfile.TemporaryDirectory() as d:
            name = backend.build_wheel(d)
            self.assertEqual(name, f"cagebox-{cagebox.__version__}-py3-none-any.whl")
            with zipfile.ZipFile(os.path.join(d, name)) as z:
                names = set(z.namelist())
                for want in ["cagebox/__init__.py", "cagebox/client.py", "cagebox/_transport.py", "cagebox/errors.py",
                             "cagebox/py.typed", f"cagebox-{cagebox.__version__}.dist-info/METADATA"]:
                    self.assertIn(want, names)
                self.assertFalse([n for n in names if "__pycache__" in n or n.startswith("tests/")])
                record = z.read(f"cagebox-{cagebox.__version__}.dist-info/RECORD").decode().splitlines()
                for line in record:
                    path, digest, size = line.rsplit(",", 2)
                    if not digest:
                        continue
                    data = z.read(path)
                    want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                    self.assertEqual((digest, int(size)), (want, len(data)), path)
                self.assertIn("Requires-Python: >=3.9", z.read(f"cagebox-{cagebox.__version__}.dist-info/METADATA").decode())
            sdist = backend.build_sdist(d)
            with tarfile.open(os.path.join(d, sdist)) as t:
                self.assertIn(f"cagebox-{cagebox.__version__}/pyproject.toml", t.getnames())


class TestSafeExtract(unittest.TestCase):
    """download_dir's checks, with crafted archives (Python 3.9 has no
    tarfile extraction filters)."""

    def tar(self, *entries):
        import io
        import tarfile
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name, typ, extra in entries:
                ti = tarfile.TarInfo(name)
                ti.type = typ
                data = None
                if typ == tarfile.REGTYPE:
                    body = extra if isinstance(extra, bytes) else b"x"
                    ti.size = len(body)
                    data = io.BytesIO(body)
                elif extra is not None:
                    ti.linkname = extra
                tf.addfile(ti, data)
        buf.seek(0)
        return buf

    def setUp(self):
        import shutil
        import tempfile
        self.base = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.base)
        self.dest = os.path.join(self.base, "dest")
        with open(os.path.join(self.base, "secret"), "w") as f:
            f.write("s")

    def test_refusals(self):
        import tarfile
        from cagebox import _tar
        cases = {
            "dotdot": [("../evil", tarfile.REGTYPE, None)],
            "absolute": [("/evil", tarfile.REGTYPE, None)],
            "symlink then through it": [("ln", tarfile.SYMTYPE, ".."), ("ln/evil", tarfile.REGTYPE, None)],
            "absolute symlink then through it": [("ln", tarfile.SYMTYPE, "/tmp"), ("ln/evil", tarfile.REGTYPE, None)],
            "hard link out": [("hl", tarfile.LNKTYPE, "../secret")],
            "device": [("null", tarfile.CHRTYPE, None)],
            "fifo": [("p", tarfile.FIFOTYPE, None)],
        }
        for name, ents in cases.items():
            with self.subTest(name):
                with self.assertRaises(_tar.UnsafeArchive):
                    _tar.safe_extract(self.tar(*ents), self.dest)
                self.assertFalse(os.path.exists(os.path.join(self.base, "evil")))
                self.assertFalse(os.path.exists("/tmp/evil"))
                self.assertFalse(os.path.lexists(os.path.join(self.dest, "hl")))
                with open(os.path.join(self.base, "secret")) as f:
                    self.assertEqual(f.read(), "s")

    def test_limits(self):
        import tarfile
        from cagebox import _tar
        with self.assertRaises(_tar.UnsafeArchive):
            _tar.safe_extract(self.tar(*[(f"f{i}", tarfile.REGTYPE, None) for i in range(5)]), self.dest, max_entries=4)
        with self.assertRaises(_tar.UnsafeArchive):
            _tar.safe_extract(self.tar(("big", tarfile.REGTYPE, b"x" * 100)), self.dest, max_bytes=10)

    def test_round_trip_and_replacing_a_symlink(self):
        import io
        from cagebox import _tar
        src = os.path.join(self.base, "src")
        os.makedirs(os.path.join(src, "d"))
        with open(os.path.join(src, "d", "f"), "w") as f:
            f.write("data")
        os.chmod(os.path.join(src, "d", "f"), 0o640)
        os.symlink("d/f", os.path.join(src, "l"))
        buf = io.BytesIO()
        _tar.write_tree(buf, src)
        buf.seek(0)
        # A symlink already where a file goes is replaced, not written through.
        os.makedirs(os.path.join(self.dest, "d"))
        os.symlink(os.path.join(self.base, "secret"), os.path.join(self.dest, "d", "f"))
        _tar.safe_extract(buf, self.dest)
        with open(os.path.join(self.base, "secret")) as f:
            self.assertEqual(f.read(), "s")
        with open(os.path.join(self.dest, "l")) as f:
            self.assertEqual(f.read(), "data")
        self.assertEqual(os.stat(os.path.join(self.dest, "d", "f")).st_mode & 0o777, 0o640)


class TestWebSocketFrames(unittest.TestCase):
    def test_accept_key_and_masking(self):
        from cagebox import _ws
        # RFC 6455 section 1.3's example.
        self.assertEqual(_ws.accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        f = _ws.encode_frame(_ws.OP_TEXT, b"Hello", mask=bytes([0x37, 0xFA, 0x21, 0x3D]))
        # RFC 6455 section 5.7: a masked "Hello".
        self.assertEqual(f, bytes([0x81, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58]))
        big = _ws.encode_frame(_ws.OP_BINARY, b"a" * 70000, mask=b"\0\0\0\0")
        self.assertEqual(big[1], 0x80 | 127)

    def test_fragments_ping_close(self):
        import socket
        import struct
        from cagebox import _ws
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)

        def frame(op, payload, fin=True):  # server frames: unmasked
            n = len(payload)
            assert n < 126
            return bytes([(0x80 if fin else 0) | op, n]) + payload

        b.sendall(frame(_ws.OP_BINARY, b"ab", fin=False) + frame(_ws.OP_PING, b"p") +
                  frame(_ws.OP_CONT, b"cd") + frame(_ws.OP_CLOSE, struct.pack("!H", 1000) + b"bye"))
        ws = _ws.WebSocket(a)
        self.assertEqual(ws.recv(), (_ws.OP_BINARY, b"abcd"))
        with self.assertRaises(_ws.Closed) as c:
            ws.recv()
        self.assertEqual((c.exception.code, c.exception.reason), (1000, "bye"))
        # It answered the ping with a pong and the close with a close, masked.
        got = b.recv(100)
        self.assertEqual(got[0], 0x80 | _ws.OP_PONG)
        self.assertTrue(got[1] & 0x80)
        # A masked frame from the server is a protocol error.
        a2, b2 = socket.socketpair()
        self.addCleanup(a2.close)
        self.addCleanup(b2.close)
        b2.sendall(bytes([0x82, 0x81, 1, 2, 3, 4, 5]))
        with self.assertRaises(_ws.WebSocketError):
            _ws.WebSocket(a2).recv()
