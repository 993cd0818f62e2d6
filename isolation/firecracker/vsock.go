package firecracker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Host-initiated connections to a guest vsock port through Firecracker's
// hybrid vsock: connect to the unix socket, write "CONNECT <port>\n", read
// "OK <host port>\n"; from then on the stream is the guest's port.
//
// Written here rather than taken from firecracker-go-sdk/vsock (v1.0.0):
// that dialer reads the reply through a 32-byte bufio.Reader, unbounded
// until a newline arrives, and drops whatever it buffered past the newline.
// This one reads the reply a byte at a time, at most maxReply bytes, under
// one deadline, so nothing of the stream is lost and a misbehaving peer
// cannot make it allocate.
const (
	maxReply       = 64
	handshakeLimit = 2 * time.Second
)

// dialVsock connects to port through the hybrid vsock socket at path. ctx
// bounds the whole attempt (the caller retries).
func dialVsock(ctx context.Context, path string, port uint32) (net.Conn, error) {
	conn, err := dialJailed(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("firecracker: dial vsock: %w", err)
	}
	if err := vsockHandshake(ctx, conn, port); err != nil {
		conn.Close()
		return nil, fmt.Errorf("firecracker: vsock %s port %d: %w", path, port, err)
	}
	return conn, nil
}

func vsockHandshake(ctx context.Context, conn net.Conn, port uint32) error {
	deadline := time.Now().Add(handshakeLimit)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := fmt.Fprintf(conn, "CONNECT %d\n", port); err != nil {
		return fmt.Errorf("send CONNECT: %w", err)
	}
	var line []byte
	b := make([]byte, 1)
	for {
		if _, err := conn.Read(b); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if os.IsTimeout(err) {
				return fmt.Errorf("no answer to CONNECT within %s (%q so far)", handshakeLimit, line)
			}
			if len(line) == 0 && errors.Is(err, net.ErrClosed) {
				return errors.New("closed before answering CONNECT")
			}
			return fmt.Errorf("read the answer to CONNECT (%q so far): %w", line, err)
		}
		if b[0] == '\n' {
			break
		}
		if len(line) >= maxReply {
			return fmt.Errorf("answer to CONNECT longer than %d bytes: not a Firecracker vsock", maxReply)
		}
		line = append(line, b[0])
	}
	f := strings.Fields(string(line))
	if len(f) != 2 || f[0] != "OK" {
		return fmt.Errorf("answer to CONNECT is %q, want \"OK <port>\" (is the agent listening on vsock port %d?)", line, port)
	}
	if _, err := strconv.ParseUint(f[1], 10, 32); err != nil {
		return fmt.Errorf("answer to CONNECT is %q: bad port", line)
	}
	return conn.SetDeadline(time.Time{})
}
