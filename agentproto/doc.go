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
// client). Each operation (exec, health, file write/read, directory listing,
// signal) is one yamux stream.
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
package agentproto
