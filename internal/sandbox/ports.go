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
func (m *Manager) revoke(id string, port uint16) {
	if in := m.ingressCfg(); in != nil && in.OnRevoke != nil {
		in.OnRevoke(id, port)
	}
}

// SetIngress tells the manager about the daemon's ingress listener (nil:
// none; ports are still recorded and published, without URLs).
func (m *Manager) SetIngress(in *Ingress) {
	m.mu.Lock()
	m.ingress = in
	m.mu.Unlock()
}

func (m *Manager) ingressCfg() *Ingress {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ingress
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

func (m *Manager) portView(p *store.Port, token string) api.Port {
	v := api.Port{Port: p.Port, Public: p.Public, ExpiresAt: p.ExpiresAt, CreatedAt: p.CreatedAt, Token: token}
	if in := m.ingressCfg(); in != nil {
		v.URL = in.URL(p.SandboxID, uint16(p.Port))
		v.PathURL = in.PathURL(p.SandboxID, uint16(p.Port))
	}
	return v
}

// AddPort publishes a port of a sandbox of tenant ("" = any). Publishing
// a published port again gives it a new token (the old token and every
// signed URL made with it stop working).
func (m *Manager) AddPort(ctx context.Context, tenant, id string, spec api.PortSpec) (*api.Port, error) {
	ttl, err := checkPortSpec(spec)
	if err != nil {
		return nil, err
	}
	r, err := m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return nil, notFound(id, err)
	}
	switch r.Status {
	case StatusDestroyed, StatusRemoving, StatusFailed:
		return nil, fmt.Errorf("%w: sandbox %s is %s", errdefs.ErrConflict, id, r.Status)
	}
	existing, err := m.cfg.Store.ListPorts(ctx, "", id)
	if err != nil {
		return nil, err
	}
	if len(existing) >= MaxPorts && !slices.ContainsFunc(existing, func(p *store.Port) bool { return p.Port == spec.Port }) {
		return nil, invalid("sandbox %s already publishes %d ports, the limit", id, MaxPorts)
	}
	token := ingress.NewToken()
	p := &store.Port{SandboxID: id, TenantID: r.TenantID, Port: spec.Port, Public: spec.Public, TokenHash: ingress.HashToken(token)}
	if ttl > 0 {
		exp := m.cfg.Now().Add(ttl)
		p.ExpiresAt = &exp
	}
	err = m.cfg.Store.PutPort(ctx, p)
	m.forgetPorts(id) // also on failure: the store may have changed
	// A new token (or, on failure, maybe no port): what the old token
	// opened goes.
	m.revoke(id, uint16(spec.Port))
	if err != nil {
		return nil, fmt.Errorf("publish port: %w", err)
	}
	if err := m.syncPublished(ctx, id); err != nil {
		_ = m.cfg.Store.DeletePort(context.Background(), "", id, spec.Port)
		m.forgetPorts(id)
		m.revoke(id, uint16(spec.Port))
		return nil, err
	}
	m.log.Info("port published", "sandbox", id, "port", spec.Port, "public", spec.Public)
	if spec.Public {
		token = "" // not needed; its hash only keeps signatures unforgeable
	}
	v := m.portView(p, token)
	return &v, nil
}

// SetExtraPorts adds ports the link admits besides the published ones
// (a webhook's or relay's target port, delivered through
// ingress.Server.Send); call SyncPublished after they change.
func (m *Manager) SetExtraPorts(fn func(ctx context.Context, id string) []uint16) {
	m.mu.Lock()
	m.extraPorts = fn
	m.mu.Unlock()
}

// SyncPublished makes a sandbox link's admitted ports its published ports
// (unexpired) plus its extra ports.
func (m *Manager) SyncPublished(ctx context.Context, id string) error {
	return m.syncPublished(ctx, id)
}

