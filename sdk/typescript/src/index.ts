/**
 * TypeScript SDK of cagebox: sandboxes for untrusted code whose credentials
 * never enter the guest. No runtime dependencies; Node >= 20.
 *
 *   import { Cagebox } from "cagebox";
 *   const cb = new Cagebox();   // $CAGEBOX_HOME/cagebox.sock, or CAGEBOX_HOST + CAGEBOX_API_KEY
 *   await cb.withSandbox({ allow: ["api.github.com"] }, async (sb) => {
 *     const r = await sb.exec("echo hello", { onStdout: (b) => process.stdout.write(b) });
 *   });
 */

export * from "./client.js";
export * from "./errors.js";
export { Pty } from "./pty.js";
export type { PtyExit } from "./pty.js";
export type * from "./types.js";
export { routePath, Transport } from "./transport.js";
export type { TransportOptions } from "./transport.js";
