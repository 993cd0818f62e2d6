package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/ingress"
	"github.com/cagebox/cagebox/internal/store"
)

// Limits of published ports.
const (
	MaxPorts       = 32
	DefaultURLTTL  = time.Hour
	MaxURLTTL      = 30 * 24 * time.Hour
	portWakeReason = "ingress"
)

// Ports is the manager's service of published ports, keyed by sandbox id
// (Manager.Ports): the port table and its tokens, signed URLs, what the
// ingress listener resolves a request to (it is the listener's backend:
// Resolve, Begin, Guest), the ports each link admits, and revocation. The
// manager calls it as sandboxes are made and go.
type Ports struct {
	m *Manager
	// mu guards ingress and extraPorts.
	mu         sync.Mutex
	ingress    *Ingress
	extraPorts func(ctx context.Context, id string) []uint16
	// cache holds published ports for ingress.
	cache portCache
}

// Ingress is what the manager needs from the daemon's ingress listener.
type Ingress struct {
	// Signer makes signed URLs.
	Signer *ingress.Signer
	// URL and PathURL are a port's URLs (host and path form).
	URL, PathURL func(id string, port uint16) string
	// OnRevoke runs once access to port of sandbox id has changed and
	// the change is visible to Resolve: the port was unpublished, published
	// again (a new token), expired, or (port 0: every port) its sandbox
	// was destroyed. The listener cuts what is under way to it and drops
	// idle connections (ingress.Server.Revoke).
	OnRevoke func(id string, port uint16)
}

// revoke tells the ingress listener that access to port of sandbox id
// (0: every port) has changed.
func (pt *Ports) revoke(id string, port uint16) {
	if in := pt.ingressCfg(); in != nil && in.OnRevoke != nil {
		in.OnRevoke(id, port)
	}
}

// SetIngress tells the manager about the daemon's ingress listener (nil:
// none; ports are still recorded and published, without URLs).
func (pt *Ports) SetIngress(in *Ingress) {
	pt.mu.Lock()
	pt.ingress = in
	pt.mu.Unlock()
}

func (pt *Ports) ingressCfg() *Ingress {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return pt.ingress
}

func checkPortSpec(p api.PortSpec) (time.Duration, error) {
	if p.Port < 1 || p.Port > 65535 {
		return 0, invalid("port %d: want a TCP port 1-65535", p.Port)
	}
	ttl, err := parseDuration("ttl", p.TTL)
	if err != nil {
		return 0, err
	}
	return ttl, nil
}

func (pt *Ports) portView(p *store.Port, token string) api.Port {
	v := api.Port{Port: p.Port, Public: p.Public, ExpiresAt: p.ExpiresAt, CreatedAt: p.CreatedAt, Token: token}
	if in := pt.ingressCfg(); in != nil {
		v.URL = in.URL(p.SandboxID, uint16(p.Port))
		v.PathURL = in.PathURL(p.SandboxID, uint16(p.Port))
	}
	return v
}

// AddPort publishes a port of a sandbox of tenant ("" = any). Publishing
// a published port again gives it a new token (the old token and every
// signed URL made with it stop working).
func (pt *Ports) AddPort(ctx context.Context, tenant, id string, spec api.PortSpec) (*api.Port, error) {
	ttl, err := checkPortSpec(spec)
	if err != nil {
		return nil, err
	}
	r, err := pt.m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return nil, notFound(id, err)
	}
	switch r.Status {
	case StatusDestroyed, StatusRemoving, StatusFailed:
		return nil, fmt.Errorf("%w: sandbox %s is %s", errdefs.ErrConflict, id, r.Status)
	}
	existing, err := pt.m.cfg.Store.ListPorts(ctx, "", id)
	if err != nil {
		return nil, err
	}
	if len(existing) >= MaxPorts && !slices.ContainsFunc(existing, func(p *store.Port) bool { return p.Port == spec.Port }) {
		return nil, invalid("sandbox %s already publishes %d ports, the limit", id, MaxPorts)
	}
	token := ingress.NewToken()
	p := &store.Port{SandboxID: id, TenantID: r.TenantID, Port: spec.Port, Public: spec.Public, TokenHash: ingress.HashToken(token)}
	if ttl > 0 {
		exp := pt.m.cfg.Now().Add(ttl)
		p.ExpiresAt = &exp
	}
	err = pt.m.cfg.Store.PutPort(ctx, p)
	pt.forgetPorts(id) // also on failure: the store may have changed
	// A new token (or, on failure, maybe no port): what the old token
	// opened goes.
	pt.revoke(id, uint16(spec.Port))
	if err != nil {
		return nil, fmt.Errorf("publish port: %w", err)
	}
	if err := pt.syncPublished(ctx, id); err != nil {
		_ = pt.m.cfg.Store.DeletePort(context.Background(), "", id, spec.Port)
		pt.forgetPorts(id)
		pt.revoke(id, uint16(spec.Port))
		return nil, err
	}
	pt.m.log.Info("port published", "sandbox", id, "port", spec.Port, "public", spec.Public)
	if spec.Public {
		token = "" // not needed; its hash only keeps signatures unforgeable
	}
	v := pt.portView(p, token)
	return &v, nil
}

