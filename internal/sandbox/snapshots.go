package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/isolation"
)

// Snapshots and forks.
//
// A snapshot is a saved state of a running sandbox (isolation.Snapshotter:
// a microVM's memory, devices and disks, or a container's or gVisor
// sandbox's writable layer), kept under Config.SnapshotDir by id, with a
// store row naming it within its tenant. A sandbox started from one is
// made, then bound, as every sandbox is: make passes the snapshot to the
// runtime (isolation.Spec.FromSnapshot) — a memory snapshot's guest
// resumes answering to the snapshotted sandbox's token and awaits a claim
// — and bind gives it everything its own: a new token, fresh entropy, the
// clock, its link's address, hostname, CA and environment, its own
// gateway, and fresh placeholders bound to the same vault entries (never
// the placeholder values of another sandbox). Its live policy starts from
// the document of the snapshotted sandbox's generation at the snapshot;
// budgets are per sandbox, each started with what the snapshotted sandbox
// had spent (docs/policy.md): a fork copies the spend, it cannot reset it.
//
// A fork is a snapshot (Fork true) and COUNT sandboxes started from it;
// the snapshot goes with the last of them.
//
// Which sandboxes were started from a snapshot is read from their records
// (specRecord.Snapshot), as volumes are: a snapshot is removed only when
// none is left, and a daemon that stops at any point finds at its next
// start (recoverSnapshots) every snapshot still being written, and every
// directory without a row, and removes them; a fork's snapshot that no
// sandbox uses any more goes too.
//
// What a snapshot holds of its sandbox is in its row's spec (snapshotSpec):
// never a secret value. An inline secret the sandbox was created with is
// copied in the vault under the snapshot's own name (deleted with it), so
// that a sandbox started from the snapshot outlives the one snapshotted.

// Snapshot statuses and kinds.
const (
	snapshotCreating = "creating"
	snapshotReady    = "ready"
	KindMemory       = "memory"
	KindFilesystem   = "filesystem"
)

// Bounds.
const (
	// DefaultMaxSnapshots is how many snapshots a tenant may keep when
	// Config.MaxSnapshots is zero (forks' included).
	DefaultMaxSnapshots = 32
	// MaxForkCount is the most copies one fork makes.
	MaxForkCount = 16
	// forkParallel is how many of a fork's copies are made at once.
	forkParallel = 4
)

// ForkParentLabel is the label every copy of a fork carries: the id of
// the sandbox forked.
const ForkParentLabel = ReservedLabelPrefix + "fork.parent"

var snapshotName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// snapshotSpec is a snapshot's store spec: what a sandbox started from it
// is made and bound with.
type snapshotSpec struct {
	Resources   isolation.Resources `json:"resources"`
	ImageDigest string              `json:"image_digest"`
	Env         []string            `json:"env,omitempty"`
	IdleTimeout string              `json:"idle_timeout,omitempty"`
	IdleAction  string              `json:"idle_action,omitempty"`
	// Policy is the live policy's document at the snapshot (PolicyRef: the
	// named policy the sandbox followed, which a started sandbox follows).
	Policy    *policy.Document `json:"policy,omitempty"`
	PolicyRef string           `json:"policy_ref,omitempty"`
	// Secrets are the bindings by vault name; Owned lists the vault names
	// the snapshot owns (copies of inline secrets), deleted with it.
	Secrets []api.SecretBinding `json:"secrets,omitempty"`
	Owned   []string            `json:"owned,omitempty"`
	// AgentToken is the token a memory snapshot's agent answers to until
	// its claim (the snapshotted sandbox's).
	AgentToken string `json:"agent_token,omitempty"`
	// Usage is what the sandbox had used of its budgets: every sandbox
	// started from the snapshot starts with it (a fork cannot reset
	// spending).
	Usage []store.BudgetUsage `json:"usage,omitempty"`
}

// Snapshots is the manager's service of the tenants' snapshots and of
// forks (Manager.Snapshots).
type Snapshots struct {
	m *Manager
	// mu serialises the check-then-record of a snapshot's name and the
	// tenant's count, and a removal against starts from the snapshot:
	// starting counts, by snapshot id, the creates from it that have
	// not yet written their row.
	mu       sync.Mutex
	starting map[string]int
}

// Snapshots is the service of the tenants' snapshots.
func (m *Manager) Snapshots() *Snapshots { return m.snapshots }

