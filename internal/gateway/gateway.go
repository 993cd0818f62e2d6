// Package gateway gives each sandbox its egress gateway: a routed link
// (package link), a synthetic DNS resolver and a transparent proxy listener
// on the link's host address, a per-sandbox interception CA, the live
// policy both consult, and the sandbox's credential pipeline (package
// credentials), which it plugs into the proxy as its request hook. It is
// the one place the daemon attaches and detaches a sandbox's network.
package gateway

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/egress"
	"github.com/cagebox/cagebox/internal/link"
	"github.com/cagebox/cagebox/internal/livepolicy"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/resolver"
	"github.com/cagebox/cagebox/internal/statedir"
)

// Defaults.
const (
	DefaultProxyPort = 15001
	DefaultDNSPort   = 15053
	// caValidity bounds the interception CA; sandboxes living longer get a
	// new CA only by being recreated (documented).
	caValidity = 30 * 24 * time.Hour
)

// Config configures the gateway.
type Config struct {
	// Live holds every sandbox's live policy (required).
	Live *livepolicy.Registry
	// StateDir holds the link allocations and each sandbox's CA.
	StateDir  string
	Pool      netip.Prefix
	ProxyPort uint16
	DNSPort   uint16
	// TableName and IfPrefix select the nftables table and interface prefix
	// (tests use their own so they never touch a running daemon's).
	TableName, IfPrefix string
	// Resolve are explicit upstream overrides "host:port" → addr:port; only
	// they may reach loopback or private addresses.
	Resolve     map[string]netip.AddrPort
	UpstreamCAs *x509.CertPool
	// HostAddrs are the host's addresses it cannot learn from its
	// interfaces (public addresses behind 1:1 NAT); no upstream may have one.
	HostAddrs []netip.Prefix
	// Emit records an audit event (of ev's kind) about a sandbox.
	Emit   func(tenant, sandbox string, ev api.EventPayload)
	Logger *slog.Logger
	// Credentials configures every sandbox's credential pipeline (the
	// exfil scan's mode and bounds).
	Credentials credentials.Config
	// Limits bounds each sandbox's in-flight request bytes, body read
	// times and upstream connections (zero fields: egress' defaults).
	Limits Limits
}

// Limits are the per-sandbox bounds of egress.Config.
type Limits struct {
	InFlightBytes                int64
	BodyIdleTimeout, BodyTimeout time.Duration
	UpstreamConns                int
}

// Gateway manages every sandbox's network.
type Gateway struct {
	cfg   Config
	log   *slog.Logger
	links *link.Manager
	proxy *egress.Proxy

	// mu guards atts.
	mu   sync.Mutex
	atts map[string]*Attachment
}

// Attachment is one sandbox's gateway.
type Attachment struct {
	ID, Tenant string
	Link       *link.Link
	CA         *egress.CA
	// Policy is the sandbox's live policy (package livepolicy).
	Policy  *livepolicy.Sandbox
	Pool    *resolver.Pool
	sandbox *egress.Sandbox
	dns     *resolver.Server
	ln      net.Listener

	// Credentials is the sandbox's credential pipeline: the daemon
	// installs its bindings, the proxy's request hook runs it.
	Credentials *credentials.Pipeline

	// mu guards journaled and observers.
	mu sync.Mutex
	// journaled are the names whose synthetic address is in the journal.
	journaled map[string]bool
	observers map[int]func(api.EventPayload)
	nextObs   int
}

// Observe calls fn with every egress decision (api.EgressAllow,
// EgressDeny, EgressError) the proxy makes for the sandbox from now on,
// until stop. fn must not block.
func (a *Attachment) Observe(fn func(api.EventPayload)) (stop func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.observers == nil {
		a.observers = map[int]func(api.EventPayload){}
	}
	k := a.nextObs
	a.nextObs++
	a.observers[k] = fn
	return func() {
		a.mu.Lock()
		delete(a.observers, k)
		a.mu.Unlock()
	}
}

func (a *Attachment) notify(p api.EventPayload) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, fn := range a.observers {
		fn(p)
	}
}

