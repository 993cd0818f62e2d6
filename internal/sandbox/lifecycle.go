package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/syscallaudit"
	"github.com/cagebox/cagebox/isolation"
)

// agentStartTimeout bounds the wait for a started sandbox's agent to answer
// (VMs under TCG boot in seconds; a container's agent answers in ms).
const agentStartTimeout = 60 * time.Second

// Limits on create requests.
const (
	MinMemory   = 32 << 20
	MaxEnvBytes = 256 << 10
)

// createParams is a create request, checked and resolved.
type createParams struct {
	req           *api.CreateSandboxRequest
	timeout, idle time.Duration
	doc           *policy.Document
	rt            isolation.Runtime
	img           *image.Image
	res           isolation.Resources
	// mounts are the request's mounts, checked (checkMounts).
	mounts []mounts.Spec
	audit  syscallaudit.Set
	// snap and snapSpec: the snapshot the sandbox starts from
	// (from_snapshot); release lets go of the hold on it (startFrom).
	snap     *store.Snapshot
	snapSpec *snapshotSpec
	release  func()
	// labels are added to the request's after its labels are checked
	// (the daemon's own: a fork's parent).
	labels map[string]string
}

// recordSnapshot names, in a sandbox's record, the snapshot it starts
// from: the record holds the snapshot from then on.
func (p *createParams) recordSnapshot(sr *specRecord) {
	if p.snap != nil {
		sr.Snapshot, sr.SnapshotName = p.snap.ID, p.snap.Name
	}
}

// Create creates and starts a sandbox for tenant: from a warm pool when
// one holds the request's class, cold otherwise.
func (m *Manager) Create(ctx context.Context, tenant *store.Tenant, req *api.CreateSandboxRequest) (*api.Sandbox, error) {
	if err := checkPublish(req.Publish); err != nil {
		return nil, err
	}
	v, _, err := m.create(ctx, tenant, req, nil)
	if err == nil && len(req.Publish) > 0 {
		ports, perr := m.ports.publishOnCreate(ctx, tenant.ID, v.ID, req.Publish)
		if perr != nil {
			_ = m.RemoveAsync(context.Background(), tenant.ID, v.ID)
			return nil, perr
		}
		v.Ports = ports
	}
	return v, err
}

// create is Create, also saying whether the sandbox came from a pool;
// labels (nil: none) are the daemon's own, added to the request's.
func (m *Manager) create(ctx context.Context, tenant *store.Tenant, req *api.CreateSandboxRequest, labels map[string]string) (*api.Sandbox, bool, error) {
	t0 := time.Now()
	p, err := m.prepare(ctx, tenant, req)
	if err != nil {
		return nil, false, err
	}
	if p.release != nil {
		// The sandbox's row, written by make, holds the snapshot from then
		// on (or the create failed).
		defer p.release()
	}
	p.labels = labels
	m.creating.Add(1)
	defer m.creating.Add(-1)
	v, claimed, err := m.pools.fromPool(ctx, tenant, p)
	if err == nil && !claimed {
		v, err = m.createCold(ctx, tenant, p)
	}
	if err != nil {
		return nil, false, err
	}
	if m.cfg.OnCreate != nil {
		m.cfg.OnCreate(v.Runtime, claimed, time.Since(t0))
	}
	return v, claimed, nil
}

