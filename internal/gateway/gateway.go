// Package gateway gives each sandbox its egress gateway: a routed link
// (package link), a synthetic DNS resolver and a transparent proxy listener
// on the link's host address, a per-sandbox interception CA, and the live
// policy both consult. It is the one place the daemon attaches and detaches
// a sandbox's network.
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
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/egress"
	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/link"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/resign"
	"github.com/cagebox/cagebox/internal/resolver"
	"github.com/cagebox/cagebox/internal/substitute"
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
	// Emit records an audit event.
	Emit   func(tenant, sandbox, kind string, data any)
	Logger *slog.Logger
	// Exfil is what happens to a request carrying a credential-shaped
	// string that is not one of the sandbox's placeholders: "flag" (an
	// event; the default), "block" (403) or "off".
	Exfil string
	// ExfilScan bounds the exfil scan of one request (zero fields:
	// substitute's defaults). Its Body is how much of a body is read ahead
	// and scanned. Past a bound the rest of the request is not scanned: an
	// event under "flag", a 403 under "block" (which refuses what it cannot
	// scan, bodies longer than Body included).
	ExfilScan substitute.Budget
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

// Exfil modes.
const (
	ExfilFlag  = "flag"
	ExfilBlock = "block"
	ExfilOff   = "off"
)

// unboundVerifyMax bounds the body read to tell whether a request to a host
// an HMAC binding is not bound to was signed with its placeholder key (an
// alert, not a protection: that signature is worth nothing upstream).
const unboundVerifyMax = 64 << 10

// Gateway manages every sandbox's network.
type Gateway struct {
	cfg   Config
	det   *substitute.Detector
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
	Policy     *policy.Live
	Pool       *resolver.Pool
	sandbox    *egress.Sandbox
	dns        *resolver.Server
	ln         net.Listener

	// mu guards journaled and secrets.
	mu sync.Mutex
	// journaled are the names whose synthetic address is in the journal.
	journaled map[string]bool
	// secrets swaps placeholders for real values (nil: no bindings).
	secrets *substitute.Set
	// sigv4 re-signs AWS requests signed with placeholder keys.
	sigv4 []*SigV4Binding
	// hmac re-signs requests carrying a placeholder-keyed HMAC signature.
	hmac []*HMACBinding
}

// HMACBinding: the guest signs with a placeholder key as Signer describes;
// on requests to Hosts over intercepted TLS the gateway verifies that
// signature and re-signs with the real key (Real, read per request).
type HMACBinding struct {
	Name  string
	Hosts []string
	// Signer holds the configuration and the placeholder key; Real is
	// filled in per request on a copy.
	Signer *resign.HMAC
	Real   func() ([]byte, error)
}

// SetHMAC installs the sandbox's HMAC re-signing bindings.
func (a *Attachment) SetHMAC(bs []*HMACBinding) {
	a.mu.Lock()
	a.hmac = bs
	a.mu.Unlock()
}

func (a *Attachment) hmacs() []*HMACBinding {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.hmac
}

// SigV4Binding: the guest signs with Placeholder; on requests to Hosts over
// intercepted TLS the gateway verifies that signature and re-signs with the
// real key.
type SigV4Binding struct {
	Name        string
	Hosts       []string
	Placeholder resign.AWSCreds
	Real        func() (resign.AWSCreds, error)
}

// SetSigV4 installs the sandbox's re-signing bindings.
func (a *Attachment) SetSigV4(bs []*SigV4Binding) {
	a.mu.Lock()
	a.sigv4 = bs
	a.mu.Unlock()
}

func (a *Attachment) sigV4() []*SigV4Binding {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sigv4
}

// known tells the exfil scan which strings are this sandbox's own
// placeholders.
type known struct {
	set   *substitute.Set
	sigv4 []*SigV4Binding
}

