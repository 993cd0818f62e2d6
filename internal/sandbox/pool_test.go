//go:build linux

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/isolation"
)

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func poolStatus(m *Manager) api.PoolStatus {
	if p := m.pools.Status(); len(p.Pools) == 1 {
		return p.Pools[0]
	}
	return api.PoolStatus{}
}

// startTestPool gives m a pool of one createtest sandbox of the default
// image and size.
func startTestPool(t *testing.T, m *Manager) pool.Class {
	t.Helper()
	c := pool.ClassOf(createRuntimeName, "default", isolation.Resources{})
	m.cfg.Pools = []pool.Target{{Class: c, Size: 1}}
	if err := m.pools.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a pooled sandbox", func() bool { return poolStatus(m).Ready == 1 })
	return c
}

// pooledRows are the IDs of the store's rows of no tenant, each checked
// to be status pooled.
func pooledRows(t *testing.T, db store.Store) []string {
	t.Helper()
	rs, err := db.ListUnownedSandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rs {
		if r.Status != StatusPooled {
			t.Errorf("row %s of no tenant is %s, not pooled", r.ID, r.Status)
		}
		ids = append(ids, r.ID)
	}
	return ids
}

// TestPoolClaim: a create of the pooled class takes the pooled sandbox —
// its agent claimed with a new token (the fill token stops working), its
// row bound to the tenant, running — and the pool refills. A pooled
// sandbox is a row of no tenant: no tenant (not even the admin's list)
// sees it; the pool's status names it.
func TestPoolClaim(t *testing.T) {
	testRuntime.use(createPlan{})
	m, db, _ := newCreateManager(t, "")
	startTestPool(t, m)
	if rs, _ := db.ListSandboxes(context.Background(), ""); len(rs) != 0 {
		t.Fatalf("pooled sandboxes in the tenants' lists: %d", len(rs))
	}
	pooled := testRuntime.sandboxes()[0]
	if ids := pooledRows(t, db); len(ids) != 1 || ids[0] != pooled.id {
		t.Fatalf("pooled rows %v, want [%s]", ids, pooled.id)
	}
	if st := poolStatus(m); len(st.Sandboxes) != 1 || st.Sandboxes[0] != pooled.id {
		t.Fatalf("pool status names %v, want [%s]", st.Sandboxes, pooled.id)
	}
	if _, err := m.Get(context.Background(), "", pooled.id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the admin's inspect of a pooled sandbox: %v, want not found", err)
	}
	if err := m.RemoveAsync(context.Background(), "", pooled.id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the admin's rm of a pooled sandbox: %v, want not found", err)
	}
	sb, err := m.Create(context.Background(), &store.Tenant{ID: "t1"}, createRequest())
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != pooled.id || sb.Status != StatusRunning || !sb.Pooled {
		t.Fatalf("created %s (%s), want the pooled %s running", sb.ID, sb.Status, pooled.id)
	}
	if !pooled.srv.Claimed() {
		t.Fatal("the pooled agent was not claimed")
	}
	// The fill token no longer opens the agent; the sandbox's does.
	conn, _ := pooled.DialAgent(context.Background())
	if _, err := agentproto.NewClient(context.Background(), conn, pooledToken(t, pooled)); !errors.Is(err, agentproto.ErrHandshake) {
		t.Fatalf("fill token after the claim: %v", err)
	}
	var sr specRecord
	r, _ := db.GetSandbox(context.Background(), "t1", sb.ID)
	_ = json.Unmarshal(r.Spec, &sr)
	conn, _ = pooled.DialAgent(context.Background())
	c, err := agentproto.NewClient(context.Background(), conn, sr.AgentToken)
	if err != nil {
		t.Fatalf("the sandbox's token: %v", err)
	}
	c.Close()
	// Exec and files work on the claimed sandbox.
	if _, err := m.guest.ListDir(context.Background(), "t1", sb.ID, "/"); err != nil {
		t.Fatalf("list dir: %v", err)
	}
	waitUntil(t, "a refill", func() bool { st := poolStatus(m); return st.Ready == 1 && st.Claims == 1 })
	if ids := pooledRows(t, db); len(ids) != 1 || ids[0] == pooled.id {
		t.Fatalf("pooled rows after claim and refill: %v, want the new one only", ids)
	}
	if rs, _ := db.ListSandboxes(context.Background(), "t1"); len(rs) != 1 || rs[0].ID != sb.ID {
		t.Fatalf("t1's rows after the claim: %d, want the claimed one", len(rs))
	}
	// Another size is made cold; the pool is untouched.
	req := createRequest()
	req.MemoryBytes = 256 << 20
	cold, err := m.Create(context.Background(), &store.Tenant{ID: "t1"}, req)
	if err != nil {
		t.Fatal(err)
	}
	if st := poolStatus(m); cold.ID == pooled.id || cold.Pooled || st.Claims != 1 || st.Misses != 0 {
		t.Fatalf("a 256m create: %s, pool %+v", cold.ID, st)
	}
}