// dir is snapshot id's directory.
func (ss *Snapshots) dir(id string) string { return filepath.Join(ss.m.cfg.SnapshotDir, id) }

func (ss *Snapshots) maxPerTenant() int {
	if n := ss.m.cfg.MaxSnapshots; n > 0 {
		return n
	}
	return DefaultMaxSnapshots
}

// Create snapshots the running sandbox id of tenant scope ("" any: the
// admin) under name ("" one is picked); the snapshot is the sandbox's
// tenant's.
func (ss *Snapshots) Create(ctx context.Context, scope, id, name string) (*api.Snapshot, error) {
	sn, err := ss.create(ctx, scope, id, name, false)
	if err != nil {
		return nil, err
	}
	return ss.view(ctx, sn)
}

func (ss *Snapshots) create(ctx context.Context, scope, id, name string, fork bool) (*store.Snapshot, error) {
	m := ss.m
	if m.cfg.SnapshotDir == "" {
		return nil, fmt.Errorf("%w: this daemon keeps no snapshots", errdefs.ErrUnavailable)
	}
	if name != "" && !snapshotName.MatchString(name) {
		return nil, invalid("name: %q is not 1-63 of [a-z0-9-] starting with a letter or digit", name)
	}
	r, e, err := m.attached(ctx, scope, id)
	if err != nil {
		return nil, err
	}
	if r.Status != StatusRunning {
		return nil, fmt.Errorf("%w: sandbox %s is %s: only a running sandbox can be snapshotted (cagebox resume %s)", errdefs.ErrConflict, id, r.Status, id)
	}
	var sr specRecord
	if err := json.Unmarshal(r.Spec, &sr); err != nil {
		return nil, fmt.Errorf("sandbox %s: its record: %w", id, err)
	}
	if len(sr.Mounts) > 0 || sr.ReadOnlyRoot {
		return nil, invalid("sandbox %s has mounts or a read-only root: a snapshot holds the sandbox's own root filesystem (and a microVM's memory) only; copy what its mounts hold into a volume of its own", id)
	}
	rt, ok := isolation.Lookup(r.Runtime)
	if !ok {
		return nil, fmt.Errorf("sandbox %s: runtime %q is not registered", id, r.Runtime)
	}
	srt, ok := rt.(isolation.SnapshottingRuntime)
	snapper, ok2 := e.sb.(isolation.Snapshotter)
	if !ok || !ok2 {
		return nil, invalid("the %s runtime cannot snapshot a sandbox", rt.Name())
	}
	memory, err := srt.Snapshots()
	if err != nil {
		return nil, invalid("the %s runtime cannot snapshot a sandbox here: %v", rt.Name(), err)
	}
	img, err := m.cfg.Images.Get(r.Image)
	if err != nil {
		return nil, imageError(r.Image, err)
	}
	snID := "sn-" + randHex(8)
	if name == "" {
		if fork {
			name = "fork-" + randHex(6)
		} else {
			name = "snap-" + randHex(6)
		}
	}
	spec := &snapshotSpec{Resources: sr.Resources, ImageDigest: img.Digest, Env: sr.Env, IdleTimeout: sr.IdleTimeout,
		IdleAction: sr.IdleAction, Policy: sr.Policy, PolicyRef: sr.PolicyRef, AgentToken: sr.AgentToken}
	if live := m.Live(); live != nil {
		if ls, ok := live.Get(id); ok {
			// Copies of a frozen sandbox would run unfrozen: whoever froze
			// it (the operator, say) thaws it first.
			if ls.Frozen() {
				return nil, fmt.Errorf("%w: sandbox %s is frozen: a snapshot or fork of it would start sandboxes that are not; thaw it first (cagebox thaw %s)", errdefs.ErrConflict, id, id)
			}
			spec.Policy, _, spec.PolicyRef = ls.Policy()
		}
	}
	us, err := m.cfg.Store.ListBudgetUsage(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: its budgets' usage: %w", id, err)
	}
	for _, u := range us {
		spec.Usage = append(spec.Usage, *u)
	}
	sn := &store.Snapshot{ID: snID, TenantID: r.TenantID, Name: name, SandboxID: id, Runtime: r.Runtime, Image: r.Image,
		Status: snapshotCreating, Fork: fork}
	// Everything the snapshot owns is undone on error, last made first.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	if spec.Secrets, spec.Owned, err = ss.copySecrets(ctx, r.TenantID, snID, sr.Secrets); err != nil {
		return nil, err
	}
	undo = append(undo, func() { ss.dropOwned(r.TenantID, spec.Owned) })
	sn.Spec, _ = json.Marshal(spec)
	ss.mu.Lock()
	l, err := m.cfg.Store.ListSnapshots(ctx, r.TenantID)
	if err == nil && len(l) >= ss.maxPerTenant() {
		err = fmt.Errorf("%w: tenant %s keeps %d snapshots, the most this daemon allows; remove one (cagebox snapshot rm NAME)", errdefs.ErrDenied, r.TenantID, len(l))
	}
	if err == nil {
		err = m.cfg.Store.CreateSnapshot(ctx, sn)
		if errors.Is(err, store.ErrConflict) {
			err = fmt.Errorf("%w: a snapshot named %q exists; pick another name or remove it (cagebox snapshot rm %s)", errdefs.ErrConflict, name, name)
		}
	}
	ss.mu.Unlock()
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() {
		if derr := m.cfg.Store.DeleteSnapshot(context.Background(), snID); derr != nil && !errors.Is(derr, store.ErrNotFound) {
			m.log.Error("delete a failed snapshot's row", "snapshot", snID, "err", derr)
		}
	})
	// The snapshot holds its image, as a sandbox does: a restore reads
	// the image under it.
	if err = m.imageRefs.acquire(img, snID); err != nil {
		return nil, err
	}
	undo = append(undo, func() { m.imageRefs.release(snID) })
	dir := ss.dir(snID)
	if err = statedir.Make(dir); err != nil {
		return nil, fmt.Errorf("snapshot directory: %w", err)
	}
	undo = append(undo, func() { _ = os.RemoveAll(dir) })
	// The sandbox is busy while it is snapshotted: its idle timeout does
	// not pause or destroy it meanwhile.
	e.mu.Lock()
	e.execs++
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.execs--
		e.active = m.cfg.Now().UTC()
		e.mu.Unlock()
	}()
	// Bounded by the daemon, not by the caller's connection: a client that
	// hangs up must not leave a sandbox frozen or a snapshot half-made.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	// No pause, resume or hibernation meanwhile (the snapshot's own thaw
	// would undo a pause); one made before this point is seen here.
	e.freezeMu.Lock()
	defer e.freezeMu.Unlock()
	e.mu.Lock()
	paused := e.paused
	e.mu.Unlock()
	if paused {
		err = fmt.Errorf("%w: sandbox %s was paused: only a running sandbox can be snapshotted (cagebox resume %s)", errdefs.ErrConflict, id, id)
		return nil, err
	}
	t0 := time.Now()
	if !memory {
		// The guest's files as it last wrote them: gVisor's sentry keeps
		// written data in its own page cache until a sync.
		c, aerr := e.agent(sctx)
		if aerr == nil {
			aerr = c.Sync(sctx)
		}
		if aerr != nil {
			err = fmt.Errorf("snapshot sandbox %s: flush its files: %w", id, aerr)
			return nil, err
		}
	}
	info, err := snapper.Snapshot(sctx, dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	took := time.Since(t0)
	sn.Status, sn.SizeBytes, sn.Digest, sn.Kind = snapshotReady, info.Bytes, info.Digest, KindFilesystem
	if info.Memory {
		sn.Kind = KindMemory
	} else {
		// A filesystem snapshot's sandboxes boot afresh: no token to keep.
		spec.AgentToken = ""
		sn.Spec, _ = json.Marshal(spec)
	}
	if err = m.cfg.Store.UpdateSnapshot(sctx, sn); err != nil {
		return nil, fmt.Errorf("record snapshot: %w", err)
	}
	m.log.Info("sandbox snapshotted", "sandbox", id, "snapshot", snID, "name", name, "kind", sn.Kind, "bytes", sn.SizeBytes, "took", took)
	m.Emit(r.TenantID, id, api.SandboxSnapshotted{Snapshot: name, Kind: sn.Kind, SizeBytes: sn.SizeBytes, Fork: fork, DurationMs: took.Milliseconds()})
	return sn, nil
}

