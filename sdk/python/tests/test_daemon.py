"""The SDK against a real daemon with real sandboxes (container runtime,
busybox image). Skips, saying why, without root or without `make build`."""

import io
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import UPSTREAM_HOST, cagebox  # noqa: E402

D = None


def setUpModule():
    global D
    reason = harness.skip_reason()
    if reason:
        if os.environ.get("CAGEBOX_SDK_REQUIRE_DAEMON"):
            raise RuntimeError("CAGEBOX_SDK_REQUIRE_DAEMON is set but the daemon tests cannot run: " + reason)
        raise unittest.SkipTest(reason)
    D = harness.Daemon()
    try:
        D.start()
    except BaseException:
        print(D.log(), file=sys.stderr)
        D.stop()
        raise


def tearDownModule():
    if D is not None:
        D.stop()


FETCH = f"wget -q -O- http://{UPSTREAM_HOST}/x"


class DaemonTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cb = D.client

    def new(self, **kw):
        kw.setdefault("image", "busybox")
        sb = self.cb.create(**kw)
        self.addCleanup(self._remove, sb)
        return sb

    @staticmethod
    def _remove(sb):
        try:
            sb.remove()
        except cagebox.NotFound:
            pass

    def wait_for(self, what, fn, timeout=15):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = fn()
            if v:
                return v
            time.sleep(0.1)
        self.fail(f"timed out waiting for {what}")


class TestBasics(DaemonTest):
    def test_health_runtimes_images_pools(self):
        h = self.cb.health()
        self.assertEqual(h.tenant, "admin")
        self.assertTrue(h.version)
        rts = {r.name: r for r in self.cb.runtimes()}
        self.assertTrue(rts["container"].available, rts["container"])
        self.assertLessEqual({"busybox", "default"}, {i.name for i in self.cb.images()})
        p = self.cb.pools()
        self.assertEqual(p.pools, [])

    def test_import_image_and_metrics(self):
        archive = harness.oci_layout_tar(os.path.join(D.home, "images", "busybox", "rootfs"))
        img = self.cb.import_image(archive, name="sdk-imported")
        self.assertEqual(img.name, "sdk-imported")
        self.assertTrue(img.manifest_digest.startswith("sha256:"), img)
        self.assertEqual(img.config.env, ["PATH=/bin:/usr/bin", "FROM_IMPORT=1"])
        self.assertIn("sdk-imported", [i.name for i in self.cb.images()])
        with self.cb.create(image="sdk-imported") as sb:
            self.assertEqual(sb.exec("echo from the imported image").stdout, b"from the imported image\n")
        # The same archive again is no change; another one under the name
        # is a Conflict without force. A file path is streamed.
        self.assertEqual(self.cb.import_image(archive, name="sdk-imported").digest, img.digest)
        path = os.path.join(D.home, "archive.tar")
        with open(path, "wb") as f:
            f.write(harness.oci_layout_tar(os.path.join(D.home, "images", "busybox", "rootfs"), env=("V=2",)))
        with self.assertRaises(cagebox.Conflict):
            self.cb.import_image(path, name="sdk-imported")
        self.assertEqual(self.cb.import_image(path, name="sdk-imported", force=True).config.env, ["V=2"])
        with self.assertRaises(cagebox.Invalid):
            self.cb.import_image(b"not a tar at all", name="sdk-garbage")
        with self.assertRaises(cagebox.Invalid):
            self.cb.pull_image("UPPER CASE is no reference")
        m = self.cb.metrics()
        self.assertIn("# TYPE", m)
        self.assertIn("cagebox_", m)

    def test_create_inspect_list(self):
        sb = self.new(env={"GREETING": "hi"}, memory="128M", timeout=600, idle_timeout="5m", idle_action="pause")
        self.assertEqual((sb.status, sb.info.runtime, sb.info.image), ("running", "container", "busybox"))
        self.assertEqual(sb.info.resources.memory_bytes, 128 << 20)
        self.assertEqual((sb.info.idle_timeout, sb.info.idle_action), ("5m0s", "pause"))
        self.assertIn(sb.id, [s.id for s in self.cb.sandboxes()])
        self.assertEqual(self.cb.sandbox(sb.id).id, sb.id)
        self.assertEqual(sb.inspect().status, "running")
        self.assertEqual(sb.exec("echo $GREETING").stdout, b"hi\n")

    def test_default_image(self):
        sb = self.new(image=None)
        self.assertEqual(sb.info.image, "default")