// syncPublished makes the link's published ports the store's (unexpired).
func (m *Manager) syncPublished(ctx context.Context, id string) error {
	gw := m.cfg.Gateway
	if gw == nil {
		return nil
	}
	ps, err := m.cfg.Store.ListPorts(ctx, "", id)
	if err != nil {
		return err
	}
	now := m.cfg.Now()
	var ports []uint16
	for _, p := range ps {
		if p.ExpiresAt == nil || now.Before(*p.ExpiresAt) {
			ports = append(ports, uint16(p.Port))
		}
	}
	m.mu.Lock()
	extra := m.extraPorts
	m.mu.Unlock()
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
func (m *Manager) RemovePort(ctx context.Context, tenant, id string, port int) error {
	if _, err := m.cfg.Store.GetSandbox(ctx, tenant, id); err != nil {
		return notFound(id, err)
	}
	err := m.cfg.Store.DeletePort(ctx, tenant, id, port)
	m.forgetPorts(id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: port %d of %s is not published (cagebox port ls %s)", errdefs.ErrNotFound, port, id, id)
		}
		return err
	}
	err = m.syncPublished(ctx, id)
	m.revoke(id, uint16(port))
	return err
}

// ListPorts lists a sandbox's published ports (no tokens).
func (m *Manager) ListPorts(ctx context.Context, tenant, id string) ([]api.Port, error) {
	if _, err := m.cfg.Store.GetSandbox(ctx, tenant, id); err != nil {
		return nil, notFound(id, err)
	}
	ps, err := m.cfg.Store.ListPorts(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	out := make([]api.Port, 0, len(ps))
	for _, p := range ps {
		out = append(out, m.portView(p, ""))
	}
	return out, nil
}

// PortURL makes a signed URL of a published, non-public port.
func (m *Manager) PortURL(ctx context.Context, tenant, id string, port int, ttlStr string) (*api.PortURL, error) {
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
	if _, err := m.cfg.Store.GetSandbox(ctx, tenant, id); err != nil {
		return nil, notFound(id, err)
	}
	p, err := m.cfg.Store.GetPort(ctx, tenant, id, port)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("%w: port %d of %s is not published (cagebox port add %s %d)", errdefs.ErrNotFound, port, id, id, port)
		}
		return nil, err
	}
	in := m.ingressCfg()
	if in == nil || in.Signer == nil {
		return nil, fmt.Errorf("%w: the daemon runs no ingress listener: start it with --ingress ADDR --ingress-domain DOMAIN", errdefs.ErrConflict)
	}
	exp := m.cfg.Now().Add(ttl).Truncate(time.Second)
	if p.ExpiresAt != nil && p.ExpiresAt.Before(exp) {
		exp = p.ExpiresAt.Truncate(time.Second)
	}
	u := in.URL(id, uint16(port)) + "?" + ingress.SigParam + "=" + in.Signer.Sign(id, uint16(port), exp, p.TokenHash)
	return &api.PortURL{URL: u, ExpiresAt: exp.UTC()}, nil
}