// copySecrets turns a sandbox's bindings into a snapshot's: stored
// secrets by name, inline ones copied under the snapshot's own names
// (returned as owned).
func (ss *Snapshots) copySecrets(ctx context.Context, tenant, snID string, bound []boundSecret) (reqs []api.SecretBinding, owned []string, err error) {
	defer func() {
		if err != nil {
			ss.dropOwned(tenant, owned)
		}
	}()
	for _, b := range bound {
		req := api.SecretBinding{Name: b.Name, Secret: b.Secret, Hosts: b.Hosts, Body: b.Body, Headers: b.Headers, Query: b.Query, Mode: b.Mode, HMAC: b.HMAC}
		if b.Inline {
			v := ss.m.cfg.Vault
			if v == nil {
				return nil, owned, fmt.Errorf("%w: secrets: this daemon has no vault", errdefs.ErrInvalid)
			}
			name := credentials.InlineName(snID, b.Name)
			if _, err := v.Copy(ctx, tenant, b.Secret, name, b.Mode == ModeEnv); err != nil {
				return nil, owned, fmt.Errorf("copy inline secret %s for the snapshot: %w", b.Name, err)
			}
			owned = append(owned, name)
			req.Secret = name
		}
		reqs = append(reqs, req)
	}
	return reqs, owned, nil
}