class TestExec(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sb = cls.cb.create(image="busybox")

    @classmethod
    def tearDownClass(cls):
        cls.sb.remove()

    def test_exit_codes_and_output(self):
        r = self.sb.exec("echo out; echo err >&2; exit 3")
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.ok), (3, b"out\n", b"err\n", False))
        r = self.sb.exec(["/bin/echo", "a b", "c"])
        self.assertEqual((r.exit_code, r.stdout_text), (0, "a b c\n"))
        r = self.sb.exec("kill -9 $$")
        self.assertEqual(r.signal, "SIGKILL")
        self.assertNotEqual(r.exit_code, 0)

    def test_streaming_arrives_before_exit(self):
        seen = []
        start = time.monotonic()
        r = self.sb.exec("echo one; sleep 1.5; echo two >&2",
                         on_stdout=lambda b: seen.append(("out", b, time.monotonic() - start)),
                         on_stderr=lambda b: seen.append(("err", b, time.monotonic() - start)))
        total = time.monotonic() - start
        self.assertEqual([(s, b) for s, b, _ in seen], [("out", b"one\n"), ("err", b"two\n")])
        self.assertLess(seen[0][2], total - 1.0, "stdout came only with the exit: not streamed")
        self.assertEqual(r.exit_code, 0)
        with self.sb.exec_stream("for i in 1 2 3; do echo $i; done") as st:
            got = b"".join(o.data for o in st)
        self.assertEqual(got, b"1\n2\n3\n")
        self.assertEqual(st.result.exit_code, 0)

    def test_close_kills_the_command(self):
        st = self.sb.exec_stream("echo first; sleep 30")
        it = iter(st)
        self.assertEqual(next(it).data, b"first\n")
        st.close()
        self.assertIsNone(st.result)
        self.wait_for("the command to be killed", lambda: b"sleep 30" not in self.sb.exec("ps").stdout)

    def test_stdin(self):
        for stdin in [b"bytes\n", "text\n", io.BytesIO(b"file\n"), iter([b"gen", b"erator\n"])]:
            r = self.sb.exec("cat", stdin=stdin)
            self.assertEqual(r.exit_code, 0)
            self.assertTrue(r.stdout.endswith(b"\n") and len(r.stdout) > 1, r.stdout)
        # Full duplex: 4 MiB through cat, more than any socket buffer holds.
        data = os.urandom(1 << 20) * 4
        r = self.sb.exec(["cat"], stdin=data)
        self.assertEqual((r.exit_code, len(r.stdout)), (0, len(data)))
        self.assertEqual(r.stdout, data)
        # No stdin: the command reads EOF at once.
        self.assertEqual(self.sb.exec("wc -c").stdout.strip(), b"0")

    def test_timeout_env_cwd(self):
        t = time.monotonic()
        r = self.sb.exec("sleep 30", timeout=0.5)
        self.assertTrue(r.timed_out)
        self.assertLess(time.monotonic() - t, 10)
        r = self.sb.exec("echo $A-$B; pwd", env={"A": "1", "B": "2"}, cwd="/tmp")
        self.assertEqual(r.stdout, b"1-2\n/tmp\n")

    def test_files(self):
        blob = bytes(range(256)) * 100
        self.sb.files.write("/tmp/sdk/dir/blob.bin", blob, mode=0o600)
        self.assertEqual(self.sb.files.read("/tmp/sdk/dir/blob.bin"), blob)
        self.sb.files.write("/tmp/sdk/hello.txt", "héllo")
        self.assertEqual(self.sb.files.read_text("/tmp/sdk/hello.txt"), "héllo")
        ents = {e.name: e for e in self.sb.files.list("/tmp/sdk")}
        self.assertTrue(ents["dir"].is_dir)
        self.assertEqual(ents["hello.txt"].size, len("héllo".encode()))
        self.assertEqual(self.sb.files.list("/tmp/sdk/dir")[0].mode, "-rw-------")
        self.assertEqual(self.sb.exec("cat /tmp/sdk/hello.txt").stdout_text, "héllo")
        with self.assertRaises(cagebox.NotFound):
            self.sb.files.read("/tmp/sdk/missing")
        with self.assertRaises(cagebox.Invalid):
            self.sb.files.read("relative/path")