func (k known) IsPlaceholder(s string) bool {
	if k.set != nil && k.set.IsPlaceholder(s) {
		return true
	}
	for _, b := range k.sigv4 {
		if s == b.Placeholder.AccessKeyID || s == b.Placeholder.SecretAccessKey {
			return true
		}
	}
	return false
}

// SetSecrets installs the sandbox's credential bindings.
func (a *Attachment) SetSecrets(s *substitute.Set) {
	a.mu.Lock()
	a.secrets = s
	a.mu.Unlock()
}

// Secrets returns the sandbox's substitution set (nil: none).
func (a *Attachment) Secrets() *substitute.Set { return a.secretSet() }

func (a *Attachment) secretSet() *substitute.Set {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.secrets
}

// New prepares the gateway; Init installs the rules.
func New(cfg Config) (*Gateway, error) {
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
		cfg.Emit = func(string, string, string, any) {}
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
	switch cfg.Exfil {
	case "":
		g.cfg.Exfil = ExfilFlag
	case ExfilFlag, ExfilBlock, ExfilOff:
	default:
		return nil, fmt.Errorf("gateway: exfil mode %q: use flag, block or off", cfg.Exfil)
	}
	if g.cfg.Exfil != ExfilOff {
		if g.det, err = substitute.NewDetector(); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	if g.cfg.ExfilScan.Body == 0 {
		g.cfg.ExfilScan.Body = substitute.DefaultScanBody
	}
	if g.cfg.ExfilScan.Bytes <= 0 {
		g.cfg.ExfilScan.Bytes = substitute.DefaultScanBytes
	}
	if g.cfg.ExfilScan.Time <= 0 {
		g.cfg.ExfilScan.Time = substitute.DefaultScanTime
	}
	g.proxy, err = egress.New(egress.Config{
		Lookup:      g.lookup,
		OnEvent:     g.onProxyEvent,
		Hook:        g.substitute,
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
	kind := "egress.allow"
	switch ev.Verdict {
	case "deny":
		kind = "egress.deny"
	case "error":
		kind = "egress.error"
	}
	g.cfg.Emit(ev.Tenant, ev.Sandbox, kind, map[string]any{
		"host": ev.Host, "port": ev.Port, "protocol": ev.Protocol, "method": ev.Method,
		"path": ev.Path, "rule": ev.Rule, "verdict": ev.Verdict, "reason": ev.Reason,
		"status": ev.Status, "bytes_up": ev.BytesUp, "bytes_down": ev.BytesDown,
		"duration_ms": float64(ev.Duration) / 1e6,
	})
}

func (g *Gateway) caPath(id string) string { return filepath.Join(g.cfg.StateDir, "ca", id+".pem") }

// Attach creates the sandbox's link, CA, resolver and proxy listener.
// resume is true after a daemon restart: the link exists and the CA is
// loaded from disk (the guest already trusts it).
func (g *Gateway) Attach(ctx context.Context, id, tenant string, pol *policy.Policy, resume bool) (_ *Attachment, err error) {
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	a := &Attachment{ID: id, Tenant: tenant, Policy: policy.NewLive(pol)}
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
		l, err := g.links.Create(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("gateway: create link: %w", err)
		}
		undo.Add(func() { _ = g.links.Destroy(context.Background(), id) })
		a.Link = l
		if a.CA, err = egress.NewCA(id, caValidity); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		pem, err := a.CA.MarshalPEM()
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(g.caPath(id)), 0o700); err != nil {
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
			g.cfg.Emit(tenant, id, "dns.query", map[string]any{"name": q.Name, "type": q.Type, "rcode": q.Rcode, "answer": q.Answer, "reason": q.Reason})
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
type policyAdapter struct{ l *policy.Live }

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
		d, err := p.l.Decide(ctx, &policy.Request{Host: r.Host, Port: r.Port, Protocol: "http", Method: "GET", Path: "/"})
		if err != nil {
			return egress.Decision{}, err
		}
		return egress.Decision{Allow: false, Rule: d.Rule, Reason: d.Reason}, nil
	}
	d, err := p.l.Decide(ctx, &policy.Request{
		Host: r.Host, Port: r.Port, Protocol: r.Protocol, Method: r.Method, Path: r.Path,
		WebSocket: r.WebSocket, ContentType: r.ContentType, Accept: r.Accept,
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
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
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

// substitute is the proxy's request hook: placeholders become real values
// on requests to their bound hosts over intercepted TLS, and anything else
// carrying a placeholder is refused (and raises an alert). Every real value
// put into the request (swapped, injected, or a re-signer's key id and
// signatures) is recorded for the response filter it returns, which
// scrubs those values out of the response (secret.reflected) and, after a
// WebSocket upgrade, checks the guest's frames for placeholders.
func (g *Gateway) substitute(sb *egress.Sandbox, r *http.Request) (*egress.Refusal, egress.ResponseFilter) {
	a, ok := g.Get(sb.ID)
	if !ok {
		return &egress.Refusal{Rule: "secret", Reason: "sandbox is detaching"}, nil
	}
	set := a.secretSet()
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	// What can be refused from the headers alone is refused before any
	// of the body is read.
	if ref := g.resignSigV4(sb, a, r, host, nil, true); ref != nil {
		return ref, nil
	}
	// Credential-shaped strings that are not our placeholders: scanned on
	// the request as the guest sent it, before any swap.
	if ref := g.exfilScan(sb, a, r, host, set); ref != nil {
		return ref, nil
	}
	reals := &credentials.Reals{}
	if ref := g.resignSigV4(sb, a, r, host, reals, false); ref != nil {
		return ref, nil
	}
	if ref := g.resignHMAC(sb, a, r, host, reals); ref != nil {
		return ref, nil
	}
	streaming := false
	if set != nil {
		res, err := set.ApplyReport(r, hostname.Canonical(host), r.TLS != nil, func(name, real, ph string) {
			reals.Add(credentials.Swap{Name: name, Real: real, Placeholder: ph})
		})
		if err != nil {
			g.cfg.Emit(sb.Tenant, sb.ID, "secret.error", map[string]any{"host": host, "error": err.Error()})
			return &egress.Refusal{Rule: "secret", Reason: err.Error()}, nil
		}
		if res.Refusal != nil {
			kind := "secret.refused"
			if res.Alert {
				kind = "secret.alert"
			}
			g.cfg.Emit(sb.Tenant, sb.ID, kind, map[string]any{"host": host, "method": r.Method, "path": r.URL.Path, "rule": res.Refusal.Rule, "reason": res.Refusal.Reason})
			return &egress.Refusal{Rule: res.Refusal.Rule, Reason: res.Refusal.Reason}, nil
		}
		if len(res.Replaced) > 0 {
			g.cfg.Emit(sb.Tenant, sb.ID, "secret.used", map[string]any{"host": host, "method": r.Method, "path": r.URL.Path, "names": res.Replaced})
		}
		if res.Streaming {
			reals.SetPending()
			streaming = true
		}
	}
	if r.TLS == nil || (reals.Len() == 0 && !a.bound(host)) {
		return nil, nil
	}
	// Frames must stay readable on a bound host; a response that may carry
	// a real value must come in an encoding the scrub decodes.
	r.Header.Del("Sec-WebSocket-Extensions")
	if reals.Len() > 0 || streaming {
		credentials.NarrowAcceptEncoding(r)
	}
	method, path := r.Method, r.URL.Path
	scrub := &credentials.Scrub{
		Reals:             reals,
		Placeholder:       a.placeholderIn,
		PlaceholderWindow: a.placeholderWindow(),
		OnReflect: func(ref credentials.Reflection) {
			g.cfg.Emit(sb.Tenant, sb.ID, "secret.reflected", map[string]any{"host": host, "method": method, "path": path, "name": ref.Name, "where": ref.Where, "encoding": ref.Encoding})
		},
		OnAlert: func(al credentials.Alert) {
			g.cfg.Emit(sb.Tenant, sb.ID, "secret.alert", map[string]any{"host": host, "method": method, "path": path, "rule": "secret:" + al.Name, "reason": al.Reason})
		},
	}
	return nil, scrub.Filter
}

// bound reports whether any of the sandbox's bindings is bound to host.
func (a *Attachment) bound(host string) bool {
	if set := a.secretSet(); set != nil && set.Bound(host) {
		return true
	}
	for _, b := range a.sigV4() {
		if hostname.MatchAny(b.Hosts, hostname.Canonical(host)) {
			return true
		}
	}
	for _, b := range a.hmacs() {
		if hostname.MatchAny(b.Hosts, hostname.Canonical(host)) {
			return true
		}
	}
	return false
}

// placeholderIn reports the binding whose placeholder text carries, in any
// form (the AWS key id placeholder literally).
func (a *Attachment) placeholderIn(text string) (string, bool) {
	if set := a.secretSet(); set != nil {
		if name, ok := set.Contains(text); ok {
			return name, true
		}
	}
	for _, b := range a.sigV4() {
		if strings.Contains(text, b.Placeholder.AccessKeyID) {
			return b.Name, true
		}
	}
	return "", false
}

func (a *Attachment) placeholderWindow() int {
	w := 0
	if set := a.secretSet(); set != nil {
		w = set.Window()
	}
	for _, b := range a.sigV4() {
		w = max(w, len(b.Placeholder.AccessKeyID))
	}
	return w
}

// exfilScan scans r for credential-shaped strings within the configured
// budget. Under "block" a finding, or a part of the request the scan could
// not cover (a spent budget, a body longer than the scan window or of
// unknown length, a body that failed to arrive), is a 403: block refuses
// what it cannot scan. Under "flag" findings and spent budgets are events.
func (g *Gateway) exfilScan(sb *egress.Sandbox, a *Attachment, r *http.Request, host string, set *substitute.Set) *egress.Refusal {
	if g.det == nil {
		return nil
	}
	b := g.cfg.ExfilScan
	if g.cfg.Exfil != ExfilBlock && r.ContentLength < 0 {
		// A stream is not read ahead under flag: a client waiting for an
		// answer before sending more would stall.
		b.Body = 0
	}
	res, err := g.det.ScanBudget(r, b, known{set, a.sigV4()})
	for _, f := range res.Findings {
		g.cfg.Emit(sb.Tenant, sb.ID, "secret.exfil_suspect", map[string]any{"host": host, "method": r.Method, "path": r.URL.Path, "rule": f.Rule, "where": f.Where, "preview": f.Preview, "mode": g.cfg.Exfil})
	}
	block := g.cfg.Exfil == ExfilBlock
	if block && len(res.Findings) > 0 {
		f := res.Findings[0]
		return &egress.Refusal{Rule: f.Rule, Reason: "request carries a credential-shaped string (" + f.Rule + " in " + f.Where + ", …" + strings.TrimPrefix(f.Preview, "…") + ")"}
	}
	if res.Complete {
		return nil
	}
	if res.Limit == substitute.LimitBody && !block && err == nil {
		return nil // under flag, bodies are scanned as far as the window reaches
	}
	g.cfg.Emit(sb.Tenant, sb.ID, "secret.exfil_unscanned", map[string]any{"host": host, "method": r.Method, "path": r.URL.Path, "limit": res.Limit, "unscanned": res.Gap, "scanned_bytes": res.Scanned, "mode": g.cfg.Exfil})
	if !block {
		return nil
	}
	reason := "the exfil scan (--exfil block) could not cover the request: " + res.Gap + "; block refuses what it cannot scan"
	switch res.Limit {
	case substitute.LimitBytes:
		reason += fmt.Sprintf(" (scan budget %d bytes, --exfil-scan-bytes)", g.cfg.ExfilScan.Bytes)
	case substitute.LimitTime:
		reason += fmt.Sprintf(" (scan time budget %s, --exfil-scan-time)", g.cfg.ExfilScan.Time)
	case substitute.LimitBody:
		reason += fmt.Sprintf(" (scan window %d body bytes, --exfil-scan-body); send less", b.Body)
	}
	return &egress.Refusal{Rule: "builtin:exfil-unscanned", Reason: reason}
}

// deniedAlert raises secret.alert when a request the policy refused carries
// one of the sandbox's placeholders in its URL or headers: the request is
// already refused, but a credential heading somewhere it may not go is what
// an operator wants to hear about.
func (g *Gateway) deniedAlert(sb *egress.Sandbox, r *http.Request, host string) {
	a, ok := g.Get(sb.ID)
	if !ok {
		return
	}
	var text strings.Builder
	text.WriteString(r.URL.String())
	for k, vs := range r.Header {
		for _, v := range vs {
			text.WriteString("\n" + k + ": " + v)
		}
	}
	t := text.String()
	name, found := "", false
	if set := a.secretSet(); set != nil {
		name, found = set.Contains(t)
	}
	for _, b := range a.sigV4() {
		if !found && strings.Contains(t, b.Placeholder.AccessKeyID) {
			name, found = b.Name, true
		}
	}
	if found {
		g.cfg.Emit(sb.Tenant, sb.ID, "secret.alert", map[string]any{"host": host, "method": r.Method, "path": r.URL.Path, "rule": "secret:" + name, "reason": fmt.Sprintf("placeholder for %s sent to %s, which the policy denies", name, host)})
	}
}

// resignHMAC handles requests carrying an HMAC signature made with a
// sandbox's placeholder key: re-signed with the real key for a bound host
// over intercepted TLS; refused with an alert when such a signature heads
// anywhere else; refused when it does not verify on a bound host. A
// request without the binding's header passes untouched.
func (g *Gateway) resignHMAC(sb *egress.Sandbox, a *Attachment, r *http.Request, host string, reals *credentials.Reals) *egress.Refusal {
	for _, b := range a.hmacs() {
		if r.Header.Get(b.Signer.Header) == "" {
			continue
		}
		refuse := func(kind, reason string) *egress.Refusal {
			g.cfg.Emit(sb.Tenant, sb.ID, kind, map[string]any{"host": host, "method": r.Method, "path": r.URL.Path, "rule": "secret:" + b.Name, "reason": reason})
			return &egress.Refusal{Rule: "secret:" + b.Name, Reason: reason}
		}
		if r.TLS == nil || !hostname.MatchAny(b.Hosts, host) {
			// Another header of the same name is none of our business;
			// a signature made with our placeholder key is — but only
			// worth an alert, so it is checked only when that is cheap:
			// a signature over no body or a small one of known length.
			if signsSmallBody(b.Signer, r) && b.Signer.Verify(r) == nil {
				return refuse("secret.alert", fmt.Sprintf("request signed with the placeholder key of %s sent to %s (bound to %s)", b.Name, host, strings.Join(b.Hosts, ", ")))
			}
			continue
		}
		real, err := b.Real()
		if err != nil {
			return refuse("secret.refused", fmt.Sprintf("%s cannot be used: %v", b.Name, err))
		}
		s := *b.Signer
		s.Real = real
		s.Report = func(real, guest string) { reals.Add(credentials.Swap{Name: b.Name, Real: real, Placeholder: guest}) }
		if err := s.Resign(r); err != nil {
			ref := refuse("secret.refused", fmt.Sprintf("HMAC signature of %s: %v", b.Name, err))
			if errors.Is(err, resign.ErrBodyTooLarge) {
				ref.Status = http.StatusRequestEntityTooLarge
			}
			return ref
		}
		g.cfg.Emit(sb.Tenant, sb.ID, "secret.used", map[string]any{"host": host, "method": r.Method, "path": r.URL.Path, "names": []string{b.Name}, "resigned": "hmac"})
		return nil
	}
	return nil
}

// resignSigV4 handles requests signed with a sandbox's placeholder AWS key:
// re-signed with the real key for a bound host over intercepted TLS,
// refused (with an alert) anywhere else or when the signature does not
// verify. It runs before the generic swap, which must not touch them. With
// headersOnly it only refuses what the headers show (the placeholder key
// headed for a host it is not bound to) and reads no body; otherwise every
// real-key output it puts in is recorded in reals for the response scrub.
func (g *Gateway) resignSigV4(sb *egress.Sandbox, a *Attachment, r *http.Request, host string, reals *credentials.Reals, headersOnly bool) *egress.Refusal {
	bs := a.sigV4()
	if len(bs) == 0 {
		return nil
	}
	cred := r.Header.Get("Authorization") + " " + r.URL.Query().Get("X-Amz-Credential")
	for _, b := range bs {
		if !strings.Contains(cred, b.Placeholder.AccessKeyID) {
			continue
		}
		refuse := func(kind, reason string) *egress.Refusal {
			g.cfg.Emit(sb.Tenant, sb.ID, kind, map[string]any{"host": host, "method": r.Method, "path": r.URL.Path, "rule": "secret:" + b.Name, "reason": reason})
			return &egress.Refusal{Rule: "secret:" + b.Name, Reason: reason}
		}
		if r.TLS == nil || !hostname.MatchAny(b.Hosts, host) {
			return refuse("secret.alert", fmt.Sprintf("AWS request signed with the placeholder key of %s sent to %s (bound to %s)", b.Name, host, strings.Join(b.Hosts, ", ")))
		}
		if headersOnly {
			return nil
		}
		real, err := b.Real()
		if err != nil {
			return refuse("secret.refused", fmt.Sprintf("%s cannot be used: %v", b.Name, err))
		}
		s := &resign.SigV4{Placeholder: b.Placeholder, Real: real, Report: func(real, guest string) {
			reals.Add(credentials.Swap{Name: b.Name, Real: real, Placeholder: guest})
		}}
		if err := s.Resign(r); err != nil {
			ref := refuse("secret.refused", fmt.Sprintf("AWS signature of %s: %v", b.Name, err))
			if errors.Is(err, resign.ErrBodyTooLarge) {
				ref.Status = http.StatusRequestEntityTooLarge
			}
			return ref
		}
		// The body may still fail its check as it streams (a payload
		// hash, an aws-chunked signature): refuse it then, by name.
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &refusingBody{ReadCloser: r.Body, refuse: func(err error) error {
				return refuse("secret.refused", fmt.Sprintf("AWS signature of %s: %v", b.Name, err))
			}}
		}
		g.cfg.Emit(sb.Tenant, sb.ID, "secret.used", map[string]any{"host": host, "method": r.Method, "path": r.URL.Path, "names": []string{b.Name}, "resigned": "sigv4"})
		return nil
	}
	return nil
}

// signsSmallBody reports whether checking h's signature on r reads at most
// unboundVerifyMax body bytes.
func signsSmallBody(h *resign.HMAC, r *http.Request) bool {
	if !slices.Contains(h.Canonical, "body") || r.Body == nil || r.Body == http.NoBody {
		return true
	}
	return r.ContentLength >= 0 && r.ContentLength <= unboundVerifyMax
}

// refusingBody turns a re-signer's failure on a streaming body into an
// egress refusal, so the sandbox gets a 403 naming the secret instead of a
// broken upstream request.
type refusingBody struct {
	io.ReadCloser
	once   sync.Once
	refuse func(error) error
	err    error
}

func (b *refusingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && (errors.Is(err, resign.ErrBadSignature) || errors.Is(err, resign.ErrUnsupported)) {
		b.once.Do(func() { b.err = b.refuse(err) })
		return n, b.err
	}
	return n, err
}