// pooledToken digs the fill token out of a pooled sandbox's agent (the
// test runtime's agent is in this process).
func pooledToken(t *testing.T, s *createSandbox) string {
	t.Helper()
	return s.token
}

// TestPoolClaimFailureFallsBack: a pooled sandbox whose claim fails is
// destroyed and the create made cold (a miss); a request at fault fails
// without a cold retry.
func TestPoolClaimFailureFallsBack(t *testing.T) {
	testRuntime.use(createPlan{claimErr: errors.New("entropy device missing")})
	m, _, v := newCreateManager(t, "")
	startTestPool(t, m)
	pooled := testRuntime.sandboxes()[0]
	testRuntime.mu.Lock()
	testRuntime.plan.claimErr = nil
	testRuntime.mu.Unlock()
	sb, err := m.Create(context.Background(), &store.Tenant{ID: "t1"}, createRequest())
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID == pooled.id {
		t.Fatal("the sandbox whose claim failed was handed out")
	}
	if destroyed, open, _ := pooled.released(); !destroyed || open != 0 {
		t.Errorf("failed pooled sandbox: destroyed %v, %d connections open", destroyed, open)
	}
	if st := poolStatus(m); st.Misses != 1 || st.Claims != 0 {
		t.Errorf("pool %+v: want the failed claim counted as a miss", st)
	}
	// Only the cold sandbox's inline secret is in the vault.
	if infos, _ := v.List(context.Background(), "t1"); len(infos) != 1 {
		t.Errorf("vault: %d secrets, want 1", len(infos))
	}
	// A bad request is the request's fault: no cold retry, a 4xx.
	waitUntil(t, "a refill", func() bool { return poolStatus(m).Ready == 1 })
	req := createRequest()
	req.Secrets = append(req.Secrets, api.SecretBinding{Name: "NOHOSTS", Value: "x-value-123456"})
	if _, err := m.Create(context.Background(), &store.Tenant{ID: "t1"}, req); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad request from the pool: %v", err)
	}
}