func (ss *Snapshots) dropOwned(tenant string, owned []string) {
	if v := ss.m.cfg.Vault; v != nil {
		for _, n := range owned {
			if err := v.Delete(context.Background(), tenant, n); err != nil && !errors.Is(err, vault.ErrNotFound) {
				ss.m.log.Error("delete a snapshot's secret", "secret", n, "err", err)
			}
		}
	}
}

// List returns the snapshots of tenant scope ("" all).
func (ss *Snapshots) List(ctx context.Context, scope string) ([]*api.Snapshot, error) {
	l, err := ss.m.cfg.Store.ListSnapshots(ctx, scope)
	if err != nil {
		return nil, err
	}
	users, err := ss.users(ctx, scope)
	if err != nil {
		return nil, err
	}
	out := []*api.Snapshot{}
	for _, sn := range l {
		if sn.Status != snapshotReady {
			continue
		}
		out = append(out, ss.viewWith(sn, len(users[sn.ID])))
	}
	return out, nil
}

// Get returns tenant scope's snapshot name.
func (ss *Snapshots) Get(ctx context.Context, scope, name string) (*api.Snapshot, error) {
	sn, err := ss.lookup(ctx, scope, name)
	if err != nil {
		return nil, err
	}
	return ss.view(ctx, sn)
}

// lookup finds tenant scope's ready snapshot name (the admin's scope: any
// tenant's, by name if only one tenant has it, or by id).
func (ss *Snapshots) lookup(ctx context.Context, scope, name string) (*store.Snapshot, error) {
	var sn *store.Snapshot
	var err error
	if scope != "" {
		sn, err = ss.m.cfg.Store.GetSnapshot(ctx, scope, name)
	} else {
		sn, err = ss.m.cfg.Store.GetSnapshot(ctx, "", name)
		if errors.Is(err, store.ErrNotFound) {
			var l []*store.Snapshot
			if l, err = ss.m.cfg.Store.ListSnapshots(ctx, ""); err == nil {
				err = store.ErrNotFound
				for _, c := range l {
					if c.Name == name {
						if sn != nil {
							return nil, invalid("snapshot name %q is used by more than one tenant: give its id (%s or %s)", name, sn.ID, c.ID)
						}
						sn, err = c, nil
					}
				}
			}
		}
	}
	if err == nil && sn.Status != snapshotReady {
		err = store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: no snapshot %q (cagebox snapshot ls lists yours)", errdefs.ErrNotFound, name)
	}
	return sn, err
}

// users maps each snapshot of tenant scope ("" all) to the sandboxes
// started from it that still exist, read from their records.
func (ss *Snapshots) users(ctx context.Context, scope string) (map[string][]string, error) {
	rs, err := ss.m.cfg.Store.ListSandboxes(ctx, scope)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	out := map[string][]string{}
	for _, r := range rs {
		if r.Status == StatusDestroyed || r.Status == StatusFailed {
			continue
		}
		var sr specRecord
		if json.Unmarshal(r.Spec, &sr) == nil && sr.Snapshot != "" {
			out[sr.Snapshot] = append(out[sr.Snapshot], r.ID)
		}
	}
	return out, nil
}

