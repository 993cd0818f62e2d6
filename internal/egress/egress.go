// Package egress is cagebox's transparent, deny-by-default L7 proxy: the only
// way out of a sandbox.
//
// Every TCP connection a sandbox opens is redirected (nftables REDIRECT) to
// one listener. The proxy learns the sandbox and the original destination
// from Config.Lookup, then classifies the flow by its first bytes:
//
//   - a TLS ClientHello: the SNI must be the name the sandbox's synthetic DNS
//     gave the destination address; the proxy terminates TLS with a leaf from
//     the sandbox's CA (HTTP/1.1 or HTTP/2 by ALPN), evaluates the policy for
//     every request, refuses domain fronting, and forwards allowed requests
//     over verified TLS to the same name and port;
//   - plain HTTP: the same, with the name taken from the destination and the
//     Host header required to match it;
//   - anything else: spliced to the upstream only if the policy allows raw
//     TCP to that name and port.
//
// A literal IP destination (one the sandbox's DNS never handed out) has no
// name and is refused. Names are compared in the canonical form of package
// hostname (ASCII lower case, no trailing dot). Upstream connections resolve
// the name on the host, refuse private, loopback, link-local, metadata and
// cloud host-endpoint addresses (see safedial.CheckAddr; rule RuleBlockedAddress)
// and the host's own addresses (learned from its interfaces and local
// routes, plus Config.HostAddrs; rule RuleHostAddress), and dial the checked
// address itself. Only names with an explicit Config.Resolve override (per
// host and port) may reach such upstreams.
//
// A denied HTTP request is answered with 403 and a JSON body naming the rule;
// an upstream address refused by a built-in rule with 502 naming the rule;
// every request and flow produces an Event.
package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/safedial"
	"github.com/cagebox/cagebox/internal/sniff"
)

// Request is what the policy decides on. Protocol is "http" for an HTTP
// request (plain or intercepted TLS) and "tcp" for a raw flow.
//
// A connection-level question about an intercepted TLS connection has
// Protocol "http" and empty Method and Path: the policy should allow it when
// some request to Host:Port could be allowed; every request on the
// connection is then decided on its own.
type Request struct {
	Host     string
	Port     int
	Protocol string // "http" | "tcp"
	// Method is upper-case: the method sent upstream.
	Method string
	// Path is the request path in canonical escaped form (see
	// canonicalPath), without the query: exactly what is sent upstream. A
	// policy decodes it once.
	Path        string
	WebSocket   bool
	ContentType string
	Accept      string
	// Query, Header and BodySize (Content-Length, -1 unknown) are for
	// policy conditions; nil/0 on connection-level questions.
	RawQuery string // parsed only if a condition reads it
	Header   map[string][]string
	BodySize int64
	// Peek, on HTTP requests, reads up to n bytes of the body ahead (once;
	// the body still reaches the upstream whole) for a held request's
	// preview. The guest's body holds placeholders, never real values.
	Peek func(n int) []byte
}

// Decision is a policy's answer. Rule names the rule that decided (shown to
// the sandbox on a denial); Reason says why.
type Decision struct {
	Allow        bool
	Rule, Reason string
}

// Policy decides requests and flows. An error means the request is refused:
// the proxy never fails open.
type Policy interface {
	Decide(ctx context.Context, r *Request) (Decision, error)
}

// PolicyFunc adapts a function to Policy.
type PolicyFunc func(ctx context.Context, r *Request) (Decision, error)

// Decide calls f.
func (f PolicyFunc) Decide(ctx context.Context, r *Request) (Decision, error) { return f(ctx, r) }

// Sandbox is what the proxy knows about the sender of a connection.
type Sandbox struct {
	ID, Tenant string
	CA         *CA
	Policy     Policy
	// NameOf maps a synthetic destination address (handed out by the
	// sandbox's DNS) to its name; ok=false for anything else, such as a
	// literal IP the guest dialled.
	NameOf func(netip.Addr) (string, bool)
}

func (sb *Sandbox) nameOf(a netip.Addr) (string, bool) {
	if sb.NameOf == nil {
		return "", false
	}
	name, ok := sb.NameOf(a.Unmap())
	name = hostname.Canonical(name)
	return name, ok && name != ""
}

// Verdicts of an Event.
const (
	VerdictAllow = "allow"
	VerdictDeny  = "deny"
	VerdictError = "error"
)