// prepare checks a create request and resolves its policy, runtime and
// image.
func (m *Manager) prepare(ctx context.Context, tenant *store.Tenant, req *api.CreateSandboxRequest) (_ *createParams, err error) {
	var snap *store.Snapshot
	var snapSpec *snapshotSpec
	var release func()
	if req.FromSnapshot != "" {
		// The request is filled in from the snapshot, then checked as any.
		if snap, snapSpec, release, err = m.snapshots.startFrom(ctx, tenant, req); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				release()
			}
		}()
	}
	if req.MemoryBytes != 0 && req.MemoryBytes < MinMemory {
		return nil, invalid("memory: %d bytes is below the minimum of %d MiB", req.MemoryBytes, MinMemory>>20)
	}
	if req.CPUs < 0 || req.CPUs > 64 {
		return nil, invalid("cpus: %v is out of range (0 < cpus <= 64)", req.CPUs)
	}
	if req.PIDs < 0 || req.DiskBytes < 0 || req.MemoryBytes < 0 {
		return nil, invalid("limits must not be negative")
	}
	if req.PIDs != 0 && req.PIDs < 8 {
		return nil, invalid("pids: %d is too few for the agent and a shell (at least 8)", req.PIDs)
	}
	timeout, err := parseDuration("timeout", req.Timeout)
	if err != nil {
		return nil, err
	}
	idle, err := parseDuration("idle_timeout", req.IdleTimeout)
	if err != nil {
		return nil, err
	}
	switch req.IdleAction {
	case "", IdleDestroy, IdlePause, IdleHibernate:
	default:
		return nil, invalid("idle_action: %q is not destroy, pause or hibernate", req.IdleAction)
	}
	if req.IdleAction != "" && idle == 0 {
		return nil, invalid("idle_action: give idle_timeout too (the action is taken after that long without API activity)")
	}
	if err := ValidateEnv("env", req.Env); err != nil {
		return nil, err
	}
	if err := ValidateLabels(req.Labels); err != nil {
		return nil, err
	}
	if err := checkReserved(tenant.ID, req.Labels); err != nil {
		return nil, err
	}
	auditClasses, err := auditSet(req)
	if err != nil {
		return nil, err
	}
	rawPolicy := req.Policy
	if req.PolicyRef != "" {
		if len(req.Policy) > 0 {
			return nil, invalid("policy and policy_ref: give one (policy_ref follows a named policy)")
		}
		np, err := m.cfg.Store.GetNamedPolicy(ctx, tenant.ID, req.PolicyRef)
		if errors.Is(err, store.ErrNotFound) {
			return nil, invalid("policy_ref: no policy is named %q; create it with `cagebox policy create %s FILE`", req.PolicyRef, req.PolicyRef)
		}
		if err != nil {
			return nil, err
		}
		rawPolicy = np.Document
	}
	doc, _, err := PolicyOf(rawPolicy, req.Allow)
	if err != nil {
		return nil, err
	}
	rt, err := m.PickRuntime(req.Runtime, tenant)
	if err != nil {
		if errors.Is(err, isolation.ErrUnavailable) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: runtime: %v", errdefs.ErrInvalid, err)
	}
	imgName := req.Image
	if imgName == "" {
		imgName = "default"
	}
	img, err := m.cfg.Images.Get(imgName)
	if err != nil {
		return nil, imageError(imgName, err)
	}
	if snap != nil {
		if err := checkSnapshotImage(snap, snapSpec, img.Digest); err != nil {
			return nil, err
		}
		if _, ok := rt.(isolation.SnapshottingRuntime); !ok || rt.Name() != snap.Runtime {
			return nil, invalid("from_snapshot: snapshot %s is of the %s runtime, which cannot start sandboxes from it here", snap.Name, snap.Runtime)
		}
	}

	if req.IdleAction == IdleHibernate {
		if h, ok := rt.(isolation.HibernatingRuntime); !ok || !h.Hibernates() {
			return nil, invalid("idle_action: the %s runtime cannot hibernate a sandbox (microVMs can: --runtime qemu); use pause (frozen in memory) or destroy", rt.Name())
		}
	}
	ms, err := m.volumes.checkMounts(ctx, tenant, req, rt)
	if err != nil {
		return nil, err
	}
	if err := auditSupported(rt, auditClasses); err != nil {
		return nil, err
	}
	res := isolation.Resources{MemoryBytes: req.MemoryBytes, CPUs: req.CPUs, PIDs: req.PIDs, DiskBytes: req.DiskBytes}
	return &createParams{req: req, timeout: timeout, idle: idle, doc: doc, rt: rt, img: img, res: res.WithDefaults(), mounts: ms, audit: auditClasses,
		snap: snap, snapSpec: snapSpec, release: release}, nil
}