// SetExtraPorts adds ports the link admits besides the published ones
// (a webhook's or relay's target port, delivered through
// ingress.Server.Send); call SyncPublished after they change.
func (pt *Ports) SetExtraPorts(fn func(ctx context.Context, id string) []uint16) {
	pt.mu.Lock()
	pt.extraPorts = fn
	pt.mu.Unlock()
}

// SyncPublished makes a sandbox link's admitted ports its published ports
// (unexpired) plus its extra ports.
func (pt *Ports) SyncPublished(ctx context.Context, id string) error {
	return pt.syncPublished(ctx, id)
}

// syncPublished makes the link's published ports the store's (unexpired).
func (pt *Ports) syncPublished(ctx context.Context, id string) error {
	gw := pt.m.cfg.Gateway
	if gw == nil {
		return nil
	}
	ps, err := pt.m.cfg.Store.ListPorts(ctx, "", id)
	if err != nil {
		return err
	}
	now := pt.m.cfg.Now()
	var ports []uint16
	for _, p := range ps {
		if p.ExpiresAt == nil || now.Before(*p.ExpiresAt) {
			ports = append(ports, uint16(p.Port))
		}
	}
	pt.mu.Lock()
	extra := pt.extraPorts
	pt.mu.Unlock()
	if extra != nil {
		ports = append(ports, extra(ctx, id)...)
	}
	if _, ok := gw.Links().Get(id); !ok {
		return nil // no link (stopped or pooled): nothing to admit
	}
	if err := gw.Links().SetPublished(id, ports); err != nil {
		return fmt.Errorf("publish ports of %s: %w", id, err)
	}
	return nil
}

// RemovePort unpublishes a port.
func (pt *Ports) RemovePort(ctx context.Context, tenant, id string, port int) error {
	if _, err := pt.m.cfg.Store.GetSandbox(ctx, tenant, id); err != nil {
		return notFound(id, err)
	}
	err := pt.m.cfg.Store.DeletePort(ctx, tenant, id, port)
	pt.forgetPorts(id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: port %d of %s is not published (cagebox port ls %s)", errdefs.ErrNotFound, port, id, id)
		}
		return err
	}
	err = pt.syncPublished(ctx, id)
	pt.revoke(id, uint16(port))
	return err
}

// ListPorts lists a sandbox's published ports (no tokens).
func (pt *Ports) ListPorts(ctx context.Context, tenant, id string) ([]api.Port, error) {
	if _, err := pt.m.cfg.Store.GetSandbox(ctx, tenant, id); err != nil {
		return nil, notFound(id, err)
	}
	ps, err := pt.m.cfg.Store.ListPorts(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	out := make([]api.Port, 0, len(ps))
	for _, p := range ps {
		out = append(out, pt.portView(p, ""))
	}
	return out, nil
}

// PortURL makes a signed URL of a published, non-public port.
func (pt *Ports) PortURL(ctx context.Context, tenant, id string, port int, ttlStr string) (*api.PortURL, error) {
	ttl, err := parseDuration("ttl", ttlStr)
	if err != nil {
		return nil, err
	}
	if ttl == 0 {
		ttl = DefaultURLTTL
	}
	if ttl > MaxURLTTL {
		return nil, invalid("ttl: %s is longer than the limit of %s", ttl, MaxURLTTL)
	}
	if _, err := pt.m.cfg.Store.GetSandbox(ctx, tenant, id); err != nil {
		return nil, notFound(id, err)
	}
	p, err := pt.m.cfg.Store.GetPort(ctx, tenant, id, port)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("%w: port %d of %s is not published (cagebox port add %s %d)", errdefs.ErrNotFound, port, id, id, port)
		}
		return nil, err
	}
	in := pt.ingressCfg()
	if in == nil || in.Signer == nil {
		return nil, fmt.Errorf("%w: the daemon runs no ingress listener: start it with --ingress ADDR --ingress-domain DOMAIN", errdefs.ErrConflict)
	}
	exp := pt.m.cfg.Now().Add(ttl).Truncate(time.Second)
	if p.ExpiresAt != nil && p.ExpiresAt.Before(exp) {
		exp = p.ExpiresAt.Truncate(time.Second)
	}
	u := in.URL(id, uint16(port)) + "?" + ingress.SigParam + "=" + in.Signer.Sign(id, uint16(port), exp, p.TokenHash)
	return &api.PortURL{URL: u, ExpiresAt: exp.UTC()}, nil
}