// Event records one request (HTTP) or flow (TCP, refused TLS connection).
// Protocol is "https", "http" or "tcp".
type Event struct {
	Sandbox, Tenant string
	Host            string
	Port            int
	Protocol        string
	Method, Path    string
	Rule            string
	Verdict         string // "allow" | "deny" | "error"
	Reason          string
	Status          int
	BytesUp         int64 // sandbox → upstream (request bodies, tunnel bytes)
	BytesDown       int64 // upstream → sandbox (response bodies, tunnel bytes)
	Duration        time.Duration
	Time            time.Time
}

// RequestHook lets a later stage rewrite an allowed request before it goes
// upstream (placeholder swap, re-signing) or refuse it. It is called with the
// request as decided; changes to its query, headers and body are forwarded,
// while its method and path are what the policy decided on and must not
// change (a request whose hook changed them is refused). A non-nil *Refusal
// answers 403 (or Refusal.Status) with that rule and reason. Reading the
// body counts against the sandbox's in-flight bytes and body timeouts; a
// read that fails with ErrInFlightLimit or ErrBodyTimeout is answered with
// that limit whatever the hook returns. A non-nil ResponseFilter is applied
// to the upstream's response to this request (see ResponseFilter).
type RequestHook func(sb *Sandbox, r *http.Request) (*Refusal, ResponseFilter)

// Refusal is a RequestHook's denial: 403 unless Status says otherwise (413
// for a body too large to check, say).
type Refusal struct {
	Rule, Reason string
	Status       int
}

// Error makes a Refusal an error, so that a hook's body reader can refuse a
// request as its body streams: the proxy answers a request whose body
// failed with a *Refusal (in its chain) with that refusal, if the answer
// has not started.
func (r *Refusal) Error() string { return r.Reason }

// Config configures a Proxy.
type Config struct {
	// Lookup identifies the sandbox of an accepted connection (by its remote
	// address) and returns the original destination (the caller recovers it,
	// e.g. via SO_ORIGINAL_DST). ok=false closes the connection.
	Lookup func(c net.Conn) (sb *Sandbox, origDst netip.AddrPort, ok bool)
	// OnEvent receives every event, synchronously; it must not block long.
	OnEvent func(Event)
	// Hook runs on every allowed HTTP request; may be nil.
	Hook RequestHook
	// OnDenied, when set, sees every HTTP request the proxy itself refuses
	// (policy, fronting, literal IPs, …) before the 403 is written, e.g. to
	// raise an alert for a credential placeholder heading somewhere it may
	// not go. It must not read the body or block long.
	OnDenied func(sb *Sandbox, r *http.Request, host string)

	// Resolve holds explicit upstream overrides, "host:port" → address. Only
	// these names may reach loopback or private addresses.
	Resolve map[string]netip.AddrPort
	// HostAddrs are addresses (or prefixes) of this host that no upstream
	// may have, besides those the proxy learns from the host's interfaces
	// and local routes: its public addresses behind 1:1 NAT, which only the
	// operator knows (the daemon's --host-public-addr).
	HostAddrs []netip.Prefix
	// UpstreamCAs are roots trusted in addition to the system roots.
	UpstreamCAs *x509.CertPool
	// Resolver resolves upstream names on the host; nil means the default.
	Resolver *net.Resolver
	Logger   *slog.Logger

	// PeekTimeout bounds the wait for a flow's first bytes (default 2s). A
	// flow that sends nothing in that time is treated as raw TCP.
	PeekTimeout time.Duration
	// HandshakeTimeout bounds the sandbox-side TLS handshake (default 10s).
	HandshakeTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers (default 30s).
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes idle sandbox connections (default 2m).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds request headers (default 64 KiB).
	MaxHeaderBytes int
	// MaxConnsPerSandbox bounds concurrent connections per sandbox (default 512).
	MaxConnsPerSandbox int

	// MaxInFlightBytesPerSandbox bounds the request body bytes a sandbox's
	// requests hold in the gateway at once: read from the sandbox and not yet
	// sent upstream, e.g. buffered by a hook to check a signature or scan for
	// credentials (default 64 MiB). A request that would go over it is
	// refused with 503 naming the limit.
	MaxInFlightBytesPerSandbox int64
	// BodyIdleTimeout bounds each wait for more of a request body (default
	// 30s); BodyTimeout bounds reading a whole request body (default 10m).
	// Past either the request is refused with 408 (or aborted upstream).
	BodyIdleTimeout, BodyTimeout time.Duration
	// MaxUpstreamConnsPerSandbox bounds a sandbox's open upstream
	// connections (default 128); each sandbox has its own connection pool.
	// A request needing one more waits up to UpstreamConnWait (default 2s)
	// for one to close, then is refused with 503.
	MaxUpstreamConnsPerSandbox int
	UpstreamConnWait           time.Duration
}

