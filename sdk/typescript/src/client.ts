/**
 * The cagebox client: Cagebox (the daemon) and Sandbox (one sandbox).
 *
 * Every request names its route as "METHOD /path/{param}", exactly as the
 * daemon's route table (internal/daemon/server.go, Routes()) spells it; a Go
 * test (sdk/sdk_test.go) checks that every route is used here or listed in
 * sdk/ABSENT.md.
 */

import * as fs from "node:fs";
import type * as http from "node:http";
import * as path from "node:path";

import { CageboxError, InternalError, NotFound } from "./errors.js";
import { Pty } from "./pty.js";
import { jsonLines, Transport, type Params, type TransportOptions } from "./transport.js";
import type * as api from "./types.js";

export const DEFAULT_HOME = "/var/lib/cagebox";

/** Seconds (number) or a Go duration string ("90s", "10m"). */
export type Duration = number | string;
/** Bytes (number) or a size string ("512M", "2G"; binary units, as the CLI reads them). */
export type Size = number | string;
/** A mapping, or KEY=VALUE strings. */
export type Env = Record<string, string> | string[];
/** A string runs through /bin/sh -c; an array is the argv. */
export type Command = string | string[];
/** Process input: bytes, text, or an (async) iterable of chunks such as a Readable. */
export type Stdin = string | Uint8Array | Iterable<Uint8Array | string> | AsyncIterable<Uint8Array | string>;

export function duration(d: Duration | undefined): string | undefined {
  if (d === undefined || d === null || d === "") return undefined;
  if (typeof d === "string") return d;
  if (typeof d !== "number" || !Number.isFinite(d)) throw new TypeError(`duration: want seconds or a string such as "10m", not ${String(d)}`);
  if (d < 0) throw new RangeError(`duration: ${d} is negative`);
  // Go's ParseDuration takes decimals but not exponents.
  const s = d.toFixed(9).replace(/\.?0+$/, "");
  return `${s || "0"}s`;
}

export function size(v: Size | undefined): number | undefined {
  if (v === undefined || v === null || v === "" || v === 0) return undefined;
  if (typeof v === "number") return v;
  const m = /^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*$/i.exec(v);
  if (!m) throw new TypeError(`size: ${JSON.stringify(v)} is not a size such as 512M or 2G`);
  const mult = { "": 1, k: 2 ** 10, m: 2 ** 20, g: 2 ** 30, t: 2 ** 40 }[m[2].toLowerCase() as "" | "k" | "m" | "g" | "t"];
  return Math.floor(Number(m[1]) * mult);
}

export function envList(env: Env | undefined): string[] | undefined {
  if (env === undefined) return undefined;
  if (Array.isArray(env)) return [...env];
  return Object.entries(env).map(([k, v]) => `${k}=${v}`);
}

export function argvOf(cmd: Command): string[] {
  if (typeof cmd === "string") return ["/bin/sh", "-c", cmd];
  if (!cmd.length) throw new TypeError("exec: the command is empty");
  return [...cmd];
}

/** A policy document as a request body: objects as JSON, text as is (YAML or JSON). */
export function docBody(doc: api.PolicyDocument | string): { body: string; contentType: string } {
  if (typeof doc === "string") {
    return { body: doc, contentType: doc.trimStart().startsWith("{") ? "application/json" : "application/yaml" };
  }
  return { body: JSON.stringify(doc), contentType: "application/json" };
}

function dropEmpty<T extends Record<string, unknown>>(o: T): T {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) {
    if (v === undefined || v === null || v === "" || (Array.isArray(v) && v.length === 0)) continue;
    out[k] = v;
  }
  return out as T;
}

/** secrets: bindings, or a mapping ENV_NAME → stored secret name or → binding. */
export type Secrets = api.SecretBinding[] | Record<string, string | Omit<api.SecretBinding, "name">>;

function bindings(s: Secrets | undefined): api.SecretBinding[] | undefined {
  if (s === undefined) return undefined;
  if (Array.isArray(s)) return s;
  return Object.entries(s).map(([name, b]) => (typeof b === "string" ? { name, secret: b } : { ...b, name }));
}

// -- exec ---------------------------------------------------------------------

export interface ExecResult {
  exitCode: number | null;
  signal: string;
  timedOut: boolean;
  oomKilled: boolean;
  stdout: Buffer;
  stderr: Buffer;
}

export interface Output {
  stream: "stdout" | "stderr";
  data: Buffer;
}

export interface ExecOptions {
  stdin?: Stdin;
  /** The daemon kills the command after this (result.timedOut). */
  timeout?: Duration;
  env?: Env;
  cwd?: string;
  user?: string;
  signal?: AbortSignal;
}

export interface RunOptions extends ExecOptions {
  onStdout?: (data: Buffer) => void;
  onStderr?: (data: Buffer) => void;
}

async function* stdinChunks(stdin: Stdin): AsyncGenerator<Buffer> {
  if (typeof stdin === "string") {
    yield Buffer.from(stdin);
    return;
  }
  if (stdin instanceof Uint8Array) {
    yield Buffer.from(stdin);
    return;
  }
  for await (const c of stdin as AsyncIterable<Uint8Array | string>) yield typeof c === "string" ? Buffer.from(c) : Buffer.from(c);
}

/**
 * A running command's output as it comes: iterate (for await) for Output
 * pieces; `result` is set once the iteration ends. close() hangs up (the
 * daemon then kills the command).
 */
export class ExecStream implements AsyncIterable<Output> {
  result?: ExecResult;
  private closed = false;

