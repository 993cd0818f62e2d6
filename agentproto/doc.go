// Package agentproto is the protocol between the cagebox host and
// cagebox-agent, the PID 1 of every sandbox guest. It holds both sides: the
// host's [Client] and the guest's [Server].
//
// The host talks to the agent over one byte stream (a unix socket
// bind-mounted into a container, a virtio-serial port, vsock). A connection
// starts with a handshake: the host sends a hello frame carrying the
// per-sandbox token, the agent compares it in constant time and answers with
// a hello-ok frame or an error frame and closes. After the handshake both
// sides run a yamux session over the connection (the host is the yamux
// client). Each operation (exec — on pipes or on a pty —, health, file
// write/read, directory listing, tar archive get/put, signal) is one yamux
// stream.
//
// On a stream, data travels in frames: a 5-byte header (type byte, big-endian
// uint32 payload length) followed by the payload. Control messages are JSON
// (at most [MaxJSONSize] bytes); data frames (stdin, stdout, stderr, file
// data) carry raw bytes (at most [MaxFrameSize]). Oversized or unknown frames
// are rejected before anything is allocated.
//
// The host treats everything the agent sends as untrusted: sizes are bounded,
// reads are bounded by contexts, and malformed input yields an error (often
// wrapping [ErrProtocol]), never a panic.
//
// # Where the guest side lives
//
// The files are by side: the host's in client.go; the guest's in server.go
// (handshake, the registry of running processes, file operations, Shutdown),
// exec_linux.go (starting a process: user lookup through passwd.go, working
// directory, stdio pumps, timeouts, exit status), pty_linux.go (a pty
// exec's terminal: allocation on the guest's devpts, resize, signals to the
// session's jobs, the line discipline's Ctrl-C where the kernel does not do
// it), archive_linux.go (tar streams through internal/tarx),
// reaper_linux.go ([Reaper]:
// PID 1's reaping of orphans, which hands exec'd children's statuses back to
// exec); frame.go and proto.go (frames and messages) are both sides'.
// cmd/cagebox-agent is the process around the [Server]: PID 1 duties, the
// listeners, capability dropping, the self-check.
//
// The guest side stays in this package rather than beside the agent
// because it shares the frame reader and writer and the message types,
// unexported, with the client: moving it out would make the framing public
// API (or split it into a third package) only to move code, and the tests
// here drive both sides against each other, including malformed frames
// written below the public API. Nothing is gained in what binaries link:
// the daemon links no guest code (it never references [Server]), and the
// agent's dependency guard (cmd/cagebox-agent/main_test.go) admits this
// package as it is.
package agentproto