// TestPoolCloseAndRecover: Close destroys the ready sandboxes and deletes
// their rows; the pooled sandboxes of a daemon that stopped without Close
// (killed) are destroyed by the next one's Recover, as are those an older
// daemon recorded as files below StateDir/pool.
func TestPoolCloseAndRecover(t *testing.T) {
	testRuntime.use(createPlan{})
	m, db, _ := newCreateManager(t, "")
	startTestPool(t, m)
	pooled := testRuntime.sandboxes()[0]
	m.Close()
	if destroyed, _, _ := pooled.released(); !destroyed {
		t.Error("Close left a pooled sandbox")
	}
	if ids := pooledRows(t, db); len(ids) != 0 {
		t.Errorf("pooled rows after Close: %v", ids)
	}

	// A killed daemon: its pool made a sandbox and never let it go. The
	// test runtime's Recover says gone, as a real one does for a sandbox
	// whose processes died with the host; what it left on disk goes.
	m2, db2, _ := newCreateManager(t, "")
	startTestPool(t, m2)
	left := pooledRows(t, db2)
	if len(left) != 1 {
		t.Fatalf("pooled rows %v, want one", left)
	}
	dir := m2.stateDir(left[0])
	if err := os.MkdirAll(filepath.Join(dir, "rw"), 0o700); err != nil {
		t.Fatal(err)
	}
	// An older daemon's pool record file, with its state dir.
	oldDir := filepath.Join(m2.cfg.StateDir, "sb-left0000000000")
	if err := os.MkdirAll(filepath.Join(oldDir, "rw"), 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(&legacyPoolRecord{ID: "sb-left0000000000", Class: "createtest:default", StateDir: oldDir,
		State: &isolation.State{ID: "sb-left0000000000", Runtime: createRuntimeName}})
	if err := os.MkdirAll(filepath.Join(m2.cfg.StateDir, "pool"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m2.cfg.StateDir, "pool", "sb-left0000000000.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if ids := LegacyPoolIDs(m2.cfg.StateDir); len(ids) != 1 || ids[0] != "sb-left0000000000" {
		t.Fatalf("LegacyPoolIDs %v", ids)
	}
	m3 := New(Config{Store: db2, Images: m2.cfg.Images, StateDir: m2.cfg.StateDir, Logger: m2.log})
	t.Cleanup(m3.Close)
	if err := m3.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ids := pooledRows(t, db2); len(ids) != 0 {
		t.Errorf("pooled rows after Recover: %v", ids)
	}
	for _, d := range []string{dir, oldDir, filepath.Join(m2.cfg.StateDir, "pool")} {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("Recover left %s", d)
		}
	}
	if rs, _ := db2.ListSandboxes(context.Background(), ""); len(rs) != 0 {
		t.Errorf("rows after Recover: %d", len(rs))
	}
}

// TestMakeBind: a cold create and a pool claim go through the same make
// and bind: a fill is a make, a claim a bind, a cold create one of each.
func TestMakeBind(t *testing.T) {
	testRuntime.use(createPlan{})
	m, _, _ := newCreateManager(t, "")
	count := func() (int64, int64) { return m.makes.Load(), m.binds.Load() }
	startTestPool(t, m)
	if mk, bd := count(); mk != 1 || bd != 0 {
		t.Fatalf("after a fill: %d makes, %d binds; want 1, 0", mk, bd)
	}
	sb, err := m.Create(context.Background(), &store.Tenant{ID: "t1"}, createRequest())
	if err != nil || !sb.Pooled {
		t.Fatalf("create from the pool: %+v, %v", sb, err)
	}
	waitUntil(t, "a refill", func() bool { st := poolStatus(m); return st.Ready == 1 && st.Claims == 1 })
	if mk, bd := count(); mk != 2 || bd != 1 {
		t.Fatalf("after a claim and a refill: %d makes, %d binds; want 2, 1", mk, bd)
	}
	req := createRequest()
	req.MemoryBytes = 256 << 20
	cold, err := m.Create(context.Background(), &store.Tenant{ID: "t1"}, req)
	if err != nil || cold.Pooled {
		t.Fatalf("cold create: %+v, %v", cold, err)
	}
	if mk, bd := count(); mk != 3 || bd != 2 {
		t.Fatalf("after a cold create: %d makes, %d binds; want 3, 2", mk, bd)
	}
}

// fakeClock is a clock (for Config.Now) that stands until advance moves it.
func fakeClock() (clock func() time.Time, advance func(time.Duration)) {
	var mu sync.Mutex
	now := time.Now()
	return func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
}

// TestIdlePause: with idle action pause the idle timeout freezes the
// sandbox (event with the reason); the next exec or file operation wakes
// it; a sandbox paused through the API is not woken.
func TestIdlePause(t *testing.T) {
	testRuntime.use(createPlan{})
	m, db, _ := newCreateManager(t, "")
	clock, advance := fakeClock()
	m.cfg.Now = clock
	ctx := context.Background()
	req := createRequest()
	req.IdleTimeout, req.IdleAction = "1m", IdlePause
	sb, err := m.Create(ctx, &store.Tenant{ID: "t1"}, req)
	if err != nil {
		t.Fatal(err)
	}
	made := testRuntime.sandboxes()[0]
	advance(2 * time.Minute)
	m.Reap(ctx)
	r, _ := db.GetSandbox(ctx, "t1", sb.ID)
	if r.Status != StatusPaused || made.pauses != 1 {
		t.Fatalf("after the idle timeout: %s, %d pauses; want paused", r.Status, made.pauses)
	}
	m.Reap(ctx) // already paused: nothing more
	if made.pauses != 1 {
		t.Fatalf("paused again: %d", made.pauses)
	}
	if _, err := m.guest.ListDir(ctx, "t1", sb.ID, "/"); err != nil {
		t.Fatalf("files on an idle-paused sandbox: %v", err)
	}
	r, _ = db.GetSandbox(ctx, "t1", sb.ID)
	if r.Status != StatusRunning || made.resumes != 1 {
		t.Fatalf("after a file operation: %s, %d resumes; want running", r.Status, made.resumes)
	}
	if v, _ := m.Get(ctx, "t1", sb.ID); v.IdleAction != IdlePause {
		t.Errorf("view idle action %q", v.IdleAction)
	}
	// Paused through the API: stays paused, the caller is told.
	if _, err := m.Pause(ctx, "t1", sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.guest.ListDir(ctx, "t1", sb.ID, "/"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "cagebox resume") {
		t.Fatalf("files on a paused sandbox: %v", err)
	}
	// Bad combinations are refused before anything is made.
	for _, bad := range []api.CreateSandboxRequest{
		{Runtime: createRuntimeName, IdleAction: IdlePause},
		{Runtime: createRuntimeName, IdleTimeout: "1m", IdleAction: "sleep"},
		{Runtime: createRuntimeName, IdleTimeout: "1m", IdleAction: "hibernate"},
	} {
		if _, err := m.Create(ctx, &store.Tenant{ID: "t1"}, &bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", bad, err)
		}
	}
}