  constructor(private readonly res: http.IncomingMessage, private readonly t: Transport) {}

  async *[Symbol.asyncIterator](): AsyncGenerator<Output> {
    let eof = true;
    try {
      for await (const f of jsonLines<api.ExecFrame>(this.res, (e) => this.t.fail(e), () => this.closed)) {
        if (f.stream === "stdout" || f.stream === "stderr") {
          yield { stream: f.stream, data: Buffer.from(f.data ?? "", "base64") };
        } else if (f.stream === "exit") {
          this.result = {
            exitCode: f.exit_code ?? null, signal: f.signal ?? "", timedOut: !!f.timed_out, oomKilled: !!f.oom_killed,
            stdout: Buffer.alloc(0), stderr: Buffer.alloc(0),
          };
          return;
        } else if (f.stream === "error") {
          throw new InternalError(f.error || "exec failed", 500, "internal");
        }
      }
      eof = !this.closed;
    } finally {
      this.close();
    }
    if (!this.result && eof) throw new CageboxError("exec stream ended without an exit frame (did the daemon stop?)", 0, "connection");
  }

  /** Reads the rest and returns the result with the output collected. */
  async wait(): Promise<ExecResult> {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    for await (const o of this) (o.stream === "stdout" ? out : err).push(o.data);
    if (!this.result) throw new CageboxError("exec stream closed before the exit frame", 0, "connection");
    this.result.stdout = Buffer.concat(out);
    this.result.stderr = Buffer.concat(err);
    return this.result;
  }

  close(): void {
    this.closed = true;
    this.res.destroy();
  }
}

/** Audit events as they come (for await); close() (or break) stops. */
export class EventStream implements AsyncIterable<api.Event> {
  /** The last event seen: follow again with after = lastSeq to resume. */
  lastSeq: number;
  private closed = false;

  constructor(private readonly res: http.IncomingMessage, private readonly t: Transport, after: number) {
    this.lastSeq = after;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<api.Event> {
    try {
      for await (const e of jsonLines<api.Event>(this.res, (err) => this.t.fail(err), () => this.closed)) {
        this.lastSeq = Math.max(this.lastSeq, e.seq);
        yield e;
      }
    } finally {
      this.close();
    }
  }

  close(): void {
    this.closed = true;
    this.res.destroy();
  }
}

// -- sandbox parts ----------------------------------------------------------------

/** A sandbox's files (sb.files). */
export class Files {
  constructor(private readonly sb: Sandbox) {}

  /** Writes a file (parent directories are made), replacing it. */
  async write(filePath: string, data: Uint8Array | string, mode = 0o644): Promise<void> {
    await this.sb.t.call("PUT /v1/sandboxes/{id}/files", { id: this.sb.id }, {
      query: { path: filePath, mode: mode.toString(8) }, body: typeof data === "string" ? Buffer.from(data) : data,
      contentType: "application/octet-stream",
    });
  }

  /** Reads a file (at most 64 MiB). */
  read(filePath: string): Promise<Buffer> {
    return this.sb.t.bytes("GET /v1/sandboxes/{id}/files", { id: this.sb.id }, { query: { path: filePath } });
  }

  async readText(filePath: string): Promise<string> {
    return (await this.read(filePath)).toString("utf8");
  }

  /** Lists a directory. */
  list(dir = "/"): Promise<api.FileInfo[]> {
    return this.sb.t.call("GET /v1/sandboxes/{id}/dir", { id: this.sb.id }, { query: { path: dir } });
  }

  /**
   * The directory (or file) at path as a tar stream (a Readable): a
   * directory's contents with names relative to it, symlinks as links. It
   * is the guest's word: extract it as hostile (no absolute names, no ..,
   * nothing through a symlink, no device nodes), e.g. with `cagebox cp`.
   * A stream that errors mid-way was cut short by the daemon.
   */
  archiveGet(dirPath: string): Promise<http.IncomingMessage> {
    return this.sb.t.open("GET /v1/sandboxes/{id}/archive", { id: this.sb.id }, { query: { path: dirPath }, timeoutMs: false });
  }

  /**
   * Extracts a tar archive (bytes, or a stream / async iterable of chunks)
   * under the directory path (made if missing). The daemon refuses
   * (Invalid) entries that would land outside it, device nodes, and
   * archives over 1 GiB of files or 100000 entries.
   */
  async archivePut(dirPath: string, archive: Uint8Array | AsyncIterable<Uint8Array> | Iterable<Uint8Array>): Promise<void> {
    const params = { id: this.sb.id };
    const o = { query: { path: dirPath }, contentType: "application/x-tar", timeoutMs: false as const };
    if (archive instanceof Uint8Array) {
      const res = await this.sb.t.open("PUT /v1/sandboxes/{id}/archive", params, { ...o, body: archive });
      res.resume();
      return;
    }
    const chunks = archive;
    const res = await this.sb.t.open("PUT /v1/sandboxes/{id}/archive", params, o, async (r: http.ClientRequest) => {
      for await (const c of chunks as AsyncIterable<Uint8Array>) {
        if (r.destroyed) return;
        if (!r.write(c)) await new Promise<void>((res) => { r.once("drain", res); r.once("close", res); });
      }
      r.end();
    });
    res.resume();
  }
}

export interface RuleOptions {
  path?: string;
  method?: string;
  ports?: number[];
  name?: string;
  /** Position in the rules (default first). */
  at?: number;
  /** CEL condition (policy version 2). */
  when?: string;
}

/** A running sandbox's live egress policy (sb.policy): each change applies to the next request. */
export class Policy {
  constructor(private readonly sb: Sandbox) {}

