package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/gateway"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/link"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/internal/rootfs"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/isolation"
)

// Make, then bind. Every sandbox is made, then bound, by one function
// each:
//
//   - make: the store row, the image reference, the link, the runtime's
//     Create and Start, an agent awaiting its claim. No tenant, secrets,
//     policy or environment reach the guest.
//   - bind: the gateway attached on the existing link (CA, resolver,
//     proxy, policy, credentials), the agent claimed with a fresh token,
//     the environment and the guest files (hostname, resolv.conf, CA),
//     and the row written as its tenant's, running.
//
// A cold create is make + bind (createCold); a warm pool makes ahead of
// time (Fill) and a create of its class binds what it made (Pools.fromPool). A
// sandbox restored from a snapshot is a made sandbox too — its agent
// answers to the snapshot's token and awaits a claim — so bind is where
// everything unique to a sandbox (token, entropy, clock, address, CA,
// hostname) is set before its caller sees it.
//
// The row comes first, so a daemon that stops at any point finds what it
// made at its next start (Recover): a pooled sandbox's row has no tenant
// and status pooled; a cold create's is its tenant's, status creating (it
// holds the sandbox's volumes from the start).

// makeSpec is what make makes a sandbox of.
type makeSpec struct {
	id  string
	rt  isolation.Runtime
	img *image.Image
	res isolation.Resources
	// row is the sandbox's first row, written before anything is made on
	// the host: pooledRow's (no tenant), or a cold create's (its tenant's,
	// status creating).
	row *store.Sandbox
	// What a pool cannot make ahead of its tenant (cold creates only):
	// the checked mounts (resolved against row's tenant), a read-only
	// root and the syscall audit's sink (its undo is make's).
	mounts       []mounts.Spec
	readOnlyRoot bool
	audit        isolation.Audit
	// early, when set, binds the network once the link exists and before
	// the runtime makes the sandbox: a root made read-only cannot take
	// the claim's guest files, so they are written at Create, and the
	// agent starts as the bound sandbox instead of awaiting a claim.
	early *binding
	// fromSnapshot is the directory of the snapshot the sandbox starts
	// from (isolation.Spec.FromSnapshot); snapshotToken, for a memory
	// snapshot, the token its agent answers to until its claim;
	// snapshotDigest, the digest recorded when it was taken.
	fromSnapshot, snapshotToken, snapshotDigest string
}

// made is a sandbox that make made: started, its agent awaiting its
// claim (unless it was made with makeSpec.early).
type made struct {
	id   string
	rt   isolation.Runtime
	img  *image.Image
	res  isolation.Resources
	rec  *store.Sandbox
	link *link.Link // nil without a gateway
	sb   isolation.Sandbox
	e    *entry
	// info is how the agent is claimed: its Token is the one the agent
	// answers to until then ("" once it runs as its sandbox).
	info isolation.ClaimInfo
	at   time.Time
	// audit is the syscall audit's sink (cold creates that ask for one).
	audit isolation.Audit
	// net is the network binding (attach): bind's, or make's with
	// makeSpec.early.
	net *netBinding
	// undo destroys what make made, last made first (unmake); cause is
	// why, read by the row's step (nil: a pooled sandbox let go).
	undo  cleanup.Stack
	cause error
	// destroyFailed: the runtime could not destroy the sandbox, so a
	// pooled row stays for the next daemon start to try again.
	destroyFailed bool
}

// binding is who a made sandbox is bound to and how: the tenant, the
// checked create request and its secrets, resolved for the sandbox's id
// before bind (newBinding), so a request that cannot be bound is refused
// before a cold create makes anything.
type binding struct {
	tenant *store.Tenant
	p      *createParams
	// pool is the class the sandbox was pooled in ("": made for this
	// create).
	pool      string
	bound     []boundSecret
	secretEnv []string
	creds     *credentials.Bindings
	// drop deletes the inline secrets newBinding sealed (bind's undo).
	drop func()
}

// netBinding is a made sandbox attached to its gateway: what its guest
// learns from the claim.
type netBinding struct {
	token      string
	env        []string
	nameserver string
	caPEM      []byte
}

// stateDir is sandbox id's state directory.
func (m *Manager) stateDir(id string) string { return filepath.Join(m.cfg.StateDir, id) }