// createCold makes a sandbox for the request and binds it (make, then
// bind). Its secrets are resolved first, so a request that cannot be
// bound makes nothing; its row is its tenant's from the start (status
// creating), holding its volumes.
func (m *Manager) createCold(ctx context.Context, tenant *store.Tenant, p *createParams) (*api.Sandbox, error) {
	req := p.req
	id := newID()
	b, err := m.newBinding(ctx, tenant, p, id)
	if err != nil {
		return nil, err
	}
	sr := specRecord{Resources: p.res, Env: req.Env, StateDir: m.stateDir(id), IdleTimeout: req.IdleTimeout, IdleAction: req.IdleAction,
		Policy: p.doc, PolicyRef: req.PolicyRef, Secrets: b.bound, Mounts: p.mounts, ReadOnlyRoot: req.ReadOnlyRoot, Audit: p.audit.Strings()}
	sr.ExecCwd, sr.ExecUser = imageExecDefaults(p.img)
	ms := &makeSpec{id: id, rt: p.rt, img: p.img, res: p.res,
		mounts: p.mounts, readOnlyRoot: req.ReadOnlyRoot, audit: m.sysAudit.start(tenant.ID, id, p.audit)}
	if sn := p.snap; sn != nil {
		p.recordSnapshot(&sr)
		ms.fromSnapshot, ms.snapshotToken, ms.snapshotDigest = m.snapshots.dir(sn.ID), p.snapSpec.AgentToken, sn.Digest
	}
	ms.row = m.newRecord(id, tenant, p, &sr, StatusCreating, m.cfg.Now().UTC())
	if req.ReadOnlyRoot {
		ms.early = b
	}
	// Setup is bounded by the daemon, not by the caller's connection.
	md, err := m.make(context.WithoutCancel(ctx), ms)
	if err != nil {
		b.drop()
		return nil, err
	}
	return m.bind(ctx, b, md)
}

// Who paused a sandbox (specRecord.PausedBy): the admin
// (store.AdminTenantID), a tenant (its id), or its idle timeout.
// What the operator paused only the operator resumes: a tenant's Resume
// is refused (ErrDenied) and no exec, file operation or inbound request
// wakes it; a tenant's own pause is resumed by it or the admin; an idle
// pause wakes on the next call.
const pausedIdle = "idle timeout" // never a tenant's id (validName)

// pauser is who pauses for a caller of tenant scope ("" the admin).
func pauser(tenant string) string {
	if tenant == "" {
		return store.AdminTenantID
	}
	return tenant
}

// Pause freezes a running sandbox; tenant "" (or the admin's) is the
// operator, whose pause only the operator resumes.
func (m *Manager) Pause(ctx context.Context, tenant, id string) (*api.Sandbox, error) {
	return m.transition(ctx, tenant, id, StatusRunning, StatusPaused, pauser(tenant), api.SandboxPaused{}, func(ctx context.Context, e *entry) error {
		return e.sb.Pause(ctx)
	})
}

// Resume thaws a paused sandbox, or restores a hibernated one. A tenant
// cannot resume what the operator paused (ErrDenied).
func (m *Manager) Resume(ctx context.Context, tenant, id string) (*api.Sandbox, error) {
	return m.transition(ctx, tenant, id, StatusPaused+"|"+StatusHibernated, StatusRunning, "", api.SandboxResumed{}, func(ctx context.Context, e *entry) error {
		return e.sb.Resume(ctx)
	})
}

// Hibernate saves a running sandbox whole to disk and ends its VMM,
// freeing its memory (isolation.Hibernator: microVMs); Resume restores it
// with the same identity. A runtime that cannot is told apart: pause keeps
// a sandbox frozen in memory.
func (m *Manager) Hibernate(ctx context.Context, tenant, id string) (*api.Sandbox, error) {
	return m.hibernate(ctx, tenant, id, "")
}