  private get p(): Params {
    return { id: this.sb.id };
  }

  get(): Promise<api.SandboxPolicy> {
    return this.sb.t.call("GET /v1/sandboxes/{id}/policy", this.p);
  }

  /** Replaces the document (an object, or JSON or YAML text); ifGeneration: Conflict if it changed since. */
  set(doc: api.PolicyDocument | string, ifGeneration?: number): Promise<api.SandboxPolicy> {
    const { body, contentType } = docBody(doc);
    return this.sb.t.call("PUT /v1/sandboxes/{id}/policy", this.p, {
      body, contentType, headers: ifGeneration ? { "If-Match": String(ifGeneration) } : undefined,
    });
  }

  patch(patch: api.PolicyPatch): Promise<api.SandboxPolicy> {
    return this.sb.t.call("PATCH /v1/sandboxes/{id}/policy", this.p, { json: patch });
  }

  private add(action: api.PolicyRule["action"], host: string, o: RuleOptions & { timeout?: Duration }): Promise<api.SandboxPolicy> {
    const rule = dropEmpty({
      name: o.name, host, action, ports: o.ports, paths: o.path ? [o.path] : undefined,
      methods: o.method ? [o.method] : undefined, when: o.when, timeout: duration(o.timeout),
    }) as api.PolicyRule;
    return this.patch({ op: "add", rule, ...(o.at !== undefined ? { index: o.at } : {}) });
  }

  /** Allows a host (first in the rules unless `at` says where). */
  allow(host: string, o: RuleOptions = {}): Promise<api.SandboxPolicy> {
    return this.add("allow", host, o);
  }

  deny(host: string, o: RuleOptions = {}): Promise<api.SandboxPolicy> {
    return this.add("deny", host, o);
  }

  /** Holds requests to a host until an approval or the timeout (default 60s). */
  hold(host: string, o: RuleOptions & { timeout?: Duration } = {}): Promise<api.SandboxPolicy> {
    return this.add("hold", host, o);
  }

  removeRule(name: string): Promise<api.SandboxPolicy> {
    return this.patch({ op: "remove", name });
  }

  moveRule(name: string, index: number): Promise<api.SandboxPolicy> {
    return this.patch({ op: "move", name, index });
  }

  usage(): Promise<api.BudgetUsage[]> {
    return this.sb.t.call("GET /v1/sandboxes/{id}/policy/usage", this.p);
  }

  history(): Promise<api.PolicyVersion[]> {
    return this.sb.t.call("GET /v1/sandboxes/{id}/policy/history", this.p);
  }
}

/** A handle on one sandbox; `info` is its record as last seen. */
export class Sandbox {
  readonly id: string;
  info: api.SandboxInfo;
  readonly files: Files;
  readonly policy: Policy;
  /** @internal */
  readonly t: Transport;

  constructor(private readonly cb: Cagebox, info: api.SandboxInfo) {
    this.t = cb.transport;
    this.info = info;
    this.id = info.id;
    this.files = new Files(this);
    this.policy = new Policy(this);
  }

  get status(): string {
    return this.info.status;
  }

  /** `await using sb = await cb.create()` removes it at the end of the scope. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.remove();
    } catch (err) {
      if (!(err instanceof NotFound)) throw err;
    }
  }

  private update(info: api.SandboxInfo | undefined): this {
    if (info) this.info = info;
    return this;
  }

  async inspect(): Promise<api.SandboxInfo> {
    this.update(await this.t.call<api.SandboxInfo>("GET /v1/sandboxes/{id}", { id: this.id }));
    return this.info;
  }

  /**
   * Runs a command and waits for it: output goes to onStdout/onStderr as it
   * comes and is collected in the result. A non-zero exit is not an error.
   */
  async exec(cmd: Command, o: RunOptions = {}): Promise<ExecResult> {
    const st = await this.execStream(cmd, o);
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    for await (const c of st) {
      if (c.stream === "stdout") {
        out.push(c.data);
        o.onStdout?.(c.data);
      } else {
        err.push(c.data);
        o.onStderr?.(c.data);
      }
    }
    if (!st.result) throw new CageboxError("exec stream closed before the exit frame", 0, "connection");
    return { ...st.result, stdout: Buffer.concat(out), stderr: Buffer.concat(err) };
  }

  /**
   * Starts a command; its output is an async iterator (ExecStream). The
   * promise resolves when the command first writes (or ends): the daemon
   * answers only then, so that a command that cannot start still gets its
   * 4xx. To give up before that, pass `signal`; after, close() the stream.
   * Either way the daemon kills the command.
   */
  async execStream(cmd: Command, o: ExecOptions = {}): Promise<ExecStream> {
    const req: api.ExecRequest = dropEmpty({
      argv: argvOf(cmd), env: envList(o.env), cwd: o.cwd, user: o.user, timeout: duration(o.timeout),
    });
    if (o.stdin !== undefined) req.stdin = true;
    const first = Buffer.from(JSON.stringify(req) + "\n");
    const stdin = o.stdin;
    const feed = stdin === undefined ? undefined : async (r: http.ClientRequest) => {
      for await (const c of stdinChunks(stdin)) {
        if (r.destroyed) return;
        if (!r.write(c)) await new Promise<void>((res) => { r.once("drain", res); r.once("close", res); });
      }
      r.end();
    };
    const res = await this.t.open("POST /v1/sandboxes/{id}/exec", { id: this.id }, {
      body: first, contentType: "application/octet-stream", timeoutMs: false, signal: o.signal,
    }, feed);
    return new ExecStream(res, this.t);
  }

