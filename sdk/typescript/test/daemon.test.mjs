// The SDK against a real daemon with real sandboxes (container runtime,
// busybox image). Skips, saying why, without root or without `make build`.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";
import { Readable } from "node:stream";
import { after, before, describe, it } from "node:test";

import * as cagebox from "../dist/index.js";
import { Cagebox } from "../dist/index.js";
import { Daemon, ociLayoutTar, skipReason, UPSTREAM_HOST } from "./harness.mjs";

const reason = skipReason();
if (reason && process.env.CAGEBOX_SDK_REQUIRE_DAEMON) {
  throw new Error(`CAGEBOX_SDK_REQUIRE_DAEMON is set but the daemon tests cannot run: ${reason}`);
}
const FETCH = `wget -q -O- http://${UPSTREAM_HOST}/x`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(what, fn, ms = 15_000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const v = await fn();
    if (v) return v;
    await sleep(100);
  }
  throw new Error(`timed out waiting for ${what}`);
}


// One ustar entry (header + padded body), for crafting archives.
function tarEntry(name, type = "0", body = Buffer.alloc(0), linkname = "") {
  const h = Buffer.alloc(512);
  h.write(name, 0, 100);
  h.write("0000644\0", 100);
  h.write("0000000\0", 108);
  h.write("0000000\0", 116);
  h.write(body.length.toString(8).padStart(11, "0") + "\0", 124);
  h.write("14712345670\0", 136);
  h.write("        ", 148);
  h.write(type, 156);
  h.write(linkname, 157, 100);
  h.write("ustar\0" + "00", 257);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, "0") + "\0 ", 148);
  const pad = Buffer.alloc((512 - (body.length % 512)) % 512);
  return Buffer.concat([h, body, pad]);
}

async function readUntil(it, p, needle, ms = 20_000) {
  let seen = "";
  const deadline = Date.now() + ms;
  while (!seen.includes(needle)) {
    if (Date.now() > deadline) throw new Error(`no ${JSON.stringify(needle)} on the terminal; it shows ${JSON.stringify(seen)}`);
    const { value, done } = await it.next();
    if (done) throw new Error(`terminal ended before ${JSON.stringify(needle)}; it showed ${JSON.stringify(seen)}`);
    seen += value.toString();
  }
  return seen;
}

