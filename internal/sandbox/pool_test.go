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
	if p := m.Pools(); len(p.Pools) == 1 {
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
	if err := m.StartPool(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a pooled sandbox", func() bool { return poolStatus(m).Ready == 1 })
	return c
}

// TestPoolClaim: a create of the pooled class takes the pooled sandbox —
// its agent claimed with a new token (the fill token stops working), the
// record written once, running — and the pool refills; nothing pooled is
// in the store.
func TestPoolClaim(t *testing.T) {
	testRuntime.use(createPlan{})
	m, db, _ := newCreateManager(t, "")
	startTestPool(t, m)
	if rs, _ := db.ListSandboxes(context.Background(), ""); len(rs) != 0 {
		t.Fatalf("pooled sandboxes in the store: %d", len(rs))
	}
	pooled := testRuntime.sandboxes()[0]
	if recs, _ := os.ReadDir(m.poolDir()); len(recs) != 1 {
		t.Fatalf("pool records: %d, want 1", len(recs))
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
	if _, err := m.ListDir(context.Background(), "t1", sb.ID, "/"); err != nil {
		t.Fatalf("list dir: %v", err)
	}
	waitUntil(t, "a refill", func() bool { st := poolStatus(m); return st.Ready == 1 && st.Claims == 1 })
	if recs, _ := os.ReadDir(m.poolDir()); len(recs) != 1 {
		t.Fatalf("pool records after claim and refill: %d, want 1 (the new one)", len(recs))
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

// TestPoolCloseAndRecover: Close destroys the ready sandboxes and their
// records; records a killed daemon left are destroyed by RecoverPool.
func TestPoolCloseAndRecover(t *testing.T) {
	testRuntime.use(createPlan{})
	m, _, _ := newCreateManager(t, "")
	startTestPool(t, m)
	pooled := testRuntime.sandboxes()[0]
	m.Close()
	if destroyed, _, _ := pooled.released(); !destroyed {
		t.Error("Close left a pooled sandbox")
	}
	if recs, _ := os.ReadDir(m.poolDir()); len(recs) != 0 {
		t.Errorf("pool records after Close: %d", len(recs))
	}
	// A record left by a killed daemon, with its state dir.
	m2, _, _ := newCreateManager(t, "")
	dir := filepath.Join(m2.cfg.StateDir, "sb-left0000000000")
	if err := os.MkdirAll(filepath.Join(dir, "rw"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := m2.writePoolRecord(&poolRecord{ID: "sb-left0000000000", Class: "createtest:default", StateDir: dir,
		State: &isolation.State{ID: "sb-left0000000000", Runtime: createRuntimeName}}); err != nil {
		t.Fatal(err)
	}
	if ids := PoolIDs(m2.cfg.StateDir); len(ids) != 1 || ids[0] != "sb-left0000000000" {
		t.Fatalf("PoolIDs %v", ids)
	}
	m2.RecoverPool(context.Background())
	if _, err := os.Stat(dir); err == nil {
		t.Error("RecoverPool left the state dir")
	}
	if ids := PoolIDs(m2.cfg.StateDir); len(ids) != 0 {
		t.Errorf("records after RecoverPool: %v", ids)
	}
}

// TestIdlePause: with idle action pause the idle timeout freezes the
// sandbox (event with the reason); the next exec or file operation wakes
// it; a sandbox paused through the API is not woken.
func TestIdlePause(t *testing.T) {
	testRuntime.use(createPlan{})
	m, db, _ := newCreateManager(t, "")
	var mu sync.Mutex
	now := time.Now()
	m.cfg.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
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
	if _, err := m.ListDir(ctx, "t1", sb.ID, "/"); err != nil {
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
	if _, err := m.ListDir(ctx, "t1", sb.ID, "/"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "cagebox resume") {
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