func (c *Config) setDefaults() {
	if c.PeekTimeout <= 0 {
		c.PeekTimeout = 2 * time.Second
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = 30 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Minute
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = 64 << 10
	}
	if c.MaxConnsPerSandbox <= 0 {
		c.MaxConnsPerSandbox = 512
	}
	if c.MaxInFlightBytesPerSandbox <= 0 {
		c.MaxInFlightBytesPerSandbox = 64 << 20
	}
	if c.BodyIdleTimeout <= 0 {
		c.BodyIdleTimeout = 30 * time.Second
	}
	if c.BodyTimeout <= 0 {
		c.BodyTimeout = 10 * time.Minute
	}
	if c.MaxUpstreamConnsPerSandbox <= 0 {
		c.MaxUpstreamConnsPerSandbox = 128
	}
	if c.UpstreamConnWait <= 0 {
		c.UpstreamConnWait = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Proxy is the transparent egress proxy.
type Proxy struct {
	cfg    Config
	log    *slog.Logger
	guard  *safedial.Dialer
	rp     *httputil.ReverseProxy
	srv    *http.Server // serves HTTP/1.1 and HTTP/2 on handed-over conns
	conns  *connQueue   // the srv's listener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards the fields below.
	mu         sync.Mutex
	closed     bool
	listeners  map[net.Listener]struct{}
	open       map[net.Conn]string // accepted sandbox connections → sandbox
	perSandbox map[string]int
	limits     map[string]*sbState // per sandbox; swept when idle
	lastSweep  time.Time
	served     map[net.Conn]*connInfo // conns handed to srv
}

// sbIdle is how long a sandbox without connections keeps its upstream pool
// (so a guest opening a connection per request still reuses upstream
// connections); states idle longer are swept as new connections arrive.
const sbIdle = 2 * time.Minute

// New returns a proxy; Serve starts it.
func New(cfg Config) (*Proxy, error) {
	if cfg.Lookup == nil {
		return nil, errors.New("egress: config: Lookup is required")
	}
	for k := range cfg.Resolve {
		host, port, err := net.SplitHostPort(k)
		if err != nil || host == "" {
			return nil, fmt.Errorf("egress: config: resolve override %q: want host:port", k)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("egress: config: resolve override %q: bad port", k)
		}
	}
	cfg.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		cfg:        cfg,
		log:        cfg.Logger,
		guard:      safedial.New(safedial.Config{Overrides: cfg.Resolve, Resolver: cfg.Resolver, HostAddrs: cfg.HostAddrs}),
		ctx:        ctx,
		cancel:     cancel,
		listeners:  make(map[net.Listener]struct{}),
		open:       make(map[net.Conn]string),
		perSandbox: make(map[string]int),
		limits:     make(map[string]*sbState),
		served:     make(map[net.Conn]*connInfo),
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		ModifyResponse: modifyResponse,
		Transport:      roundTripper(p.roundTrip),
		FlushInterval:  -1,
		ErrorHandler:   p.upstreamError,
		ErrorLog:       slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	p.conns = newConnQueue()
	p.srv = &http.Server{
		Handler:           http.HandlerFunc(p.serveHTTP),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ConnContext:       p.connContext,
		ConnState:         p.connState,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: 250},
	}
	p.srv.Protocols = new(http.Protocols)
	p.srv.Protocols.SetHTTP1(true)
	p.srv.Protocols.SetHTTP2(true)
	go func() { _ = p.srv.Serve(p.conns) }()
	return p, nil
}

// newTransport is one sandbox's upstream transport, dialling with dial.
func (p *Proxy) newTransport(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if extra := p.cfg.UpstreamCAs; extra != nil {
		// A CertPool cannot be merged with the system pool, so verify by
		// hand: system roots first, then the extra roots. Same checks as the
		// standard verifier (chain, expiry, name).
		tc.InsecureSkipVerify = true
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			return verifyUpstream(cs, extra)
		}
	}
	return &http.Transport{
		Proxy:                  nil, // never an environment proxy
		DialContext:            dial,
		TLSClientConfig:        tc,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           1024,
		MaxIdleConnsPerHost:    64,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		DisableCompression:     true, // pass Accept-Encoding and bodies through untouched
		MaxResponseHeaderBytes: 1 << 20,
	}
}