  /**
   * Starts a command on a terminal (default: the user's login shell in
   * the sandbox, else /bin/sh; a string is an argv
   * of one word, an array the argv): iterate the Pty for output, write()
   * to type ("\x03" is Ctrl-C), resize(rows, cols), wait() for the exit
   * code.
   */
  pty(cmd?: string | string[], o: { rows?: number; cols?: number; env?: Env; cwd?: string; user?: string; timeout?: Duration } = {}): Promise<Pty> {
    const argv = cmd === undefined ? undefined : typeof cmd === "string" ? [cmd] : cmd;
    return Pty.open(this.t, "GET /v1/sandboxes/{id}/pty", { id: this.id }, {
      argv, rows: o.rows ?? 24, cols: o.cols ?? 80, env: envList(o.env), cwd: o.cwd, user: o.user, timeout: duration(o.timeout),
    });
  }

  /**
   * Freezes every process (memory kept). toDisk hibernates a microVM
   * instead: saved whole to disk, its VMM ended (status hibernated);
   * resume() restores it. Runtimes that cannot refuse it.
   */
  async pause(o: { toDisk?: boolean } = {}): Promise<this> {
    return this.update(await this.t.call("POST /v1/sandboxes/{id}/pause", { id: this.id }, { query: { to_disk: o.toDisk ? "true" : undefined } }));
  }

  async resume(): Promise<this> {
    return this.update(await this.t.call("POST /v1/sandboxes/{id}/resume", { id: this.id }));
  }

  /** Stops the processes (SIGTERM, SIGKILL after grace, default 5s); the sandbox stays until removed. */
  async stop(grace?: Duration): Promise<this> {
    return this.update(await this.t.call("POST /v1/sandboxes/{id}/stop", { id: this.id }, { query: { grace: duration(grace) } }));
  }

  /** Destroys the sandbox; wait = false returns once the removal is recorded. */
  async remove(wait = true): Promise<void> {
    await this.t.call("DELETE /v1/sandboxes/{id}", { id: this.id }, { query: wait ? {} : { wait: "false" } });
  }

  /**
   * Saves the running sandbox for new sandboxes to start from
   * (cb.create({ fromSnapshot })): a microVM's memory, devices and disks
   * (its processes go on in each), or a container's or gVisor sandbox's
   * writable layer, taken frozen (they boot afresh on its files).
   */
  snapshot(o: { name?: string } = {}): Promise<api.Snapshot> {
    return this.t.call("POST /v1/sandboxes/{id}/snapshots", { id: this.id }, { json: dropEmpty({ name: o.name }) });
  }

  /**
   * Copies the running sandbox count times (1–16): each copy is a sandbox
   * of its own in the same tenant, with fresh secret placeholders bound to
   * the same stored secrets and the parent's live policy.
   */
  async fork(o: { count?: number; labels?: Record<string, string>; timeout?: Duration } = {}): Promise<Sandbox[]> {
    const req: api.ForkRequest = dropEmpty({ count: o.count, labels: o.labels, timeout: duration(o.timeout) });
    const res = await this.t.call<api.ForkResponse>("POST /v1/sandboxes/{id}/fork", { id: this.id }, { json: req });
    return (res.sandboxes ?? []).map((info) => new Sandbox(this.cb, info));
  }

  /** Removes a secret binding: its placeholder is refused from the next request on. */
  async unbind(name: string): Promise<this> {
    return this.update(await this.t.call("DELETE /v1/sandboxes/{id}/secrets/{name}", { id: this.id, name }));
  }

  /** Publishes a guest port through the daemon's ingress listener
   * (https://PORT-ID.DOMAIN/). The answer's token (header X-Cagebox-Access)
   * is in it only; publishing again rotates it. public: no token needed. */
  publish(port: number, o: { public?: boolean; ttl?: Duration } = {}): Promise<api.Port> {
    return this.t.call("POST /v1/sandboxes/{id}/ports", { id: this.id }, {
      json: dropEmpty({ port, public: o.public || undefined, ttl: duration(o.ttl) }),
    });
  }

  /** The published ports (without tokens). */
  ports(): Promise<api.Port[]> {
    return this.t.call("GET /v1/sandboxes/{id}/ports", { id: this.id });
  }

  async unpublish(port: number): Promise<void> {
    await this.t.call("DELETE /v1/sandboxes/{id}/ports/{port}", { id: this.id, port: String(port) });
  }

  /** A signed URL of a published port: whoever holds it reaches the port until it expires (default 1h). */
  portURL(port: number, o: { ttl?: Duration } = {}): Promise<api.PortURL> {
    return this.t.call("POST /v1/sandboxes/{id}/ports/{port}/url", { id: this.id, port: String(port) }, {
      json: dropEmpty({ ttl: duration(o.ttl) }),
    });
  }

  /** Adds a webhook: a stable URL (the answer's url, shown this once) whose
   * deliveries the daemon verifies with the vault secret `secret` by the
   * scheme `verify` (github, stripe, slack or hmac:SPEC) and delivers to the
   * guest's port and path, queued while the sandbox sleeps. */
  addWebhook(name: string, port: number, verify: string, secret: string, o: { path?: string } = {}): Promise<api.Webhook> {
    return this.t.call("POST /v1/sandboxes/{id}/webhooks", { id: this.id }, {
      json: dropEmpty({ name, port, verify, secret, path: o.path }),
    });
  }