func (m *Manager) hibernate(ctx context.Context, tenant, id, reason string) (*api.Sandbox, error) {
	by := pauser(tenant)
	if reason != "" {
		by = pausedIdle
	}
	return m.transition(ctx, tenant, id, StatusRunning, StatusHibernated, by, api.SandboxPaused{Reason: reason, ToDisk: true}, func(ctx context.Context, e *entry) error {
		h, ok := e.sb.(isolation.Hibernator)
		if !ok {
			return fmt.Errorf("%w: the %s runtime cannot hibernate a sandbox (microVMs can); pause freezes it in memory", errdefs.ErrInvalid, e.sb.State().Runtime)
		}
		e.dropAll()
		return h.Hibernate(ctx)
	})
}

// idlePause freezes a sandbox whose idle timeout passed (idle action
// pause); the next exec or file operation wakes it.
func (m *Manager) idlePause(r *store.Sandbox, reason string) error {
	_, err := m.transition(context.Background(), "", r.ID, StatusRunning, StatusPaused, pausedIdle, api.SandboxPaused{Reason: reason}, func(ctx context.Context, e *entry) error {
		return e.sb.Pause(ctx)
	})
	return err
}

// wake resumes e if the idle timeout paused it (why: what woke it); a
// sandbox paused through the API stays paused (ErrConflict), the
// operator's pause saying that only the operator resumes it.
func (m *Manager) wake(ctx context.Context, e *entry, why string) error {
	e.mu.Lock()
	paused, by := e.paused, e.pausedBy
	e.mu.Unlock()
	if !paused {
		return nil
	}
	switch by {
	case pausedIdle:
	case store.AdminTenantID:
		return fmt.Errorf("%w: sandbox %s was paused by the operator; only the operator can resume it (cagebox resume %s)", errdefs.ErrConflict, e.id, e.id)
	default:
		return fmt.Errorf("%w: sandbox %s is paused: cagebox resume %s", errdefs.ErrConflict, e.id, e.id)
	}
	e.wakeMu.Lock()
	defer e.wakeMu.Unlock()
	e.mu.Lock()
	paused = e.paused
	e.mu.Unlock()
	if !paused {
		return nil // another caller woke it
	}
	_, err := m.transition(ctx, "", e.id, StatusPaused+"|"+StatusHibernated, StatusRunning, "", api.SandboxResumed{Reason: why}, func(ctx context.Context, e *entry) error {
		return e.sb.Resume(ctx)
	})
	if err != nil {
		return fmt.Errorf("wake idle-paused sandbox %s: %w", e.id, err)
	}
	return nil
}