func verifyUpstream(cs tls.ConnectionState, extra *x509.CertPool) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("upstream sent no certificate")
	}
	if cs.ServerName == "" {
		return errors.New("upstream verification: no server name")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{DNSName: cs.ServerName, Intermediates: inter}
	_, err := cs.PeerCertificates[0].Verify(opts) // system roots
	if err == nil {
		return nil
	}
	opts.Roots = extra
	if _, err2 := cs.PeerCertificates[0].Verify(opts); err2 == nil {
		return nil
	}
	return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
}

// Serve accepts redirected sandbox connections on l until Close, then
// returns nil; it closes l. It may be called for several listeners.
func (p *Proxy) Serve(l net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = l.Close()
		return nil
	}
	p.listeners[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, l)
		p.mu.Unlock()
	}()
	var delay time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if p.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				p.log.Warn("egress accept", "err", err, "retry", delay)
				time.Sleep(delay)
				continue
			}
			return fmt.Errorf("egress accept: %w", err)
		}
		delay = 0
		// Add under mu, after the closed check, so it never races Close's Wait.
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return nil
		}
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Close stops every listener passed to Serve, closes every sandbox connection
// and waits for their handlers.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for l := range p.listeners {
		_ = l.Close()
	}
	for c := range p.open {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.cancel()
	_ = p.srv.Close()
	p.wg.Wait()
	p.mu.Lock()
	for _, l := range p.limits {
		l.transport.CloseIdleConnections()
	}
	p.mu.Unlock()
	return nil
}

// acquire registers an accepted connection and returns its sandbox's
// state; nil if the proxy is closed or the sandbox is at its connection
// limit.
func (p *Proxy) acquire(c net.Conn, sandbox string) *sbState {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.perSandbox[sandbox] >= p.cfg.MaxConnsPerSandbox {
		return nil
	}
	p.perSandbox[sandbox]++
	p.open[c] = sandbox
	l := p.limits[sandbox]
	if l == nil {
		l = p.newSBState()
		p.limits[sandbox] = l
	}
	l.idleSince = time.Time{}
	if now := time.Now(); now.Sub(p.lastSweep) > sbIdle/4 {
		p.lastSweep = now
		for id, st := range p.limits {
			if !st.idleSince.IsZero() && now.Sub(st.idleSince) > sbIdle {
				st.transport.CloseIdleConnections()
				delete(p.limits, id)
			}
		}
	}
	return l
}

// CloseSandbox closes every open connection of a sandbox (a freeze, or a
// policy that no longer allows what they were for); their handlers end
// and the guest sees its connections reset. New connections are decided
// as usual. It returns how many it closed.
func (p *Proxy) CloseSandbox(sandbox string) int {
	p.mu.Lock()
	var cs []net.Conn
	for c, id := range p.open {
		if id == sandbox {
			cs = append(cs, c)
		}
	}
	p.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
	return len(cs)
}

func (p *Proxy) release(c net.Conn, sandbox string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.open, c)
	if p.perSandbox[sandbox]--; p.perSandbox[sandbox] <= 0 {
		delete(p.perSandbox, sandbox)
		// No request of the sandbox runs any more (a connection is
		// released after its handlers); its pool stays a while.
		if l := p.limits[sandbox]; l != nil {
			l.idleSince = time.Now()
		}
	}
}

