// Starts a real cagebox daemon for the SDK's tests: the binaries of `make
// build` (bin/cagebox, bin/cagebox-agent; CAGEBOX_BIN_DIR overrides), a
// temporary --home with busybox images named busybox and default, the
// container runtime, a TCP listener on loopback, and a local HTTP upstream
// that sandboxes reach as http://api.sdk.test/ through the daemon's --resolve.
// The TCP listener serves HTTPS with a certificate of a CA the test makes
// (openssl); clients trust it with caCert (CAGEBOX_CA_CERT).

import { execFileSync, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import * as fs from "node:fs";
import * as http from "node:http";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import * as zlib from "node:zlib";

import { Cagebox, CageboxError, ConnectionFailed } from "../dist/index.js";

export const UPSTREAM_HOST = "api.sdk.test";
const here = path.dirname(fileURLToPath(import.meta.url));

export function repoRoot() {
  let d = here;
  while (d !== "/") {
    if (fs.existsSync(path.join(d, "go.mod"))) return d;
    d = path.dirname(d);
  }
  throw new Error(`no go.mod above ${here}`);
}

export const binDir = () => process.env.CAGEBOX_BIN_DIR || path.join(repoRoot(), "bin");

/** Why the daemon tests cannot run here, or "". */
export function skipReason() {
  if (process.getuid() !== 0) return "needs root (the daemon makes namespaces, mounts, cgroups and nftables rules)";
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
  } catch {
    return "openssl is not installed (the tests make the daemon's TLS certificate with it)";
  }
  for (const b of ["cagebox", "cagebox-agent"]) {
    const p = path.join(binDir(), b);
    try {
      fs.accessSync(p, fs.constants.X_OK);
    } catch {
      return `${p} is missing: run \`make build\` at the repository root`;
    }
  }
  return "";
}

/**
 * An OCI image layout, as a tar (what `cagebox image import` takes), of one
 * gzipped layer holding the tree at rootfs (made with tar(1)); written to out.
 */
export function ociLayoutTar(rootfs, out, env = ["PATH=/bin:/usr/bin", "FROM_IMPORT=1"]) {
  const dir = fs.mkdtempSync(path.join(path.dirname(out), "oci"));
  const layerTar = path.join(dir, "layer.tar");
  execFileSync("tar", ["-C", rootfs, "-cf", layerTar, "."], { stdio: "pipe" });
  const raw = fs.readFileSync(layerTar);
  fs.rmSync(layerTar);
  const layer = zlib.gzipSync(raw);
  const digest = (b) => "sha256:" + createHash("sha256").update(b).digest("hex");
  const config = Buffer.from(JSON.stringify({ architecture: "amd64", os: "linux", config: { Env: env }, rootfs: { type: "layers", diff_ids: [digest(raw)] } }));
  const manifest = Buffer.from(JSON.stringify({
    schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: digest(config), size: config.length },
    layers: [{ mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: digest(layer), size: layer.length }],
  }));
  const index = JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: "application/vnd.oci.image.manifest.v1+json", digest: digest(manifest), size: manifest.length }] });
  fs.mkdirSync(path.join(dir, "blobs", "sha256"), { recursive: true });
  fs.writeFileSync(path.join(dir, "oci-layout"), '{"imageLayoutVersion": "1.0.0"}');
  fs.writeFileSync(path.join(dir, "index.json"), index);
  for (const b of [manifest, config, layer]) fs.writeFileSync(path.join(dir, "blobs", "sha256", digest(b).slice(7)), b);
  execFileSync("tar", ["-C", dir, "-cf", out, "oci-layout", "index.json", "blobs"], { stdio: "pipe" });
  fs.rmSync(dir, { recursive: true, force: true });
  return out;
}