// transition moves the sandbox of tenant ("" any: the admin, or the
// daemon itself) from one of from's statuses to to by fn, recording who
// paused it (by, when to is a paused status) in its record: a tenant's
// move to running is refused when the operator paused it.
func (m *Manager) transition(ctx context.Context, tenant, id, from, to, by string, ev api.EventPayload, fn func(context.Context, *entry) error) (*api.Sandbox, error) {
	r, e, err := m.attached(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	e.freezeMu.Lock()
	defer e.freezeMu.Unlock()
	paused := to == StatusPaused || to == StatusHibernated
	// The operator pausing what a tenant or the idle timeout paused takes
	// the pause over: from then on it is the operator's.
	claim := paused && by == store.AdminTenantID && (r.Status == StatusPaused || r.Status == StatusHibernated)
	if !claim && !slices.Contains(strings.Split(from, "|"), r.Status) {
		return nil, fmt.Errorf("%w: sandbox %s is %s, not %s", errdefs.ErrConflict, id, r.Status, strings.ReplaceAll(from, "|", " or "))
	}
	var sr specRecord
	if err := json.Unmarshal(r.Spec, &sr); err != nil {
		return nil, fmt.Errorf("sandbox %s: its record: %w", id, err)
	}
	if !paused {
		by = ""
		if sr.PausedBy == store.AdminTenantID && pauser(tenant) != store.AdminTenantID {
			return nil, fmt.Errorf("%w: sandbox %s was paused by the operator; only the operator can resume it (ask your operator)", errdefs.ErrDenied, id)
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if claim {
		if sr.PausedBy == store.AdminTenantID {
			return m.view(r), nil
		}
		ev = api.SandboxPaused{Reason: "the operator took over the pause", ToDisk: r.Status == StatusHibernated}
	} else if err := fn(sctx, e); err != nil {
		return nil, fmt.Errorf("%s %s: %w", strings.TrimPrefix(string(ev.EventKind()), "sandbox."), id, err)
	}
	e.mu.Lock()
	e.paused, e.pausedBy = paused, by
	e.mu.Unlock()
	if !claim {
		if r.Status == StatusHibernated || to == StatusHibernated {
			// The VMM ended or started again: connections to the agent
			// are gone, the next call redials.
			e.dropAll()
		}
		r.Status = to
	}
	r.UpdatedAt = m.cfg.Now().UTC()
	sr.PausedBy = by
	if rs, ok := ev.(api.SandboxResumed); ok && rs.Reason != "" {
		// A wake from an idle pause: inspect shows why and when.
		sr.LastWake = &api.Wake{Reason: rs.Reason, At: r.UpdatedAt}
	}
	if r.Spec, err = json.Marshal(&sr); err != nil {
		return nil, err
	}
	if err := m.cfg.Store.UpdateSandbox(sctx, r); err != nil {
		return nil, err
	}
	m.Emit(r.TenantID, id, ev)
	return m.view(r), nil
}

// Stop stops a sandbox's processes; its record and writable layer stay
// until Remove.
func (m *Manager) Stop(ctx context.Context, tenant, id string, grace time.Duration) (*api.Sandbox, error) {
	r, err := m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return nil, notFound(id, err)
	}
	m.mu.Lock()
	e := m.live[id]
	delete(m.live, id)
	m.mu.Unlock()
	if e == nil {
		return m.view(r), nil
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace+30*time.Second)
	defer cancel()
	e.dropAll()
	if err := e.sb.Stop(sctx, grace); err != nil {
		m.log.Warn("stop", "sandbox", id, "err", err)
	}
	r.Status = StatusStopped
	r.UpdatedAt = m.cfg.Now().UTC()
	if err := m.cfg.Store.UpdateSandbox(sctx, r); err != nil {
		return nil, err
	}
	m.Emit(r.TenantID, id, api.SandboxStopped{})
	return m.view(r), nil
}

// Remove destroys a sandbox and deletes its record.
func (m *Manager) Remove(ctx context.Context, tenant, id string) error {
	r, err := m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return notFound(id, err)
	}
	if err := m.destroy(r, "removed"); err != nil {
		return err
	}
	return m.cfg.Store.DeleteSandbox(context.Background(), id)
}

// RemoveAsync removes a sandbox off the caller's path: it records the
// sandbox as removing (so a daemon that stops meanwhile finishes the job
// when it starts again), takes it out of service at once — no exec, files
// or policy answer for it any more — and destroys it in the background.
// The sandbox's confinement holds until its runtime has destroyed it; its
// network is detached with it. Removing a sandbox that is already being
// removed succeeds.
func (m *Manager) RemoveAsync(ctx context.Context, tenant, id string) error {
	r, err := m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return notFound(id, err)
	}
	if r.Status == StatusRemoving {
		return nil
	}
	r.Status, r.UpdatedAt = StatusRemoving, m.cfg.Now().UTC()
	if err := m.cfg.Store.UpdateSandbox(ctx, r); err != nil {
		return err
	}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		m.finishRemoval(r)
	}()
	return nil
}

// finishRemoval destroys a sandbox being removed and deletes its record.
func (m *Manager) finishRemoval(r *store.Sandbox) {
	if err := m.destroy(r, "removed"); err != nil {
		// The record stays "removing": the next daemon start tries again.
		m.log.Error("background removal", "sandbox", r.ID, "err", err)
		return
	}
	if err := m.cfg.Store.DeleteSandbox(context.Background(), r.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		m.log.Error("background removal: delete record", "sandbox", r.ID, "err", err)
	}
}

