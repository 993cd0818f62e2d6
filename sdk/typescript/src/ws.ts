/**
 * A minimal WebSocket client (RFC 6455) on a node:http upgrade, for the
 * terminals of Sandbox.pty(): masked client frames, fragmented messages,
 * ping/pong and the closing handshake; no extensions, no subprotocols.
 * Node 20 has no stable global WebSocket, and the SDK has no runtime
 * dependencies, hence this file.
 */

import { createHash, randomBytes } from "node:crypto";
import type { Socket } from "node:net";

import { CageboxError } from "./errors.js";
import type { Params, Transport } from "./transport.js";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const MAX_MESSAGE = 16 << 20;

export const OP_CONT = 0x0;
export const OP_TEXT = 0x1;
export const OP_BINARY = 0x2;
export const OP_CLOSE = 0x8;
export const OP_PING = 0x9;
export const OP_PONG = 0xa;

export function acceptKey(key: string): string {
  return createHash("sha1").update(key + GUID).digest("base64");
}

/** One client frame, masked (RFC 6455 5.3). */
export function encodeFrame(opcode: number, payload: Uint8Array, mask: Uint8Array = randomBytes(4)): Buffer {
  const n = payload.length;
  let head: Buffer;
  if (n < 126) {
    head = Buffer.from([0x80 | opcode, 0x80 | n]);
  } else if (n < 65536) {
    head = Buffer.alloc(4);
    head[0] = 0x80 | opcode;
    head[1] = 0x80 | 126;
    head.writeUInt16BE(n, 2);
  } else {
    head = Buffer.alloc(10);
    head[0] = 0x80 | opcode;
    head[1] = 0x80 | 127;
    head.writeBigUInt64BE(BigInt(n), 2);
  }
  const body = Buffer.alloc(n);
  for (let i = 0; i < n; i++) body[i] = payload[i] ^ mask[i & 3];
  return Buffer.concat([head, Buffer.from(mask), body]);
}

export interface WSHandlers {
  message(opcode: number, data: Buffer): void;
  /** The peer's close frame (code 1005: none given) or a broken connection (err set). */
  close(code: number, reason: string, err?: Error): void;
}

/** A client WebSocket on an upgraded socket. */
export class WebSocket {
  private buf: Buffer = Buffer.alloc(0);
  private frag: Buffer[] = [];
  private fragOp = -1;
  private fragSize = 0;
  private closeSent = false;
  private ended = false;

  constructor(private readonly socket: Socket, head: Buffer, private readonly h: WSHandlers) {
    socket.setNoDelay(true);
    socket.on("data", (d: Buffer) => this.feed(d));
    socket.on("error", (err) => this.end(1006, "", err));
    socket.on("close", () => this.end(1006, "", new Error("the connection ended without a WebSocket close")));
    if (head.length) queueMicrotask(() => this.feed(head));
  }

  /** Opens a WebSocket on route (a GET the daemon upgrades). */
  static async connect(t: Transport, route: string, params: Params,
    query: Record<string, string | number | string[] | undefined>, h: WSHandlers): Promise<WebSocket> {
    const key = randomBytes(16).toString("base64");
    const { res, socket, head } = await t.upgrade(route, params, query, {
      Connection: "Upgrade", Upgrade: "websocket", "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13",
    });
    if (String(res.headers.upgrade).toLowerCase() !== "websocket" || res.headers["sec-websocket-accept"] !== acceptKey(key)) {
      socket.destroy();
      throw new CageboxError("the daemon's WebSocket handshake is malformed (Sec-WebSocket-Accept)");
    }
    return new WebSocket(socket, head, h);
  }

  private end(code: number, reason: string, err?: Error): void {
    if (this.ended) return;
    this.ended = true;
    this.socket.destroy();
    this.h.close(code, reason, err);
  }

  private fail(msg: string): void {
    this.send(OP_CLOSE, closePayload(1002, ""));
    this.end(1002, msg, new CageboxError(`WebSocket: ${msg}`));
  }

  private feed(d: Buffer): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
    while (!this.ended) {
      const b = this.buf;
      if (b.length < 2) return;
      const fin = (b[0] & 0x80) !== 0;
      const op = b[0] & 0x0f;
      if (b[0] & 0x70) return this.fail("frame with reserved bits set");
      if (b[1] & 0x80) return this.fail("the server sent a masked frame");
      let n = b[1] & 0x7f;
      let off = 2;
      if (n === 126) {
        if (b.length < 4) return;
        n = b.readUInt16BE(2);
        off = 4;
      } else if (n === 127) {
        if (b.length < 10) return;
        const big = b.readBigUInt64BE(2);
        if (big > BigInt(MAX_MESSAGE)) return this.fail(`frame of ${big} bytes is over ${MAX_MESSAGE}`);
        n = Number(big);
        off = 10;
      }
      if (n > MAX_MESSAGE) return this.fail(`frame of ${n} bytes is over ${MAX_MESSAGE}`);
      if (b.length < off + n) return;
      const payload = b.subarray(off, off + n);
      this.buf = b.subarray(off + n);
      this.frame(fin, op, Buffer.from(payload));
    }
  }

  private frame(fin: boolean, op: number, payload: Buffer): void {
    if (op >= 0x8 && (!fin || payload.length > 125)) return this.fail("malformed control frame");
    switch (op) {
      case OP_PING:
        this.send(OP_PONG, payload);
        return;
      case OP_PONG:
        return;
      case OP_CLOSE: {
        const code = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
        const reason = payload.length > 2 ? payload.subarray(2).toString("utf8") : "";
        this.send(OP_CLOSE, payload.subarray(0, 2));
        this.end(code, reason);
        return;
      }
      case OP_CONT:
        if (this.fragOp < 0) return this.fail("continuation frame without a message");
        break;
      case OP_TEXT:
      case OP_BINARY:
        if (this.fragOp >= 0) return this.fail("new message inside a fragmented one");
        this.fragOp = op;
        break;
      default:
        return this.fail(`unknown opcode ${op}`);
    }
    this.fragSize += payload.length;
    if (this.fragSize > MAX_MESSAGE) return this.fail(`message over ${MAX_MESSAGE} bytes`);
    this.frag.push(payload);
    if (!fin) return;
    const data = Buffer.concat(this.frag);
    const mop = this.fragOp;
    this.frag = [];
    this.fragOp = -1;
    this.fragSize = 0;
    this.h.message(mop, data);
  }

  /** Sends one frame; false once the WebSocket is closing. */
  send(opcode: number, payload: Uint8Array): boolean {
    if (this.closeSent || this.ended) return false;
    if (opcode === OP_CLOSE) this.closeSent = true;
    this.socket.write(encodeFrame(opcode, payload));
    return true;
  }

  /** Starts the closing handshake; the socket is dropped after a grace. */
  close(code = 1000, reason = ""): void {
    if (this.ended) return;
    this.send(OP_CLOSE, closePayload(code, reason));
    setTimeout(() => this.end(code, reason), 2000).unref();
  }
}

function closePayload(code: number, reason: string): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16BE(code, 0);
  return Buffer.concat([b, Buffer.from(reason, "utf8").subarray(0, 123)]);
}
