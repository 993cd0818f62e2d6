// Drives cagebox's MCP server with the official TypeScript SDK client and
// prints what happened as JSON, for test/e2e/mcp_test.go to judge.
//
//   MCP_MODE=stdio  CAGEBOX_BIN=… CAGEBOX_HOME=…   (spawns `cagebox mcp`)
//   MCP_MODE=http   MCP_URL=http://…/mcp MCP_API_KEY=…
//   MCP_CALLS='[{"name":"…","arguments":{…}}, …]'
//
// "$SANDBOX" in an argument is replaced by the id the last sandbox_create
// returned, "$FORK0", "$FORK1", … by the ids the last sandbox_fork did.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const mode = process.env.MCP_MODE;
let transport;
if (mode === "stdio") {
  transport = new StdioClientTransport({
    command: process.env.CAGEBOX_BIN,
    args: ["--home", process.env.CAGEBOX_HOME, "mcp"],
    stderr: "inherit",
  });
} else if (mode === "http") {
  transport = new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
    requestInit: { headers: { Authorization: "Bearer " + process.env.MCP_API_KEY } },
  });
} else {
  console.error("MCP_MODE must be stdio or http");
  process.exit(2);
}

const client = new Client({ name: "cagebox-e2e", version: "1.0.0" });
const out = { server: null, tools: [], calls: [] };
try {
  await client.connect(transport);
  out.server = client.getServerVersion();
  const listed = await client.listTools();
  out.tools = listed.tools.map((t) => ({ name: t.name, description: t.description, inputSchema: t.inputSchema }));
  let sandbox = "";
  let forks = [];
  const subst = (v) => {
    if (typeof v === "string") return v.replaceAll("$SANDBOX", sandbox).replace(/\$FORK(\d+)/g, (_, i) => forks[Number(i)] ?? "");
    if (Array.isArray(v)) return v.map(subst);
    if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, subst(x)]));
    return v;
  };
  for (const c of JSON.parse(process.env.MCP_CALLS || "[]")) {
    const rec = { name: c.name };
    try {
      const res = await client.callTool({ name: c.name, arguments: subst(c.arguments || {}) }, undefined, { timeout: 120000 });
      rec.isError = !!res.isError;
      rec.text = (res.content || []).filter((x) => x.type === "text").map((x) => x.text).join("");
      rec.structured = res.structuredContent ?? null;
      if (c.name === "sandbox_create" && res.structuredContent && res.structuredContent.id) {
        sandbox = res.structuredContent.id;
      }
      if (c.name === "sandbox_fork" && res.structuredContent && Array.isArray(res.structuredContent.sandboxes)) {
        forks = res.structuredContent.sandboxes;
      }
    } catch (e) {
      rec.protocolError = String(e && e.message ? e.message : e);
    }
    out.calls.push(rec);
  }
} catch (e) {
  out.fatal = String(e && e.stack ? e.stack : e);
}
await client.close().catch(() => {});
// Exit only once the report is written (a pipe takes large writes in
// pieces).
process.stdout.write(JSON.stringify(out) + "\n", () => process.exit(out.fatal ? 1 : 0));
