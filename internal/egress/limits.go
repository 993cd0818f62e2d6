package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cagebox/cagebox/internal/safedial"
)

// Per-sandbox bounds on the work a sandbox's requests make the proxy do:
// request body bytes held in the gateway, how long a body may take to
// arrive, and open upstream connections. Each refusal names its limit.
const (
	ruleInFlight      = "builtin:inflight-bytes"
	ruleBodyTimeout   = "builtin:body-timeout"
	ruleUpstreamConns = "builtin:upstream-conns"
	headerLimit       = "X-Cagebox-Limit"
	limitMessage      = "refused by a cagebox egress limit"
)

// Limit errors. They reach hooks reading a request body (wrapped) and the
// proxy's own error handling, which answers with the limit's status.
var (
	// ErrInFlightLimit: the sandbox's requests already hold
	// Config.MaxInFlightBytesPerSandbox bytes of request bodies.
	ErrInFlightLimit = errors.New("egress: the sandbox's in-flight request bytes are at their limit")
	// ErrBodyTimeout: the request body did not arrive in time.
	ErrBodyTimeout = errors.New("egress: request body read timed out")
	// errUpstreamConns: the sandbox has its maximum of upstream connections.
	errUpstreamConns = errors.New("too many upstream connections")
)

// sbState is what the proxy keeps per sandbox while the sandbox has
// connections, and a while after: its own upstream transport (connections are never shared
// between sandboxes) with a cap on open connections, and its in-flight
// request bytes.
type sbState struct {
	transport *http.Transport
	// upstream holds one token per open upstream connection.
	upstream chan struct{}
	wait     time.Duration
	inflight atomic.Int64
	maxBytes int64
	// idleSince is when the sandbox's last connection closed (zero while
	// it has connections); guarded by Proxy.mu.
	idleSince time.Time
}

func (p *Proxy) newSBState() *sbState {
	s := &sbState{
		upstream: make(chan struct{}, p.cfg.MaxUpstreamConnsPerSandbox),
		wait:     p.cfg.UpstreamConnWait,
		maxBytes: p.cfg.MaxInFlightBytesPerSandbox,
	}
	s.transport = p.newTransport(func(ctx context.Context, network, addr string) (net.Conn, error) {
		return s.dial(ctx, p.guard, network, addr)
	})
	return s
}

