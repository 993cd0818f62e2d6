package main

// The host-side commands — the daemon, a fleet node, the fleet controller,
// the image cache's build/ls/rm, the vault's master-key rotation, the
// runtimes of this host when no daemon runs, and the MCP stdio server —
// link the whole daemon
// (runtimes, gateway, store) and, for the fleet, client-go and
// controller-runtime, whose package initialisation alone cost ~35 ms at
// every start. So there are two builds of this one command tree:
//
//   - the full build (`go build ./cmd/cagebox`, installed as
//     bin/cagebox-server): every command, in-process;
//   - the CLI (`go build -tags lite`, bin/cagebox): the client commands,
//     and for each host-side command a stand-in that execs cagebox-server
//     (beside the CLI's own executable, else on $PATH) with the same
//     arguments, so `cagebox daemon …` is unchanged for its users.
//
// hostcmds_full.go and hostcmds_lite.go are the two sides; the names and
// one-line help below are shared so `cagebox --help` reads the same in
// both.

// serverName is the full build's executable name beside the CLI.
const serverName = "cagebox-server"

type cmdDoc struct{ use, short string }

var (
	docDaemon     = cmdDoc{"daemon", "Run the cagebox daemon"}
	docNode       = cmdDoc{"node", "Run the daemon as a Kubernetes fleet node (announced by a Lease; driven by `cagebox controller`)"}
	docController = cmdDoc{"controller", "Run the Kubernetes controller: agent-sandbox Sandboxes, SandboxClaims and SandboxWarmPools on cagebox nodes"}
	docImageBuild = cmdDoc{"build [NAME]", "Build a guest image (default: the Debian image \"default\"; \"busybox\": a tiny test image)"}
	docImageLs    = cmdDoc{"ls", "List cached images, and the microVM templates made from them"}
	docImageRm    = cmdDoc{"rm NAME", "Remove a cached image (refused while sandboxes use it)"}
	docRotateKey  = cmdDoc{"rotate-master-key", "Re-seal every secret under a new master key (stop the daemon first)"}
	// mcp is a client of the API, but a long-lived one: it pays the exec
	// once per MCP session, and the CLI does not link the MCP SDK.
	docMCP = cmdDoc{"mcp", "Serve the Model Context Protocol over stdio: your registered tools, sandbox tools and request_access (the daemon also serves it at /mcp)"}
)