class TestLifecycle(DaemonTest):
    def test_pause_resume_stop_remove(self):
        sb = self.new()
        # Hibernation is for microVMs: the container runtime refuses it.
        with self.assertRaises(cagebox.Invalid) as c:
            sb.pause(to_disk=True)
        self.assertIn("hibernate", str(c.exception))
        self.assertEqual(sb.inspect().status, "running")
        self.assertEqual(sb.pause().status, "paused")
        self.assertEqual(sb.inspect().status, "paused")
        self.assertEqual(sb.resume().status, "running")
        self.assertEqual(sb.exec("echo back").stdout, b"back\n")
        self.assertEqual(sb.stop(grace=1).status, "stopped")
        sb.remove()
        with self.assertRaises(cagebox.NotFound):
            sb.inspect()

    def test_context_manager_removes(self):
        with self.cb.create(image="busybox") as sb:
            sid = sb.id
            self.assertEqual(sb.exec("true").exit_code, 0)
        with self.assertRaises(cagebox.NotFound):
            self.cb.sandbox(sid)
        # Also when the block raises; the error is the caller's.
        with self.assertRaises(ZeroDivisionError):
            with self.cb.create(image="busybox") as sb:
                sid = sb.id
                1 / 0
        with self.assertRaises(cagebox.NotFound):
            self.cb.sandbox(sid)

    def test_remove_async(self):
        sb = self.cb.create(image="busybox")
        sb.remove(wait=False)
        self.wait_for("the removal", lambda: sb.id not in [s.id for s in self.cb.sandboxes()])


class TestPorts(DaemonTest):
    def test_publish_list_url_unpublish(self):
        sb = self.new()
        p = sb.publish(8080, ttl="1h")
        self.assertTrue(p.token.startswith("cbp_"), p)
        self.assertIn(f"8080-{sb.id}.sdk.test", p.url)
        self.assertTrue(p.expires_at)
        self.assertEqual(sb.publish(9090, public=True).get("token"), None)
        ports = sb.ports()
        self.assertEqual([x.port for x in ports], [8080, 9090])
        self.assertFalse(any(x.get("token") for x in ports))
        self.assertEqual([x.port for x in sb.inspect()["ports"]], [8080, 9090])
        u = sb.port_url(8080, ttl="10m")
        self.assertIn("cbx_sig=", u.url)
        self.assertTrue(u.expires_at)
        sb.unpublish(8080)
        with self.assertRaises(cagebox.NotFound):
            sb.unpublish(8080)
        with self.assertRaises(cagebox.NotFound):
            sb.port_url(8080)
        with self.assertRaises(cagebox.Invalid):
            sb.publish(70000)
        self.assertEqual([x.port for x in sb.ports()], [9090])


class TestCreateOptions(DaemonTest):
    def test_audit_and_publish_at_create(self):
        sb = self.new(audit=["exec"], publish=[8080])
        info = sb.inspect()
        self.assertEqual(info["audit"]["classes"], ["exec"])
        self.assertEqual([p["port"] for p in info["ports"]], [8080])
        with self.assertRaises(cagebox.Invalid):
            self.new(audit=["everything"])


class TestWebhooks(DaemonTest):
    def test_add_list_remove(self):
        self.cb.secrets.put("SDK_HOOK", "whsec_" + "b" * 32, [UPSTREAM_HOST])
        self.addCleanup(lambda: self.cb.secrets.delete("SDK_HOOK"))
        sb = self.new()
        w = sb.add_webhook("gh", 8080, "github", "SDK_HOOK", path="/hook")
        self.assertTrue(w.url.startswith("https://hooks.sdk.test") and "/w/cbw_" in w.url, w)
        self.assertNotIn("b" * 32, repr(w))
        ls = sb.webhooks()
        self.assertEqual([(x.name, x.port, x.path, x.pending) for x in ls], [("gh", 8080, "/hook", 0)])
        self.assertFalse(any(x.get("url") or x.get("token") for x in ls))
        with self.assertRaises(cagebox.Conflict):
            sb.add_webhook("gh", 8080, "github", "SDK_HOOK")
        with self.assertRaises(cagebox.Invalid):
            sb.add_webhook("x", 8080, "gitlab", "SDK_HOOK")
        with self.assertRaises(cagebox.Invalid):
            sb.add_webhook("y", 8080, "github", "NO_SUCH_SECRET")
        sb.remove_webhook("gh")
        with self.assertRaises(cagebox.NotFound):
            sb.remove_webhook("gh")
        self.assertEqual(sb.webhooks(), [])


