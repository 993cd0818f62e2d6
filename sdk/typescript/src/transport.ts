/** HTTP/1.1 to the daemon: its unix socket, or TCP (http:// or https://). */

import * as fs from "node:fs";
import * as http from "node:http";
import * as https from "node:https";
import * as tls from "node:tls";

import { CageboxError, ConnectionFailed, errorFor } from "./errors.js";

const MAX_ERROR_BODY = 64 << 10;

export interface TransportOptions {
  /** The daemon's unix socket (every call acts as the admin tenant). */
  socketPath?: string;
  /** http://HOST:PORT or https://HOST:PORT of a daemon's TCP listener. */
  baseUrl?: string;
  /** API key sent as Authorization: Bearer (TCP). */
  apiKey?: string;
  /** PEM file of CA certificates trusted besides the system roots (https). */
  caCert?: string;
  /** Bounds each ordinary call (not streams); default 300 s. */
  timeoutMs?: number;
}

export interface RequestOptions {
  query?: Record<string, string | number | boolean | undefined | null>;
  json?: unknown;
  body?: Uint8Array | string;
  contentType?: string;
  headers?: Record<string, string>;
  /** false: no timeout (streams). */
  timeoutMs?: number | false;
  signal?: AbortSignal;
}

export type Params = Record<string, string>;

/** Splits "METHOD /v1/x/{id}" and fills the path's parameters (escaped). */
export function routePath(route: string, params: Params = {}): [string, string] {
  const sp = route.indexOf(" ");
  const method = route.slice(0, sp);
  const path = route.slice(sp + 1).replace(/\{([a-z_]+)\}/g, (_, name: string) => {
    const v = params[name];
    if (!v) throw new TypeError(`${route}: ${name} is empty`);
    return encodeURIComponent(v);
  });
  return [method, path];
}

export class Transport {
  readonly where: string;
  readonly socketPath?: string;
  // A true private field: console.log and util.inspect never show the key.
  readonly #key: string;
  private readonly timeoutMs: number;
  private readonly url?: URL;
  private readonly ca?: string[];

  constructor(o: TransportOptions) {
    this.#key = o.apiKey ?? "";
    this.timeoutMs = o.timeoutMs ?? 300_000;
    if (o.baseUrl) {
      let u: URL;
      try {
        u = new URL(o.baseUrl);
      } catch {
        throw new TypeError(`daemon URL ${JSON.stringify(o.baseUrl)}: want http://HOST:PORT or https://HOST:PORT`);
      }
      if ((u.protocol !== "http:" && u.protocol !== "https:") || !u.hostname) {
        throw new TypeError(`daemon URL ${JSON.stringify(o.baseUrl)}: want http://HOST:PORT or https://HOST:PORT`);
      }
      if (u.username || u.password || (u.pathname !== "/" && u.pathname !== "") || u.search || u.hash) {
        throw new TypeError("daemon URL: want the scheme, host and port only");
      }
      if (o.caCert) {
        if (u.protocol !== "https:") {
          throw new TypeError(`a CA certificate (${o.caCert}) verifies an https:// daemon; ${o.baseUrl} is plain HTTP`);
        }
        this.ca = [...tls.rootCertificates, fs.readFileSync(o.caCert, "utf8")];
      }
      this.url = u;
      this.where = `${u.protocol}//${u.host}`;
    } else if (o.socketPath) {
      this.socketPath = o.socketPath;
      this.where = o.socketPath;
    } else {
      throw new TypeError("give a unix socket path or a daemon URL");
    }
  }

