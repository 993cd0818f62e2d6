// Package router is the fleet's ingress router: one address for every
// published port in the fleet. A client connects with TLS to
// PORT-ID.DOMAIN; the router reads the ClientHello's server name (SNI)
// without terminating TLS, finds the node that runs sandbox ID (Lookup,
// fed by the controller from the node leases), and splices the raw
// connection — the ClientHello first, replayed — to that node's ingress
// listener, which terminates TLS and applies the port's access rules
// (token, signed URL, public). The router holds no keys and sees no
// plaintext.
//
// Only PORT-ID.DOMAIN names are routed. A node's webhook host
// (hooks.DOMAIN) is not: webhooks name no sandbox in their host, so the
// fleet cannot tell which node a delivery is for; send webhooks to a
// node's own ingress. A connection the router cannot route (no TLS, no
// SNI, a name outside DOMAIN, an unknown sandbox, a ClientHello too large
// or too slow) is closed without contacting any node, logged and counted.
package router

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/sniff"
)

// Config configures a Router. Zero limits take the defaults.
type Config struct {
	// Domain is the fleet's ingress domain: PORT-ID.Domain is routed.
	Domain string
	// Lookup returns the ingress listener (ADDR:PORT) of the node that
	// runs sandbox id.
	Lookup func(id string) (nodeIngressAddr string, ok bool)
	// Logger; nil discards.
	Logger *slog.Logger

	// MaxConns caps the connections open at once (default 10000); more
	// are closed at accept.
	MaxConns int
	// MaxHello caps the ClientHello's size (default 16 KiB + 5, one full
	// TLS record; a post-quantum key share makes ~1.8 KB).
	MaxHello int
	// HelloTimeout bounds the time from accept to a whole ClientHello
	// (default 5s), however slowly its bytes trickle in.
	HelloTimeout time.Duration
	// DialTimeout bounds the dial to a node (default 5s).
	DialTimeout time.Duration
	// IdleTimeout closes a spliced connection that moved no byte in
	// either direction for this long (default 5m).
	IdleTimeout time.Duration
	// Dial dials a node; default a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Stats counts connections by outcome.
type Stats struct {
	Accepted int64 // accepted connections
	Routed   int64 // spliced to a node
	NoTLS    int64 // refused: not a TLS ClientHello (or too large)
	NoSNI    int64 // refused: a ClientHello without a server name
	BadHost  int64 // refused: a server name that is not PORT-ID.Domain
	Unknown  int64 // refused: no node runs the sandbox
	Slow     int64 // refused: no whole ClientHello before HelloTimeout
	Busy     int64 // refused: MaxConns reached
	DialFail int64 // the node's ingress did not answer
	Idle     int64 // closed by IdleTimeout
}

// Router routes TLS connections by SNI. Serve may be called for several
// listeners; Close stops them all and closes every connection.
type Router struct {
	cfg Config
	log *slog.Logger

	st struct {
		accepted, routed, noTLS, noSNI, badHost, unknown, slow, busy, dialFail, idle atomic.Int64
	}
	open atomic.Int64 // connections being served
	wg   sync.WaitGroup
	// logs bounds the refusal log lines (a scan of the fleet address
	// would flood the log otherwise); the counters count them all.
	logs *rate.Limiter
	// ctx ends with Close (dials to nodes).
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards the fields below.
	mu     sync.Mutex
	closed bool
	lns    map[net.Listener]struct{}
	conns  map[net.Conn]struct{}
}

// New makes a Router.
func New(cfg Config) *Router {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 10000
	}
	if cfg.MaxHello <= 0 {
		cfg.MaxHello = 16<<10 + 5
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = 5 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Router{cfg: cfg, log: log, lns: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{},
		logs: rate.NewLimiter(10, 50), ctx: ctx, cancel: cancel}
}

// Stats returns the counters so far.
func (r *Router) Stats() Stats {
	return Stats{
		Accepted: r.st.accepted.Load(), Routed: r.st.routed.Load(), NoTLS: r.st.noTLS.Load(),
		NoSNI: r.st.noSNI.Load(), BadHost: r.st.badHost.Load(), Unknown: r.st.unknown.Load(),
		Slow: r.st.slow.Load(), Busy: r.st.busy.Load(), DialFail: r.st.dialFail.Load(), Idle: r.st.idle.Load(),
	}
}

// ErrClosed is Serve's answer after Close.
var ErrClosed = errors.New("router closed")

// Serve accepts connections on ln until Close (ErrClosed) or a permanent
// accept error. It closes ln when it returns.
func (r *Router) Serve(ln net.Listener) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		_ = ln.Close()
		return ErrClosed
	}
	r.lns[ln] = struct{}{}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.lns, ln)
		r.mu.Unlock()
		_ = ln.Close()
	}()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if r.isClosed() {
				return ErrClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || temporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				r.log.Warn("router: accept", "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("router: accept: %w", err)
		}
		backoff = 0
		r.st.accepted.Add(1)
		if r.open.Add(1) > int64(r.cfg.MaxConns) {
			r.open.Add(-1)
			r.st.busy.Add(1)
			r.refused(r.log, slog.LevelWarn, "router: connection refused: too many connections", "remote", c.RemoteAddr().String(), "max", r.cfg.MaxConns)
			_ = c.Close()
			continue
		}
		if !r.track(c, true) {
			r.open.Add(-1)
			_ = c.Close()
			return ErrClosed
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer r.open.Add(-1)
			defer r.track(c, false)
			r.handle(c)
		}()
	}
}