func (ss *Snapshots) view(ctx context.Context, sn *store.Snapshot) (*api.Snapshot, error) {
	users, err := ss.users(ctx, sn.TenantID)
	if err != nil {
		return nil, err
	}
	return ss.viewWith(sn, len(users[sn.ID])), nil
}

func (ss *Snapshots) viewWith(sn *store.Snapshot, inUse int) *api.Snapshot {
	var spec snapshotSpec
	_ = json.Unmarshal(sn.Spec, &spec)
	r := spec.Resources
	return &api.Snapshot{Name: sn.Name, Tenant: sn.TenantID, Sandbox: sn.SandboxID, Runtime: sn.Runtime, Image: sn.Image,
		Kind: sn.Kind, Resources: api.Resources{MemoryBytes: r.MemoryBytes, CPUs: r.CPUs, PIDs: r.PIDs, DiskBytes: r.DiskBytes},
		SizeBytes: sn.SizeBytes, Digest: sn.Digest, Fork: sn.Fork, InUse: inUse, CreatedAt: sn.CreatedAt}
}

// Remove removes tenant scope's snapshot name; it is refused while a
// sandbox started from it exists.
func (ss *Snapshots) Remove(ctx context.Context, scope, name string) error {
	sn, err := ss.lookup(ctx, scope, name)
	if err != nil {
		return err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	users, err := ss.users(ctx, sn.TenantID)
	if err != nil {
		return err
	}
	if u := users[sn.ID]; len(u) > 0 || ss.starting[sn.ID] > 0 {
		sort.Strings(u)
		return fmt.Errorf("%w: snapshot %s is in use by %d sandboxes started from it (%v): remove them first", errdefs.ErrConflict, name, len(u)+ss.starting[sn.ID], u)
	}
	return ss.removeLocked(sn)
}

// removeLocked removes sn: its row first (a crash after it leaves a
// directory without a row, which the next start removes), then its
// files, its secrets and its image reference.
func (ss *Snapshots) removeLocked(sn *store.Snapshot) error {
	m := ss.m
	if err := m.cfg.Store.DeleteSnapshot(context.Background(), sn.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	ss.dropFiles(sn)
	m.log.Info("snapshot removed", "snapshot", sn.ID, "name", sn.Name)
	m.Emit(sn.TenantID, sn.SandboxID, api.SandboxSnapshotRemoved{Snapshot: sn.Name})
	return nil
}

// dropFiles removes what a snapshot has besides its row.
func (ss *Snapshots) dropFiles(sn *store.Snapshot) {
	if err := os.RemoveAll(ss.dir(sn.ID)); err != nil {
		ss.m.log.Error("remove a snapshot's files", "snapshot", sn.ID, "err", err)
	}
	var spec snapshotSpec
	if json.Unmarshal(sn.Spec, &spec) == nil {
		ss.dropOwned(sn.TenantID, spec.Owned)
	}
	ss.m.imageRefs.release(sn.ID)
}

// released is told that a sandbox started from snapshot id is gone: a
// fork's snapshot goes with the last of them.
func (ss *Snapshots) released(tenant, id string) {
	if id == "" {
		return
	}
	ctx := context.Background()
	sn, err := ss.m.cfg.Store.GetSnapshot(ctx, "", id)
	if err != nil || !sn.Fork {
		return
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	users, err := ss.users(ctx, tenant)
	if err != nil || len(users[id]) > 0 || ss.starting[id] > 0 {
		return
	}
	if err := ss.removeLocked(sn); err != nil {
		ss.m.log.Error("remove a fork's snapshot", "snapshot", id, "err", err)
	}
}

// startFrom resolves a create request's from_snapshot for tenant: the
// snapshot (ready, the tenant's) and its spec, with the request filled in
// from it, and a hold on the snapshot (release: once the sandbox's row is
// written, or the create failed) so that it is not removed meanwhile.
func (ss *Snapshots) startFrom(ctx context.Context, tenant *store.Tenant, req *api.CreateSandboxRequest) (_ *store.Snapshot, _ *snapshotSpec, release func(), err error) {
	m := ss.m
	if m.cfg.SnapshotDir == "" {
		return nil, nil, nil, fmt.Errorf("%w: this daemon keeps no snapshots", errdefs.ErrUnavailable)
	}
	sn, err := ss.lookup(ctx, tenant.ID, req.FromSnapshot)
	if err != nil {
		return nil, nil, nil, err
	}
	var spec snapshotSpec
	if err := json.Unmarshal(sn.Spec, &spec); err != nil {
		return nil, nil, nil, fmt.Errorf("snapshot %s: its record: %w", sn.Name, err)
	}
	switch {
	case req.Runtime != "" && req.Runtime != "auto" && req.Runtime != sn.Runtime:
		return nil, nil, nil, invalid("from_snapshot: snapshot %s is of the %s runtime; leave runtime empty", sn.Name, sn.Runtime)
	case req.Image != "" && req.Image != sn.Image:
		return nil, nil, nil, invalid("from_snapshot: snapshot %s is of image %s; leave image empty", sn.Name, sn.Image)
	case (req.MemoryBytes != 0 && req.MemoryBytes != spec.Resources.MemoryBytes) || (req.CPUs != 0 && req.CPUs != spec.Resources.CPUs) ||
		(req.PIDs != 0 && req.PIDs != spec.Resources.PIDs) || (req.DiskBytes != 0 && req.DiskBytes != spec.Resources.DiskBytes):
		return nil, nil, nil, invalid("from_snapshot: a sandbox started from a snapshot has the snapshotted sandbox's limits; leave them empty")
	case len(req.Mounts) > 0 || req.ReadOnlyRoot || len(req.Audit) > 0:
		return nil, nil, nil, invalid("from_snapshot: mounts, a read-only root and syscall audit are not supported for a sandbox started from a snapshot")
	}
	req.Runtime, req.Image = sn.Runtime, sn.Image
	req.MemoryBytes, req.CPUs, req.PIDs, req.DiskBytes = spec.Resources.MemoryBytes, spec.Resources.CPUs, spec.Resources.PIDs, spec.Resources.DiskBytes
	if req.Env == nil {
		req.Env = spec.Env
	}
	if req.Secrets == nil {
		req.Secrets = spec.Secrets
	}
	if len(req.Policy) == 0 && len(req.Allow) == 0 && req.PolicyRef == "" {
		req.PolicyRef = spec.PolicyRef
		if spec.PolicyRef == "" && spec.Policy != nil {
			req.Policy, _ = json.Marshal(spec.Policy)
		}
	}
	if req.IdleTimeout == "" && req.IdleAction == "" {
		req.IdleTimeout, req.IdleAction = spec.IdleTimeout, spec.IdleAction
	}
	ss.mu.Lock()
	if ss.starting == nil {
		ss.starting = map[string]int{}
	}
	ss.starting[sn.ID]++
	ss.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			ss.mu.Lock()
			if ss.starting[sn.ID]--; ss.starting[sn.ID] <= 0 {
				delete(ss.starting, sn.ID)
			}
			ss.mu.Unlock()
		})
	}
	return sn, &spec, release, nil
}

