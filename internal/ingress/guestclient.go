package ingress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The guest client: the HTTP/1.1 client of the ingress's body-less
// requests (GET and HEAD, no upgrade — nearly every request a browser or
// an API client makes). It does a round trip in the caller's goroutine:
// http.Transport hands each request to a writer goroutine and each answer
// back from a reader goroutine, and on this host those hand-offs were
// 40% of the latency ingress adds to a small GET (p50 +0.07–0.15 ms
// inline against +0.16–0.20 ms through http.Transport, the same run).
//
// Why hand-written: http.Transport has no way to run a round trip
// inline. The protocol work is still the standard library's: the request
// is written by http.Request.Write and the answer parsed by
// http.ReadResponse, body framing included (the code http.Transport
// uses, so no smuggling of our own making), with http.Transport's limits
// on response header bytes and 1xx answers. Requests with bodies and
// upgrades go through http.Transport.
//
// Tried and dropped: splicing Content-Length bodies from the guest's
// socket to the client's (splice(2) through the ResponseWriter's
// ReadFrom) on the plain listener. It worked, and saved nothing here: the
// CPU a download costs is the kernel's TCP work for the second hop, not
// the copies (0.87 ms/MiB spliced against 0.84 ms/MiB copied).

const (
	// guestMaxIdle bounds the idle connections kept per guest address.
	guestMaxIdle = 64
	// guestIdleTimeout drops connections idle longer than this.
	guestIdleTimeout = 90 * time.Second
	// guestBufSize is a guest connection's read buffer (larger reads go
	// to the caller's buffer directly).
	guestBufSize = 16 << 10
	// guestMaxHeader bounds a response's header bytes (1xx answers
	// included), as http.Transport's MaxResponseHeaderBytes does.
	guestMaxHeader = 1 << 20
	// guestMax1xx is how many 1xx answers one request may get (as
	// http.Transport).
	guestMax1xx = 5
)

// inline reports whether r goes through the guest client: a GET or HEAD
// with no body that asks for no upgrade.
func inline(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
		(r.Body == nil || r.Body == http.NoBody) && r.ContentLength <= 0 &&
		len(r.TransferEncoding) == 0 && r.Header.Get("Upgrade") == ""
}

// guestConn is a connection to a guest kept by guestClient.
type guestConn struct {
	tc   *net.TCPConn
	lr   *io.LimitedReader // under br: bounds a response's header
	br   *bufio.Reader
	bw   *bufio.Writer
	key  netip.AddrPort
	used time.Time // when it went idle
}

var errHeaderTooLarge = errors.New("ingress: the guest's response header is too large")

// unlimited is a guest connection's read limit outside a header.
const unlimited = math.MaxInt64

// guestClient is the http.RoundTripper of the inline requests.
type guestClient struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	// mu guards idle.
	mu   sync.Mutex
	idle map[netip.AddrPort][]*guestConn
}

func newGuestClient(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *guestClient {
	return &guestClient{dial: dial, idle: map[netip.AddrPort][]*guestConn{}}
}

// CloseIdleConnections closes every idle guest connection.
func (g *guestClient) CloseIdleConnections() {
	g.mu.Lock()
	idle := g.idle
	g.idle = map[netip.AddrPort][]*guestConn{}
	g.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.tc.Close()
		}
	}
}

// get returns an idle connection to key (the newest), or nil.
func (g *guestClient) get(key netip.AddrPort) *guestConn {
	g.mu.Lock()
	defer g.mu.Unlock()
	cs := g.idle[key]
	var c *guestConn
	for len(cs) > 0 && c == nil {
		c, cs = cs[len(cs)-1], cs[:len(cs)-1]
		if time.Since(c.used) >= guestIdleTimeout || !quiet(c.tc) {
			c.tc.Close()
			c = nil
		}
	}
	if len(cs) == 0 {
		delete(g.idle, key)
	} else {
		g.idle[key] = cs
	}
	return c
}

// quiet reports whether an idle connection is open with nothing to read:
// one the guest closed, or that has bytes no request asked for, is not
// used again (http.Transport keeps a reader on each idle connection for
// this; a peek when it is taken costs less).
func quiet(tc *net.TCPConn) bool {
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	_ = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		ok = err == unix.EAGAIN
		return true // a peek: never wait
	})
	return ok
}