func (p *Proxy) emit(sb *Sandbox, ev Event) {
	ev.Sandbox, ev.Tenant = sb.ID, sb.Tenant
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if ev.Duration == 0 {
		ev.Duration = time.Since(ev.Time)
	}
	if p.log.Enabled(context.Background(), slog.LevelDebug) {
		p.log.Debug("egress", "sandbox", ev.Sandbox, "host", ev.Host, "port", ev.Port,
			"protocol", ev.Protocol, "method", ev.Method, "path", ev.Path, "verdict", ev.Verdict,
			"rule", ev.Rule, "reason", ev.Reason, "status", ev.Status,
			"up", ev.BytesUp, "down", ev.BytesDown, "duration", ev.Duration)
	}
	if p.cfg.OnEvent != nil {
		p.cfg.OnEvent(ev)
	}
}

// decide asks the sandbox's policy; no policy or an error is a refusal.
func (p *Proxy) decide(ctx context.Context, sb *Sandbox, r *Request) (d Decision, verdict string) {
	if sb.Policy == nil {
		return Decision{Rule: "default", Reason: "no policy"}, VerdictDeny
	}
	defer func() {
		if v := recover(); v != nil {
			p.log.Error("egress policy panic", "sandbox", sb.ID, "host", r.Host, "panic", v)
			d, verdict = Decision{Reason: "policy unavailable"}, VerdictError
		}
	}()
	d, err := sb.Policy.Decide(ctx, r)
	if err != nil {
		p.log.Warn("egress policy error", "sandbox", sb.ID, "host", r.Host, "err", err)
		return Decision{Rule: d.Rule, Reason: "policy unavailable"}, VerdictError
	}
	if !d.Allow {
		return d, VerdictDeny
	}
	return d, VerdictAllow
}

// handle serves one accepted sandbox connection.
func (p *Proxy) handle(c net.Conn) {
	sb, dst, ok := p.cfg.Lookup(c)
	if !ok || sb == nil {
		p.log.Warn("egress: connection from unknown source", "remote", c.RemoteAddr())
		_ = c.Close()
		return
	}
	start := time.Now()
	lim := p.acquire(c, sb.ID)
	if lim == nil {
		_ = c.Close()
		if !p.isClosed() {
			p.emit(sb, Event{Port: int(dst.Port()), Protocol: "tcp", Verdict: VerdictDeny,
				Rule: "builtin:conn-limit", Reason: "too many connections", Time: start})
		}
		return
	}
	defer p.release(c, sb.ID)
	defer c.Close()

	br := bufio.NewReaderSize(c, 4096)
	pc := sniff.NewConn(c, br)
	_ = c.SetReadDeadline(start.Add(p.cfg.PeekTimeout))
	kind, err := sniff.Classify(br)
	if err == nil && kind == sniff.Silent {
		// Server-speaks-first protocols send nothing: splice them if raw
		// TCP is allowed here. Otherwise this may just be a slow client:
		// wait longer for its first bytes.
		if name, ok := sb.nameOf(dst.Addr()); ok {
			if _, v := p.decide(p.ctx, sb, &Request{Host: name, Port: int(dst.Port()), Protocol: "tcp"}); v == VerdictAllow {
				_ = c.SetReadDeadline(time.Time{})
				p.serveTCP(pc, sb, lim, dst, start)
				return
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(p.cfg.HandshakeTimeout))
		kind, err = sniff.Classify(br)
	}
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		return // closed before saying anything
	}
	switch kind {
	case sniff.TLS:
		p.serveTLS(pc, sb, lim, dst, start)
	case sniff.HTTP:
		name, ok := sb.nameOf(dst.Addr())
		p.serveConn(pc, &connInfo{sb: sb, lim: lim, dst: dst, scheme: "http", name: name, named: ok})
	default:
		p.serveTCP(pc, sb, lim, dst, start)
	}
}