// newBinding resolves a request's secret bindings for sandbox id (inline
// values sealed in the vault, placeholders made) and the gateway's
// credentials. Nothing is left behind on error; on success b.drop undoes
// it.
func (m *Manager) newBinding(ctx context.Context, tenant *store.Tenant, p *createParams, id string) (_ *binding, err error) {
	bound, secretEnv, undo, err := m.secrets.bind(ctx, tenant.ID, id, p.req.Secrets)
	if err != nil {
		undo()
		return nil, err
	}
	creds, err := m.secrets.bindings(tenant.ID, bound)
	if err != nil {
		undo()
		return nil, fmt.Errorf("%w: secrets: %v", errdefs.ErrInvalid, err)
	}
	return &binding{tenant: tenant, p: p, bound: bound, secretEnv: secretEnv, creds: creds, drop: undo}, nil
}

// make makes a sandbox of ms: its row first, then the image reference,
// the link, the runtime's sandbox and its started agent. On error nothing
// is left but the row of a cold create, marked failed.
func (m *Manager) make(ctx context.Context, ms *makeSpec) (_ *made, err error) {
	m.makes.Add(1)
	id, rt, img := ms.id, ms.rt, ms.img
	md := &made{id: id, rt: rt, img: img, res: ms.res, rec: ms.row, audit: ms.audit}
	defer func() {
		if err != nil {
			m.unmake(md, err)
		}
	}()
	if !ms.audit.Classes.Empty() {
		md.undo.Add(func() { m.sysAudit.end(id) })
	}
	// Bind sources are opened now and held until the runtime has mounted
	// them (mounts.Source).
	ims, err := m.volumes.resolveMounts(ms.row.TenantID, ms.mounts, rt)
	if err != nil {
		return nil, err
	}
	defer closeMounts(ims)
	// The row exists before anything is made on the host, so a crash at
	// any later point is found and cleaned up by Recover. A cold create's
	// row is also what holds its volumes.
	if err := m.volumes.recordWithVolumes(ctx, ms.row, ms.mounts, rt); err != nil {
		return nil, err
	}
	md.undo.Add(func() { m.dropRow(md) })
	if err := m.imageRefs.acquire(img, id); err != nil {
		return nil, err
	}
	md.undo.Add(func() { m.imageRefs.release(id) })
	// Setup is bounded by the daemon (ctx is never a caller's
	// connection): a client that hangs up mid-create must not leave a
	// half-made sandbox.
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	spec := &isolation.Spec{
		ID:                 id,
		StateDir:           m.stateDir(id),
		RootFS:             img.Path,
		AgentPath:          m.cfg.AgentPath,
		AgentToken:         newToken(),
		Hostname:           rootfs.DefaultHostname,
		Resources:          ms.res,
		AwaitClaim:         true,
		Mounts:             ims,
		ReadOnlyRoot:       ms.readOnlyRoot,
		Audit:              ms.audit,
		FromSnapshot:       ms.fromSnapshot,
		FromSnapshotDigest: ms.snapshotDigest,
	}
	if ms.snapshotToken != "" {
		// A memory snapshot's guest resumes answering to the token of
		// the sandbox snapshotted; bind's claim re-keys it.
		spec.AgentToken = ms.snapshotToken
	}
	if gw := m.cfg.Gateway; gw != nil {
		l, err := gw.PrepareLink(sctx, id)
		if err != nil {
			return nil, err
		}
		// Detach removes the link, and whatever an attach added to it.
		md.undo.Add(func() { m.detach(id) })
		md.link = l
		spec.NetNS = l.NetNSPath
		spec.GuestIf, spec.GuestAddr, spec.Gateway, spec.Prefix = l.GuestIf, l.GuestAddr, l.HostAddr, l.Prefix
	}
	if ms.early != nil {
		if err := m.attach(ctx, sctx, ms.early, md, &md.undo); err != nil {
			return nil, err
		}
		spec.AwaitClaim = false
		spec.AgentToken, spec.Env = md.net.token, md.net.env
		spec.Nameserver, spec.TrustedCAPEM = md.net.nameserver, md.net.caPEM
	}
	t0 := time.Now()
	sb, err := rt.Create(sctx, spec)
	tCreate := time.Since(t0)
	if err != nil {
		return nil, fmt.Errorf("create %s sandbox: %w", rt.Name(), err)
	}
	md.undo.Add(func() {
		uctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sb.Destroy(uctx); err != nil {
			md.destroyFailed = true
			m.log.Error("destroy a sandbox being unmade", "sandbox", id, "err", err)
		}
	})
	md.sb = sb
	md.rec.State, _ = json.Marshal(sb.State())
	if err := m.cfg.Store.UpdateSandbox(sctx, md.rec); err != nil {
		return nil, fmt.Errorf("record sandbox state: %w", err)
	}
	// A sandbox restored from a template answers to the template's token
	// until it is claimed.
	md.info = claimInfo(sb)
	if md.info.Token == "" && spec.AwaitClaim {
		md.info.Token = spec.AgentToken
	}
	now := m.cfg.Now().UTC()
	e := &entry{id: id, sb: sb, token: spec.AgentToken, active: now, persisted: now, started: make(chan struct{})}
	if md.info.Token != "" {
		e.token = md.info.Token
	}
	md.undo.Add(e.dropAll)
	t1 := time.Now()
	if err := startAgent(sctx, rt.Name(), sb, e); err != nil {
		return nil, err
	}
	md.e, md.at = e, now
	m.log.Debug("sandbox made", "sandbox", id, "runtime", rt.Name(), "image", img.Name, "setup", tCreate, "agent_ready", time.Since(t1))
	return md, nil
}