class TestRelays(DaemonTest):
    def test_add_list_remove(self):
        # A bot token goes only to Discord's hosts (the gateway is *.discord.gg)
        # and to the WebSocket relay's host below.
        self.cb.secrets.put("SDK_BOT", "bot." + "d" * 32, ["discord.com", "*.discord.gg", "relay.invalid"])
        self.addCleanup(lambda: self.cb.secrets.delete("SDK_BOT"))
        sb = self.new()
        r = sb.add_relay("discord", 8080, "SDK_BOT", path="/discord", intents=513)
        self.assertEqual((r.name, r.kind, r.port, r.path, r.token_secret, r.intents), ("discord", "discord", 8080, "/discord", "SDK_BOT", 513))
        self.assertNotIn("d" * 32, repr(r))
        ls = sb.relays()
        self.assertEqual([(x.name, x.pending) for x in ls], [("discord", 0)])
        self.assertIn("connected", ls[0].state)
        self.assertEqual(sb.webhooks(), [])
        with self.assertRaises(cagebox.Conflict):
            sb.add_relay("discord", 8080, "SDK_BOT")
        ws = sb.add_relay("websocket", 8081, "SDK_BOT", name="feed", url="wss://relay.invalid/events", headers=["Authorization: Bearer {secret}"])
        self.assertEqual((ws.kind, ws.url, ws.headers), ("websocket", "wss://relay.invalid/events", ["Authorization: Bearer {secret}"]))
        sb.remove_relay("feed")
        with self.assertRaises(cagebox.Invalid):
            sb.add_relay("websocket", 8081, name="nosecret", url="wss://relay.invalid/", headers=["Authorization: Bearer {secret}"])
        with self.assertRaises(cagebox.Invalid):
            sb.add_relay("irc", 8080, "SDK_BOT", name="x")
        with self.assertRaises(cagebox.Invalid):
            sb.add_relay("discord", 8080, "NO_SUCH_SECRET", name="y")
        sb.remove_relay("discord")
        with self.assertRaises(cagebox.NotFound):
            sb.remove_relay("discord")
        self.assertEqual(sb.relays(), [])


class TestErrors(DaemonTest):
    def test_kinds(self):
        with self.assertRaises(cagebox.NotFound) as c:
            self.cb.sandbox("sb-0000000000000000")
        self.assertEqual((c.exception.status, c.exception.kind), (404, "not_found"))
        with self.assertRaises(cagebox.NotFound):
            cagebox.Sandbox(self.cb, {"id": "sb-0000000000000000"}).exec("true")
        with self.assertRaises(cagebox.Invalid) as c:
            self.cb.create(image="busybox", timeout="forever")
        self.assertEqual((c.exception.status, c.exception.kind), (400, "invalid"))
        self.assertIn("timeout", str(c.exception))
        with self.assertRaises(cagebox.Invalid):
            self.cb.create(image="busybox", idle_action="explode")
        with self.assertRaises(cagebox.NotFound):
            self.cb.create(image="no-such-image")
        with self.assertRaises(cagebox.NotFound):
            self.cb.secrets.get("NO_SUCH_SECRET")
        self.cb.policies.create("dup-policy", {"version": 1, "rules": []})
        self.addCleanup(self.cb.policies.delete, "dup-policy")
        with self.assertRaises(cagebox.Conflict) as c:
            self.cb.policies.create("dup-policy", {"version": 1, "rules": []})
        self.assertEqual(c.exception.status, 409)