  /** The sandbox's webhooks (without URLs or tokens). */
  webhooks(): Promise<api.Webhook[]> {
    return this.t.call("GET /v1/sandboxes/{id}/webhooks", { id: this.id });
  }

  /** Removes a webhook and its queued deliveries. */
  async removeWebhook(name: string): Promise<void> {
    await this.t.call("DELETE /v1/sandboxes/{id}/webhooks/{name}", { id: this.id, name });
  }

  /** Adds a relay: the daemon holds a connection for the sandbox (kind
   * "discord": the bot's Discord Gateway WebSocket, its token the vault
   * secret `tokenSecret`, opened only to identify or resume; kind
   * "websocket": `o.url`, with `o.headers` "Name: value" where {secret}
   * stands for tokenSecret's value) and POSTs each event to the guest's port
   * and path, queued while the sandbox sleeps and waking it. Needs the
   * daemon's --ingress. */
  addRelay(
    kind: string,
    port: number,
    tokenSecret?: string,
    o: { path?: string; intents?: number; name?: string; url?: string; headers?: string[] } = {},
  ): Promise<api.Relay> {
    return this.t.call("POST /v1/sandboxes/{id}/relays", { id: this.id }, {
      json: dropEmpty({ name: o.name, kind, port, path: o.path, token_secret: tokenSecret, intents: o.intents, url: o.url, headers: o.headers }),
    });
  }

  /** The sandbox's relays with their connections' state. */
  relays(): Promise<api.Relay[]> {
    return this.t.call("GET /v1/sandboxes/{id}/relays", { id: this.id });
  }

  /** Stops a relay and drops its queued events. */
  async removeRelay(name: string): Promise<void> {
    await this.t.call("DELETE /v1/sandboxes/{id}/relays/{name}", { id: this.id, name });
  }

  events(after = 0): Promise<api.Event[]> {
    return this.cb.events({ sandbox: this.id, after });
  }

  followEvents(o: { after?: number; signal?: AbortSignal } = {}): Promise<EventStream> {
    return this.cb.followEvents({ ...o, sandbox: this.id });
  }

  /**
   * Asks an operator to let the sandbox reach host: a pending approval
   * (cb.approvals) this call waits on (timeout: default and at most 10m).
   * Allowed, the host is allowed for the rest of the session.
   */
  requestAccess(host: string, o: { reason?: string; timeout?: Duration } = {}): Promise<api.AccessResult> {
    return this.t.call("POST /v1/sandboxes/{id}/access", { id: this.id }, {
      json: dropEmpty({ host, reason: o.reason, timeout: duration(o.timeout) }), timeoutMs: false,
    });
  }

  approvals(state: string | null = "pending"): Promise<api.Approval[]> {
    return this.cb.approvals.list({ state, sandbox: this.id });
  }

  /** Cuts the sandbox off the network until thaw(). */
  freeze(): Promise<api.FreezeResult> {
    return this.cb.freeze({ sandbox: this.id });
  }

  thaw(): Promise<api.FreezeResult> {
    return this.cb.thaw({ sandbox: this.id });
  }
}

// -- tenant-wide parts ------------------------------------------------------------

/** The caller's tenant's stored secrets. Values are write-only: answers carry a preview. */
export class SecretStore {
  constructor(private readonly t: Transport) {}

  put(name: string, value: string, hosts: string[], o: { inject?: string; allowEnv?: boolean } = {}): Promise<api.Secret> {
    return this.t.call("POST /v1/secrets", undefined, {
      json: { name, value, hosts, ...(o.inject ? { inject: o.inject } : {}), ...(o.allowEnv ? { allow_env: true } : {}) },
    });
  }

  list(): Promise<api.Secret[]> {
    return this.t.call("GET /v1/secrets");
  }

  get(name: string): Promise<api.Secret> {
    return this.t.call("GET /v1/secrets/{name}", { name });
  }

  /** Replaces the value (version + 1); the next request uses it. */
  rotate(name: string, value: string, o: { allowEnv?: boolean } = {}): Promise<api.Secret> {
    return this.t.call("PUT /v1/secrets/{name}", { name }, { json: { value, ...(o.allowEnv !== undefined ? { allow_env: o.allowEnv } : {}) } });
  }

  revoke(name: string): Promise<api.Secret> {
    return this.t.call("POST /v1/secrets/{name}/revoke", { name });
  }

  async delete(name: string): Promise<void> {
    await this.t.call("DELETE /v1/secrets/{name}", { name });
  }
}

/** The tenant's named policies; sandboxes created with policyRef follow their edits. */
export class NamedPolicies {
  constructor(private readonly t: Transport) {}

  create(name: string, doc: api.PolicyDocument | string): Promise<api.NamedPolicy> {
    return this.t.call("POST /v1/policies", undefined, { ...docBody(doc), query: { name } });
  }

  list(): Promise<api.NamedPolicy[]> {
    return this.t.call("GET /v1/policies");
  }

  get(name: string): Promise<api.NamedPolicy> {
    return this.t.call("GET /v1/policies/{name}", { name });
  }

  /** Replaces it and the policy of every running sandbox following it. */
  update(name: string, doc: api.PolicyDocument | string, ifGeneration?: number): Promise<api.NamedPolicy> {
    return this.t.call("PUT /v1/policies/{name}", { name }, {
      ...docBody(doc), headers: ifGeneration ? { "If-Match": String(ifGeneration) } : undefined,
    });
  }

