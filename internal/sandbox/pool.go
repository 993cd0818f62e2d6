package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/gateway"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/internal/rootfs"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/isolation"
)

// Warm pools. A pooled sandbox is made like a cold one — its own state
// dir, writable root, cgroup and link — but started with no tenant,
// gateway, policy, secrets, environment or CA, its agent awaiting its
// claim (isolation.Spec.AwaitClaim). A create of its class claims it:
// the gateway is attached to its link (a new CA, resolver, proxy
// listener, policy and credentials), and the agent is claimed with a new
// token, the environment and the guest files (agentproto.Claim). Nothing
// but the agent has run in it before the claim. It is never pooled again.
//
// The pool is not in the store (it counts toward no tenant): each pooled
// sandbox has a record file below StateDir/pool, written before anything
// is made, so a daemon that stops with sandboxes in its pools destroys them
// at its next start (RecoverPool).

// pooled is a sandbox in a pool.
type pooled struct {
	id    string
	class pool.Class
	// image is the image's digest when the sandbox was made: an image
	// rebuilt since is not handed out.
	image string
	sb    isolation.Sandbox
	e     *entry
	info  isolation.ClaimInfo
	made  time.Time
}

func (p *pooled) ID() string { return p.id }

// poolRecord is a pooled sandbox's record file.
type poolRecord struct {
	ID       string           `json:"id"`
	Class    string           `json:"class"`
	StateDir string           `json:"state_dir"`
	State    *isolation.State `json:"state,omitempty"`
}

func (m *Manager) poolDir() string { return filepath.Join(m.cfg.StateDir, "pool") }

func (m *Manager) writePoolRecord(r *poolRecord) error {
	if err := statedir.Make(m.poolDir()); err != nil {
		return fmt.Errorf("pool record: %w", err)
	}
	b, _ := json.Marshal(r)
	tmp := filepath.Join(m.poolDir(), "."+r.ID+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("pool record: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(m.poolDir(), r.ID+".json")); err != nil {
		return fmt.Errorf("pool record: %w", err)
	}
	return nil
}

func (m *Manager) dropPoolRecord(id string) {
	_ = os.Remove(filepath.Join(m.poolDir(), id+".json"))
}

// PoolIDs lists the sandboxes the pool records name (the daemon passes
// them to the gateway's Init as its own, so their links are removed).
func PoolIDs(stateDir string) []string {
	ents, _ := os.ReadDir(filepath.Join(stateDir, "pool"))
	var ids []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok && !strings.HasPrefix(id, ".") {
			ids = append(ids, id)
		}
	}
	return ids
}

// RecoverPool destroys the pooled sandboxes a stopped daemon left (call
// it after the gateway's Init and before StartPool). A sandbox the store
// records was claimed before the daemon stopped: it is left to Recover.
func (m *Manager) RecoverPool(ctx context.Context) {
	for _, id := range PoolIDs(m.cfg.StateDir) {
		b, err := os.ReadFile(filepath.Join(m.poolDir(), id+".json"))
		var r poolRecord
		if err != nil || json.Unmarshal(b, &r) != nil || r.ID != id {
			m.log.Warn("unreadable pool record; removing it", "file", id+".json")
			m.dropPoolRecord(id)
			continue
		}
		if _, err := m.cfg.Store.GetSandbox(ctx, "", id); err == nil {
			m.dropPoolRecord(id)
			continue
		}
		if r.State != nil {
			if rt, ok := isolation.Lookup(r.State.Runtime); ok {
				if sb, err := rt.Recover(ctx, *r.State); sb != nil {
					_ = sb.Destroy(ctx)
				} else if err != nil && !errors.Is(err, isolation.ErrGone) {
					m.log.Warn("pooled sandbox left by a stopped daemon", "sandbox", id, "err", err)
				}
			}
		}
		if r.StateDir != "" {
			unmountBelow(r.StateDir)
			_ = os.RemoveAll(r.StateDir)
		}
		if gw := m.cfg.Gateway; gw != nil {
			_ = gw.Detach(ctx, id, false)
		}
		m.releaseImage(id)
		m.dropPoolRecord(id)
		m.log.Info("destroyed a pooled sandbox left by a stopped daemon", "sandbox", id, "class", r.Class)
	}
}