// publishOnCreate publishes a create request's ports.
func (m *Manager) publishOnCreate(ctx context.Context, tenant, id string, specs []api.PortSpec) ([]api.Port, error) {
	var out []api.Port
	for _, s := range specs {
		p, err := m.AddPort(ctx, tenant, id, s)
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
func (m *Manager) dropPorts(id string) {
	ctx := context.Background()
	if err := m.cfg.Store.DeletePorts(ctx, id); err != nil {
		m.log.Warn("delete published ports", "sandbox", id, "err", err)
	}
	m.forgetPorts(id)
	m.revoke(id, 0)
	ws, err := m.cfg.Store.ListWebhooks(ctx, "", id)
	if err != nil {
		m.log.Warn("list webhooks", "sandbox", id, "err", err)
		return
	}
	for _, w := range ws {
		if err := m.cfg.Store.DeleteWebhook(ctx, "", id, w.Name); err != nil {
			m.log.Warn("delete webhook", "sandbox", id, "webhook", w.Name, "err", err)
		}
	}
}

// reapPorts unpublishes expired ports.
func (m *Manager) reapPorts(ctx context.Context) {
	ps, err := m.cfg.Store.ListPorts(ctx, "", "")
	if err != nil {
		return
	}
	now := m.cfg.Now()
	for _, p := range ps {
		if p.ExpiresAt != nil && !now.Before(*p.ExpiresAt) {
			err := m.cfg.Store.DeletePort(ctx, "", p.SandboxID, p.Port)
			m.forgetPorts(p.SandboxID)
			if err == nil {
				_ = m.syncPublished(ctx, p.SandboxID)
				m.revoke(p.SandboxID, uint16(p.Port))
				m.log.Info("published port expired", "sandbox", p.SandboxID, "port", p.Port)
			}
		}
	}
}

// Resolve implements ingress.Backend: a published, unexpired port of a
// sandbox that has a link. It runs for every ingress request, so it reads
// the port cache, not the store.
func (m *Manager) Resolve(ctx context.Context, id string, port uint16) (*ingress.Target, error) {
	gw := m.cfg.Gateway
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
	ps, err := m.publishedPorts(ctx, id)
	if err != nil {
		return nil, err
	}
	p := ps[int(port)]
	if p == nil || (p.ExpiresAt != nil && !m.cfg.Now().Before(*p.ExpiresAt)) {
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
func (m *Manager) publishedPorts(ctx context.Context, id string) (map[int]*store.Port, error) {
	c := &m.ports
	c.mu.Lock()
	ps, ok := c.m[id]
	gen := c.gen
	c.mu.Unlock()
	if ok {
		return ps, nil
	}
	rows, err := m.cfg.Store.ListPorts(ctx, "", id)
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
func (m *Manager) forgetPorts(id string) {
	c := &m.ports
	c.mu.Lock()
	c.gen++
	delete(c.m, id)
	c.mu.Unlock()
}

// Begin implements ingress.Backend: wake an idle-paused sandbox and hold
// it busy (no idle pause) until end.
func (m *Manager) Begin(ctx context.Context, id, reason string) (func(), error) {
	m.mu.Lock()
	e := m.live[id]
	m.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("%w: sandbox %s is not running", errdefs.ErrConflict, id)
	}
	e.touch(m.cfg.Now())
	e.mu.Lock()
	e.inbound++
	e.mu.Unlock()
	end := func() {
		e.mu.Lock()
		e.inbound--
		e.mu.Unlock()
		e.touch(m.cfg.Now())
	}
	if err := m.wake(ctx, e, reason); err != nil {
		end()
		return nil, err
	}
	return end, nil
}

// Guest implements ingress.Backend: a sandbox's tenant and link address.
func (m *Manager) Guest(ctx context.Context, id string) (string, netip.Addr, error) {
	r, err := m.cfg.Store.GetSandbox(ctx, "", id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return "", netip.Addr{}, ingress.ErrNotFound
		}
		return "", netip.Addr{}, err
	}
	gw := m.cfg.Gateway
	if gw == nil {
		return "", netip.Addr{}, fmt.Errorf("sandbox %s has no network: %w", id, ingress.ErrNotFound)
	}
	a, ok := gw.Get(id)
	if !ok {
		return "", netip.Addr{}, fmt.Errorf("sandbox %s has no link: %w", id, ingress.ErrNotFound)
	}
	return r.TenantID, a.Link.GuestAddr, nil
}

var _ ingress.Backend = (*Manager)(nil)

// SyncPorts makes every link's published ports the store's (at daemon
// start: a crash between the store write and the rule change, or ports
// that expired while the daemon was down, leave nothing admitted that is
// not published).
func (m *Manager) SyncPorts(ctx context.Context) {
	m.reapPorts(ctx)
	gw := m.cfg.Gateway
	if gw == nil {
		return
	}
	for _, l := range gw.Links().List() {
		if err := m.syncPublished(ctx, l.ID); err != nil {
			m.log.Warn("sync published ports", "sandbox", l.ID, "err", err)
		}
	}
}