  async delete(name: string): Promise<void> {
    await this.t.call("DELETE /v1/policies/{name}", { name });
  }
}

/** Held requests. */
export class Approvals {
  constructor(private readonly t: Transport) {}

  /** state: pending (default), allowed, denied, expired, or null for all. */
  list(o: { state?: string | null; sandbox?: string } = {}): Promise<api.Approval[]> {
    const state = o.state === undefined ? "pending" : o.state;
    return this.t.call("GET /v1/approvals", undefined, { query: { state, sandbox: o.sandbox } });
  }

  decide(id: string, d: api.ApprovalDecisionBody): Promise<api.Approval> {
    return this.t.call("POST /v1/approvals/{id}", { id }, { json: d });
  }

  /** The key this tenant's approval webhooks are signed with (tenant: the admin's choice). */
  webhookKey(o: { tenant?: string } = {}): Promise<{ tenant: string; key: string }> {
    return this.t.call("GET /v1/approvals/webhook-key", undefined, { query: { tenant: o.tenant } });
  }

  approve(id: string, o: { remember?: boolean; reason?: string } = {}): Promise<api.Approval> {
    return this.decide(id, { decision: "allow", ...o });
  }

  deny(id: string, o: { remember?: boolean; reason?: string } = {}): Promise<api.Approval> {
    return this.decide(id, { decision: "deny", ...o });
  }
}

/** Tenants and their API keys (admin only). */
export class Tenants {
  constructor(private readonly t: Transport) {}

  create(name: string, o: { minIsolation?: string; untrusted?: boolean } = {}): Promise<api.Tenant> {
    return this.t.call("POST /v1/tenants", undefined, {
      json: dropEmpty({ name, min_isolation: o.minIsolation, untrusted: o.untrusted || undefined }),
    });
  }

  list(): Promise<api.Tenant[]> {
    return this.t.call("GET /v1/tenants");
  }

  /** A new API key; its `key` is in this answer only. */
  createKey(tenant: string): Promise<api.APIKey> {
    return this.t.call("POST /v1/tenants/{id}/keys", { id: tenant });
  }
}

export interface ToolOptions {
  description?: string;
  inputFile?: string;
  image?: string;
  runtime?: string;
  runtimeFloor?: string;
  allow?: string[];
  policyRef?: string;
  secrets?: Secrets;
  env?: Env;
  timeout?: Duration;
  memory?: Size;
  cpus?: number;
  inputSchema?: Record<string, unknown>;
  /** Replace a tool of that name. */
  replace?: boolean;
}

/** Named tools: a registered command each execute runs in a fresh sandbox. */
export class Tools {
  constructor(private readonly t: Transport) {}

  add(name: string, argv: string[], o: ToolOptions = {}): Promise<api.Tool> {
    const tool = dropEmpty({
      name, argv, description: o.description, input_file: o.inputFile, image: o.image, runtime: o.runtime,
      runtime_floor: o.runtimeFloor, allow: o.allow, policy_ref: o.policyRef, secrets: bindings(o.secrets),
      env: envList(o.env), timeout: duration(o.timeout), memory_bytes: size(o.memory), cpus: o.cpus || undefined,
      input_schema: o.inputSchema,
    });
    tool.argv = argv;
    return this.t.call("POST /v1/tools", undefined, { json: tool, query: { replace: o.replace ? "true" : undefined } });
  }

  list(): Promise<api.Tool[]> {
    return this.t.call("GET /v1/tools");
  }

  get(name: string): Promise<api.Tool> {
    return this.t.call("GET /v1/tools/{name}", { name });
  }

  async remove(name: string): Promise<void> {
    await this.t.call("DELETE /v1/tools/{name}", { name });
  }

  /** Runs the tool once with input. */
  execute(name: string, input = "", o: { maxOutput?: number } = {}): Promise<api.ExecuteResult> {
    return this.t.call("POST /v1/tools/{name}/execute", { name }, {
      json: { input, ...(o.maxOutput ? { max_output: o.maxOutput } : {}) },
    });
  }
}

// -- the daemon -------------------------------------------------------------------

export interface CageboxOptions {
  /** A daemon's TCP listener, http(s)://HOST:PORT (default: CAGEBOX_HOST). */
  host?: string;
  /** API key (default: CAGEBOX_API_KEY). */
  apiKey?: string;
  /** PEM CA file trusted besides the system roots (default: CAGEBOX_CA_CERT). */
  caCert?: string;
  /** The daemon's home: its socket is HOME/cagebox.sock (default: CAGEBOX_HOME, else /var/lib/cagebox). */
  home?: string;
  /** The unix socket itself. */
  socket?: string;
  /** Bounds each ordinary call (not streams); default 300 000. */
  timeoutMs?: number;
}

export interface CreateOptions {
  runtime?: string;
  image?: string;
  allow?: string[];
  secrets?: Secrets;
  env?: Env;
  memory?: Size;
  cpus?: number;
  pids?: number;
  disk?: Size;
  timeout?: Duration;
  idleTimeout?: Duration;
  idleAction?: "destroy" | "pause" | "hibernate";
  /** A policy document (object or JSON text). */
  policy?: api.PolicyDocument | string;
  policyRef?: string;
  /** Host paths below the daemon's --mount-root and volumes: objects, or
   * strings in the CLI's --mount syntax (type=bind|volume,src=…,dst=…[,ro|rw][,exec]). */
  mounts?: (api.Mount | string)[];
  /** Only rw mounts and a size-bounded /tmp are writable. */
  readOnlyRoot?: boolean;
  /** Stream the guest's audited syscalls as syscall.* events: exec, net, file, priv or all. */
  audit?: string[];
  /** Guest ports to publish through the ingress listener (numbers, or PortSpec for public/ttl). */
  publish?: (number | api.PortSpec)[];
  /** Start from one of the tenant's snapshots (its runtime, image, resources, env, policy and bindings). */
  fromSnapshot?: string;
}

/** Parses the CLI's --mount syntax into a Mount. */
export function parseMount(s: string): api.Mount {
  const m: Record<string, unknown> = {};
  const alias: Record<string, string> = { source: "src", target: "dst", destination: "dst" };
  for (const part of s.split(",")) {
    const eq = part.indexOf("=");
    const k0 = (eq < 0 ? part : part.slice(0, eq)).trim();
    const k = alias[k0] ?? k0;
    if (eq >= 0) m[k] = part.slice(eq + 1);
    else if (k === "rw" || k === "exec") m[k] = true;
    else if (k !== "ro" && k !== "noexec") throw new TypeError(`mount ${JSON.stringify(s)}: unknown option ${JSON.stringify(k)}`);
  }
  return m as unknown as api.Mount;
}

/** Named volumes: data that outlives sandboxes. */
export class Volumes {
  constructor(private readonly t: Transport) {}