class TestPolicy(DaemonTest):
    def test_live_allow_deny(self):
        sb = self.new(allow=[UPSTREAM_HOST])
        r = sb.exec(FETCH)
        self.assertEqual(r.exit_code, 0, r)
        self.assertIn(b"upstream says hello to /x", r.stdout)
        g0 = sb.policy.get().generation
        p = sb.policy.deny(UPSTREAM_HOST, name="block")
        self.assertEqual(p.generation, g0 + 1)
        self.assertEqual(p.policy.rules[0].name, "block")
        r = sb.exec(FETCH)
        self.assertNotEqual(r.exit_code, 0)
        self.assertIn(b"403", r.stderr)
        sb.policy.remove_rule("block")
        self.assertEqual(sb.exec(FETCH).exit_code, 0)
        # Path rules: deny one path, the rest stays allowed.
        sb.policy.deny(UPSTREAM_HOST, path="/secret/**", name="nosecret")
        self.assertNotEqual(sb.exec(f"wget -q -O- http://{UPSTREAM_HOST}/secret/a").exit_code, 0)
        self.assertEqual(sb.exec(FETCH).exit_code, 0)
        hist = sb.policy.history()
        self.assertGreaterEqual(len(hist), 4)
        self.assertEqual(hist[-1].generation if hist[-1].generation > hist[0].generation else hist[0].generation,
                         sb.policy.get().generation)
        self.assertIsInstance(sb.policy.usage(), list)

    def test_set_and_if_generation(self):
        sb = self.new()
        self.assertNotEqual(sb.exec(FETCH).exit_code, 0)  # default: deny everything
        g = sb.policy.get().generation
        sb.policy.set(f"version: 1\nrules:\n  - {{name: up, host: {UPSTREAM_HOST}, action: allow}}\n", if_generation=g)
        self.assertEqual(sb.exec(FETCH).exit_code, 0)
        with self.assertRaises(cagebox.Conflict):
            sb.policy.set({"version": 1, "rules": []}, if_generation=g)

    def test_hold_and_approve(self):
        sb = self.new(policy={"version": 2, "rules": []})
        sb.policy.hold(UPSTREAM_HOST, name="ask", timeout=30)
        box = {}
        t = threading.Thread(target=lambda: box.update(r=sb.exec(FETCH)))
        t.start()
        pending = self.wait_for("a pending approval", lambda: sb.approvals())
        self.assertEqual(pending[0].rule, "ask")
        a = self.cb.approvals.approve(pending[0].id, reason="sdk test")
        self.assertEqual(a.state, "allowed")
        t.join(30)
        self.assertEqual(box["r"].exit_code, 0, box["r"])
        self.assertIn(a.id, [x.id for x in self.cb.approvals.list(state=None, sandbox=sb.id)])

    def test_request_access(self):
        sb = self.new()
        self.assertNotEqual(sb.exec(FETCH).exit_code, 0)
        box = {}
        t = threading.Thread(target=lambda: box.update(r=sb.request_access(UPSTREAM_HOST, reason="needs the API", timeout=30)))
        t.start()
        pending = self.wait_for("the access request", lambda: sb.approvals())
        self.cb.approvals.approve(pending[0].id)
        t.join(30)
        self.assertTrue(box["r"].allowed, box["r"])
        self.assertEqual(box["r"].approval, pending[0].id)
        self.assertEqual(sb.exec(FETCH).exit_code, 0)

    def test_named_policy_and_freeze(self):
        self.cb.policies.create("sdk-up", f"version: 1\nrules:\n  - {{host: {UPSTREAM_HOST}, action: allow}}\n")
        self.addCleanup(self.cb.policies.delete, "sdk-up")
        sb = self.new(policy_ref="sdk-up")
        self.assertEqual(sb.policy.get().ref, "sdk-up")
        self.assertIn("sdk-up", [p.name for p in self.cb.policies.list()])
        self.assertEqual(sb.exec(FETCH).exit_code, 0)
        u = self.cb.policies.update("sdk-up", {"version": 1, "rules": []})
        self.assertIn(sb.id, u.updated)
        self.assertNotEqual(sb.exec(FETCH).exit_code, 0)
        self.cb.policies.update("sdk-up", {"version": 1, "rules": [{"host": UPSTREAM_HOST, "action": "allow"}]})
        self.assertEqual(self.cb.policies.get("sdk-up").generation, 3)
        self.assertEqual(sb.freeze().sandboxes, [sb.id])
        self.assertTrue(sb.policy.get().frozen)
        self.assertNotEqual(sb.exec(FETCH).exit_code, 0)
        sb.thaw()
        self.assertEqual(sb.exec(FETCH).exit_code, 0)


class TestSecretsAndEvents(DaemonTest):
    def test_secrets(self):
        s = self.cb.secrets.put("SDK_TOKEN", "ghp_" + "a" * 36, [UPSTREAM_HOST])
        self.addCleanup(lambda: self.cb.secrets.delete("SDK_TOKEN") if "SDK_TOKEN" in
                        [x.name for x in self.cb.secrets.list()] else None)
        self.assertEqual((s.name, s.version), ("SDK_TOKEN", 1))
        self.assertNotIn("a" * 36, repr(s))
        sb = self.new(secrets={"GH": "SDK_TOKEN"}, allow=[UPSTREAM_HOST])
        self.assertEqual(sb.info.secrets[0].name, "GH")
        seen = sb.exec("echo $GH").stdout_text.strip()
        self.assertTrue(seen and "a" * 36 not in seen, "the guest must see a placeholder, not the value")
        self.assertEqual(self.cb.secrets.rotate("SDK_TOKEN", "ghp_" + "b" * 36).version, 2)
        self.assertEqual(self.cb.secrets.get("SDK_TOKEN").version, 2)
        self.assertTrue(self.cb.secrets.revoke("SDK_TOKEN").revoked_at)
        self.assertEqual(sb.unbind("GH").info.get("secrets"), None)
        sb.remove()
        self.cb.secrets.delete("SDK_TOKEN")
        with self.assertRaises(cagebox.NotFound):
            self.cb.secrets.get("SDK_TOKEN")

    def test_events_list_and_follow(self):
        sb = self.new()
        # Events are stored by a batched writer: wait for the create's.
        evs = self.wait_for("sandbox.created", lambda: [e for e in sb.events() if e.kind == "sandbox.created"] and sb.events())
        last = max(e.seq for e in evs)
        got = []
        st = sb.follow_events(after=last, timeout=30)

        def read():
            for e in st:
                got.append(e)
                if e.kind == "sandbox.resumed":
                    return

        t = threading.Thread(target=read)
        t.start()
        sb.pause()
        sb.resume()
        t.join(20)
        st.close()
        self.assertFalse(t.is_alive(), "follow did not deliver sandbox.resumed")
        self.assertEqual([e.kind for e in got][:2], ["sandbox.paused", "sandbox.resumed"])
        self.assertTrue(all(e.sandbox == sb.id and e.seq > last for e in got))
        self.assertEqual(st.last_seq, got[-1].seq)
        # All of the tenant's events, filtered by after.
        self.assertTrue(all(e.seq > last for e in self.cb.events(after=last)))