// publishOnCreate publishes a create request's ports.
func (pt *Ports) publishOnCreate(ctx context.Context, tenant, id string, specs []api.PortSpec) ([]api.Port, error) {
	var out []api.Port
	for _, s := range specs {
		p, err := pt.AddPort(ctx, tenant, id, s)
		if err != nil {
			return nil, fmt.Errorf("publish port %d: %w", s.Port, err)
		}
		out = append(out, *p)
	}
	return out, nil
}

func checkPublish(specs []api.PortSpec) error {
	if len(specs) > MaxPorts {
		return invalid("publish: %d ports, the limit is %d", len(specs), MaxPorts)
	}
	for _, s := range specs {
		if _, err := checkPortSpec(s); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	return nil
}

// dropPorts forgets a destroyed sandbox's ports (its link, and so its
// published elements, are gone with it) and its webhooks with their
// queued deliveries (package hooks).
func (pt *Ports) dropPorts(id string) {
	ctx := context.Background()
	if err := pt.m.cfg.Store.DeletePorts(ctx, id); err != nil {
		pt.m.log.Warn("delete published ports", "sandbox", id, "err", err)
	}
	pt.forgetPorts(id)
	pt.revoke(id, 0)
	ws, err := pt.m.cfg.Store.ListWebhooks(ctx, "", id)
	if err != nil {
		pt.m.log.Warn("list webhooks", "sandbox", id, "err", err)
		return
	}
	for _, w := range ws {
		if err := pt.m.cfg.Store.DeleteWebhook(ctx, "", id, w.Name); err != nil {
			pt.m.log.Warn("delete webhook", "sandbox", id, "webhook", w.Name, "err", err)
		}
	}
}

// reapPorts unpublishes expired ports.
func (pt *Ports) reapPorts(ctx context.Context) {
	ps, err := pt.m.cfg.Store.ListPorts(ctx, "", "")
	if err != nil {
		return
	}
	now := pt.m.cfg.Now()
	for _, p := range ps {
		if p.ExpiresAt != nil && !now.Before(*p.ExpiresAt) {
			err := pt.m.cfg.Store.DeletePort(ctx, "", p.SandboxID, p.Port)
			pt.forgetPorts(p.SandboxID)
			if err == nil {
				_ = pt.syncPublished(ctx, p.SandboxID)
				pt.revoke(p.SandboxID, uint16(p.Port))
				pt.m.log.Info("published port expired", "sandbox", p.SandboxID, "port", p.Port)
			}
		}
	}
}

// Resolve implements ingress.Backend: a published, unexpired port of a
// sandbox that has a link. It runs for every ingress request, so it reads
// the port cache, not the store.
func (pt *Ports) Resolve(ctx context.Context, id string, port uint16) (*ingress.Target, error) {
	gw := pt.m.cfg.Gateway
	if gw == nil {
		return nil, ingress.ErrNotFound
	}
	// The link first: it is in memory, and a sandbox without one (unknown,
	// stopped, another daemon's) is never cached, so requests for made-up
	// IDs cannot grow the cache.
	a, ok := gw.Get(id)
	if !ok {
		return nil, ingress.ErrNotFound
	}
	ps, err := pt.publishedPorts(ctx, id)
	if err != nil {
		return nil, err
	}
	p := ps[int(port)]
	if p == nil || (p.ExpiresAt != nil && !pt.m.cfg.Now().Before(*p.ExpiresAt)) {
		return nil, ingress.ErrNotFound
	}
	return &ingress.Target{Tenant: p.TenantID, Addr: netip.AddrPortFrom(a.Link.GuestAddr, port), Public: p.Public, TokenHash: p.TokenHash}, nil
}

// portCache holds the published ports of sandboxes that have a link, as
// the store has them. Every change to a sandbox's ports is made by the
// manager, which drops that sandbox's entry once the store has changed
// (forgetPorts); gen stops a lookup that read the store before a change
// from caching what it read after the change dropped the entry. So a
// removed port or a rotated token stops working at once, as it did when
// every request read the store.
type portCache struct {
	mu  sync.Mutex
	gen uint64
	m   map[string]map[int]*store.Port // sandbox → port → row
}

// publishedPorts returns a sandbox's published ports (expired ones
// included: the caller checks), from the cache or else the store.
func (pt *Ports) publishedPorts(ctx context.Context, id string) (map[int]*store.Port, error) {
	c := &pt.cache
	c.mu.Lock()
	ps, ok := c.m[id]
	gen := c.gen
	c.mu.Unlock()
	if ok {
		return ps, nil
	}
	rows, err := pt.m.cfg.Store.ListPorts(ctx, "", id)
	if err != nil {
		return nil, fmt.Errorf("published ports of %s: %w", id, err)
	}
	ps = make(map[int]*store.Port, len(rows))
	for _, p := range rows {
		ps[p.Port] = p
	}
	c.mu.Lock()
	if c.gen == gen {
		if c.m == nil {
			c.m = map[string]map[int]*store.Port{}
		}
		c.m[id] = ps
	}
	c.mu.Unlock()
	return ps, nil
}

// forgetPorts drops a sandbox's cached ports; call it after every store
// change to them.
func (pt *Ports) forgetPorts(id string) {
	c := &pt.cache
	c.mu.Lock()
	c.gen++
	delete(c.m, id)
	c.mu.Unlock()
}

// Begin implements ingress.Backend: wake an idle-paused sandbox and hold
// it busy (no idle pause) until end.
func (pt *Ports) Begin(ctx context.Context, id, reason string) (func(), error) {
	pt.m.mu.Lock()
	e := pt.m.live[id]
	pt.m.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("%w: sandbox %s is not running", errdefs.ErrConflict, id)
	}
	e.touch(pt.m.cfg.Now())
	e.mu.Lock()
	e.inbound++
	e.mu.Unlock()
	end := func() {
		e.mu.Lock()
		e.inbound--
		e.mu.Unlock()
		e.touch(pt.m.cfg.Now())
	}
	if err := pt.m.wake(ctx, e, reason); err != nil {
		end()
		return nil, err
	}
	return end, nil
}