// seedUsage gives sandbox id, started from a snapshot, the budget usage
// of the sandbox snapshotted, before its gateway is attached (which
// reads it).
func (ss *Snapshots) seedUsage(ctx context.Context, id string, spec *snapshotSpec) error {
	for _, u := range spec.Usage {
		u.SandboxID = id
		if _, err := ss.m.cfg.Store.AddBudgetUsage(ctx, u); err != nil {
			return fmt.Errorf("budget usage from the snapshot: %w", err)
		}
	}
	return nil
}

// checkImage refuses a start from sn when its image is no longer the one
// snapshotted (a rebuilt image of the same name).
func checkSnapshotImage(sn *store.Snapshot, spec *snapshotSpec, digest string) error {
	if spec.ImageDigest != "" && digest != spec.ImageDigest {
		return fmt.Errorf("%w: image %s changed since snapshot %s was taken (%s, now %s): the snapshot's files apply to the image it was taken on only", errdefs.ErrConflict, sn.Image, sn.Name, spec.ImageDigest, digest)
	}
	return nil
}

// Fork makes req.Count copies of the running sandbox id of tenant scope
// ("" any: the admin): a snapshot of it, and as many sandboxes started from
// it, each its own (token, address, placeholders, gateway), in the
// sandbox's tenant. All or nothing: if one copy cannot be made, the others
// and the snapshot are removed.
func (ss *Snapshots) Fork(ctx context.Context, scope, id string, req *api.ForkRequest) (*api.ForkResponse, error) {
	m := ss.m
	n := req.Count
	if n == 0 {
		n = 1
	}
	if n < 1 || n > MaxForkCount {
		return nil, invalid("count: %d copies; a fork makes 1 to %d", req.Count, MaxForkCount)
	}
	if err := ValidateLabels(req.Labels); err != nil {
		return nil, err
	}
	if _, err := parseDuration("timeout", req.Timeout); err != nil {
		return nil, err
	}
	r, err := m.cfg.Store.GetSandbox(ctx, scope, id)
	if err != nil {
		return nil, notFound(id, err)
	}
	tenant, err := m.cfg.Store.GetTenant(ctx, r.TenantID)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: its tenant: %w", id, err)
	}
	if scope != "" {
		if err := checkReserved(tenant.ID, req.Labels); err != nil {
			return nil, err
		}
	}
	sn, err := ss.create(ctx, scope, id, "", true)
	if err != nil {
		return nil, err
	}
	parent := map[string]string{ForkParentLabel: id}
	copies := make([]*api.Sandbox, n)
	errs := make([]error, n)
	sem := make(chan struct{}, forkParallel)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			copies[i], _, errs[i] = m.create(ctx, tenant, &api.CreateSandboxRequest{FromSnapshot: sn.Name, Labels: req.Labels, Timeout: req.Timeout}, parent)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range copies {
			if c != nil {
				if rerr := m.Remove(context.Background(), "", c.ID); rerr != nil {
					m.log.Error("remove a copy of a failed fork", "sandbox", c.ID, "err", rerr)
				}
			}
		}
		ss.released(tenant.ID, sn.ID)
		return nil, fmt.Errorf("fork %s: %w", id, errs[firstErr(errs)])
	}
	v, err := ss.view(ctx, sn)
	if err != nil {
		return nil, err
	}
	out := &api.ForkResponse{Snapshot: *v}
	for _, c := range copies {
		out.Sandboxes = append(out.Sandboxes, *c)
	}
	return out, nil
}