// unmake destroys what make made (a failed make or bind, a pooled sandbox
// let go: cause nil).
func (m *Manager) unmake(md *made, cause error) {
	md.cause = cause
	md.undo.Run()
}

// dropRow is the undo of a made sandbox's row: a pooled one's is deleted
// (kept when its sandbox could not be destroyed, for the next daemon start
// to try again); a cold create's stays, marked failed and saying why.
func (m *Manager) dropRow(md *made) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := md.rec
	if r.TenantID == "" {
		if md.destroyFailed {
			return
		}
		if err := m.cfg.Store.DeleteSandbox(ctx, r.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			m.log.Error("delete a pooled sandbox's row", "sandbox", r.ID, "err", err)
		}
		return
	}
	msg := "create failed"
	if md.cause != nil {
		msg = md.cause.Error()
	}
	m.log.Error("create failed", "sandbox", r.ID, "tenant", r.TenantID, "runtime", r.Runtime, "err", msg)
	r.Status, r.Error = StatusFailed, msg
	r.UpdatedAt = m.cfg.Now().UTC()
	_ = m.cfg.Store.UpdateSandbox(ctx, r)
	m.Emit(r.TenantID, r.ID, api.SandboxFailed{Error: msg})
}

// attach binds md's network to b (AttachClaim on the link make made: a new
// CA, resolver, proxy listener, policy and credentials) and picks the
// agent's new token and environment; undo gets its undo step.
func (m *Manager) attach(ctx, sctx context.Context, b *binding, md *made, undo *cleanup.Stack) error {
	p := b.p
	n := &netBinding{token: newToken(), env: guestEnv(p.img, p.req.Env, b.secretEnv)}
	if gw := m.cfg.Gateway; gw != nil {
		att, err := gw.Attach(sctx, md.id, b.tenant.ID, p.doc, p.req.PolicyRef, gateway.AttachClaim)
		if err != nil {
			return fmt.Errorf("attach network: %w", err)
		}
		undo.Add(func() { m.detach(md.id) })
		att.Credentials.Install(b.creds)
		n.nameserver = att.Link.HostAddr.String()
		n.caPEM = att.CA.CertPEM()
		n.env = append(isolation.CAEnv(), n.env...)
	}
	md.net = n
	return nil
}

