package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/isolation"
)

// Warm pools. A pooled sandbox is made ahead of its tenant (make, with
// no tenant, gateway, policy, secrets, environment or CA; its agent
// awaiting its claim) and a create of its class binds it (bind: the
// gateway attached to its link, the agent claimed with a new token, the
// environment and the guest files). Nothing but the agent has run in it
// before the claim. It is never pooled again.
//
// A pooled sandbox is a store row of no tenant, status pooled: no tenant
// sees or counts it (the store's reads leave rows of no tenant out), the
// admin sees it in its pool's status (GET /v1/pools), and a daemon that
// stops with sandboxes in its pools destroys them at its next start, on
// the one recovery path (Recover).

// Pools is the manager's service of its warm pools (Manager.Pools): it
// keeps them (pool.Filler) and serves creates of their classes.
type Pools struct{ m *Manager }

// Pools is the service of the warm pools.
func (m *Manager) Pools() *Pools { return m.pools }

var _ pool.Filler = (*Pools)(nil)

// pooled is a sandbox in a pool.
type pooled struct {
	md    *made
	class pool.Class
	// image is the image's digest when the sandbox was made: an image
	// rebuilt since is not handed out.
	image string
}

func (p *pooled) ID() string { return p.md.id }

// Pools.Start starts keeping the configured warm pools (after Recover). Without targets the pool is empty until Pools.Set gives it
// some.
func (ps *Pools) Start() error {
	m := ps.m
	for _, t := range m.cfg.Pools {
		if err := m.pools.checkClass(t.Class); err != nil {
			return err
		}
	}
	p, err := pool.New(pool.Config{
		Targets:      m.cfg.Pools,
		MemoryBudget: m.cfg.PoolMemory,
		Filler:       ps,
		Logger:       m.log.With("part", "pool"),
		Emit:         m.Emit,
		Busy:         func() bool { return m.creating.Load() > 0 },
	})
	if err != nil {
		return err
	}
	m.pool = p
	p.Start()
	return nil
}

// checkClass checks that this daemon can fill c: a runtime that is
// here, available and at or above the floor, and an image in the cache.
func (ps *Pools) checkClass(c pool.Class) error {
	m := ps.m
	rt, ok := isolation.Lookup(c.Runtime)
	if !ok {
		return fmt.Errorf("pool %s: no runtime %q (`cagebox runtimes` lists them)", c, c.Runtime)
	}
	if err := rt.Available(); err != nil {
		return fmt.Errorf("pool %s: runtime %s is unavailable here: %v", c, rt.Name(), err)
	}
	if rt.Class() < m.cfg.MinIsolation {
		return fmt.Errorf("pool %s: runtime %s is below the daemon's isolation floor", c, rt.Name())
	}
	if _, err := m.cfg.Images.Get(c.Image); err != nil {
		return fmt.Errorf("pool %s: %w", c, err)
	}
	return nil
}

// Pools.Set replaces the warm pool targets (PUT /v1/pools): new classes
// start filling, a class left out or shrunk loses its surplus ready
// sandboxes. Every target is checked first (runtime, image, size, memory);
// a bad one is ErrInvalid and changes nothing.
func (ps *Pools) Set(req *api.SetPoolsRequest) (*api.Pools, error) {
	m := ps.m
	if m.pool == nil {
		return nil, fmt.Errorf("%w: the warm pools have not started yet; retry in a moment", errdefs.ErrUnavailable)
	}
	targets := make([]pool.Target, 0, len(req.Targets))
	seen := map[pool.Class]bool{}
	for i, t := range req.Targets {
		if t.Runtime == "" || t.Image == "" {
			return nil, invalid("targets[%d]: give runtime and image", i)
		}
		if t.Size < 0 || t.Size > pool.MaxSize {
			return nil, invalid("targets[%d]: size %d is out of range (0 to %d)", i, t.Size, pool.MaxSize)
		}
		if t.MemoryBytes < 0 || t.MemoryBytes != 0 && t.MemoryBytes < MinMemory {
			return nil, invalid("targets[%d]: memory_bytes %d is below the minimum of %d MiB (0: the default)", i, t.MemoryBytes, MinMemory>>20)
		}
		c := pool.ClassOf(t.Runtime, t.Image, isolation.Resources{MemoryBytes: t.MemoryBytes})
		if seen[c] {
			return nil, invalid("targets[%d]: class %s is given twice", i, c)
		}
		seen[c] = true
		if err := m.pools.checkClass(c); err != nil {
			return nil, fmt.Errorf("%w: targets[%d]: %v", errdefs.ErrInvalid, i, err)
		}
		targets = append(targets, pool.Target{Class: c, Size: t.Size})
	}
	if err := m.pool.SetTargets(targets); err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	m.log.Info("pool targets set", "classes", len(targets))
	return m.pools.Status(), nil
}

// Pools describes the warm pools (nil without any).
func (ps *Pools) Status() *api.Pools {
	m := ps.m
	out := &api.Pools{Pools: []api.PoolStatus{}}
	if m.pool == nil {
		return out
	}
	out.Pools = m.pool.Status()
	out.MemoryBudget, out.MemoryUsed = m.pool.Memory()
	return out
}