/** A throw-away CA and a server certificate for 127.0.0.1 signed by it (openssl). */
function makePKI(d) {
  const f = (n) => path.join(d, n);
  fs.writeFileSync(f("server.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n");
  const ssl = (...args) => execFileSync("openssl", args, { stdio: "pipe", timeout: 60_000 });
  ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f("ca.key"),
    "-out", f("ca.pem"), "-days", "2", "-subj", "/CN=cagebox sdk test CA",
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign");
  ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f("server.key"),
    "-out", f("server.csr"), "-subj", "/CN=127.0.0.1");
  ssl("x509", "-req", "-in", f("server.csr"), "-CA", f("ca.pem"), "-CAkey", f("ca.key"), "-CAcreateserial",
    "-out", f("server.pem"), "-days", "2", "-extfile", f("server.ext"));
  return { ca: f("ca.pem"), cert: f("server.pem"), key: f("server.key") };
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export class Daemon {
  constructor() {
    this.bin = binDir();
    this.home = fs.mkdtempSync(path.join(os.tmpdir(), "cbsdkjs"));
    this.logPath = path.join(this.home, "daemon.log");
    this.env = { ...process.env };
    // Our own nftables table, interface prefix and link pool: no clash with
    // another daemon on this host (values in the environment win).
    this.env.CAGEBOX_NET_TABLE ||= "cagebox_sdkjs";
    this.env.CAGEBOX_NET_IFPREFIX ||= "cbj";
    this.env.CAGEBOX_LINK_POOL ||= "10.249.128.0/17";
    for (const k of ["CAGEBOX_HOST", "CAGEBOX_API_KEY", "CAGEBOX_CA_CERT"]) delete this.env[k];
  }

  cli(...args) {
    return execFileSync(path.join(this.bin, "cagebox"), ["--home", this.home, ...args], { env: this.env, encoding: "utf8", stdio: "pipe", timeout: 120_000 });
  }

  async start() {
    // Busybox images (well under a second) under both names, so requests
    // naming no image get "default".
    this.cli("image", "build", "busybox", "--vm", "no");
    const images = path.join(this.home, "images");
    fs.cpSync(path.join(images, "busybox"), path.join(images, "default"), { recursive: true, verbatimSymlinks: true });
    const meta = path.join(images, "default", "image.json");
    fs.writeFileSync(meta, fs.readFileSync(meta, "utf8").replace('"name": "busybox"', '"name": "default"'));

    // Host files sandboxes may bind-mount (outside the daemon's home).
    this.mountRoot = fs.mkdtempSync(path.join(os.tmpdir(), "cbx-sdk-mnt"));
    fs.mkdirSync(path.join(this.mountRoot, "code"));
    fs.writeFileSync(path.join(this.mountRoot, "code", "main.py"), "print('hello')\n");

    this.upstream = http.createServer((req, res) => {
      res.setHeader("Content-Type", "text/plain");
      res.end(`upstream says hello to ${req.url}\n`);
    });
    await new Promise((r) => this.upstream.listen(0, "127.0.0.1", r));
    const upPort = this.upstream.address().port;

    // The TCP listener serves HTTPS with a CA of the test's own.
    const pki = makePKI(fs.mkdtempSync(path.join(this.home, "pki")));
    this.ca = pki.ca;
    this.port = await freePort();
    this.url = `https://127.0.0.1:${this.port}`;
    const log = fs.openSync(this.logPath, "w");
    this.proc = spawn(path.join(this.bin, "cagebox"), [
      "--home", this.home, "daemon", "--agent", path.join(this.bin, "cagebox-agent"), "--default-runtime", "container",
      "--listen", `127.0.0.1:${this.port}`, "--tls-cert", pki.cert, "--tls-key", pki.key, "--resolve", `${UPSTREAM_HOST}:80=127.0.0.1:${upPort}`,
      "--mount-root", this.mountRoot,
      "--ingress", `127.0.0.1:${await freePort()}`, "--ingress-domain", "sdk.test", "--relay-discord-url", "wss://gateway.discord.gg:9/", "--resolve", "gateway.discord.gg:9=127.0.0.1:9",
    ], { env: this.env, stdio: ["ignore", log, log] });
    fs.closeSync(log);
    this.exited = new Promise((r) => this.proc.on("exit", r));
    this.client = new Cagebox({ home: this.home, timeoutMs: 120_000 });
    const deadline = Date.now() + 30_000;
    for (;;) {
      try {
        await this.client.health();
        return;
      } catch (err) {
        if (!(err instanceof ConnectionFailed) || this.proc.exitCode !== null || Date.now() > deadline) {
          throw new Error(`daemon did not come up: ${err}\n${this.log()}`);
        }
        await sleep(50);
      }
    }
  }

  log() {
    try {
      return fs.readFileSync(this.logPath, "utf8").slice(-20000);
    } catch {
      return "";
    }
  }

  async stop() {
    if (this.proc && this.proc.exitCode === null) {
      try {
        for (const sb of await this.client.sandboxes()) {
          await sb.remove().catch(() => {});
        }
      } catch (err) {
        if (!(err instanceof CageboxError)) throw err;
      }
      this.proc.kill("SIGTERM");
      const t = setTimeout(() => this.proc.kill("SIGKILL"), 20_000);
      await this.exited;
      clearTimeout(t);
    }
    if (this.upstream) {
      this.upstream.closeAllConnections();
      await new Promise((r) => this.upstream.close(r));
    }
    fs.rmSync(this.home, { recursive: true, force: true });
    if (this.mountRoot) fs.rmSync(this.mountRoot, { recursive: true, force: true });
  }
}
