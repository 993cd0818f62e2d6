package qemu

import (
	"net"
	"sync"
	"time"
)

// A virtio-serial port is one byte stream with no connection boundaries
// inside the guest: when the host's connection to QEMU's socket ends and a
// new one begins, the guest sees only a "host disconnected" state change,
// and the agent's session of the old connection may read the new
// connection's first bytes before it notices. Two measures keep redials
// working:
//
//   - DialAgent waits reconnectGap after the previous connection closed, so
//     that the agent has seen the disconnect (its read returns EOF) before
//     the next hello arrives;
//   - once the agent serves the port (QEMU reports the guest has it open),
//     a new connection whose first write gets no answer within
//     answerTimeout fails (a read timeout), so the caller redials instead of
//     waiting for ever on a hello the old session swallowed. (While the
//     guest boots there is no such limit: the first connection waits.)
var (
	reconnectGap  = 250 * time.Millisecond
	answerTimeout = 5 * time.Second // a variable for tests
)

// agentLink is the Sandbox's record of its agent connections.
type agentLink struct {
	// mu guards the fields below.
	mu sync.Mutex
	// lastClose is when the latest connection was closed (or, after a
	// daemon restart, when the sandbox was recovered).
	lastClose time.Time
}

func (l *agentLink) closedNow() {
	l.mu.Lock()
	l.lastClose = time.Now()
	l.mu.Unlock()
}

func (l *agentLink) waitGap() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lastClose.IsZero() {
		return 0
	}
	return time.Until(l.lastClose.Add(reconnectGap))
}

// agentConn wraps one connection to QEMU's agent socket.
type agentConn struct {
	net.Conn
	link *agentLink

	// mu guards the fields below.
	mu sync.Mutex
	// limit: arm an answer deadline at the first write.
	limit bool
	// limited: an answer deadline is armed (first write made, no answer
	// yet); answerBy is that deadline.
	limited  bool
	answerBy time.Time
	// readDL is the read deadline the caller set.
	readDL time.Time
	// gotAnswer: a read returned data.
	gotAnswer bool
	closed    bool
}

func newAgentConn(c net.Conn, l *agentLink, limit bool) *agentConn {
	return &agentConn{Conn: c, link: l, limit: limit}
}

// applyLocked sets the effective read deadline: the caller's, or the
// answer deadline if that is earlier.
func (c *agentConn) applyLocked() error {
	dl := c.readDL
	if c.limited && (dl.IsZero() || c.answerBy.Before(dl)) {
		dl = c.answerBy
	}
	return c.Conn.SetReadDeadline(dl)
}

func (c *agentConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if c.limit && !c.gotAnswer && !c.limited {
		c.limited, c.answerBy = true, time.Now().Add(answerTimeout)
		_ = c.applyLocked()
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *agentConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.mu.Lock()
		if !c.gotAnswer {
			c.gotAnswer = true
			if c.limited {
				c.limited = false
				_ = c.applyLocked()
			}
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *agentConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

func (c *agentConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDL = t
	return c.applyLocked()
}

func (c *agentConn) Close() error {
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	c.mu.Unlock()
	err := c.Conn.Close()
	if first {
		c.link.closedNow()
	}
	return err
}