// StartPool starts keeping the configured warm pools (after Recover and
// RecoverPool). Without targets the pool is empty until SetPools gives it
// some.
func (m *Manager) StartPool() error {
	for _, t := range m.cfg.Pools {
		if err := m.checkPoolClass(t.Class); err != nil {
			return err
		}
	}
	p, err := pool.New(pool.Config{
		Targets:      m.cfg.Pools,
		MemoryBudget: m.cfg.PoolMemory,
		Filler:       m,
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

// checkPoolClass checks that this daemon can fill c: a runtime that is
// here, available and at or above the floor, and an image in the cache.
func (m *Manager) checkPoolClass(c pool.Class) error {
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

// SetPools replaces the warm pool targets (PUT /v1/pools): new classes
// start filling, a class left out or shrunk loses its surplus ready
// sandboxes. Every target is checked first (runtime, image, size, memory);
// a bad one is ErrInvalid and changes nothing.
func (m *Manager) SetPools(req *api.SetPoolsRequest) (*api.Pools, error) {
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
		if err := m.checkPoolClass(c); err != nil {
			return nil, fmt.Errorf("%w: targets[%d]: %v", errdefs.ErrInvalid, i, err)
		}
		targets = append(targets, pool.Target{Class: c, Size: t.Size})
	}
	if err := m.pool.SetTargets(targets); err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	m.log.Info("pool targets set", "classes", len(targets))
	return m.Pools(), nil
}

// Pools describes the warm pools (nil without any).
func (m *Manager) Pools() *api.Pools {
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
func (m *Manager) Fill(ctx context.Context, c pool.Class) (_ pool.Item, err error) {
	rt, ok := isolation.Lookup(c.Runtime)
	if !ok {
		return nil, fmt.Errorf("no runtime %q", c.Runtime)
	}
	img, err := m.cfg.Images.Get(c.Image)
	if err != nil {
		return nil, err
	}
	id := newID()
	rec := &poolRecord{ID: id, Class: c.String(), StateDir: filepath.Join(m.cfg.StateDir, id)}
	if err := m.writePoolRecord(rec); err != nil {
		return nil, err
	}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	undo.Add(func() { m.dropPoolRecord(id) })
	if err := m.acquireImage(img, id); err != nil {
		return nil, err
	}
	undo.Add(func() { m.releaseImage(id) })
	spec := &isolation.Spec{
		ID:         id,
		StateDir:   rec.StateDir,
		RootFS:     img.Path,
		AgentPath:  m.cfg.AgentPath,
		AgentToken: newToken(),
		Hostname:   rootfs.DefaultHostname,
		Resources:  c.Resources,
		AwaitClaim: true,
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if gw := m.cfg.Gateway; gw != nil {
		l, err := gw.PrepareLink(sctx, id)
		if err != nil {
			return nil, err
		}
		undo.Add(func() { _ = gw.DropLink(context.Background(), id) })
		spec.NetNS = l.NetNSPath
		spec.GuestIf, spec.GuestAddr, spec.Gateway, spec.Prefix = l.GuestIf, l.GuestAddr, l.HostAddr, l.Prefix
	}
	sb, err := rt.Create(sctx, spec)
	if err != nil {
		return nil, fmt.Errorf("create %s sandbox: %w", rt.Name(), err)
	}
	undo.Add(func() { _ = sb.Destroy(context.Background()) })
	st := sb.State()
	rec.State = &st
	if err := m.writePoolRecord(rec); err != nil {
		return nil, err
	}
	info := claimInfo(sb)
	if info.Token == "" {
		info.Token = spec.AgentToken
	}
	now := m.cfg.Now().UTC()
	e := &entry{id: id, sb: sb, token: info.Token, active: now, persisted: now, started: make(chan struct{})}
	undo.Add(e.dropAll)
	if err := startAgent(sctx, rt.Name(), sb, e); err != nil {
		return nil, err
	}
	return &pooled{id: id, class: c, image: img.Digest, sb: sb, e: e, info: info, made: now}, nil
}

// Discard implements pool.Filler.
func (m *Manager) Discard(it pool.Item) {
	p := it.(*pooled)
	m.discard(p)
}

func (m *Manager) discard(p *pooled) {
	p.e.dropAll()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.sb.Destroy(ctx); err != nil {
		// The record stays: the next daemon start tries again.
		m.log.Error("destroy pooled sandbox", "sandbox", p.id, "err", err)
		return
	}
	if gw := m.cfg.Gateway; gw != nil {
		_ = gw.Detach(ctx, p.id, false)
	}
	m.releaseImage(p.id)
	m.dropPoolRecord(p.id)
}

// fromPool serves a create from a warm pool; ok is false when the
// request's class has no pool, the pool is empty, or the claimed sandbox
// could not be bound (a miss: the caller makes it cold).
func (m *Manager) fromPool(ctx context.Context, tenant *store.Tenant, p *createParams) (*api.Sandbox, error, bool) {
	if m.pool == nil || !p.audit.Empty() {
		// A pooled sandbox was made without audit.
		return nil, nil, false
	}
	// A pooled sandbox's root and mounts were made before its tenant was
	// known: mounts and a read-only root need a cold create.
	if len(p.mounts) > 0 || p.req.ReadOnlyRoot {
		return nil, nil, false
	}
	c := pool.ClassOf(p.rt.Name(), p.img.Name, p.res)
	if !m.pool.Pooled(c) {
		return nil, nil, false
	}
	it, ok := m.pool.Claim(c)
	if !ok {
		m.Emit(tenant.ID, "", api.PoolMissed{Class: c.String(), Reason: "empty"})
		return nil, nil, false
	}
	pd := it.(*pooled)
	if pd.image != p.img.Digest {
		m.pool.Missed(c)
		m.bg.Add(1)
		go func() {
			defer m.bg.Done()
			m.discard(pd)
		}()
		m.Emit(tenant.ID, "", api.PoolMissed{Class: c.String(), Reason: "image changed since the sandbox was pooled"})
		return nil, nil, false
	}
	v, err := m.claim(ctx, tenant, p, pd)
	if err == nil {
		return v, nil, true
	}
	if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrDenied) {
		// The request is at fault: a cold create would fail the same way.
		return nil, err, true
	}
	m.pool.Missed(c)
	m.log.Warn("claiming a pooled sandbox failed; creating one cold", "class", c.String(), "err", err)
	m.Emit(tenant.ID, "", api.PoolMissed{Class: c.String(), Reason: err.Error()})
	return nil, nil, false
}

// claim binds a pooled sandbox to tenant and the request: secrets, the
// gateway (CA, resolver, proxy, policy, credentials), then the agent's
// claim (token, env, guest files), then the store record. Any failure
// destroys the pooled sandbox.
func (m *Manager) claim(ctx context.Context, tenant *store.Tenant, p *createParams, pd *pooled) (_ *api.Sandbox, err error) {
	t0 := time.Now()
	req, id := p.req, pd.id
	var (
		undo cleanup.Stack
		rec  *store.Sandbox
	)
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	undo.Add(func() { m.discard(pd) })
	bound, secretEnv, undoSecrets, err := m.bindSecrets(ctx, tenant.ID, id, req.Secrets)
	undo.Add(undoSecrets)
	if err != nil {
		return nil, err
	}
	creds, err := m.credentialBindings(tenant.ID, bound)
	if err != nil {
		return nil, fmt.Errorf("%w: secrets: %v", errdefs.ErrInvalid, err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := &isolation.Spec{
		ID:         id,
		AgentToken: newToken(),
		Env:        guestEnv(p.img, req.Env, secretEnv),
		Hostname:   rootfs.DefaultHostname,
		Resources:  p.res,
	}
	if gw := m.cfg.Gateway; gw != nil {
		att, err := gw.Attach(sctx, id, tenant.ID, p.doc, req.PolicyRef, gateway.AttachClaim)
		if err != nil {
			return nil, fmt.Errorf("attach network: %w", err)
		}
		undo.Add(func() { m.detach(id) })
		att.Credentials.Install(creds)
		spec.GuestIf, spec.GuestAddr, spec.Gateway, spec.Prefix = att.Link.GuestIf, att.Link.GuestAddr, att.Link.HostAddr, att.Link.Prefix
		spec.Nameserver = att.Link.HostAddr.String()
		spec.TrustedCAPEM = att.CA.CertPEM()
		spec.Env = append(isolation.CAEnv(), spec.Env...)
	}
	tAttach := time.Since(t0)
	cl, err := newClaim(spec, pd.info)
	if err != nil {
		return nil, err
	}
	if err := m.claimAgent(sctx, pd.e, cl); err != nil {
		return nil, err
	}
	tAgent := time.Since(t0)
	now := m.cfg.Now().UTC()
	sr := specRecord{Resources: p.res, Env: req.Env, AgentToken: spec.AgentToken, StateDir: filepath.Join(m.cfg.StateDir, id),
		IdleTimeout: req.IdleTimeout, IdleAction: req.IdleAction, Policy: p.doc, PolicyRef: req.PolicyRef, Secrets: bound}
	sr.ExecCwd, sr.ExecUser = imageExecDefaults(p.img)
	rec = m.newRecord(id, tenant, p, &sr, StatusRunning, now)
	rec.State, _ = json.Marshal(pd.sb.State())
	if err := m.cfg.Store.CreateSandbox(sctx, rec); err != nil {
		return nil, fmt.Errorf("record sandbox: %w", err)
	}
	tStore := time.Since(t0)
	undo.Release()
	m.dropPoolRecord(id)
	e := pd.e
	e.mu.Lock()
	e.tenant, e.active, e.persisted = tenant.ID, now, now
	e.execCwd, e.execUser = sr.ExecCwd, sr.ExecUser
	e.mu.Unlock()
	m.mu.Lock()
	m.live[id] = e
	m.mu.Unlock()
	m.emitEnvSecrets(tenant.ID, id, bound)
	setup := time.Since(t0)
	m.log.Info("sandbox running", "sandbox", id, "tenant", tenant.ID, "runtime", p.rt.Name(), "image", p.img.Name, "pool", pd.class.String(), "claim", setup, "attached", tAttach, "agent", tAgent, "stored", tStore)
	m.Emit(tenant.ID, id, api.SandboxCreated{Runtime: p.rt.Name(), Image: p.img.Name})
	m.Emit(tenant.ID, id, api.PoolClaimed{Class: pd.class.String(), SetupMs: setup.Milliseconds()})
	v := m.view(rec)
	v.Pooled = true
	return v, nil
}

// claimInfo is how sb's agent must be claimed (zero: it was started as the
// sandbox its spec describes).
func claimInfo(sb isolation.Sandbox) isolation.ClaimInfo {
	if c, ok := sb.(isolation.Claimable); ok {
		return c.ClaimInfo()
	}
	return isolation.ClaimInfo{}
}

// newClaim is the claim that makes an agent the sandbox spec describes.
func newClaim(spec *isolation.Spec, info isolation.ClaimInfo) (*agentproto.Claim, error) {
	ent := make([]byte, 64)
	if _, err := rand.Read(ent); err != nil {
		return nil, fmt.Errorf("entropy for the claim: %w", err)
	}
	cl := &agentproto.Claim{
		Token:        spec.AgentToken,
		Env:          spec.Env,
		Hostname:     spec.Hostname,
		Nameserver:   spec.Nameserver,
		TrustedCAPEM: spec.TrustedCAPEM,
		Entropy:      ent,
		Time:         time.Now(),
	}
	if info.GuestNet && spec.GuestAddr.IsValid() {
		cl.Net = &agentproto.ClaimNet{Addr: netip.PrefixFrom(spec.GuestAddr, spec.Prefix.Bits()), Gateway: spec.Gateway, MAC: info.MAC}
	}
	return cl, nil
}

// claimAgent claims e's agent and switches e to the claim's token.
func (m *Manager) claimAgent(ctx context.Context, e *entry, cl *agentproto.Claim) error {
	c, err := e.agent(ctx)
	if err != nil {
		return fmt.Errorf("claim the sandbox's agent: %w", err)
	}
	if err := c.Claim(ctx, cl); err != nil {
		if lt, ok := e.sb.(interface{ LogTail() string }); ok {
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

// emitEnvSecrets records that secrets delivered in the environment are
// real values inside the guest.
func (m *Manager) emitEnvSecrets(tenant, id string, bound []boundSecret) {
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