  private headers(contentType?: string, extra?: Record<string, string>): Record<string, string> {
    const h: Record<string, string> = { Accept: "application/json", "User-Agent": "cagebox-typescript" };
    if (this.#key) h.Authorization = `Bearer ${this.#key}`;
    if (contentType) h["Content-Type"] = contentType;
    return { ...h, ...extra };
  }

  fail(err: Error & { code?: string }): ConnectionFailed {
    let hint = "";
    if (this.socketPath && (err.code === "ENOENT" || err.code === "ECONNREFUSED")) {
      hint = " (is `cagebox daemon` running with this --home? set CAGEBOX_HOME, or CAGEBOX_HOST for TCP)";
    }
    return new ConnectionFailed(`cagebox daemon at ${this.where}: ${err.message}${hint}`);
  }

  private start(method: string, path: string, headers: Record<string, string>, signal?: AbortSignal): http.ClientRequest {
    const common = { method, path, headers, agent: false as const, signal };
    if (this.socketPath) return http.request({ ...common, socketPath: this.socketPath });
    const u = this.url!;
    const port = u.port ? Number(u.port) : u.protocol === "https:" ? 443 : 80;
    const host = u.hostname.replace(/^\[|\]$/g, "");
    if (u.protocol === "https:") {
      return https.request({ ...common, host, port, servername: host, ca: this.ca, minVersion: "TLSv1.2" });
    }
    return http.request({ ...common, host, port });
  }

  private async check(res: http.IncomingMessage): Promise<http.IncomingMessage> {
    const status = res.statusCode ?? 0;
    if (status < 300) return res;
    const chunks: Buffer[] = [];
    let n = 0;
    for await (const c of res) {
      if (n < MAX_ERROR_BODY) chunks.push(c as Buffer);
      n += (c as Buffer).length;
    }
    const text = Buffer.concat(chunks).subarray(0, MAX_ERROR_BODY).toString("utf8");
    try {
      const e = JSON.parse(text);
      if (e && typeof e.error === "string" && e.error) throw errorFor(status, String(e.kind ?? ""), e.error);
    } catch (err) {
      if (err instanceof CageboxError) throw err;
    }
    throw errorFor(status, "", `${status} ${res.statusMessage ?? ""}: ${text.trim()}`);
  }

  /**
   * Sends a request; resolves with the 2xx response (the caller reads it)
   * or rejects with the API error. `feed`, if given, writes the rest of the
   * body while the answer may already stream back.
   */
  open(route: string, params: Params | undefined, o: RequestOptions = {},
    feed?: (req: http.ClientRequest) => Promise<void>): Promise<http.IncomingMessage> {
    let [method, path] = routePath(route, params);
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(o.query ?? {})) {
      if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
    }
    if ([...q].length) path += `?${q}`;
    let body: Buffer | undefined;
    let ct = o.contentType;
    if (o.json !== undefined) {
      body = Buffer.from(JSON.stringify(o.json));
      ct = "application/json";
    } else if (o.body !== undefined) {
      body = Buffer.from(o.body as Uint8Array);
    }
    const headers = this.headers(ct, o.headers);
    if (body !== undefined && !feed) headers["Content-Length"] = String(body.length);
    const timeout = o.timeoutMs === undefined ? this.timeoutMs : o.timeoutMs;
    return new Promise((resolve, reject) => {
      let req: http.ClientRequest;
      try {
        req = this.start(method, path, headers, o.signal);
      } catch (err) {
        reject(err);
        return;
      }
      let settled = false;
      req.on("error", (err: Error & { code?: string }) => {
        if (settled) return;
        settled = true;
        reject(err.name === "AbortError" ? err : this.fail(err));
      });
      if (timeout) {
        req.setTimeout(timeout, () => req.destroy(new Error(`no answer within ${timeout} ms`)));
      }
      req.on("response", (res) => {
        if (settled) return;
        settled = true;
        if (timeout) req.setTimeout(0);
        this.check(res).then(resolve, (err) => {
          req.destroy();
          reject(err);
        });
      });
      if (feed) {
        if (body) req.write(body);
        feed(req).catch(() => {
          // The daemon stopped reading (the process ended); the answer says how it went.
        });
      } else {
        req.end(body);
      }
    });
  }

  /**
   * A WebSocket opening handshake (ws.ts): a GET with the upgrade headers.
   * Resolves with the socket once the daemon answers 101; rejects with the
   * API error of any other answer. Array query values repeat the parameter.
   */
  upgrade(route: string, params: Params, query: Record<string, string | number | string[] | undefined>,
    extra: Record<string, string>): Promise<{ res: http.IncomingMessage; socket: import("node:net").Socket; head: Buffer }> {
    let [method, path] = routePath(route, params);
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) {
      if (v === undefined || v === "") continue;
      for (const x of Array.isArray(v) ? v : [v]) q.append(k, String(x));
    }
    if ([...q].length) path += `?${q}`;
    return new Promise((resolve, reject) => {
      let req: http.ClientRequest;
      try {
        req = this.start(method, path, this.headers(undefined, extra));
      } catch (err) {
        reject(err);
        return;
      }
      req.setTimeout(this.timeoutMs, () => req.destroy(new Error(`no answer within ${this.timeoutMs} ms`)));
      req.on("error", (err: Error & { code?: string }) => reject(this.fail(err)));
      req.on("upgrade", (res, socket, head) => {
        req.setTimeout(0);
        resolve({ res, socket: socket as import("node:net").Socket, head });
      });
      req.on("response", (res) => {
        this.check(res).then(() => reject(new CageboxError(`the daemon answered ${res.statusCode} instead of switching to a WebSocket`)),
          reject);
      });
      req.end();
    });
  }

  /** One request, the whole answer read: decoded JSON (undefined for an empty body). */
  async call<T>(route: string, params?: Params, o: RequestOptions = {}): Promise<T> {
    const data = await this.bytes(route, params, o);
    const text = data.toString("utf8");
    return (text.trim() ? JSON.parse(text) : undefined) as T;
  }

  /** One request, the whole answer as bytes. */
  async bytes(route: string, params?: Params, o: RequestOptions = {}): Promise<Buffer> {
    const res = await this.open(route, params, o);
    const chunks: Buffer[] = [];
    try {
      for await (const c of res) chunks.push(c as Buffer);
    } catch (err) {
      throw this.fail(err as Error);
    }
    return Buffer.concat(chunks);
  }
}

/** The JSON lines of a streamed answer, as they come. */
export async function* jsonLines<T>(res: http.IncomingMessage, fail: (e: Error) => Error,
  closed: () => boolean): AsyncGenerator<T> {
  let buf = "";
  res.setEncoding("utf8");
  try {
    for await (const chunk of res) {
      buf += chunk as string;
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.trim()) yield JSON.parse(line) as T;
      }
    }
  } catch (err) {
    if (closed()) return;
    throw fail(err as Error);
  }
  if (buf.trim()) yield JSON.parse(buf) as T;
}
