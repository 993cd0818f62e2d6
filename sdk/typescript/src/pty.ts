/**
 * Interactive terminals: Sandbox.pty() (GET /v1/sandboxes/{id}/pty, a
 * WebSocket). Binary messages are the terminal's bytes both ways; text
 * messages are JSON control: {"type":"resize",...} from us, one
 * {"type":"exit",...} from the daemon before it closes.
 */

import { CageboxError } from "./errors.js";
import type { Params, Transport } from "./transport.js";
import { OP_BINARY, OP_TEXT, WebSocket } from "./ws.js";

/** How a terminal's command ended (the daemon's exit message). */
export interface PtyExit {
  type: "exit";
  /** 128+n after signal n. */
  exit_code: number;
  signal?: string;
  timed_out?: boolean;
  oom_killed?: boolean;
  /** Set when the command could not start (exit_code 127 or 126). */
  error?: string;
}

/**
 * A command on a terminal in a sandbox. Iterate it (for await) for the
 * output, write() to type (a "\x03" is Ctrl-C), resize(), wait() for the
 * exit code, close() to hang up (the daemon then kills the command).
 */
export class Pty implements AsyncIterable<Buffer> {
  /** The exit message, once it has come. */
  result?: PtyExit;
  private ws!: WebSocket;
  private queue: Buffer[] = [];
  private done = false;
  private error?: Error;
  private wake?: () => void;
  private readonly finished: Promise<void>;
  private finish!: () => void;

  private constructor() {
    this.finished = new Promise((r) => { this.finish = r; });
  }

  /** @internal */
  static async open(t: Transport, route: string, params: Params,
    query: Record<string, string | number | string[] | undefined>): Promise<Pty> {
    const p = new Pty();
    p.ws = await WebSocket.connect(t, route, params, query, {
      message: (op, data) => {
        if (op === OP_BINARY) {
          p.queue.push(data);
        } else if (op === OP_TEXT) {
          try {
            const m = JSON.parse(data.toString("utf8"));
            if (m && m.type === "exit") p.result = m as PtyExit;
          } catch {
            // not ours: ignored
          }
        }
        p.poke();
      },
      close: (code, reason, err) => {
        if (!p.result) {
          p.error = new CageboxError(`terminal ended without an exit status: ${reason || err?.message || `close code ${code}`}`);
        }
        p.done = true;
        p.poke();
        p.finish();
      },
    });
    return p;
  }

  private poke(): void {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  /** The terminal's output as it comes; ends when the command has ended. */
  async *[Symbol.asyncIterator](): AsyncGenerator<Buffer> {
    for (;;) {
      const b = this.queue.shift();
      if (b) {
        yield b;
        continue;
      }
      if (this.done) {
        if (this.error) throw this.error;
        return;
      }
      await new Promise<void>((r) => { this.wake = r; });
    }
  }

  /** Types data into the terminal. */
  write(data: Uint8Array | string): void {
    if (!this.ws.send(OP_BINARY, typeof data === "string" ? Buffer.from(data) : data)) {
      throw new CageboxError("terminal: write after the session ended");
    }
  }

  /** Sets the terminal's size (the command gets SIGWINCH). */
  resize(rows: number, cols: number): void {
    this.ws.send(OP_TEXT, Buffer.from(JSON.stringify({ type: "resize", rows, cols })));
  }

  /**
   * Waits for the command to end and resolves with its exit code (see
   * .result for signal, timed_out, error). Output not read by then is
   * dropped.
   */
  async wait(): Promise<number> {
    await this.finished;
    this.queue = [];
    if (!this.result) throw this.error ?? new CageboxError("terminal ended without an exit status");
    return this.result.exit_code;
  }

  /** Hangs up; a command still running is killed. */
  close(): void {
    this.ws.close(1000);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}