// Guest implements ingress.Backend: a sandbox's tenant and link address.
func (pt *Ports) Guest(ctx context.Context, id string) (string, netip.Addr, error) {
	r, err := pt.m.cfg.Store.GetSandbox(ctx, "", id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return "", netip.Addr{}, ingress.ErrNotFound
		}
		return "", netip.Addr{}, err
	}
	gw := pt.m.cfg.Gateway
	if gw == nil {
		return "", netip.Addr{}, fmt.Errorf("sandbox %s has no network: %w", id, ingress.ErrNotFound)
	}
	a, ok := gw.Get(id)
	if !ok {
		return "", netip.Addr{}, fmt.Errorf("sandbox %s has no link: %w", id, ingress.ErrNotFound)
	}
	return r.TenantID, a.Link.GuestAddr, nil
}

var _ ingress.Backend = (*Ports)(nil)

// SyncPorts makes every link's published ports the store's (at daemon
// start: a crash between the store write and the rule change, or ports
// that expired while the daemon was down, leave nothing admitted that is
// not published).
func (pt *Ports) SyncPorts(ctx context.Context) {
	pt.reapPorts(ctx)
	gw := pt.m.cfg.Gateway
	if gw == nil {
		return
	}
	for _, l := range gw.Links().List() {
		if err := pt.syncPublished(ctx, l.ID); err != nil {
			pt.m.log.Warn("sync published ports", "sandbox", l.ID, "err", err)
		}
	}
}