  /** An empty volume of size bytes or e.g. "4G" (default 1 GiB). */
  create(name: string, o: { size?: Size } = {}): Promise<api.Volume> {
    return this.t.call("POST /v1/volumes", undefined, { json: dropEmpty({ name, size_bytes: size(o.size) }) });
  }

  /** Each volume with attached_to: the sandboxes that mount it. */
  list(): Promise<api.Volume[]> {
    return this.t.call("GET /v1/volumes");
  }

  /** Deletes it and its data (Conflict while a sandbox mounts it). */
  async remove(name: string): Promise<void> {
    await this.t.call("DELETE /v1/volumes/{name}", { name });
  }
}

/** Saved sandboxes, made by sb.snapshot() and sb.fork(), started from with cb.create({ fromSnapshot }). */
export class Snapshots {
  constructor(private readonly t: Transport) {}

  /** The tenant's snapshots (the admin: all). */
  list(): Promise<api.Snapshot[]> {
    return this.t.call("GET /v1/snapshots");
  }

  get(name: string): Promise<api.Snapshot> {
    return this.t.call("GET /v1/snapshots/{name}", { name });
  }

  /** Deletes it (Conflict while a sandbox started from it exists). */
  async remove(name: string): Promise<void> {
    await this.t.call("DELETE /v1/snapshots/{name}", { name });
  }
}

/**
 * A client of one cagebox daemon. With no options it resolves the daemon as
 * the CLI does: CAGEBOX_HOST with CAGEBOX_API_KEY (and CAGEBOX_CA_CERT);
 * otherwise the unix socket $CAGEBOX_HOME/cagebox.sock (admin tenant).
 */
export class Cagebox {
  /** @internal */
  readonly transport: Transport;
  readonly secrets: SecretStore;
  readonly policies: NamedPolicies;
  readonly approvals: Approvals;
  readonly tenants: Tenants;
  readonly tools: Tools;
  readonly volumes: Volumes;
  readonly snapshots: Snapshots;

  constructor(o: CageboxOptions = {}) {
    const env = process.env;
    let host = o.host;
    if (host === undefined && o.socket === undefined && o.home === undefined) host = env.CAGEBOX_HOST || undefined;
    let t: TransportOptions;
    if (host) {
      t = { baseUrl: host, apiKey: o.apiKey ?? env.CAGEBOX_API_KEY ?? "", caCert: o.caCert ?? (env.CAGEBOX_CA_CERT || undefined) };
    } else {
      t = { socketPath: o.socket ?? path.join(o.home ?? (env.CAGEBOX_HOME || DEFAULT_HOME), "cagebox.sock") };
    }
    this.transport = new Transport({ ...t, timeoutMs: o.timeoutMs });
    this.secrets = new SecretStore(this.transport);
    this.policies = new NamedPolicies(this.transport);
    this.approvals = new Approvals(this.transport);
    this.tenants = new Tenants(this.transport);
    this.tools = new Tools(this.transport);
    this.volumes = new Volumes(this.transport);
    this.snapshots = new Snapshots(this.transport);
  }

  health(): Promise<api.Health> {
    return this.transport.call("GET /v1/health");
  }

  runtimes(): Promise<api.Runtime[]> {
    return this.transport.call("GET /v1/runtimes");
  }

  images(): Promise<api.Image[]> {
    return this.transport.call("GET /v1/images");
  }

  /**
   * Pulls an OCI image into the daemon's cache (admin only); resolves when
   * it is installed (not bounded by timeoutMs: large images take minutes).
   */
  pullImage(ref: string, o: { name?: string; force?: boolean; maxBytes?: number; maxFiles?: number } = {}): Promise<api.Image> {
    return this.transport.call("POST /v1/images/pull", undefined, {
      json: dropEmpty({ ref, name: o.name, force: o.force || undefined, max_bytes: o.maxBytes || undefined, max_files: o.maxFiles || undefined }),
      timeoutMs: false,
    });
  }