// serveTLS terminates a sandbox TLS connection after checking its SNI.
func (p *Proxy) serveTLS(pc *sniff.Conn, sb *Sandbox, lim *sbState, dst netip.AddrPort, start time.Time) {
	info := &connInfo{sb: sb, lim: lim, dst: dst, scheme: "https", named: true}
	var refusal *Event
	refuse := func(host, rule, reason string) error {
		refusal = &Event{Host: host, Port: int(dst.Port()), Protocol: "https", Verdict: VerdictDeny,
			Rule: rule, Reason: reason, Time: start}
		return errors.New(reason)
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
			sni := hostname.Canonical(hi.ServerName)
			want, ok := sb.nameOf(dst.Addr())
			switch {
			case !ok:
				return nil, refuse(sni, "builtin:literal-ip", "destination is a literal IP address, not a name from the sandbox's DNS")
			case sni == "":
				return nil, refuse(want, "builtin:no-sni", "TLS without a server name (SNI)")
			case sni != want:
				return nil, refuse(sni, "builtin:sni-mismatch", fmt.Sprintf("TLS server name %q does not match the destination %q", sni, want))
			case sb.CA == nil:
				return nil, refuse(sni, "builtin:no-ca", "sandbox has no CA")
			}
			info.name = sni
			d, verdict := p.decide(hi.Context(), sb, &Request{Host: sni, Port: int(dst.Port()), Protocol: "http"})
			if verdict != VerdictAllow {
				// Intercept anyway, so the sandbox gets a 403 naming the
				// rule instead of a bare TLS failure; nothing goes upstream.
				info.connDeny, info.connVerdict = &d, verdict
			}
			leaf, err := sb.CA.leaf(sni)
			if err != nil {
				p.log.Error("egress leaf certificate", "sandbox", sb.ID, "err", err)
				return nil, refuse(sni, "builtin:no-ca", "no certificate")
			}
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*leaf},
				NextProtos:   []string{"h2", "http/1.1"},
			}, nil
		},
	}
	tc := tls.Server(pc, cfg)
	_ = pc.SetDeadline(time.Now().Add(p.cfg.HandshakeTimeout))
	err := tc.HandshakeContext(p.ctx)
	_ = pc.SetDeadline(time.Time{})
	if err != nil {
		switch {
		case refusal != nil:
			p.emit(sb, *refusal)
		case info.name != "":
			// The name was fine; the sandbox gave up (often: it does not
			// trust its CA). Worth an event: it is what the operator debugs.
			p.emit(sb, Event{Host: info.name, Port: int(dst.Port()), Protocol: "https", Verdict: VerdictError,
				Reason: "sandbox TLS handshake failed", Time: start})
		default:
			p.log.Debug("egress tls handshake", "sandbox", sb.ID, "err", err)
		}
		return
	}
	p.serveConn(tc, info)
}

// serveConn hands an HTTP connection (TLS-terminated or plain) to the shared
// server and waits until it is closed or hijacked and its handlers are done.
func (p *Proxy) serveConn(c net.Conn, info *connInfo) {
	info.done = make(chan struct{})
	p.mu.Lock()
	p.served[c] = info
	p.mu.Unlock()
	if !p.conns.push(c) {
		p.mu.Lock()
		delete(p.served, c)
		p.mu.Unlock()
		return
	}
	select {
	case <-info.done:
		// No request can start once the conn is closed or hijacked; wait
		// for those still running (a WebSocket tunnel, an h2 stream).
		info.handlers.Wait()
	case <-p.ctx.Done():
		// Close is tearing every connection down.
	}
}

// connInfo is what the HTTP handler knows about the connection a request
// arrived on.
type connInfo struct {
	sb          *Sandbox
	lim         *sbState
	dst         netip.AddrPort
	scheme      string // "https" | "http"
	name        string // the destination's name (the SNI for https)
	named       bool   // false: the guest dialled a literal IP
	connDeny    *Decision
	connVerdict string

	done     chan struct{}
	doneOnce sync.Once
	handlers sync.WaitGroup
}

type connInfoKey struct{}

func (p *Proxy) connContext(ctx context.Context, c net.Conn) context.Context {
	p.mu.Lock()
	info := p.served[c]
	p.mu.Unlock()
	return context.WithValue(ctx, connInfoKey{}, info)
}

func (p *Proxy) connState(c net.Conn, st http.ConnState) {
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	p.mu.Lock()
	info := p.served[c]
	delete(p.served, c)
	p.mu.Unlock()
	if info != nil {
		info.doneOnce.Do(func() { close(info.done) })
	}
}

// connQueue is the listener of the shared HTTP server: serveConn pushes
// connections into it.
type connQueue struct {
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newConnQueue() *connQueue {
	return &connQueue{ch: make(chan net.Conn), closed: make(chan struct{})}
}

func (q *connQueue) push(c net.Conn) bool {
	select {
	case q.ch <- c:
		return true
	case <-q.closed:
		return false
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.closed:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.closed) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return queueAddr{} }

type queueAddr struct{}

func (queueAddr) Network() string { return "egress" }
func (queueAddr) String() string  { return "egress" }