def _read_until(p, needle, timeout=20):
    """Reads the terminal until needle shows up (in a thread-free way: the
    WebSocket's socket has a timeout)."""
    buf = b""
    deadline = time.time() + timeout
    while needle not in buf:
        if time.time() > deadline:
            raise AssertionError(f"no {needle!r} on the terminal; it shows {buf!r}")
        b = p.read()
        if not b:
            raise AssertionError(f"terminal ended before {needle!r}; it showed {buf!r}")
        buf += b
    return buf


class TestPty(DaemonTest):
    def test_shell_resize_ctrl_c_exit(self):
        sb = self.new()
        with sb.pty("sh", rows=30, cols=100, env={"PS1": "cbx$ "}) as p:
            _read_until(p, b"cbx$ ")
            p.write("stty size\r")
            _read_until(p, b"30 100")
            p.resize(40, 132)
            time.sleep(0.3)
            p.write("stty size\r")
            _read_until(p, b"40 132")
            p.write("sleep 100\r")
            time.sleep(1)
            t0 = time.time()
            p.write(b"\x03")
            p.write("echo alive$((40+2))\r")
            _read_until(p, b"alive42")
            self.assertLess(time.time() - t0, 20)
            p.write("exit 3\r")
            self.assertEqual(p.wait(), 3)
            self.assertEqual(p.result["type"], "exit")

    def test_command_and_errors(self):
        sb = self.new()
        with sb.pty(["sh", "-c", "test -t 0 && tty && exit 5"]) as p:
            out = b"".join(p)
            self.assertIn(b"/dev/pts/", out)
            self.assertEqual(p.exit_code, 5)
        with sb.pty() as p:  # the login shell
            p.write("echo shell:$0; exit 6\r")
            self.assertIn(b"shell:", _read_until(p, b"shell:"))
            self.assertEqual(p.wait(), 6)
        # Hanging up kills the command (and the session's jobs).
        p = sb.pty(["sh", "-c", "sleep 301 & sleep 302; echo never"])
        time.sleep(1)
        p.close()
        self.wait_for("the hung-up terminal's processes to be killed",
                      lambda: b"sleep 30" not in sb.exec("ps").stdout)
        with self.assertRaises(cagebox.Invalid):
            sb.pty(rows=0)
        with self.assertRaises(cagebox.NotFound):
            self.cb.sandbox("sb-nope").pty()
        with sb.pty(["no-such-command"]) as p:
            self.assertEqual(p.wait(), 127)
            self.assertIn("not found", p.result.get("error", ""))