// dial opens an upstream connection within the sandbox's cap. At the cap
// it first closes the sandbox's idle connections, then waits up to
// s.wait for one to close, then refuses.
func (s *sbState) dial(ctx context.Context, g *safedial.Dialer, network, addr string) (net.Conn, error) {
	select {
	case s.upstream <- struct{}{}:
	default:
		s.transport.CloseIdleConnections()
		t := time.NewTimer(s.wait)
		defer t.Stop()
		select {
		case s.upstream <- struct{}{}:
		case <-t.C:
			return nil, &RefusedError{Reason: fmt.Sprintf("too many upstream connections from this sandbox (limit %d, waited %s); retry later or use fewer connections at once", cap(s.upstream), s.wait), Err: errUpstreamConns}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c, err := g.DialContext(ctx, network, addr)
	if err != nil {
		<-s.upstream
		return nil, err
	}
	return &upstreamConn{Conn: c, release: func() { <-s.upstream }}, nil
}

// upstreamConn gives its token back when closed.
type upstreamConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *upstreamConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes the connection when it can (raw TCP splices).
func (c *upstreamConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// guestBody is a request body as the sandbox sends it. It counts bytes,
// charges what the gateway reads ahead of forwarding (to buffer for a
// signature check or a scan) to the sandbox's in-flight budget, and bounds
// how long the body may take: each read waits at most idle, the whole body
// at most until deadline.
type guestBody struct {
	rc       io.ReadCloser
	sb       *sbState
	ctl      *http.ResponseController
	idle     time.Duration
	total    time.Duration
	deadline time.Time

	n    atomic.Int64 // bytes read from the sandbox
	held atomic.Int64 // of those, not yet forwarded; charged to sb.inflight
	// mu guards set, the read deadline last set on the connection.
	mu  sync.Mutex
	set time.Time
	hit atomic.Pointer[limitHit] // the limit that stopped the body, if any
	// refused is the *Refusal a hook's body reader failed with, if any.
	refused atomic.Pointer[Refusal]
	ended   atomic.Bool // the body was read to its end
	// finished is set when the request's handler is done; a read after
	// that (a transport still draining) holds nothing.
	finished atomic.Bool
}

type limitHit struct {
	rule, reason string
	status       int
}

func (b *guestBody) Read(p []byte) (int, error) {
	if h := b.hit.Load(); h != nil {
		return 0, b.errOf(h)
	}
	b.armDeadline()
	n, err := b.rc.Read(p)
	if n > 0 {
		b.n.Add(int64(n))
		if b.sb.inflight.Add(int64(n)) > b.sb.maxBytes {
			b.sb.inflight.Add(-int64(n))
			h := &limitHit{ruleInFlight, fmt.Sprintf("the sandbox's requests hold over %d bytes of request bodies in the gateway (in-flight request bytes per sandbox); retry with fewer or smaller requests at once", b.sb.maxBytes), http.StatusServiceUnavailable}
			b.hit.CompareAndSwap(nil, h)
			return 0, b.errOf(h)
		}
		b.held.Add(int64(n))
		if b.finished.Load() {
			b.forwarded(b.held.Load())
		}
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			b.hit.CompareAndSwap(nil, b.timeoutHit())
			return n, b.errOf(b.hit.Load())
		}
		if err == io.EOF {
			b.ended.Store(true)
		}
		b.disarm()
	}
	return n, err
}

// closeUnread marks an HTTP/1 answer to a request whose body was not read
// to its end as the connection's last: otherwise the server reads what is
// left of the body (up to 256 KiB, as slowly as the sandbox sends it)
// before it sends the answer. (HTTP/2 resets the stream instead.)
func closeUnread(w http.ResponseWriter, r *http.Request, b *guestBody) {
	if b != nil && !b.ended.Load() && r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
}

func (b *guestBody) timeoutHit() *limitHit {
	return &limitHit{ruleBodyTimeout, fmt.Sprintf("the request body did not arrive in time (a read may wait %s, the whole body %s)", b.idle, b.total), http.StatusRequestTimeout}
}

// stopped returns the limit that stopped the body, if any. A read that
// timed out cancels an HTTP/1 request's context from inside the read,
// before Read can record why; so a body that has not ended and whose read
// deadline has passed counts as timed out even if Read has not said so yet.
func (b *guestBody) stopped() *limitHit {
	if h := b.hit.Load(); h != nil {
		return h
	}
	b.mu.Lock()
	set := b.set
	b.mu.Unlock()
	if !b.ended.Load() && !set.IsZero() && !time.Now().Before(set) {
		b.hit.CompareAndSwap(nil, b.timeoutHit())
		return b.hit.Load()
	}
	return nil
}

func (b *guestBody) errOf(h *limitHit) error {
	if h.rule == ruleInFlight {
		return fmt.Errorf("%w: %s", ErrInFlightLimit, h.reason)
	}
	return fmt.Errorf("%w: %s", ErrBodyTimeout, h.reason)
}

// armDeadline sets the connection's read deadline for the next read: idle
// from now, never past the overall deadline. It touches the connection only
// when the deadline moves by more than an eighth of idle.
func (b *guestBody) armDeadline() {
	d := time.Now().Add(b.idle)
	if d.After(b.deadline) {
		d = b.deadline
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.set.IsZero() && d.Sub(b.set) < b.idle/8 && !d.Equal(b.deadline) {
		return
	}
	b.set = d
	_ = b.ctl.SetReadDeadline(d)
}

// disarm clears the read deadline once the body has ended: the HTTP/1
// server reads on in the background after a body's end, and a deadline left
// behind would cancel a long response. A body that never ended keeps its
// deadline, which also bounds the server's discarding of its rest.
func (b *guestBody) disarm() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.set.IsZero() {
		b.set = time.Time{}
		_ = b.ctl.SetReadDeadline(time.Time{})
	}
}

func (b *guestBody) Close() error { return b.rc.Close() }

// forwarded gives back to the in-flight budget bytes as they leave for the
// upstream (up to what was charged).
func (b *guestBody) forwarded(n int64) {
	for {
		h := b.held.Load()
		r := min(h, n)
		if r <= 0 {
			return
		}
		if b.held.CompareAndSwap(h, h-r) {
			b.sb.inflight.Add(-r)
			return
		}
	}
}

// done releases what the request still holds in the in-flight budget.
func (b *guestBody) done() {
	b.finished.Store(true)
	b.forwarded(b.held.Load())
}

// forwardBody is the body as the upstream transport reads it, after any
// hook rewrote it.
type forwardBody struct {
	io.ReadCloser
	g *guestBody
}

func (f forwardBody) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	f.g.forwarded(int64(n))
	var ref *Refusal
	if err != nil && errors.As(err, &ref) {
		f.g.refused.CompareAndSwap(nil, ref)
	}
	return n, err
}

// writeLimit answers a request stopped by one of the limits above.
func writeLimit(w http.ResponseWriter, h *limitHit, host string) {
	w.Header().Set(headerLimit, h.rule)
	if h.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", strconv.Itoa(1))
	}
	writeJSON(w, h.status, map[string]string{
		"error":  limitMessage,
		"rule":   h.rule,
		"host":   host,
		"reason": h.reason,
	})
}