// destroy tears a sandbox down on the host and marks its record.
func (m *Manager) destroy(r *store.Sandbox, reason string) error {
	m.mu.Lock()
	e := m.live[r.ID]
	delete(m.live, r.ID)
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var sb isolation.Sandbox
	if e != nil {
		e.dropAll()
		sb = e.sb
	} else {
		sb = m.sandboxFromRecord(ctx, r)
	}
	if sb != nil {
		if err := sb.Destroy(ctx); err != nil {
			m.log.Error("destroy", "sandbox", r.ID, "err", err)
			return fmt.Errorf("destroy %s: %w", r.ID, err)
		}
	} else {
		m.cleanupOrphanDir(r)
	}
	m.imageRefs.release(r.ID)
	m.detach(r.ID)
	m.ports.dropPorts(r.ID)
	m.sysAudit.end(r.ID)
	var sr specRecord
	if json.Unmarshal(r.Spec, &sr) == nil {
		m.secrets.dropInline(r.TenantID, sr.Secrets)
	}
	defer m.snapshots.released(r.TenantID, sr.Snapshot)
	r.Status = StatusDestroyed
	if reason != "removed" {
		r.Error = reason
	}
	r.UpdatedAt = m.cfg.Now().UTC()
	if err := m.cfg.Store.UpdateSandbox(ctx, r); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	m.Emit(r.TenantID, r.ID, api.SandboxDestroyed{Reason: reason})
	m.log.Info("sandbox destroyed", "sandbox", r.ID, "reason", reason)
	return nil
}

// startAgent starts sb and waits until its agent (e's token) answers. The
// agent's socket exists before Start (the runtime made it), so the
// handshake is started alongside the runtime: it completes the moment the
// agent runs, overlapping the runtime's own exit.
func startAgent(ctx context.Context, runtime string, sb isolation.Sandbox, e *entry) error {
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	agentErr := make(chan error, 1)
	go func() {
		c, err := e.agent(actx)
		if err == nil {
			// The agent found that the processes it would start keep
			// capabilities: it runs nothing, and the sandbox is not made.
			err = c.Refused()
		}
		agentErr <- err
	}()
	err := sb.Start(ctx)
	close(e.started)
	if err != nil {
		acancel()
		<-agentErr
		return fmt.Errorf("start %s sandbox: %w", runtime, err)
	}
	var aerr error
	select {
	case aerr = <-agentErr:
	case <-time.After(agentStartTimeout):
		// An agent that died at start never answers: do not hold the
		// caller for the whole setup budget.
		acancel()
		<-agentErr
		aerr = fmt.Errorf("no answer within %s", agentStartTimeout)
	}
	if aerr != nil {
		if errors.Is(aerr, agentproto.ErrRefused) {
			return fmt.Errorf("the sandbox's %w", aerr)
		}
		return fmt.Errorf("sandbox started but its agent does not answer: %w", aerr)
	}
	return nil
}

// newRecord is the store record of a new sandbox of tenant made for p,
// with its applied spec sr, in status: its lifetime ends after the
// request's timeout (or the daemon's default).
func (m *Manager) newRecord(id string, tenant *store.Tenant, p *createParams, sr *specRecord, status string, now time.Time) *store.Sandbox {
	specJSON, _ := json.Marshal(sr)
	rec := &store.Sandbox{
		ID: id, TenantID: tenant.ID, Runtime: p.rt.Name(), Image: p.img.Name,
		Status: status, Spec: specJSON, CreatedAt: now, UpdatedAt: now,
		IdleTimeout: p.idle, LastActive: now, Labels: p.req.Labels,
	}
	if len(p.labels) > 0 {
		rec.Labels = map[string]string{}
		for k, v := range p.req.Labels {
			rec.Labels[k] = v
		}
		for k, v := range p.labels {
			rec.Labels[k] = v
		}
	}
	timeout := p.timeout
	if timeout == 0 {
		timeout = m.cfg.DefaultTimeout
	}
	if timeout > 0 {
		exp := now.Add(timeout)
		rec.ExpiresAt = &exp
	}
	return rec
}