// New prepares the gateway; Init installs the rules.
func New(cfg Config) (*Gateway, error) {
	if cfg.Live == nil {
		return nil, errors.New("gateway: config: Live is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ProxyPort == 0 {
		cfg.ProxyPort = DefaultProxyPort
	}
	if cfg.DNSPort == 0 {
		cfg.DNSPort = DefaultDNSPort
	}
	if cfg.Emit == nil {
		cfg.Emit = func(string, string, api.EventPayload) {}
	}
	links, err := link.NewManager(link.Config{
		Pool: cfg.Pool, TableName: cfg.TableName, IfPrefix: cfg.IfPrefix,
		ProxyPort: cfg.ProxyPort, DNSPort: cfg.DNSPort,
		StateDir: filepath.Join(cfg.StateDir, "links"),
	}, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, links: links, atts: map[string]*Attachment{}}
	if err := g.cfg.Credentials.Check(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.proxy, err = egress.New(egress.Config{
		Lookup:      g.lookup,
		OnEvent:     g.onProxyEvent,
		Hook:        g.credentialsHook,
		OnDenied:    g.deniedAlert,
		Resolve:     cfg.Resolve,
		UpstreamCAs: cfg.UpstreamCAs,
		HostAddrs:   cfg.HostAddrs,
		Logger:      cfg.Logger,

		MaxInFlightBytesPerSandbox: cfg.Limits.InFlightBytes,
		BodyIdleTimeout:            cfg.Limits.BodyIdleTimeout,
		BodyTimeout:                cfg.Limits.BodyTimeout,
		MaxUpstreamConnsPerSandbox: cfg.Limits.UpstreamConns,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	return g, nil
}

// Init (re)installs the nftables table; keep says which sandboxes still
// exist, so links of the others are removed; ours lists every sandbox the
// daemon's store records (nothing else is removed, see link.Recover).
func (g *Gateway) Init(ctx context.Context, keep func(id string) bool, ours []string) error {
	if err := g.links.Init(ctx); err != nil {
		return fmt.Errorf("gateway: install network rules: %w", err)
	}
	if err := g.links.Recover(ctx, keep, ours); err != nil {
		return fmt.Errorf("gateway: recover links: %w", err)
	}
	return nil
}

// lookup identifies the sandbox of a redirected connection by the local
// address it arrived on (its own gateway listener) and its source (the
// link's guest address), and recovers the original destination.
func (g *Gateway) lookup(c net.Conn) (*egress.Sandbox, netip.AddrPort, bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil, netip.AddrPort{}, false
	}
	remote, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return nil, netip.AddrPort{}, false
	}
	l, ok := g.links.LookupByAddr(remote.Addr().Unmap())
	if !ok {
		return nil, netip.AddrPort{}, false
	}
	g.mu.Lock()
	a := g.atts[l.ID]
	g.mu.Unlock()
	if a == nil || a.Link.GuestAddr != remote.Addr().Unmap() {
		return nil, netip.AddrPort{}, false
	}
	local, err := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil || local.Addr().Unmap() != a.Link.HostAddr {
		return nil, netip.AddrPort{}, false
	}
	dst, err := link.OriginalDst(tc)
	if err != nil {
		g.log.Warn("original destination", "sandbox", a.ID, "err", err)
		return nil, netip.AddrPort{}, false
	}
	return a.sandbox, dst, true
}

func (g *Gateway) onProxyEvent(ev egress.Event) {
	d := api.Egress{
		Host: ev.Host, Port: ev.Port, Protocol: ev.Protocol, Method: ev.Method,
		Path: ev.Path, Rule: ev.Rule, Verdict: ev.Verdict, Reason: ev.Reason,
		Status: ev.Status, BytesUp: ev.BytesUp, BytesDown: ev.BytesDown,
		DurationMS: float64(ev.Duration) / 1e6,
	}
	var p api.EventPayload = api.EgressAllow(d)
	switch ev.Verdict {
	case egress.VerdictDeny:
		p = api.EgressDeny(d)
	case egress.VerdictError:
		p = api.EgressError(d)
	}
	g.cfg.Emit(ev.Tenant, ev.Sandbox, p)
	a, ok := g.Get(ev.Sandbox)
	if !ok {
		return
	}
	a.notify(p)
	if ev.Verdict == egress.VerdictAllow && (ev.BytesUp > 0 || ev.BytesDown > 0) {
		a.Policy.Account(context.Background(), ev.Host, ev.Rule, ev.BytesUp, ev.BytesDown, 0)
	}
}

// Live returns the live policy registry.
func (g *Gateway) Live() *livepolicy.Registry { return g.cfg.Live }

// CloseConns closes a sandbox's open proxy connections (a freeze).
func (g *Gateway) CloseConns(id string) int { return g.proxy.CloseSandbox(id) }

func (g *Gateway) caPath(id string) string { return filepath.Join(g.cfg.StateDir, "ca", id+".pem") }

// AttachMode says what of a sandbox's network exists when Attach is called.
type AttachMode int

const (
	// AttachNew: nothing; Attach makes the link and a new CA.
	AttachNew AttachMode = iota
	// AttachResume: after a daemon restart the link exists and the CA is
	// loaded from disk (the guest already trusts it).
	AttachResume
	// AttachClaim: the link exists (PrepareLink made it for a pooled
	// sandbox); Attach makes a new CA and everything else.
	AttachClaim
)

// Attach creates the sandbox's link (AttachNew), CA, resolver and proxy
// listener, binding them to the tenant and policy.
//
// doc is the sandbox's policy at create (generation 1) and ref the named
// policy it follows; on resume the live policy's newest generation is
// loaded from the store instead.
func (g *Gateway) Attach(ctx context.Context, id, tenant string, doc *policy.Document, ref string, mode AttachMode) (_ *Attachment, err error) {
	resume := mode == AttachResume
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	lp, err := g.cfg.Live.Attach(ctx, id, tenant, doc, ref, resume)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	undo.Add(func() { g.cfg.Live.Detach(context.Background(), id, !resume) })
	a := &Attachment{ID: id, Tenant: tenant, Policy: lp,
		Credentials: credentials.New(g.cfg.Credentials, func(ev api.EventPayload) { g.cfg.Emit(tenant, id, ev) })}
	if resume {
		l, ok := g.links.Get(id)
		if !ok {
			return nil, fmt.Errorf("gateway: no link recorded for %s", id)
		}
		a.Link = l
		pem, err := os.ReadFile(g.caPath(id))
		if err != nil {
			return nil, fmt.Errorf("gateway: load CA of %s: %w", id, err)
		}
		if a.CA, err = egress.LoadCA(pem); err != nil {
			return nil, fmt.Errorf("gateway: load CA of %s: %w", id, err)
		}
	} else {
		if mode == AttachClaim {
			l, ok := g.links.Get(id)
			if !ok {
				return nil, fmt.Errorf("gateway: no link was prepared for %s", id)
			}
			a.Link = l
		} else {
			l, err := g.links.Create(ctx, id)
			if err != nil {
				return nil, fmt.Errorf("gateway: create link: %w", err)
			}
			undo.Add(func() { _ = g.links.Destroy(context.Background(), id) })
			a.Link = l
		}
		if a.CA, err = egress.NewCA(id, caValidity); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		pem, err := a.CA.MarshalPEM()
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		if err := statedir.Make(filepath.Dir(g.caPath(id))); err != nil {
			return nil, err
		}
		if err := os.WriteFile(g.caPath(id), pem, 0o600); err != nil {
			return nil, fmt.Errorf("gateway: store CA: %w", err)
		}
		undo.Add(func() { _ = os.Remove(g.caPath(id)) })
	}
	a.Pool, err = resolver.NewPool(resolver.DefaultV4Prefix, netip.Prefix{})
	if err != nil {
		return nil, err
	}
	a.journaled = map[string]bool{}
	if resume {
		g.replayNames(a)
	} else {
		undo.Add(func() { _ = os.Remove(g.namesPath(id)) })
	}
	a.sandbox = &egress.Sandbox{ID: id, Tenant: tenant, CA: a.CA, Policy: policyAdapter{a.Policy}, NameOf: a.Pool.Lookup}
	a.dns, err = resolver.Start(resolver.Config{
		Addr:  netip.AddrPortFrom(a.Link.HostAddr, g.cfg.DNSPort).String(),
		Pool:  a.Pool,
		Allow: a.Policy.NamesHost,
		OnQuery: func(q resolver.QueryEvent) {
			if q.Rcode == "NOERROR" && q.Answer != "" {
				g.journalName(a, q.Name)
			}
			g.cfg.Emit(tenant, id, api.DNSQuery{Name: q.Name, Type: q.Type, Rcode: q.Rcode, Answer: q.Answer, Reason: q.Reason})
		},
		Logger: g.log.With("sandbox", id),
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: start resolver: %w", err)
	}
	undo.Add(func() { a.dns.Close() })
	a.ln, err = net.Listen("tcp4", netip.AddrPortFrom(a.Link.HostAddr, g.cfg.ProxyPort).String())
	if err != nil {
		return nil, fmt.Errorf("gateway: proxy listener: %w", err)
	}
	g.mu.Lock()
	g.atts[id] = a
	g.mu.Unlock()
	go func() {
		if err := g.proxy.Serve(a.ln); err != nil && !errors.Is(err, net.ErrClosed) {
			g.log.Debug("proxy listener ended", "sandbox", id, "err", err)
		}
	}()
	return a, nil
}

// PrepareLink makes the link of a sandbox that is not attached yet (a
// pooled sandbox: its guest starts on the link, and Attach with
// AttachClaim binds the gateway to it when a tenant claims it). Until
// then nothing listens on the link's gateway address: the guest reaches
// nothing. DropLink removes it.
func (g *Gateway) PrepareLink(ctx context.Context, id string) (*link.Link, error) {
	l, err := g.links.Create(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("gateway: create link: %w", err)
	}
	return l, nil
}

// DropLink removes a link PrepareLink made (idempotent).
func (g *Gateway) DropLink(ctx context.Context, id string) error {
	return g.links.Destroy(ctx, id)
}

// Get returns a sandbox's attachment.
func (g *Gateway) Get(id string) (*Attachment, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	a, ok := g.atts[id]
	return a, ok
}

// Detach stops the sandbox's listener and resolver and, unless keepLink,
// removes its link and CA. Idempotent.
func (g *Gateway) Detach(ctx context.Context, id string, keepLink bool) error {
	g.mu.Lock()
	a := g.atts[id]
	delete(g.atts, id)
	g.mu.Unlock()
	if a != nil {
		a.ln.Close()
		a.dns.Close()
	}
	g.cfg.Live.Detach(ctx, id, !keepLink)
	if keepLink {
		return nil
	}
	_ = os.Remove(g.caPath(id))
	_ = os.Remove(g.namesPath(id))
	if err := g.links.Destroy(ctx, id); err != nil {
		return fmt.Errorf("gateway: destroy link of %s: %w", id, err)
	}
	return nil
}

// Close stops every listener and removes the nftables table (sandboxes
// keep their links, set down, until the next daemon re-attaches them).
func (g *Gateway) Close(ctx context.Context) error {
	g.mu.Lock()
	ids := make([]string, 0, len(g.atts))
	for id := range g.atts {
		ids = append(ids, id)
	}
	g.mu.Unlock()
	for _, id := range ids {
		_ = g.Detach(ctx, id, true)
	}
	_ = g.proxy.Close()
	return g.links.Close(ctx)
}

// policyAdapter lets the egress proxy consult a live policy without the two
// packages importing each other.
type policyAdapter struct{ l *livepolicy.Sandbox }

func (p policyAdapter) Decide(ctx context.Context, r *egress.Request) (egress.Decision, error) {
	if r.Protocol == "http" && r.Method == "" && r.Path == "" {
		// The proxy's connection-level question before intercepting TLS:
		// could any request to this name be allowed? Every request on the
		// connection is still decided on its own.
		if p.l.AllowsName(r.Host) {
			return egress.Decision{Allow: true, Rule: "connection"}, nil
		}
		// Nothing to this name can be allowed: answer with the rule that
		// decides a plain GET of "/" (a deny rule's name, or "default").
		d, err := p.l.Explain(ctx, &policy.Request{Host: r.Host, Port: r.Port, Protocol: "http", Method: "GET", Path: "/"})
		if err != nil {
			return egress.Decision{}, err
		}
		return egress.Decision{Allow: false, Rule: d.Rule, Reason: d.Reason}, nil
	}
	d, err := p.l.Decide(ctx, &policy.Request{
		Host: r.Host, Port: r.Port, Protocol: r.Protocol, Method: r.Method, Path: r.Path,
		WebSocket: r.WebSocket, ContentType: r.ContentType, Accept: r.Accept,
		RawQuery: r.RawQuery, Header: r.Header, BodySize: r.BodySize, Peek: r.Peek,
	})
	if err != nil {
		return egress.Decision{}, err
	}
	return egress.Decision{Allow: d.Allow, Rule: d.Rule, Reason: d.Reason}, nil
}

// The synthetic name→address map is journaled (names in the order they
// were first answered) so a restarted daemon rebuilds the same map: the pool
// assigns sequentially, so replaying the names in order gives every name its
// old address, and guests' cached answers keep working.
func (g *Gateway) namesPath(id string) string {
	return filepath.Join(g.cfg.StateDir, "dns", id+".names")
}

func (g *Gateway) journalName(a *Attachment, name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.journaled[name] {
		return
	}
	p := g.namesPath(a.ID)
	if err := statedir.Make(filepath.Dir(p)); err != nil {
		g.log.Warn("journal synthetic name", "sandbox", a.ID, "err", err)
		return
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		g.log.Warn("journal synthetic name", "sandbox", a.ID, "err", err)
		return
	}
	defer f.Close()
	if _, err := f.WriteString(name + "\n"); err == nil {
		a.journaled[name] = true
	}
}

func (g *Gateway) replayNames(a *Attachment) {
	b, err := os.ReadFile(g.namesPath(a.ID))
	if err != nil {
		return
	}
	for _, name := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if name == "" {
			continue
		}
		if _, _, err := a.Pool.Assign(name); err != nil {
			g.log.Warn("replay synthetic name", "sandbox", a.ID, "name", name, "err", err)
			continue
		}
		a.journaled[name] = true
	}
}

// credentialsHook is the proxy's request hook: the sandbox's credential
// pipeline (package credentials), adapted to egress' types as policyAdapter
// adapts the policy.
func (g *Gateway) credentialsHook(sb *egress.Sandbox, r *http.Request) (*egress.Refusal, egress.ResponseFilter) {
	a, ok := g.Get(sb.ID)
	if !ok {
		return &egress.Refusal{Rule: "secret", Reason: "sandbox is detaching"}, nil
	}
	ref, filter := a.Credentials.Request(r)
	if ref != nil {
		return egressRefusal(ref), nil
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = refusalBody{r.Body}
	}
	if host, rule, ok := g.spendRule(a, r); ok {
		// The response's usage is read as it streams: ask for it
		// uncompressed.
		r.Header.Del("Accept-Encoding")
		prev := filter
		filter = func(res *http.Response) error {
			if prev != nil {
				if err := prev(res); err != nil {
					return err
				}
			}
			a.Policy.MeterResponse(r.Context(), res, host, rule)
			return nil
		}
	}
	return nil, filter
}

// spendRule says whether r's response counts toward a spend budget, and
// under which host and deciding rule.
func (g *Gateway) spendRule(a *Attachment, r *http.Request) (host, rule string, ok bool) {
	if a.Policy == nil {
		return "", "", false
	}
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		host, port = r.Host, "443"
	}
	if !a.Policy.Meter(host, "") && !a.Policy.MetersAnyRule() {
		return "", "", false
	}
	p, _ := strconv.Atoi(port)
	d, err := a.Policy.Explain(r.Context(), &policy.Request{Host: host, Port: p, Method: r.Method, Path: r.URL.EscapedPath(), BodySize: r.ContentLength})
	if err != nil || !d.Allow || !a.Policy.Meter(host, d.Rule) {
		return "", "", false
	}
	return host, d.Rule, true
}

// deniedAlert lets the sandbox's pipeline see a request the proxy refused
// (an alert when it carries a placeholder).
func (g *Gateway) deniedAlert(sb *egress.Sandbox, r *http.Request, host string) {
	if a, ok := g.Get(sb.ID); ok {
		a.Credentials.Denied(r, host)
	}
}

func egressRefusal(r *credentials.Refusal) *egress.Refusal {
	return &egress.Refusal{Rule: r.Rule, Reason: r.Reason, Status: r.Status}
}

// refusalBody turns the pipeline's refusal of a streaming body into the
// proxy's, which answers it by name.
type refusalBody struct{ io.ReadCloser }

func (b refusalBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var ref *credentials.Refusal
	if err != nil && errors.As(err, &ref) {
		return n, egressRefusal(ref)
	}
	return n, err
}