// put keeps a connection whose last answer was read to its end.
func (g *guestClient) put(c *guestConn) {
	c.used = time.Now()
	g.mu.Lock()
	if cs := g.idle[c.key]; len(cs) < guestMaxIdle {
		g.idle[c.key] = append(cs, c)
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	c.tc.Close()
}

func (g *guestClient) newConn(ctx context.Context, key netip.AddrPort) (*guestConn, error) {
	nc, err := g.dial(ctx, "tcp", key.String())
	if err != nil {
		return nil, err
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("ingress: guest connection is a %T, not TCP", nc)
	}
	lr := &io.LimitedReader{R: tc, N: unlimited}
	return &guestConn{tc: tc, lr: lr, br: bufio.NewReaderSize(lr, guestBufSize), bw: bufio.NewWriterSize(tc, 4<<10), key: key}, nil
}

// RoundTrip sends a body-less request to the guest and reads its answer's
// header; the body must be closed.
func (g *guestClient) RoundTrip(req *http.Request) (*http.Response, error) {
	key, err := netip.ParseAddrPort(req.URL.Host)
	if err != nil || req.URL.Scheme != "http" {
		return nil, fmt.Errorf("ingress: guest client: bad guest URL %q", req.URL.Redacted())
	}
	if req.Body != nil && req.Body != http.NoBody {
		// Never sent half: requests with bodies go through http.Transport
		// (inline).
		return nil, errors.New("ingress: guest client: the request has a body")
	}
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		c, reused := g.get(key), true
		if c == nil {
			if c, err = g.newConn(ctx, key); err != nil {
				return nil, err
			}
			reused = false
		}
		resp, err := g.exchange(ctx, c, req)
		if err == nil {
			return resp, nil
		}
		c.tc.Close()
		// A kept connection the guest closed after quiet looked fails
		// before any answer: a request without a body is sent again, once,
		// on a new connection (as http.Transport does).
		if reused && attempt == 0 && ctx.Err() == nil && errors.Is(err, errNoAnswer) {
			continue
		}
		return nil, err
	}
}

// errNoAnswer marks an exchange that failed before the guest sent a byte.
var errNoAnswer = errors.New("the guest closed the connection without an answer")

// exchange writes req on c and reads the answer's header. The body it
// returns owns c from then on.
func (g *guestClient) exchange(ctx context.Context, c *guestConn, req *http.Request) (*http.Response, error) {
	// The request's context bounds the exchange and the body's reads: a
	// client gone, a revocation or the daemon stopping ends a read that
	// waits on a silent guest.
	stop := context.AfterFunc(ctx, func() { _ = c.tc.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (*http.Response, error) {
		stop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	// Nothing was read yet when a write fails: wrapped in errNoAnswer, the
	// request may be sent again.
	if err := req.Write(c.bw); err != nil {
		return fail(fmt.Errorf("%w: %w", errNoAnswer, err))
	}
	if err := c.bw.Flush(); err != nil {
		return fail(fmt.Errorf("%w: %w", errNoAnswer, err))
	}
	trace := httptrace.ContextClientTrace(ctx)
	c.lr.N = guestMaxHeader
	var resp *http.Response
	for n1xx := 0; resp == nil; {
		r, err := http.ReadResponse(c.br, req)
		if err != nil {
			switch {
			case c.lr.N == 0:
				err = errHeaderTooLarge
			case c.lr.N == guestMaxHeader && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)):
				err = fmt.Errorf("%w: %w", errNoAnswer, err)
			}
			return fail(err)
		}
		switch code := r.StatusCode; {
		case code == http.StatusSwitchingProtocols:
			return fail(errors.New("ingress: the guest switched protocols on a request that asked for no upgrade"))
		case code >= 100 && code < 200:
			// 1xx answers (103 Early Hints) go to the client the way
			// http.Transport passes them (ReverseProxy's trace).
			if n1xx++; n1xx > guestMax1xx {
				return fail(errors.New("ingress: the guest sent too many 1xx answers"))
			}
			if trace != nil && trace.Got1xxResponse != nil {
				if err := trace.Got1xxResponse(code, textproto.MIMEHeader(r.Header)); err != nil {
					return fail(err)
				}
			}
		default:
			resp = r
		}
	}
	c.lr.N = unlimited
	resp.Body = &guestBody{g: g, c: c, body: resp.Body, stop: stop, ctx: ctx, keep: !resp.Close}
	return resp, nil
}

// guestBody is a response body of the guest client: the body
// http.ReadResponse made, and the connection it is read from, kept for the
// next request when the answer was read to its end.
type guestBody struct {
	g    *guestClient
	c    *guestConn
	body io.ReadCloser
	ctx  context.Context
	stop func() bool
	keep bool

	err    error
	closed bool
}

func (b *guestBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.body.Read(p)
	if err != nil {
		if err != io.EOF && b.ctx.Err() != nil {
			err = b.ctx.Err() // the deadline the context's end set
		}
		b.err = err
	}
	return n, err
}

// Close ends the body: the connection is kept when the answer was read to
// its end and neither side asked to close, otherwise closed — never
// drained (the standard body's Close reads to the end, which for an
// endless stream is forever).
func (b *guestBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	if b.err != io.EOF {
		b.stop()
		return b.c.tc.Close()
	}
	b.body.Close() // at its end: reads nothing
	// stop reports false when the context ended meanwhile: the
	// connection's deadline is set, it cannot be kept.
	if b.stop() && b.keep && b.c.br.Buffered() == 0 {
		b.g.put(b.c)
		return nil
	}
	return b.c.tc.Close()
}