class TestArchive(DaemonTest):
    def test_upload_download_round_trip(self):
        import tempfile
        sb = self.new()
        src = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, src)
        os.makedirs(os.path.join(src, "sub", "deep"), 0o750)
        os.mkdir(os.path.join(src, "empty"), 0o700)
        with open(os.path.join(src, "run.sh"), "w") as f:
            f.write("#!/bin/sh\necho ran\n")
        os.chmod(os.path.join(src, "run.sh"), 0o755)
        with open(os.path.join(src, "sub", "deep", "data"), "wb") as f:
            f.write(b"x" * 100000)
        os.symlink("sub/deep/data", os.path.join(src, "link"))
        sb.files.upload_dir(src, "/work/up")
        r = sb.exec("cd /work/up && ./run.sh && stat -c '%n %a' run.sh empty sub/deep && readlink link")
        self.assertEqual(r.exit_code, 0, r.stderr)
        for want in (b"ran", b"run.sh 755", b"empty 700", b"sub/deep 750", b"sub/deep/data"):
            self.assertIn(want, r.stdout)
        back = os.path.join(tempfile.mkdtemp(), "back")
        self.addCleanup(__import__("shutil").rmtree, os.path.dirname(back))
        self.assertGreaterEqual(sb.files.download_dir("/work/up", back), 6)
        self.assertEqual(os.stat(os.path.join(back, "run.sh")).st_mode & 0o777, 0o755)
        self.assertEqual(os.stat(os.path.join(back, "empty")).st_mode & 0o777, 0o700)
        self.assertEqual(os.readlink(os.path.join(back, "link")), "sub/deep/data")
        with open(os.path.join(back, "link"), "rb") as f:
            self.assertEqual(len(f.read()), 100000)
        raw = sb.files.archive_get("/work/up/run.sh")
        import tarfile
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            self.assertEqual(tf.getnames(), ["run.sh"])

    def test_escapes_refused(self):
        import tarfile
        sb = self.new()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = tarfile.TarInfo("ln")
            ti.type, ti.linkname = tarfile.SYMTYPE, "/"
            tf.addfile(ti)
            ti = tarfile.TarInfo("ln/escaped")
            ti.size = 1
            tf.addfile(ti, io.BytesIO(b"x"))
        with self.assertRaises(cagebox.Invalid) as c:
            sb.files.archive_put("/work/t", buf.getvalue())
        self.assertIn("symlink", str(c.exception))
        self.assertNotEqual(sb.exec("test -e /escaped").exit_code, 0)


class TestTCP(DaemonTest):
    def test_api_key(self):
        self.cb.tenants.create("sdk-team")
        self.assertIn("sdk-team", [t.name for t in self.cb.tenants.list()])
        key = self.cb.tenants.create_key("sdk-team")
        self.assertTrue(key.key.startswith(key.prefix))
        tcp = cagebox.Cagebox(host=D.url, api_key=key.key, ca_cert=D.ca)
        self.assertEqual(tcp.health().tenant, "sdk-team")
        # The daemon's certificate is verified: without its CA the system roots refuse it.
        with self.assertRaises(cagebox.ConnectionFailed) as c:
            cagebox.Cagebox(host=D.url, api_key=key.key).health()
        self.assertIn("CERTIFICATE_VERIFY_FAILED", str(c.exception))
        with tcp.create(image="busybox") as sb:
            self.assertEqual(sb.info.tenant, "sdk-team")
            self.assertEqual(sb.exec("cat", stdin=b"over tcp").stdout, b"over tcp")
            big = os.urandom(1 << 20)
            self.assertEqual(sb.exec("cat", stdin=big).stdout, big)
            sb.files.write("/tmp/f", b"x")
            self.assertEqual(sb.files.read("/tmp/f"), b"x")
            # A terminal over HTTPS with the tenant's key.
            with sb.pty(["sh", "-c", "read line; echo got:$line; exit 4"]) as p:
                p.write("hello\r")
                self.assertIn(b"got:hello", _read_until(p, b"got:hello"))
                self.assertEqual(p.wait(), 4)
            # The tenant sees its own sandboxes only; the admin sees all.
            self.assertEqual([s.id for s in tcp.sandboxes()], [sb.id])
            self.assertIn(sb.id, [s.id for s in self.cb.sandboxes()])
        with self.assertRaises(cagebox.Denied) as c:
            tcp.pools()
        self.assertEqual(c.exception.status, 403)
        with self.assertRaises(cagebox.Unauthorized):
            cagebox.Cagebox(host=D.url, api_key="cbk_wrong", ca_cert=D.ca).health()
        with self.assertRaises(cagebox.Unauthorized):
            cagebox.Cagebox(host=D.url, api_key="", ca_cert=D.ca).health()
        # The same environment variables as the CLI and the Go client.
        saved = {k: os.environ.get(k) for k in ("CAGEBOX_HOST", "CAGEBOX_API_KEY", "CAGEBOX_CA_CERT")}
        os.environ.update(CAGEBOX_HOST=D.url, CAGEBOX_API_KEY=key.key, CAGEBOX_CA_CERT=D.ca)
        try:
            self.assertEqual(cagebox.Cagebox().health().tenant, "sdk-team")
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v