// bind binds md to b: the network (unless make did: makeSpec.early), the
// agent's claim (token, environment, guest files), then the row, written
// as b's tenant's and running. bind takes md and b: on error both are
// undone (md unmade, b's inline secrets dropped).
func (m *Manager) bind(ctx context.Context, b *binding, md *made) (_ *api.Sandbox, err error) {
	m.binds.Add(1)
	t0 := time.Now()
	tenant, p, req, id := b.tenant, b.p, b.p.req, md.id
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
			m.unmake(md, err)
		}
	}()
	undo.Add(b.drop)
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if p.snapSpec != nil {
		if err := m.snapshots.seedUsage(sctx, id, p.snapSpec); err != nil {
			return nil, err
		}
	}
	if md.net == nil {
		if err := m.attach(ctx, sctx, b, md, &undo); err != nil {
			return nil, err
		}
	}
	tAttach := time.Since(t0)
	if md.info.Token != "" {
		cl, err := newClaim(md.net, md.link, md.info)
		if err != nil {
			return nil, err
		}
		if err := m.claimAgent(sctx, md.e, cl); err != nil {
			return nil, err
		}
	}
	tAgent := time.Since(t0)
	now := m.cfg.Now().UTC()
	sr := specRecord{Resources: p.res, Env: req.Env, AgentToken: md.net.token, StateDir: m.stateDir(id),
		IdleTimeout: req.IdleTimeout, IdleAction: req.IdleAction, Policy: p.doc, PolicyRef: req.PolicyRef, Secrets: b.bound,
		Mounts: p.mounts, ReadOnlyRoot: req.ReadOnlyRoot, Audit: p.audit.Strings()}
	sr.ExecCwd, sr.ExecUser = imageExecDefaults(p.img)
	p.recordSnapshot(&sr)
	rec := m.newRecord(id, tenant, p, &sr, StatusRunning, now)
	rec.State = md.rec.State
	if md.rec.TenantID == "" {
		err = m.cfg.Store.BindSandbox(sctx, rec)
	} else {
		err = m.cfg.Store.UpdateSandbox(sctx, rec)
	}
	if err != nil {
		return nil, fmt.Errorf("record sandbox: %w", err)
	}
	tStore := time.Since(t0)
	undo.Release()
	md.undo.Release()
	e := md.e
	e.mu.Lock()
	e.tenant, e.active, e.persisted = tenant.ID, now, now
	e.execCwd, e.execUser = sr.ExecCwd, sr.ExecUser
	e.mu.Unlock()
	m.mu.Lock()
	m.live[id] = e
	m.mu.Unlock()
	if aa, ok := md.rt.(isolation.AgentAudit); ok && aa.AuditsThroughAgent() && !p.audit.Empty() {
		m.sysAudit.agent(id, e, md.audit)
	}
	m.secrets.emitEnv(tenant.ID, id, b.bound)
	setup := time.Since(t0)
	m.log.Info("sandbox running", "sandbox", id, "tenant", tenant.ID, "runtime", md.rt.Name(), "image", md.img.Name, "pool", b.pool,
		"bind", setup, "attached", tAttach, "agent", tAgent, "stored", tStore)
	m.Emit(tenant.ID, id, api.SandboxCreated{Runtime: md.rt.Name(), Image: md.img.Name})
	return m.view(rec), nil
}

// claimInfo is how sb's agent must be claimed (zero: it was started as the
// sandbox its spec describes).
func claimInfo(sb isolation.Sandbox) isolation.ClaimInfo {
	if c, ok := sb.(isolation.Claimable); ok {
		return c.ClaimInfo()
	}
	return isolation.ClaimInfo{}
}

// newClaim is the claim that makes an agent the sandbox n describes, on
// link l (nil: no network).
func newClaim(n *netBinding, l *link.Link, info isolation.ClaimInfo) (*agentproto.Claim, error) {
	ent := make([]byte, 64)
	if _, err := rand.Read(ent); err != nil {
		return nil, fmt.Errorf("entropy for the claim: %w", err)
	}
	cl := &agentproto.Claim{
		Token:        n.token,
		Env:          n.env,
		Hostname:     rootfs.DefaultHostname,
		Nameserver:   n.nameserver,
		TrustedCAPEM: n.caPEM,
		Entropy:      ent,
		Time:         time.Now(),
	}
	if info.GuestNet && l != nil && l.GuestAddr.IsValid() {
		cl.Net = &agentproto.ClaimNet{Addr: netip.PrefixFrom(l.GuestAddr, l.Prefix.Bits()), Gateway: l.HostAddr, MAC: info.MAC}
	}
	return cl, nil
}