// Fill implements pool.Filler: it makes a started sandbox of c whose agent
// awaits its claim.
func (ps *Pools) Fill(ctx context.Context, c pool.Class) (pool.Item, error) {
	m := ps.m
	rt, ok := isolation.Lookup(c.Runtime)
	if !ok {
		return nil, fmt.Errorf("no runtime %q", c.Runtime)
	}
	img, err := m.cfg.Images.Get(c.Image)
	if err != nil {
		return nil, err
	}
	id := newID()
	md, err := m.make(ctx, &makeSpec{id: id, rt: rt, img: img, res: c.Resources, row: m.pools.pooledRow(id, rt, img, c)})
	if err != nil {
		return nil, err
	}
	return &pooled{md: md, class: c, image: img.Digest}, nil
}

// pooledRow is the first row of a sandbox made for pool class c: of no
// tenant, status pooled.
func (ps *Pools) pooledRow(id string, rt isolation.Runtime, img *image.Image, c pool.Class) *store.Sandbox {
	m := ps.m
	now := m.cfg.Now().UTC()
	spec, _ := json.Marshal(&specRecord{Resources: c.Resources, StateDir: m.stateDir(id), Pool: c.String()})
	return &store.Sandbox{ID: id, Runtime: rt.Name(), Image: img.Name, Status: StatusPooled, Spec: spec,
		CreatedAt: now, UpdatedAt: now, LastActive: now}
}

// Discard implements pool.Filler.
func (ps *Pools) Discard(it pool.Item) {
	m := ps.m
	m.unmake(it.(*pooled).md, nil)
}

// Pools.fromPool serves a create from a warm pool: it takes a pooled sandbox of
// the request's class and binds it. claimed is false on a miss — the class
// has no pool, the pool is empty, or the pooled sandbox could not be bound
// — and the caller makes the sandbox cold. err is set (claimed false) only
// when the request is at fault: a cold create would fail the same way.
func (ps *Pools) fromPool(ctx context.Context, tenant *store.Tenant, p *createParams) (sb *api.Sandbox, claimed bool, err error) {
	m := ps.m
	if m.pool == nil || !p.audit.Empty() || p.snap != nil {
		// A pooled sandbox was made without audit.
		return nil, false, nil
	}
	// A pooled sandbox's root and mounts were made before its tenant was
	// known: mounts and a read-only root need a cold create.
	if len(p.mounts) > 0 || p.req.ReadOnlyRoot {
		return nil, false, nil
	}
	c := pool.ClassOf(p.rt.Name(), p.img.Name, p.res)
	if !m.pool.Pooled(c) {
		return nil, false, nil
	}
	it, ok := m.pool.Claim(c)
	if !ok {
		m.Emit(tenant.ID, "", api.PoolMissed{Class: c.String(), Reason: "empty"})
		return nil, false, nil
	}
	t0 := time.Now()
	pd := it.(*pooled)
	if pd.image != p.img.Digest {
		m.pool.Missed(c)
		m.bg.Add(1)
		go func() {
			defer m.bg.Done()
			m.unmake(pd.md, nil)
		}()
		m.Emit(tenant.ID, "", api.PoolMissed{Class: c.String(), Reason: "image changed since the sandbox was pooled"})
		return nil, false, nil
	}
	b, err := m.newBinding(ctx, tenant, p, pd.md.id)
	if err != nil {
		m.unmake(pd.md, err)
	} else {
		b.pool = c.String()
		sb, err = m.bind(ctx, b, pd.md)
	}
	if err == nil {
		sb.Pooled = true
		m.Emit(tenant.ID, sb.ID, api.PoolClaimed{Class: c.String(), SetupMs: time.Since(t0).Milliseconds()})
		return sb, true, nil
	}
	if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrDenied) {
		// The request is at fault: a cold create would fail the same way.
		return nil, false, err
	}
	m.pool.Missed(c)
	m.log.Warn("binding a pooled sandbox failed; creating one cold", "class", c.String(), "err", err)
	m.Emit(tenant.ID, "", api.PoolMissed{Class: c.String(), Reason: err.Error()})
	return nil, false, nil
}

// claimAgent claims e's agent and switches e to the claim's token.
func (m *Manager) claimAgent(ctx context.Context, e *entry, cl *agentproto.Claim) error {
	c, err := e.agent(ctx)
	if err != nil {
		return fmt.Errorf("claim the sandbox's agent: %w", err)
	}
	if err := c.Claim(ctx, cl); err != nil {
		if lt, ok := e.sb.(isolation.LogTailer); ok {
			return fmt.Errorf("claim the sandbox's agent: %w (agent log: %s)", err, lt.LogTail())
		}
		return fmt.Errorf("claim the sandbox's agent: %w", err)
	}
	e.mu.Lock()
	e.token = cl.Token
	e.mu.Unlock()
	return nil
}

// newToken is a fresh agent token.
func newToken() string {
	tok := make([]byte, 32)
	_, _ = rand.Read(tok)
	return hex.EncodeToString(tok)
}

// emitEnv records that secrets delivered in the environment are
// real values inside the guest.
func (sc *Secrets) emitEnv(tenant, id string, bound []boundSecret) {
	m := sc.m
	var envMode []string
	for _, b := range bound {
		if b.Mode == ModeEnv {
			envMode = append(envMode, b.Name)
		}
	}
	if len(envMode) > 0 {
		m.Emit(tenant, id, api.SecretEnvDelivered{Names: envMode, Warning: "real values are inside the guest"})
	}
}