  /**
   * Installs a `docker save` archive or a tar of an OCI image layout (admin
   * only). archive: a file path, bytes, or an (async) iterable of chunks
   * such as a Readable (streamed).
   */
  async importImage(archive: string | Uint8Array | Iterable<Uint8Array> | AsyncIterable<Uint8Array>,
    o: { name?: string; force?: boolean; maxBytes?: number; maxFiles?: number } = {}): Promise<api.Image> {
    const query = { name: o.name, force: o.force ? "true" : undefined, max_bytes: o.maxBytes || undefined, max_files: o.maxFiles || undefined };
    if (archive instanceof Uint8Array) {
      return this.transport.call("POST /v1/images/import", undefined, { query, body: archive, contentType: "application/x-tar", timeoutMs: false });
    }
    const chunks = typeof archive === "string" ? fs.createReadStream(archive) : archive;
    const res = await this.transport.open("POST /v1/images/import", undefined, { query, contentType: "application/x-tar", timeoutMs: false }, async (req) => {
      for await (const c of chunks as AsyncIterable<Uint8Array>) {
        if (req.destroyed) return;
        if (!req.write(c)) await new Promise<void>((r) => { req.once("drain", r); req.once("close", r); });
      }
      req.end();
    });
    const parts: Buffer[] = [];
    for await (const c of res) parts.push(c as Buffer);
    return JSON.parse(Buffer.concat(parts).toString("utf8")) as api.Image;
  }

  /** The daemon's metrics in the Prometheus text format (admin only). */
  async metrics(): Promise<string> {
    return (await this.transport.bytes("GET /metrics")).toString("utf8");
  }

  /** The warm pools (admin only). */
  pools(): Promise<api.Pools> {
    return this.transport.call("GET /v1/pools");
  }

  /** Creates and starts a sandbox. */
  async create(o: CreateOptions = {}): Promise<Sandbox> {
    let policy = o.policy;
    if (typeof policy === "string") {
      try {
        policy = JSON.parse(policy) as api.PolicyDocument;
      } catch {
        throw new TypeError("policy: give an object or JSON text here (YAML is taken by sb.policy.set and cb.policies)");
      }
    }
    const req: api.CreateSandboxRequest = dropEmpty({
      runtime: o.runtime, image: o.image, memory_bytes: size(o.memory), cpus: o.cpus || undefined,
      pids: o.pids || undefined, disk_bytes: size(o.disk), timeout: duration(o.timeout),
      idle_timeout: duration(o.idleTimeout), idle_action: o.idleAction, env: envList(o.env), policy,
      allow: o.allow, policy_ref: o.policyRef, secrets: bindings(o.secrets),
      mounts: o.mounts?.length ? o.mounts.map((m) => (typeof m === "string" ? parseMount(m) : m)) : undefined,
      read_only_root: o.readOnlyRoot || undefined,
      audit: o.audit?.length ? o.audit : undefined,
      publish: o.publish?.length ? o.publish.map((p) => (typeof p === "number" ? { port: p } : p)) : undefined,
      from_snapshot: o.fromSnapshot,
    });
    return new Sandbox(this, await this.transport.call<api.SandboxInfo>("POST /v1/sandboxes", undefined, { json: req }));
  }

  /** Creates a sandbox, runs fn with it, and removes it however fn ends. */
  async withSandbox<T>(o: CreateOptions, fn: (sb: Sandbox) => Promise<T>): Promise<T> {
    const sb = await this.create(o);
    try {
      return await fn(sb);
    } finally {
      try {
        await sb.remove();
      } catch (err) {
        if (!(err instanceof NotFound)) throw err;
      }
    }
  }

  /** Every sandbox the caller's tenant owns (the admin: all). */
  async sandboxes(): Promise<Sandbox[]> {
    const l = await this.transport.call<api.SandboxInfo[]>("GET /v1/sandboxes");
    return (l ?? []).map((s) => new Sandbox(this, s));
  }

  /** A handle on an existing sandbox (NotFound if there is none). */
  async sandbox(id: string): Promise<Sandbox> {
    return new Sandbox(this, await this.transport.call<api.SandboxInfo>("GET /v1/sandboxes/{id}", { id }));
  }

  /** Stored audit events (of one sandbox), at most 1000 after seq `after`. */
  events(o: { sandbox?: string; after?: number } = {}): Promise<api.Event[]> {
    return this.transport.call("GET /v1/events", undefined, { query: { sandbox: o.sandbox, after: o.after || undefined } });
  }

  /** The stored events after seq `after`, then new ones as they happen. */
  async followEvents(o: { sandbox?: string; after?: number; signal?: AbortSignal } = {}): Promise<EventStream> {
    const res = await this.transport.open("GET /v1/events", undefined, {
      query: { follow: "1", sandbox: o.sandbox, after: o.after || undefined }, timeoutMs: false, signal: o.signal,
    });
    return new EventStream(res, this.transport, o.after ?? 0);
  }

  /** Cuts sandboxes off the network: one, a tenant's (admin) or all (admin). */
  freeze(scope: { sandbox?: string; tenant?: string; all?: boolean }): Promise<api.FreezeResult> {
    return this.transport.call("POST /v1/freeze", undefined, { json: dropEmpty({ ...scope, all: scope.all || undefined }) });
  }

  thaw(scope: { sandbox?: string; tenant?: string; all?: boolean }): Promise<api.FreezeResult> {
    return this.transport.call("POST /v1/thaw", undefined, { json: dropEmpty({ ...scope, all: scope.all || undefined }) });
  }

  /** Runs the named tool once with input. */
  execute(name: string, input = "", o: { maxOutput?: number } = {}): Promise<api.ExecuteResult> {
    return this.tools.execute(name, input, o);
  }
}