describe("against a real daemon", { skip: reason || false }, () => {
  let d;
  let cb;
  before(async () => {
    d = new Daemon();
    try {
      await d.start();
    } catch (err) {
      await d.stop();
      throw err;
    }
    cb = d.client;
  });
  after(async () => {
    await d?.stop();
  });

  it("health, runtimes, images, pools", async () => {
    assert.equal((await cb.health()).tenant, "admin");
    const rt = (await cb.runtimes()).find((r) => r.name === "container");
    assert.ok(rt?.available, JSON.stringify(rt));
    const names = (await cb.images()).map((i) => i.name);
    assert.ok(names.includes("busybox") && names.includes("default"), names.join());
    assert.deepEqual((await cb.pools()).pools, []);
  });

  it("import an image, pull errors, metrics", async () => {
    const rootfs = path.join(d.home, "images", "busybox", "rootfs");
    const file = ociLayoutTar(rootfs, path.join(d.home, "a.tar"));
    const img = await cb.importImage(file, { name: "sdk-imported-js" });   // a path: streamed
    assert.equal(img.name, "sdk-imported-js");
    assert.match(img.manifest_digest, /^sha256:/);
    assert.deepEqual(img.config.env, ["PATH=/bin:/usr/bin", "FROM_IMPORT=1"]);
    assert.ok((await cb.images()).some((i) => i.name === "sdk-imported-js"));
    await cb.withSandbox({ image: "sdk-imported-js" }, async (sb) => {
      assert.equal((await sb.exec("echo from the imported image")).stdout.toString(), "from the imported image\n");
    });
    assert.equal((await cb.importImage(fs.readFileSync(file), { name: "sdk-imported-js" })).digest, img.digest);   // bytes
    const other = ociLayoutTar(rootfs, path.join(d.home, "b.tar"), ["V=2"]);
    await assert.rejects(cb.importImage(fs.createReadStream(other), { name: "sdk-imported-js" }), cagebox.Conflict);   // a stream
    assert.deepEqual((await cb.importImage(other, { name: "sdk-imported-js", force: true })).config.env, ["V=2"]);
    await assert.rejects(cb.importImage(Buffer.from("not a tar at all"), { name: "sdk-garbage-js" }), cagebox.Invalid);
    await assert.rejects(cb.pullImage("UPPER CASE is no reference"), cagebox.Invalid);
    const m = await cb.metrics();
    assert.match(m, /# TYPE/);
    assert.match(m, /cagebox_/);
  });

  it("create, inspect, list; the default image", async () => {
    await cb.withSandbox({ env: { GREETING: "hi" }, memory: "128M", timeout: 600, idleTimeout: "5m", idleAction: "pause" }, async (sb) => {
      assert.equal(sb.status, "running");
      assert.equal(sb.info.image, "default");
      assert.equal(sb.info.resources.memory_bytes, 128 * 2 ** 20);
      assert.equal(sb.info.idle_action, "pause");
      assert.ok((await cb.sandboxes()).some((s) => s.id === sb.id));
      assert.equal((await cb.sandbox(sb.id)).id, sb.id);
      assert.equal((await sb.inspect()).status, "running");
      assert.equal((await sb.exec("echo $GREETING")).stdout.toString(), "hi\n");
    });
  });

  describe("exec and files", () => {
    let sb;
    before(async () => {
      sb = await cb.create({ image: "busybox" });
    });
    after(async () => {
      await sb.remove();
    });

    it("exit codes, output, signals", async () => {
      let r = await sb.exec("echo out; echo err >&2; exit 3");
      assert.deepEqual([r.exitCode, r.stdout.toString(), r.stderr.toString()], [3, "out\n", "err\n"]);
      r = await sb.exec(["/bin/echo", "a b", "c"]);
      assert.equal(r.stdout.toString(), "a b c\n");
      r = await sb.exec("kill -9 $$");
      assert.equal(r.signal, "SIGKILL");
    });

    it("streams output as an async iterator, before the exit", async () => {
      const start = Date.now();
      const seen = [];
      const st = await sb.execStream("echo one; sleep 1.5; echo two >&2");
      for await (const o of st) seen.push([o.stream, o.data.toString(), Date.now() - start]);
      const total = Date.now() - start;
      assert.deepEqual(seen.map(([s, d]) => [s, d]), [["stdout", "one\n"], ["stderr", "two\n"]]);
      assert.ok(seen[0][2] < total - 1000, `stdout came only with the exit (${seen[0][2]} of ${total} ms)`);
      assert.equal(st.result.exitCode, 0);
      const got = [];
      const r = await sb.exec("for i in 1 2 3; do echo $i; done", { onStdout: (b) => got.push(b.toString()) });
      assert.equal(got.join(""), "1\n2\n3\n");
      assert.equal(r.exitCode, 0);
    });

    it("close and abort kill the command", async () => {
      const st = await sb.execStream("echo first; sleep 30");
      for await (const o of st) {
        assert.equal(o.data.toString(), "first\n");
        break; // returns the iterator: hangs up
      }
      assert.equal(st.result, undefined);
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 200);
      await assert.rejects(sb.exec("sleep 29", { signal: ac.signal }), { name: "AbortError" });
      await waitFor("the commands to be killed", async () => !/sleep (29|30)/.test((await sb.exec("ps")).stdout.toString()));
    });

    it("stdin: text, bytes, streams; 4 MiB full duplex", async () => {
      for (const stdin of ["text\n", Buffer.from("bytes\n"), Readable.from([Buffer.from("read"), Buffer.from("able\n")]), ["arr", "ay\n"]]) {
        const r = await sb.exec("cat", { stdin });
        assert.equal(r.exitCode, 0);
        assert.ok(r.stdout.length > 1 && r.stdout.toString().endsWith("\n"), r.stdout.toString());
      }
      const data = randomBytes(4 << 20);
      const r = await sb.exec(["cat"], { stdin: data });
      assert.equal(r.exitCode, 0);
      assert.ok(r.stdout.equals(data), `got ${r.stdout.length} bytes back`);
      assert.equal((await sb.exec("wc -c")).stdout.toString().trim(), "0");
    });

    it("timeout, env, cwd", async () => {
      const t = Date.now();
      const r = await sb.exec("sleep 30", { timeout: 0.5 });
      assert.ok(r.timedOut);
      assert.ok(Date.now() - t < 10_000);
      assert.equal((await sb.exec("echo $A-$B; pwd", { env: { A: "1", B: "2" }, cwd: "/tmp" })).stdout.toString(), "1-2\n/tmp\n");
    });

    it("files: write, read, list, errors", async () => {
      const blob = randomBytes(100_000);
      await sb.files.write("/tmp/sdk/dir/blob.bin", blob, 0o600);
      assert.ok((await sb.files.read("/tmp/sdk/dir/blob.bin")).equals(blob));
      await sb.files.write("/tmp/sdk/hello.txt", "héllo");
      assert.equal(await sb.files.readText("/tmp/sdk/hello.txt"), "héllo");
      const ents = Object.fromEntries((await sb.files.list("/tmp/sdk")).map((e) => [e.name, e]));
      assert.ok(ents.dir.is_dir);
      assert.equal(ents["hello.txt"].size, Buffer.byteLength("héllo"));
      assert.equal((await sb.files.list("/tmp/sdk/dir"))[0].mode, "-rw-------");
      await assert.rejects(sb.files.read("/tmp/sdk/missing"), cagebox.NotFound);
      await assert.rejects(sb.files.read("relative"), cagebox.Invalid);
    });
  });

  it("pause, resume, stop, remove", async () => {
    const sb = await cb.create({ image: "busybox" });
    // Hibernation is for microVMs: the container runtime refuses it.
    await assert.rejects(sb.pause({ toDisk: true }), (e) => e instanceof cagebox.Invalid && /hibernate/.test(e.message));
    assert.equal((await sb.inspect()).status, "running");
    assert.equal((await sb.pause()).status, "paused");
    assert.equal((await sb.resume()).status, "running");
    assert.equal((await sb.exec("echo back")).stdout.toString(), "back\n");
    assert.equal((await sb.stop(1)).status, "stopped");
    await sb.remove();
    await assert.rejects(sb.inspect(), cagebox.NotFound);
  });

  it("withSandbox removes the sandbox, also when fn throws", async () => {
    let id;
    await cb.withSandbox({ image: "busybox" }, async (sb) => {
      id = sb.id;
    });
    await assert.rejects(cb.sandbox(id), cagebox.NotFound);
    await assert.rejects(cb.withSandbox({ image: "busybox" }, async (sb) => {
      id = sb.id;
      throw new Error("boom");
    }), /boom/);
    await assert.rejects(cb.sandbox(id), cagebox.NotFound);
  });

  it("error kinds", async () => {
    await assert.rejects(cb.sandbox("sb-0000000000000000"), (e) => e instanceof cagebox.NotFound && e.status === 404 && e.kind === "not_found");
    await assert.rejects(cb.create({ image: "busybox", timeout: "forever" }), (e) => e instanceof cagebox.Invalid && e.status === 400 && /timeout/.test(e.message));
    await assert.rejects(cb.create({ image: "no-such-image" }), cagebox.NotFound);
    await assert.rejects(cb.secrets.get("NO_SUCH_SECRET"), cagebox.NotFound);
    await cb.policies.create("dup-policy-js", { version: 1, rules: [] });
    await assert.rejects(cb.policies.create("dup-policy-js", { version: 1, rules: [] }), (e) => e instanceof cagebox.Conflict && e.status === 409);
    await cb.policies.delete("dup-policy-js");
  });

  it("live policy: allow, deny, remove, set, history", async () => {
    await cb.withSandbox({ image: "busybox", allow: [UPSTREAM_HOST] }, async (sb) => {
      let r = await sb.exec(FETCH);
      assert.equal(r.exitCode, 0, r.stderr.toString());
      assert.match(r.stdout.toString(), /upstream says hello to \/x/);
      const g0 = (await sb.policy.get()).generation;
      const p = await sb.policy.deny(UPSTREAM_HOST, { name: "block" });
      assert.equal(p.generation, g0 + 1);
      r = await sb.exec(FETCH);
      assert.notEqual(r.exitCode, 0);
      assert.match(r.stderr.toString(), /403/);
      await sb.policy.removeRule("block");
      assert.equal((await sb.exec(FETCH)).exitCode, 0);
      const g = (await sb.policy.get()).generation;
      await sb.policy.set("version: 1\nrules: []\n", g);
      assert.notEqual((await sb.exec(FETCH)).exitCode, 0);
      await assert.rejects(sb.policy.set({ version: 1, rules: [] }, g), cagebox.Conflict);
      assert.ok((await sb.policy.history()).length >= 4);
      assert.ok(Array.isArray(await sb.policy.usage()));
    });
  });

  it("hold and approve", async () => {
    await cb.withSandbox({ image: "busybox", policy: { version: 2, rules: [] } }, async (sb) => {
      await sb.policy.hold(UPSTREAM_HOST, { name: "ask", timeout: 30 });
      const running = sb.exec(FETCH);
      const pending = await waitFor("a pending approval", async () => {
        const l = await sb.approvals();
        return l.length ? l : null;
      });
      assert.equal(pending[0].rule, "ask");
      assert.equal((await cb.approvals.approve(pending[0].id, { reason: "sdk test" })).state, "allowed");
      assert.equal((await running).exitCode, 0);
    });
  });

  it("request access", async () => {
    await cb.withSandbox({ image: "busybox" }, async (sb) => {
      assert.notEqual((await sb.exec(FETCH)).exitCode, 0);
      const asking = sb.requestAccess(UPSTREAM_HOST, { reason: "needs the API", timeout: 30 });
      const pending = await waitFor("the access request", async () => {
        const l = await sb.approvals();
        return l.length ? l : null;
      });
      await cb.approvals.approve(pending[0].id);
      const r = await asking;
      assert.ok(r.allowed, JSON.stringify(r));
      assert.equal(r.approval, pending[0].id);
      assert.equal((await sb.exec(FETCH)).exitCode, 0);
    });
  });

  it("named policy, freeze and thaw", async () => {
    await cb.policies.create("sdk-up-js", `version: 1\nrules:\n  - {host: ${UPSTREAM_HOST}, action: allow}\n`);
    try {
      await cb.withSandbox({ image: "busybox", policyRef: "sdk-up-js" }, async (sb) => {
        assert.equal((await sb.policy.get()).ref, "sdk-up-js");
        assert.ok((await cb.policies.list()).some((p) => p.name === "sdk-up-js"));
        assert.equal((await sb.exec(FETCH)).exitCode, 0);
        const u = await cb.policies.update("sdk-up-js", { version: 1, rules: [] });
        assert.deepEqual(u.updated, [sb.id]);
        assert.notEqual((await sb.exec(FETCH)).exitCode, 0);
        await cb.policies.update("sdk-up-js", { version: 1, rules: [{ host: UPSTREAM_HOST, action: "allow" }] });
        assert.equal((await cb.policies.get("sdk-up-js")).generation, 3);
        assert.deepEqual((await sb.freeze()).sandboxes, [sb.id]);
        assert.notEqual((await sb.exec(FETCH)).exitCode, 0);
        await sb.thaw();
        assert.equal((await sb.exec(FETCH)).exitCode, 0);
      });
    } finally {
      await cb.policies.delete("sdk-up-js");
    }
  });

  it("ports: publish, list, signed URL, unpublish", async () => {
    await cb.withSandbox({ image: "busybox" }, async (sb) => {
      const p = await sb.publish(8080, { ttl: "1h" });
      assert.ok(p.token && p.token.startsWith("cbp_"), JSON.stringify(p));
      assert.ok(p.url.includes(`8080-${sb.id}.sdk.test`), p.url);
      assert.ok(p.expires_at);
      assert.equal((await sb.publish(9090, { public: true })).token, undefined);
      const ports = await sb.ports();
      assert.deepEqual(ports.map((x) => x.port), [8080, 9090]);
      assert.ok(ports.every((x) => !x.token));
      const u = await sb.portURL(8080, { ttl: "10m" });
      assert.ok(u.url.includes("cbx_sig="), u.url);
      await sb.unpublish(8080);
      await assert.rejects(sb.unpublish(8080), cagebox.NotFound);
      await assert.rejects(sb.portURL(8080), cagebox.NotFound);
      await assert.rejects(sb.publish(70000), cagebox.Invalid);
      assert.deepEqual((await sb.ports()).map((x) => x.port), [9090]);
    });
  });

  it("create: audit and publish", async () => {
    await cb.withSandbox({ image: "busybox", audit: ["exec"], publish: [8080] }, async (sb) => {
      const info = await sb.inspect();
      assert.deepEqual(info.audit.classes, ["exec"]);
      assert.deepEqual(info.ports.map((p) => p.port), [8080]);
    });
    await assert.rejects(cb.create({ image: "busybox", audit: ["everything"] }), cagebox.Invalid);
  });

  it("webhooks: add, list, remove", async () => {
    await cb.secrets.put("SDK_HOOK_JS", "whsec_" + "c".repeat(32), [UPSTREAM_HOST]);
    try {
      await cb.withSandbox({ image: "busybox" }, async (sb) => {
        const w = await sb.addWebhook("gh", 8080, "github", "SDK_HOOK_JS", { path: "/hook" });
        assert.ok(w.url.startsWith("https://hooks.sdk.test") && w.url.includes("/w/cbw_"), JSON.stringify(w));
        assert.ok(!JSON.stringify(w).includes("c".repeat(32)));
        const ls = await sb.webhooks();
        assert.deepEqual(ls.map((x) => [x.name, x.port, x.path, x.pending]), [["gh", 8080, "/hook", 0]]);
        assert.ok(ls.every((x) => !x.url && !x.token));
        await assert.rejects(sb.addWebhook("gh", 8080, "github", "SDK_HOOK_JS"), cagebox.Conflict);
        await assert.rejects(sb.addWebhook("x", 8080, "gitlab", "SDK_HOOK_JS"), cagebox.Invalid);
        await sb.removeWebhook("gh");
        await assert.rejects(sb.removeWebhook("gh"), cagebox.NotFound);
        assert.deepEqual(await sb.webhooks(), []);
      });
    } finally {
      await cb.secrets.delete("SDK_HOOK_JS");
    }
  });

  it("relays: add, list, remove", async () => {
    // A bot token goes only to Discord's hosts (the gateway is *.discord.gg)
    // and to the WebSocket relay's host below.
    await cb.secrets.put("SDK_BOT_JS", "bot." + "e".repeat(32), ["discord.com", "*.discord.gg", "relay.invalid"]);
    try {
      await cb.withSandbox({ image: "busybox" }, async (sb) => {
        const r = await sb.addRelay("discord", 8080, "SDK_BOT_JS", { path: "/discord", intents: 513 });
        assert.deepEqual([r.name, r.kind, r.port, r.path, r.token_secret, r.intents], ["discord", "discord", 8080, "/discord", "SDK_BOT_JS", 513]);
        assert.ok(!JSON.stringify(r).includes("e".repeat(32)));
        const ls = await sb.relays();
        assert.deepEqual(ls.map((x) => [x.name, x.pending]), [["discord", 0]]);
        assert.equal(typeof ls[0].state.connected, "boolean");
        assert.deepEqual(await sb.webhooks(), []);
        await assert.rejects(sb.addRelay("discord", 8080, "SDK_BOT_JS"), cagebox.Conflict);
        const ws = await sb.addRelay("websocket", 8081, "SDK_BOT_JS", { name: "feed", url: "wss://relay.invalid/events", headers: ["Authorization: Bearer {secret}"] });
        assert.deepEqual([ws.kind, ws.url, ws.headers], ["websocket", "wss://relay.invalid/events", ["Authorization: Bearer {secret}"]]);
        await sb.removeRelay("feed");
        await assert.rejects(sb.addRelay("websocket", 8081, undefined, { name: "n", url: "wss://relay.invalid/", headers: ["Authorization: Bearer {secret}"] }), cagebox.Invalid);
        await assert.rejects(sb.addRelay("irc", 8080, "SDK_BOT_JS", { name: "x" }), cagebox.Invalid);
        await sb.removeRelay("discord");
        await assert.rejects(sb.removeRelay("discord"), cagebox.NotFound);
        assert.deepEqual(await sb.relays(), []);
      });
    } finally {
      await cb.secrets.delete("SDK_BOT_JS");
    }
  });

  it("secrets: put, bind, rotate, revoke, unbind, delete", async () => {
    const s = await cb.secrets.put("SDK_TOKEN_JS", "ghp_" + "a".repeat(36), [UPSTREAM_HOST]);
    assert.equal(s.version, 1);
    assert.ok(!JSON.stringify(s).includes("a".repeat(36)));
    await cb.withSandbox({ image: "busybox", secrets: { GH: "SDK_TOKEN_JS" }, allow: [UPSTREAM_HOST] }, async (sb) => {
      const seen = (await sb.exec("echo $GH")).stdout.toString().trim();
      assert.ok(seen && !seen.includes("a".repeat(36)), "the guest must see a placeholder");
      assert.equal((await cb.secrets.rotate("SDK_TOKEN_JS", "ghp_" + "b".repeat(36))).version, 2);
      assert.ok((await cb.secrets.revoke("SDK_TOKEN_JS")).revoked_at);
      assert.equal((await sb.unbind("GH")).info.secrets, undefined);
    });
    assert.ok((await cb.secrets.list()).some((x) => x.name === "SDK_TOKEN_JS"));
    await cb.secrets.delete("SDK_TOKEN_JS");
    await assert.rejects(cb.secrets.get("SDK_TOKEN_JS"), cagebox.NotFound);
  });

  it("events: list and follow", async () => {
    await cb.withSandbox({ image: "busybox" }, async (sb) => {
      // Events are stored by a batched writer: wait for the create's.
      const evs = await waitFor("sandbox.created", async () => {
        const l = await sb.events();
        return l.some((e) => e.kind === "sandbox.created") ? l : null;
      });
      const last = Math.max(...evs.map((e) => e.seq));
      const st = await sb.followEvents({ after: last });
      const got = [];
      const reading = (async () => {
        for await (const e of st) {
          got.push(e);
          if (e.kind === "sandbox.resumed") break;
        }
      })();
      await sb.pause();
      await sb.resume();
      let timer;
      const timeout = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error("follow did not deliver sandbox.resumed")), 20_000);
      });
      try {
        await Promise.race([reading, timeout]);
      } finally {
        clearTimeout(timer);
        st.close();
      }
      assert.deepEqual(got.map((e) => e.kind).slice(0, 2), ["sandbox.paused", "sandbox.resumed"]);
      assert.ok(got.every((e) => e.sandbox === sb.id && e.seq > last));
      assert.equal(st.lastSeq, got.at(-1).seq);
    });
  });

  describe("terminal and archives", () => {
    let sb;
    before(async () => {
      sb = await cb.create({ image: "busybox" });
    });
    after(async () => {
      await sb.remove();
    });

    it("pty: prompt, resize, Ctrl-C, exit code", async () => {
      const p = await sb.pty("sh", { rows: 30, cols: 100, env: { PS1: "cbx$ " } });
      const it = p[Symbol.asyncIterator]();
      await readUntil(it, p, "cbx$ ");
      p.write("stty size\r");
      await readUntil(it, p, "30 100");
      p.resize(40, 132);
      await sleep(300);
      p.write("stty size\r");
      await readUntil(it, p, "40 132");
      p.write("sleep 100\r");
      await sleep(1000);
      const t0 = Date.now();
      p.write("\x03");
      p.write("echo alive$((40+2))\r");
      await readUntil(it, p, "alive42");
      assert.ok(Date.now() - t0 < 20_000);
      p.write("exit 3\r");
      assert.equal(await p.wait(), 3);
      assert.equal(p.result.type, "exit");
    });

    it("pty: errors before the upgrade are API errors", async () => {
      await assert.rejects(sb.pty(undefined, { rows: 0 }), (e) => e instanceof cagebox.Invalid && /rows/.test(e.message));
      const p = await sb.pty(["no-such-command"]);
      assert.equal(await p.wait(), 127);
      assert.match(p.result.error, /not found/);
    });

    it("archives: put a tree, get it back, escapes refused", async () => {
      const src = fs.mkdtempSync(path.join(d.home, "src-"));
      fs.mkdirSync(path.join(src, "sub"), { mode: 0o750 });
      fs.writeFileSync(path.join(src, "run.sh"), "#!/bin/sh\necho ran\n", { mode: 0o755 });
      fs.writeFileSync(path.join(src, "sub", "data"), "x".repeat(100000));
      fs.symlinkSync("sub/data", path.join(src, "link"));
      const { execFileSync } = await import("node:child_process");
      const tarball = execFileSync("tar", ["-C", src, "-cf", "-", "."], { maxBuffer: 1 << 24 });
      await sb.files.archivePut("/work/up", Readable.from([tarball.subarray(0, 1000), tarball.subarray(1000)]));
      const r = await sb.exec("cd /work/up && ./run.sh && stat -c '%n %a' run.sh sub && readlink link && wc -c < link");
      assert.equal(r.exitCode, 0, r.stderr.toString());
      for (const want of ["ran", "run.sh 755", "sub 750", "sub/data", "100000"]) assert.ok(r.stdout.toString().includes(want), r.stdout.toString());
      const res = await sb.files.archiveGet("/work/up");
      const chunks = [];
      for await (const c of res) chunks.push(c);
      const names = execFileSync("tar", ["-tf", "-"], { input: Buffer.concat(chunks) }).toString().split("\n").filter(Boolean).sort();
      assert.deepEqual(names, ["./", "link", "run.sh", "sub/", "sub/data"]);
      const evil = Buffer.concat([tarEntry("ln", "2", Buffer.alloc(0), "/"), tarEntry("ln/escaped", "0", Buffer.from("x")), Buffer.alloc(1024)]);
      await assert.rejects(sb.files.archivePut("/work/t", evil), (e) => e instanceof cagebox.Invalid && /symlink/.test(e.message));
      assert.notEqual((await sb.exec("test -e /escaped")).exitCode, 0);
    });
  });

  it("TCP with an API key", async () => {
    await cb.tenants.create("sdk-team-js");
    assert.ok((await cb.tenants.list()).some((t) => t.name === "sdk-team-js"));
    const key = await cb.tenants.createKey("sdk-team-js");
    assert.ok(key.key.startsWith(key.prefix));
    const tcp = new Cagebox({ host: d.url, apiKey: key.key, caCert: d.ca });
    assert.equal((await tcp.health()).tenant, "sdk-team-js");
    // The daemon's certificate is verified: without its CA the system roots refuse it.
    await assert.rejects(new Cagebox({ host: d.url, apiKey: key.key }).health(), (e) => e instanceof cagebox.ConnectionFailed && /certificate/i.test(e.message));
    await tcp.withSandbox({ image: "busybox" }, async (sb) => {
      assert.equal(sb.info.tenant, "sdk-team-js");
      assert.equal((await sb.exec("cat", { stdin: "over tcp" })).stdout.toString(), "over tcp");
      // A terminal over HTTPS with the tenant's key.
      const p = await sb.pty(["sh", "-c", "read line; echo got:$line; exit 4"]);
      p.write("hello\r");
      await readUntil(p[Symbol.asyncIterator](), p, "got:hello");
      assert.equal(await p.wait(), 4);
      const big = randomBytes(4 << 20);
      assert.ok((await sb.exec("cat", { stdin: big })).stdout.equals(big));
      await sb.files.write("/tmp/f", "x");
      assert.equal(await sb.files.readText("/tmp/f"), "x");
      assert.deepEqual((await tcp.sandboxes()).map((s) => s.id), [sb.id]);
    });
    await assert.rejects(tcp.pools(), (e) => e instanceof cagebox.Denied && e.status === 403);
    await assert.rejects(new Cagebox({ host: d.url, apiKey: "cbk_wrong", caCert: d.ca }).health(), cagebox.Unauthorized);
    await assert.rejects(new Cagebox({ host: d.url, apiKey: "", caCert: d.ca }).health(), cagebox.Unauthorized);
    const saved = [process.env.CAGEBOX_HOST, process.env.CAGEBOX_API_KEY, process.env.CAGEBOX_CA_CERT];
    Object.assign(process.env, { CAGEBOX_HOST: d.url, CAGEBOX_API_KEY: key.key, CAGEBOX_CA_CERT: d.ca });
    try {
      assert.equal((await new Cagebox().health()).tenant, "sdk-team-js");
    } finally {
      delete process.env.CAGEBOX_HOST;
      delete process.env.CAGEBOX_API_KEY;
      delete process.env.CAGEBOX_CA_CERT;
      if (saved[0] !== undefined) process.env.CAGEBOX_HOST = saved[0];
      if (saved[1] !== undefined) process.env.CAGEBOX_API_KEY = saved[1];
      if (saved[2] !== undefined) process.env.CAGEBOX_CA_CERT = saved[2];
    }
  });

  it("volumes and mounts: one rw holder, ro after, read-only root, bind", async () => {
    const v = await cb.volumes.create("sdk-data-js", { size: "64M" });
    try {
      assert.deepEqual([v.name, v.size_bytes], ["sdk-data-js", 64 * 2 ** 20]);
      await assert.rejects(cb.volumes.create("sdk-data-js"), cagebox.Conflict);
      await assert.rejects(cb.volumes.create("Bad/Name"), cagebox.Invalid);
      const a = await cb.create({ image: "busybox", mounts: ["type=volume,src=sdk-data-js,dst=/data,rw"] });
      try {
        assert.equal((await a.exec("echo kept > /data/note")).exitCode, 0);
        const held = (await cb.volumes.list()).find((x) => x.name === "sdk-data-js");
        assert.deepEqual(held.attached_to, [{ sandbox: a.id, rw: true }]);
        await assert.rejects(cb.create({ image: "busybox", mounts: [{ type: "volume", src: "sdk-data-js", dst: "/data", rw: true }] }), cagebox.Conflict);
        await assert.rejects(cb.volumes.remove("sdk-data-js"), cagebox.Conflict);
      } finally {
        await a.remove();
      }
      const b = await cb.create({ image: "busybox", mounts: [{ type: "volume", src: "sdk-data-js", dst: "/data" }], readOnlyRoot: true });
      try {
        const r = await b.exec(["cat", "/data/note"]);
        assert.deepEqual([r.exitCode, r.stdout.toString()], [0, "kept\n"]);
        assert.notEqual((await b.exec("echo x > /data/note")).exitCode, 0);
        assert.notEqual((await b.exec("echo x > /etc/x")).exitCode, 0);
        assert.equal((await b.exec("echo x > /tmp/x")).exitCode, 0);
        assert.equal(b.info.read_only_root, true);
      } finally {
        await b.remove();
      }
      const src = path.join(d.mountRoot, "code");
      const c = await cb.create({ image: "busybox", mounts: [`type=bind,src=${src},dst=/code`] });
      try {
        const r = await c.exec(["cat", "/code/main.py"]);
        assert.deepEqual([r.exitCode, r.stdout.toString()], [0, "print('hello')\n"]);
        assert.notEqual((await c.exec("echo x > /code/main.py")).exitCode, 0);
      } finally {
        await c.remove();
      }
      await assert.rejects(cb.create({ image: "busybox", mounts: ["type=bind,src=/etc,dst=/code"] }), /mount root/);
    } finally {
      await cb.volumes.remove("sdk-data-js");
    }
  });

  it("tools: add, list, get, execute, remove", async () => {
    const tool = await cb.tools.add("sdk-upper-js", ["tr", "a-z", "A-Z"], { description: "upper-cases its input", image: "busybox" });
    try {
      assert.equal(tool.name, "sdk-upper-js");
      assert.ok((await cb.tools.list()).some((x) => x.name === "sdk-upper-js"));
      assert.deepEqual((await cb.tools.get("sdk-upper-js")).argv, ["tr", "a-z", "A-Z"]);
      const r = await cb.execute("sdk-upper-js", "hello");
      assert.deepEqual([r.exit_code, r.stdout, r.tool], [0, "HELLO", "sdk-upper-js"]);
      await assert.rejects(cb.execute("no-such-tool", "x"), cagebox.NotFound);
      await assert.rejects(cb.tools.add("bad", []), cagebox.Invalid);
    } finally {
      await cb.tools.remove("sdk-upper-js");
    }
  });

  it("tools: egress decisions, input file, replace", async () => {
    await cb.tools.add("sdk-fetch-js", ["sh", "-c", `cat /tmp/in.txt; wget -q -O- http://${UPSTREAM_HOST}/tool`], {
      inputFile: "/tmp/in.txt", image: "busybox", runtime: "container", allow: [UPSTREAM_HOST],
    });
    try {
      const r = await cb.execute("sdk-fetch-js", "from the file\n");
      assert.equal(r.exit_code, 0, JSON.stringify(r));
      assert.equal(r.stdout, "from the file\nupstream says hello to /tool\n");
      assert.equal(r.runtime, "container");
      assert.ok(r.egress.some((e) => e.host === UPSTREAM_HOST && e.allowed), JSON.stringify(r.egress));
      await waitFor("the tool's sandbox to go", async () => !(await cb.sandboxes()).some((s) => s.id === r.sandbox));
      await assert.rejects(cb.tools.add("sdk-fetch-js", ["true"], { image: "busybox" }), cagebox.Conflict);
      assert.deepEqual((await cb.tools.add("sdk-fetch-js", ["true"], { image: "busybox", replace: true })).argv, ["true"]);
    } finally {
      await cb.tools.remove("sdk-fetch-js");
    }
  });
});
