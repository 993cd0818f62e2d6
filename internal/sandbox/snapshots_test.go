//go:build linux

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/isolation"
)

// snapRuntime is createRuntime with memory snapshots: Snapshot writes a
// file into the snapshot's directory; Create records the spec it was given
// (FromSnapshot, the token a restore answers to).
type snapRuntime struct {
	*createRuntime
	// mu guards specs.
	mu    sync.Mutex
	specs []isolation.Spec
}

const snapRuntimeName = "snaptest"

var testSnapRuntime = &snapRuntime{createRuntime: &createRuntime{}}

func init() { isolation.Register(testSnapRuntime) }

func (r *snapRuntime) Name() string             { return snapRuntimeName }
func (r *snapRuntime) Snapshots() (bool, error) { return true, nil }
func (r *snapRuntime) Class() isolation.Class   { return isolation.Namespaces }
func (r *snapRuntime) lastSpecs() []isolation.Spec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]isolation.Spec(nil), r.specs...)
}
func (r *snapRuntime) reset() { r.mu.Lock(); r.specs = nil; r.mu.Unlock(); r.use(createPlan{}) }
func (r *snapRuntime) failCreates(err error) {
	r.createRuntime.mu.Lock()
	r.plan.createErr = err
	r.createRuntime.mu.Unlock()
}
func (s *snapSandbox) State() isolation.State {
	return isolation.State{ID: s.id, Runtime: snapRuntimeName}
}
func (s *snapSandbox) ClaimInfo() isolation.ClaimInfo { return isolation.ClaimInfo{Token: s.token} }

type snapSandbox struct{ *createSandbox }

// snapHold, when set, makes Snapshot tell entered and wait for release.
var snapHold struct {
	sync.Mutex
	entered, release chan struct{}
}

func (s *snapSandbox) Snapshot(_ context.Context, dir string) (isolation.SnapshotInfo, error) {
	snapHold.Lock()
	entered, release := snapHold.entered, snapHold.release
	snapHold.Unlock()
	if entered != nil {
		close(entered)
		<-release
	}
	if err := os.WriteFile(filepath.Join(dir, "state"), []byte(s.id), 0o600); err != nil {
		return isolation.SnapshotInfo{}, err
	}
	return isolation.SnapshotInfo{Memory: true, Bytes: int64(len(s.id)), Digest: "sha256:test"}, nil
}

func (r *snapRuntime) Create(ctx context.Context, spec *isolation.Spec) (isolation.Sandbox, error) {
	if spec.FromSnapshot != "" {
		if _, err := os.Stat(filepath.Join(spec.FromSnapshot, "state")); err != nil {
			return nil, err
		}
	}
	sb, err := r.createRuntime.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.specs = append(r.specs, *spec)
	r.mu.Unlock()
	return &snapSandbox{sb.(*createSandbox)}, nil
}