class TestMounts(DaemonTest):
    def test_volumes_and_mounts(self):
        v = self.cb.volumes.create("sdk-data", size="64M")
        self.addCleanup(lambda: self.cb.volumes.remove("sdk-data"))
        self.assertEqual((v.name, v.size_bytes), ("sdk-data", 64 << 20))
        with self.assertRaises(cagebox.Conflict):
            self.cb.volumes.create("sdk-data")
        with self.assertRaises(cagebox.Invalid):
            self.cb.volumes.create("Bad/Name")
        a = self.new(mounts=["type=volume,src=sdk-data,dst=/data,rw"])
        self.assertEqual(a.exec(["sh", "-c", "echo kept > /data/note"]).exit_code, 0)
        held = {x.name: x for x in self.cb.volumes.list()}["sdk-data"]
        self.assertEqual([(h.sandbox, h.rw) for h in held.attached_to], [(a.id, True)])
        # One read-write holder at a time; no removal while mounted.
        with self.assertRaises(cagebox.Conflict):
            self.new(mounts=[{"type": "volume", "src": "sdk-data", "dst": "/data", "rw": True}])
        with self.assertRaises(cagebox.Conflict):
            self.cb.volumes.remove("sdk-data")
        a.remove()
        b = self.new(mounts=[{"type": "volume", "src": "sdk-data", "dst": "/data"}], read_only_root=True)
        r = b.exec(["cat", "/data/note"])
        self.assertEqual((r.exit_code, r.stdout), (0, b"kept\n"))
        self.assertNotEqual(b.exec(["sh", "-c", "echo x > /data/note"]).exit_code, 0)
        self.assertNotEqual(b.exec(["sh", "-c", "echo x > /etc/x"]).exit_code, 0)
        self.assertEqual(b.exec(["sh", "-c", "echo x > /tmp/x"]).exit_code, 0)
        self.assertTrue(b.info.read_only_root)
        b.remove()

    def test_bind_mount(self):
        src = os.path.join(D.mount_root, "code")
        sb = self.new(mounts=[f"type=bind,src={src},dst=/code"])
        r = sb.exec(["cat", "/code/main.py"])
        self.assertEqual((r.exit_code, r.stdout), (0, b"print('hello')\n"))
        self.assertNotEqual(sb.exec(["sh", "-c", "echo x > /code/main.py"]).exit_code, 0)
        with self.assertRaises(cagebox.Invalid) as cm:
            self.new(mounts=["type=bind,src=/etc,dst=/code"])
        self.assertIn("mount root", str(cm.exception))


class TestTools(DaemonTest):
    def test_tools_execute(self):
        t = self.cb.tools.add("sdk-upper", ["tr", "a-z", "A-Z"], description="upper-cases its input", image="busybox")
        self.addCleanup(lambda: self.cb.tools.remove("sdk-upper"))
        self.assertEqual(t.name, "sdk-upper")
        self.assertIn("sdk-upper", [x.name for x in self.cb.tools.list()])
        self.assertEqual(self.cb.tools.get("sdk-upper").argv, ["tr", "a-z", "A-Z"])
        r = self.cb.execute("sdk-upper", "hello")
        self.assertEqual((r.exit_code, r.stdout, r.tool), (0, "HELLO", "sdk-upper"))
        with self.assertRaises(cagebox.NotFound):
            self.cb.execute("no-such-tool", "x")
        with self.assertRaises(cagebox.Invalid):
            self.cb.tools.add("bad", [])

    def test_tool_egress_and_input_file(self):
        self.cb.tools.add("sdk-fetch", ["sh", "-c", f"cat /tmp/in.txt; wget -q -O- http://{UPSTREAM_HOST}/tool"],
                          input_file="/tmp/in.txt", image="busybox", runtime="container", allow=[UPSTREAM_HOST])
        self.addCleanup(lambda: self.cb.tools.remove("sdk-fetch"))
        r = self.cb.execute("sdk-fetch", "from the file\n")
        self.assertEqual(r.exit_code, 0, r)
        self.assertEqual(r.stdout, "from the file\nupstream says hello to /tool\n")
        self.assertEqual(r.runtime, "container")
        self.assertTrue(any(e.host == UPSTREAM_HOST and e.allowed for e in r.egress), r.egress)
        # The sandbox goes once the result is back (removed in the background).
        self.wait_for("the tool's sandbox to go", lambda: r.sandbox not in [s.id for s in self.cb.sandboxes()])
        # Replacing needs replace=True.
        with self.assertRaises(cagebox.Conflict):
            self.cb.tools.add("sdk-fetch", ["true"], image="busybox")
        self.assertEqual(self.cb.tools.add("sdk-fetch", ["true"], image="busybox", replace=True).argv, ["true"])


if __name__ == "__main__":
    unittest.main()
