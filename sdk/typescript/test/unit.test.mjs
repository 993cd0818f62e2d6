// Tests of the SDK's own logic, with no daemon.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { inspect } from "node:util";

import * as cagebox from "../dist/index.js";
import { argvOf, Cagebox, docBody, duration, envList, errorFor, routePath, size } from "../dist/index.js";

describe("helpers", () => {
  it("duration", () => {
    for (const [given, want] of [[undefined, undefined], ["10m", "10m"], [30, "30s"], [1.5, "1.5s"], [0.25, "0.25s"], [0, "0s"], [1e-7, "0.0000001s"]]) {
      assert.equal(duration(given), want, String(given));
    }
    assert.throws(() => duration(-1), RangeError);
  });
  it("size", () => {
    for (const [given, want] of [[undefined, undefined], [1024, 1024], ["512M", 512 * 2 ** 20], ["2g", 2 * 2 ** 30], ["1.5GiB", 1.5 * 2 ** 30], ["64k", 65536]]) {
      assert.equal(size(given), want, String(given));
    }
    assert.throws(() => size("lots"), TypeError);
  });
  it("argv and env", () => {
    assert.deepEqual(argvOf("echo hi"), ["/bin/sh", "-c", "echo hi"]);
    assert.deepEqual(argvOf(["ls", "-l"]), ["ls", "-l"]);
    assert.throws(() => argvOf([]));
    assert.deepEqual(envList({ A: "1", B: "x=y" }), ["A=1", "B=x=y"]);
  });
  it("routePath escapes", () => {
    assert.deepEqual(routePath("GET /v1/sandboxes/{id}", { id: "a/b c" }), ["GET", "/v1/sandboxes/a%2Fb%20c"]);
    assert.deepEqual(routePath("DELETE /v1/sandboxes/{id}/secrets/{name}", { id: "sb-1", name: "T" }), ["DELETE", "/v1/sandboxes/sb-1/secrets/T"]);
    assert.throws(() => routePath("GET /v1/secrets/{name}", { name: "" }));
  });
  it("policy bodies", () => {
    assert.equal(docBody("version: 1\n").contentType, "application/yaml");
    assert.equal(docBody('{"version": 1}').contentType, "application/json");
    assert.equal(docBody({ version: 1 }).body, '{"version":1}');
  });
  it("error kinds", () => {
    for (const [status, kind, cls] of [[404, "not_found", cagebox.NotFound], [400, "invalid", cagebox.Invalid],
      [401, "unauthorized", cagebox.Unauthorized], [403, "denied", cagebox.Denied], [409, "conflict", cagebox.Conflict],
      [503, "unavailable", cagebox.Unavailable], [500, "internal", cagebox.InternalError], [404, "", cagebox.NotFound],
      [418, "", cagebox.InternalError]]) {
      const e = errorFor(status, kind, "msg");
      assert.equal(e.constructor, cls, `${status} ${kind}`);
      assert.ok(e instanceof cagebox.CageboxError && e instanceof Error);
      assert.equal(e.status, status);
      assert.equal(e.message, "msg");
      assert.equal(e.name, cls.name);
    }
    assert.equal(errorFor(404, "", "x").kind, "not_found");
  });
});

describe("daemon resolution", () => {
  const keys = ["CAGEBOX_HOST", "CAGEBOX_API_KEY", "CAGEBOX_CA_CERT", "CAGEBOX_HOME"];
  const with_ = (env, fn) => {
    const saved = Object.fromEntries(keys.map((k) => [k, process.env[k]]));
    for (const k of keys) delete process.env[k];
    Object.assign(process.env, env);
    try {
      fn();
    } finally {
      for (const k of keys) {
        delete process.env[k];
        if (saved[k] !== undefined) process.env[k] = saved[k];
      }
    }
  };
  it("defaults to the unix socket of CAGEBOX_HOME", () => {
    with_({}, () => assert.equal(new Cagebox().transport.socketPath, "/var/lib/cagebox/cagebox.sock"));
    with_({ CAGEBOX_HOME: "/srv/cb" }, () => assert.equal(new Cagebox().transport.socketPath, "/srv/cb/cagebox.sock"));
    with_({}, () => assert.equal(new Cagebox({ home: "/h" }).transport.socketPath, "/h/cagebox.sock"));
  });
  it("takes CAGEBOX_HOST and CAGEBOX_API_KEY", () => {
    with_({ CAGEBOX_HOST: "http://127.0.0.1:7070", CAGEBOX_API_KEY: "cbk_x" }, () => {
      const t = new Cagebox().transport;
      assert.equal(t.socketPath, undefined);
      assert.equal(t.where, "http://127.0.0.1:7070");
    });
  });
  it("refuses bad URLs", () => {
    for (const u of ["ftp://x:1", "http://u:p@h:1", "http://h:1/path", "http://h:1?q=1", "nonsense"]) {
      assert.throws(() => new Cagebox({ host: u }), TypeError, u);
    }
    assert.throws(() => new Cagebox({ host: "http://127.0.0.1:1", caCert: "/ca.pem" }), TypeError);
  });
  it("never shows the API key", async () => {
    const cb = new Cagebox({ host: "http://127.0.0.1:1", apiKey: "cbk_SECRETVALUE" });
    assert.ok(!inspect(cb, { depth: 10, showHidden: true }).includes("SECRETVALUE"));
    await assert.rejects(cb.health(), (e) => e instanceof cagebox.ConnectionFailed && !`${e.message}${e.stack}`.includes("SECRETVALUE"));
  });
  it("says when the daemon is unreachable", async () => {
    await assert.rejects(new Cagebox({ socket: "/nonexistent/cagebox.sock" }).health(), (e) => e instanceof cagebox.ConnectionFailed && /cagebox daemon/.test(e.message));
  });
});

describe("websocket frames", async () => {
  const ws = await import("../dist/ws.js");
  it("accept key and masking (RFC 6455 examples)", () => {
    assert.equal(ws.acceptKey("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    const f = ws.encodeFrame(ws.OP_TEXT, Buffer.from("Hello"), Buffer.from([0x37, 0xfa, 0x21, 0x3d]));
    assert.deepEqual([...f], [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58]);
    assert.equal(ws.encodeFrame(ws.OP_BINARY, Buffer.alloc(70000))[1], 0x80 | 127);
  });
  it("fragments, ping, close", async () => {
    const { PassThrough } = await import("node:stream");
    const sock = new PassThrough();
    sock.setNoDelay = () => {};
    const written = [];
    sock.write = (b) => { written.push(b); return true; };
    const got = [];
    let closed;
    new ws.WebSocket(sock, Buffer.alloc(0), { message: (op, d) => got.push([op, d.toString()]), close: (code, reason) => { closed = [code, reason]; } });
    const frame = (op, payload, fin = true) => Buffer.concat([Buffer.from([(fin ? 0x80 : 0) | op, payload.length]), payload]);
    sock.emit("data", Buffer.concat([frame(ws.OP_BINARY, Buffer.from("ab"), false), frame(ws.OP_PING, Buffer.from("p"))]));
    sock.emit("data", frame(ws.OP_CONT, Buffer.from("cd")));
    const close = Buffer.alloc(2);
    close.writeUInt16BE(1000);
    sock.emit("data", frame(ws.OP_CLOSE, Buffer.concat([close, Buffer.from("bye")])));
    assert.deepEqual(got, [[ws.OP_BINARY, "abcd"]]);
    assert.deepEqual(closed, [1000, "bye"]);
    assert.equal(written[0][0], 0x80 | ws.OP_PONG);
    assert.ok(written[0][1] & 0x80, "client frames are masked");
  });
});