func newSnapManager(t *testing.T) (*Manager, store.Store) {
	t.Helper()
	testSnapRuntime.reset()
	m, db, _ := newCreateManager(t, "")
	m.cfg.SnapshotDir = filepath.Join(t.TempDir(), "snapshots")
	if err := m.snapshots.recoverSnapshots(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTenant(context.Background(), &store.Tenant{ID: "t2", Name: "t2"}); err != nil {
		t.Fatal(err)
	}
	return m, db
}

func snapRequest() *api.CreateSandboxRequest {
	r := createRequest()
	r.Runtime = snapRuntimeName
	r.Env = []string{"A=1"}
	return r
}

// placeholders is a sandbox's placeholder values by binding name.
func placeholders(t *testing.T, db store.Store, id string) map[string]string {
	t.Helper()
	r, err := db.GetSandbox(context.Background(), "", id)
	if err != nil {
		t.Fatal(err)
	}
	var sr specRecord
	if err := json.Unmarshal(r.Spec, &sr); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, b := range sr.Secrets {
		out[b.Name] = b.Placeholder
	}
	return out
}

// TestSnapshotStartAndRemove: a snapshot is the sandbox's tenant's; a
// sandbox started from it is made from its directory, answering at first
// to the snapshotted sandbox's token, with the same environment and fresh
// placeholders for the same secrets, and outlives the sandbox snapshotted
// (its inline secret was copied); the snapshot cannot be removed while it
// is used, and its removal leaves nothing (files, secrets, row).
func TestSnapshotStartAndRemove(t *testing.T) {
	m, db := newSnapManager(t)
	ctx := context.Background()
	t1 := &store.Tenant{ID: "t1"}
	parent, err := m.Create(ctx, t1, snapRequest())
	if err != nil {
		t.Fatal(err)
	}
	pr, _ := db.GetSandbox(ctx, "t1", parent.ID)
	var psr specRecord
	_ = json.Unmarshal(pr.Spec, &psr)
	parentToken := psr.AgentToken
	sn, err := m.Snapshots().Create(ctx, "t1", parent.ID, "base")
	if err != nil {
		t.Fatal(err)
	}
	if sn.Name != "base" || sn.Tenant != "t1" || sn.Kind != KindMemory || sn.Sandbox != parent.ID || sn.Digest != "sha256:test" || sn.InUse != 0 {
		t.Fatalf("snapshot %+v", sn)
	}
	if _, err := m.Snapshots().Create(ctx, "t1", parent.ID, "base"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second snapshot of the same name: %v, want a conflict", err)
	}
	if _, err := m.Snapshots().Create(ctx, "t1", parent.ID, "Bad Name"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a bad name: %v, want invalid", err)
	}
	if _, err := m.Snapshots().Get(ctx, "t2", "base"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's snapshot: %v, want not found", err)
	}
	if _, err := m.Create(ctx, &store.Tenant{ID: "t2"}, &api.CreateSandboxRequest{FromSnapshot: "base"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a start from another tenant's snapshot: %v, want not found", err)
	}
	if _, err := m.Create(ctx, t1, &api.CreateSandboxRequest{FromSnapshot: "base", MemoryBytes: 1 << 30}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a start from a snapshot with other limits: %v, want invalid", err)
	}
	// The sandbox snapshotted goes; one started from the snapshot still can.
	if err := m.Remove(ctx, "t1", parent.ID); err != nil {
		t.Fatal(err)
	}
	child, err := m.Create(ctx, t1, &api.CreateSandboxRequest{FromSnapshot: "base"})
	if err != nil {
		t.Fatal(err)
	}
	specs := testSnapRuntime.lastSpecs()
	cs := specs[len(specs)-1]
	if cs.FromSnapshot == "" || cs.AgentToken != parentToken || !cs.AwaitClaim {
		t.Errorf("restore spec: from %q, token is the parent's %v, await claim %v", cs.FromSnapshot, cs.AgentToken == parentToken, cs.AwaitClaim)
	}
	if child.Snapshot != "base" || child.Runtime != snapRuntimeName {
		t.Errorf("child %+v", child)
	}
	cr, _ := db.GetSandbox(ctx, "t1", child.ID)
	var csr specRecord
	_ = json.Unmarshal(cr.Spec, &csr)
	if csr.AgentToken == parentToken || len(csr.Env) != 1 || csr.Env[0] != "A=1" {
		t.Errorf("child record: token is the parent's %v, env %v", csr.AgentToken == parentToken, csr.Env)
	}
	if ph := placeholders(t, db, child.ID); ph["API_TOKEN"] == "" {
		t.Errorf("child has no placeholder for API_TOKEN: %v", ph)
	}
	if got, _ := m.Snapshots().Get(ctx, "t1", "base"); got == nil || got.InUse != 1 {
		t.Errorf("in use: %+v", got)
	}
	if err := m.Snapshots().Remove(ctx, "t1", "base"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("removing a snapshot in use: %v, want a conflict", err)
	}
	if err := m.Remove(ctx, "t1", child.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.Snapshots().Remove(ctx, "t1", "base"); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(m.cfg.SnapshotDir); len(ents) != 0 {
		t.Errorf("snapshot files left: %v", ents)
	}
	if infos, _ := m.cfg.Vault.List(ctx, "t1"); len(infos) != 0 {
		t.Errorf("secrets left in the vault: %d", len(infos))
	}
	if l, _ := db.ListSnapshots(ctx, ""); len(l) != 0 {
		t.Errorf("snapshot rows left: %d", len(l))
	}
}

// TestFork: a fork makes COUNT sandboxes of the sandbox's tenant, each
// with its own token and placeholders (none the parent's or another
// copy's), labelled with their parent; the parent keeps running; the
// fork's snapshot goes with its last copy. A fork whose copies cannot all
// be made leaves nothing.
func TestFork(t *testing.T) {
	m, db := newSnapManager(t)
	ctx := context.Background()
	parent, err := m.Create(ctx, &store.Tenant{ID: "t1"}, snapRequest())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Snapshots().Fork(ctx, "t2", parent.ID, &api.ForkRequest{Count: 2}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's fork: %v, want not found", err)
	}
	if _, err := m.Snapshots().Fork(ctx, "t1", parent.ID, &api.ForkRequest{Count: MaxForkCount + 1}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("too many copies: %v, want invalid", err)
	}
	// What the parent spent of a budget, each copy starts with.
	if _, err := db.AddBudgetUsage(ctx, store.BudgetUsage{SandboxID: parent.ID, Budget: "llm", Requests: 7, SpendMicros: 1500}); err != nil {
		t.Fatal(err)
	}
	res, err := m.Snapshots().Fork(ctx, "t1", parent.ID, &api.ForkRequest{Count: 3, Labels: map[string]string{"run": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sandboxes) != 3 || !res.Snapshot.Fork || res.Snapshot.InUse != 3 {
		t.Fatalf("fork: %d copies, snapshot %+v", len(res.Sandboxes), res.Snapshot)
	}
	seen := map[string]string{placeholders(t, db, parent.ID)["API_TOKEN"]: parent.ID}
	for _, c := range res.Sandboxes {
		if c.Tenant != "t1" || c.Labels[ForkParentLabel] != parent.ID || c.Labels["run"] != "a" || c.Status != StatusRunning {
			t.Errorf("copy %+v", c)
		}
		ph := placeholders(t, db, c.ID)["API_TOKEN"]
		if other, dup := seen[ph]; dup || ph == "" {
			t.Errorf("copy %s's placeholder %q is also %s's", c.ID, ph, other)
		}
		seen[ph] = c.ID
		if us, _ := db.ListBudgetUsage(ctx, c.ID); len(us) != 1 || us[0].Requests != 7 || us[0].SpendMicros != 1500 {
			t.Errorf("copy %s's budget usage: %+v, want the parent's", c.ID, us)
		}
	}
	if p, err := m.Get(ctx, "t1", parent.ID); err != nil || p.Status != StatusRunning {
		t.Errorf("parent after the fork: %+v %v", p, err)
	}
	for _, c := range res.Sandboxes {
		if err := m.Remove(ctx, "t1", c.ID); err != nil {
			t.Fatal(err)
		}
	}
	if l, _ := db.ListSnapshots(ctx, "t1"); len(l) != 0 {
		t.Errorf("the fork's snapshot outlived its copies: %+v", l[0])
	}
	// A fork whose copies fail leaves no copy and no snapshot.
	testSnapRuntime.failCreates(errors.New("no room"))
	if _, err := m.Snapshots().Fork(ctx, "t1", parent.ID, &api.ForkRequest{Count: 2}); err == nil {
		t.Fatal("a fork whose copies fail succeeded")
	}
	if l, _ := db.ListSnapshots(ctx, "t1"); len(l) != 0 {
		t.Errorf("a failed fork left its snapshot")
	}
	if ents, _ := os.ReadDir(m.cfg.SnapshotDir); len(ents) != 0 {
		t.Errorf("a failed fork left snapshot files: %v", ents)
	}
	rs, _ := db.ListSandboxes(ctx, "t1")
	for _, r := range rs {
		if r.ID != parent.ID && r.Status != StatusFailed {
			t.Errorf("a failed fork left sandbox %s %s", r.ID, r.Status)
		}
	}
}

// TestSnapshotRecovery: a daemon that stopped while writing a snapshot,
// or after a fork's copies went, leaves nothing once the next one starts:
// the half-written snapshot's row and files, an unused fork's snapshot and
// a directory without a row are removed; a ready snapshot stays.
func TestSnapshotRecovery(t *testing.T) {
	m, db := newSnapManager(t)
	ctx := context.Background()
	for _, sn := range []*store.Snapshot{
		{ID: "sn-half", TenantID: "t1", Name: "half", Status: snapshotCreating},
		{ID: "sn-fork", TenantID: "t1", Name: "fork", Status: snapshotReady, Fork: true},
		{ID: "sn-kept", TenantID: "t1", Name: "kept", Status: snapshotReady},
	} {
		if err := db.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(m.cfg.SnapshotDir, sn.ID), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(m.cfg.SnapshotDir, "sn-stray"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := m.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	l, _ := db.ListSnapshots(ctx, "")
	if len(l) != 1 || l[0].ID != "sn-kept" {
		t.Errorf("rows after recovery: %+v", l)
	}
	ents, _ := os.ReadDir(m.cfg.SnapshotDir)
	if len(ents) != 1 || ents[0].Name() != "sn-kept" {
		t.Errorf("directories after recovery: %v", ents)
	}
}

// TestSnapshotHoldsPause: an operator's pause that arrives while a
// snapshot is being taken waits for it, so the snapshot's thaw cannot undo
// it: the sandbox ends paused, and a pause never ran inside the snapshot.
func TestSnapshotHoldsPause(t *testing.T) {
	m, _ := newSnapManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, &store.Tenant{ID: "t1"}, snapRequest())
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	snapHold.Lock()
	snapHold.entered, snapHold.release = entered, release
	snapHold.Unlock()
	t.Cleanup(func() {
		snapHold.Lock()
		snapHold.entered, snapHold.release = nil, nil
		snapHold.Unlock()
	})
	snapDone := make(chan error, 1)
	go func() {
		_, err := m.Snapshots().Create(ctx, "", sb.ID, "held")
		snapDone <- err
	}()
	<-entered
	pauseDone := make(chan error, 1)
	go func() {
		_, err := m.Pause(ctx, "", sb.ID)
		pauseDone <- err
	}()
	// A pause that did not wait would finish now; give it the chance
	// (a loaded machine may only make this test miss the bug, never fail
	// a correct manager).
	select {
	case err := <-pauseDone:
		t.Fatalf("a pause finished while the snapshot was being taken (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-snapDone; err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if err := <-pauseDone; err != nil {
		t.Fatalf("pause after the snapshot: %v", err)
	}
	got, err := m.Get(ctx, "", sb.ID)
	if err != nil || got.Status != StatusPaused {
		t.Fatalf("after the snapshot and the pause: %+v %v; want paused", got, err)
	}
}