// temporary reports accept errors that go away (EMFILE and the like
// report Temporary).
func temporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// Close stops every Serve, closes every connection and waits for their
// goroutines.
func (r *Router) Close() error {
	r.cancel()
	r.mu.Lock()
	r.closed = true
	for ln := range r.lns {
		_ = ln.Close()
	}
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	return nil
}

func (r *Router) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// track adds (or removes) c to the set Close closes; false when closed.
func (r *Router) track(c net.Conn, add bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !add {
		delete(r.conns, c)
		return true
	}
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

// handle routes one client connection.
func (r *Router) handle(c net.Conn) {
	defer c.Close()
	log := r.log.With("remote", c.RemoteAddr().String())
	_ = c.SetReadDeadline(time.Now().Add(r.cfg.HelloTimeout))
	br := bufio.NewReaderSize(c, r.cfg.MaxHello)
	hello, err := sniff.ClientHello(br)
	if err != nil {
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			r.st.slow.Add(1)
			r.refused(log, slog.LevelInfo, "router: refused: no whole TLS ClientHello in time", "timeout", r.cfg.HelloTimeout)
		case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
			// closed before saying anything; not worth a log line
			r.st.noTLS.Add(1)
		default:
			r.st.noTLS.Add(1)
			r.refused(log, slog.LevelInfo, "router: refused: not a TLS connection", "err", err)
		}
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if hello.ServerName == "" {
		r.st.noSNI.Add(1)
		r.refused(log, slog.LevelInfo, "router: refused: TLS without a server name (SNI); connect to https://PORT-ID."+r.cfg.Domain)
		return
	}
	port, id, ok := hostname.ParsePortHost(hello.ServerName, r.cfg.Domain)
	if !ok {
		r.st.badHost.Add(1)
		r.refused(log, slog.LevelInfo, "router: refused: server name is not PORT-ID."+r.cfg.Domain, "sni", trim(hello.ServerName))
		return
	}
	log = log.With("sandbox", id, "port", port)
	addr, ok := "", false
	if r.cfg.Lookup != nil {
		addr, ok = r.cfg.Lookup(id)
	}
	if !ok || addr == "" {
		r.st.unknown.Add(1)
		r.refused(log, slog.LevelInfo, "router: refused: no node runs this sandbox")
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.DialTimeout)
	nc, err := r.cfg.Dial(ctx, "tcp", addr)
	cancel()
	if err != nil {
		r.st.dialFail.Add(1)
		r.refused(log, slog.LevelWarn, "router: node ingress unreachable", "node_ingress", addr, "err", err)
		return
	}
	if !r.track(nc, true) {
		_ = nc.Close()
		return
	}
	defer r.track(nc, false)
	defer nc.Close()
	r.st.routed.Add(1)
	start := time.Now()
	in, out, idle := r.splice(sniff.NewConn(c, br), nc)
	if idle {
		r.st.idle.Add(1)
	}
	log.Debug("router: connection done", "node_ingress", addr, "bytes_in", in, "bytes_out", out,
		"duration", time.Since(start), "idle_timeout", idle)
}

// refused logs a refused or failed connection, at most 10 a second
// (bursts of 50); Stats counts every one.
func (r *Router) refused(log *slog.Logger, level slog.Level, msg string, args ...any) {
	if r.logs.Allow() {
		log.Log(context.Background(), level, msg, args...)
	}
}

// trim cuts a server name for a log line.
func trim(s string) string {
	if len(s) > hostname.MaxLen {
		return s[:hostname.MaxLen] + "…"
	}
	return s
}

// splice copies both ways until both are done: an EOF from one side
// half-closes the other's write side (so a client that finished sending
// still gets the answer), an error or IdleTimeout with no byte moving
// either way closes both.
func (r *Router) splice(client *sniff.Conn, node net.Conn) (in, out int64, idle bool) {
	var last atomic.Int64 // unix nanos of the last byte moved
	last.Store(time.Now().UnixNano())
	var idled atomic.Bool
	var wg sync.WaitGroup
	wg.Add(2)
	var stop sync.Once
	closeBoth := func() {
		stop.Do(func() {
			_ = client.Conn.Close()
			_ = node.Close()
		})
	}
	pipe := func(dst, src net.Conn, rd io.Reader, n *int64) {
		defer wg.Done()
		buf := make([]byte, 32<<10) // as io.Copy: 10,000 connections hold 640 MiB of buffers
		for {
			_ = src.SetReadDeadline(time.Unix(0, last.Load()).Add(r.cfg.IdleTimeout))
			k, err := rd.Read(buf)
			if k > 0 {
				last.Store(time.Now().UnixNano())
				_ = dst.SetWriteDeadline(time.Now().Add(r.cfg.IdleTimeout))
				if _, werr := dst.Write(buf[:k]); werr != nil {
					closeBoth()
					return
				}
				*n += int64(k)
			}
			if err == nil {
				continue
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Quiet this way; the other way may be busy.
				if time.Since(time.Unix(0, last.Load())) < r.cfg.IdleTimeout-time.Millisecond {
					continue
				}
				idled.Store(true)
				closeBoth()
				return
			}
			if errors.Is(err, io.EOF) {
				if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
					return
				}
			}
			closeBoth()
			return
		}
	}
	go pipe(node, client.Conn, client, &in)
	go pipe(client.Conn, node, node, &out)
	wg.Wait()
	closeBoth()
	return in, out, idled.Load()
}