func firstErr(errs []error) int {
	for i, e := range errs {
		if e != nil {
			return i
		}
	}
	return 0
}

// recoverSnapshots removes, at the daemon's start (Recover), what a
// daemon that stopped left of snapshots: rows still being written and
// their files, directories without a row, and forks' snapshots that no
// sandbox uses any more.
func (ss *Snapshots) recoverSnapshots(ctx context.Context) error {
	m := ss.m
	if m.cfg.SnapshotDir == "" {
		return nil
	}
	if err := statedir.Make(m.cfg.SnapshotDir); err != nil {
		return fmt.Errorf("snapshot directory: %w", err)
	}
	l, err := m.cfg.Store.ListSnapshots(ctx, "")
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	users, err := ss.users(ctx, "")
	if err != nil {
		return err
	}
	known := map[string]bool{}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, sn := range l {
		switch {
		case sn.Status != snapshotReady:
			m.log.Warn("removing a snapshot the daemon stopped writing", "snapshot", sn.ID, "sandbox", sn.SandboxID)
		case sn.Fork && len(users[sn.ID]) == 0:
			m.log.Info("removing a fork's snapshot no sandbox uses", "snapshot", sn.ID)
		default:
			known[sn.ID] = true
			continue
		}
		if err := ss.removeLocked(sn); err != nil {
			return err
		}
	}
	ents, err := os.ReadDir(m.cfg.SnapshotDir)
	if err != nil {
		return fmt.Errorf("snapshot directory: %w", err)
	}
	for _, de := range ents {
		if !known[de.Name()] {
			m.log.Warn("removing a snapshot directory without a record", "dir", de.Name())
			_ = os.RemoveAll(filepath.Join(m.cfg.SnapshotDir, de.Name()))
			m.imageRefs.release(de.Name())
		}
	}
	return nil
}

// snapshotIDs lists the snapshots that hold image references (for
// ImageRefs.Prune).
func (ss *Snapshots) snapshotIDs(ctx context.Context) ([]string, error) {
	l, err := ss.m.cfg.Store.ListSnapshots(ctx, "")
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(l))
	for _, sn := range l {
		ids = append(ids, sn.ID)
	}
	return ids, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
