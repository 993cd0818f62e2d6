//go:build linux

package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/isolation"
)

// createRuntime is a runtime whose sandboxes run a real agentproto.Server
// in this process; plan says where the next Create fails. (The real
// runtimes' own undo is covered by the conformance suite, as root.)
type createRuntime struct {
	// mu guards plan and made.
	mu   sync.Mutex
	plan createPlan
	made []*createSandbox
}

type createPlan struct {
	createErr error  // rt.Create fails
	startErr  error  // Start fails
	refused   string // the agent refuses to run processes
	claimErr  error  // the agent's claim fails (pooled sandboxes)
	// destroyHeld, when set, holds Destroy until it is closed.
	destroyHeld chan struct{}
	// recoverable: Recover returns the sandbox made with that id (a
	// daemon restart finds it running).
	recoverable bool
}

const createRuntimeName = "createtest"

var testRuntime = &createRuntime{}

func init() { isolation.Register(testRuntime) }

var _ isolation.Runtime = (*createRuntime)(nil)

func (r *createRuntime) Name() string           { return createRuntimeName }
func (r *createRuntime) Class() isolation.Class { return isolation.Namespaces }
func (r *createRuntime) Available() error       { return nil }
func (r *createRuntime) Recover(_ context.Context, st isolation.State) (isolation.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.plan.recoverable {
		for _, sb := range r.made {
			if sb.id == st.ID {
				return sb, nil
			}
		}
	}
	return nil, isolation.ErrGone
}

func (r *createRuntime) Create(_ context.Context, spec *isolation.Spec) (isolation.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.plan.createErr != nil {
		return nil, r.plan.createErr
	}
	claimErr := r.plan.claimErr
	sb := &createSandbox{id: spec.ID, token: spec.AgentToken, startErr: r.plan.startErr, held: r.plan.destroyHeld, srv: &agentproto.Server{Token: spec.AgentToken, Refused: r.plan.refused,
		AwaitClaim: spec.AwaitClaim, OnClaim: func(*agentproto.Claim) error { return claimErr }}}
	r.made = append(r.made, sb)
	return sb, nil
}

// use sets the plan for the next creates and forgets earlier sandboxes.
func (r *createRuntime) use(p createPlan) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.plan, r.made = p, nil
}

func (r *createRuntime) sandboxes() []*createSandbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*createSandbox(nil), r.made...)
}

type createSandbox struct {
	id       string
	token    string // the spec's agent token
	srv      *agentproto.Server
	startErr error
	held     chan struct{} // Destroy waits for it to close (nil: never)

	// mu guards conns, destroyed, pauses and resumes.
	mu              sync.Mutex
	conns           []*trackedConn
	destroyed       bool
	pauses, resumes int
}

func (s *createSandbox) ID() string { return s.id }
func (s *createSandbox) State() isolation.State {
	return isolation.State{ID: s.id, Runtime: createRuntimeName}
}
func (s *createSandbox) Start(context.Context) error { return s.startErr }
func (s *createSandbox) Pause(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pauses++
	return nil
}
func (s *createSandbox) Resume(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resumes++
	return nil
}
func (s *createSandbox) Stop(context.Context, time.Duration) error { return nil }
func (s *createSandbox) Destroy(context.Context) error {
	if s.held != nil {
		<-s.held
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.destroyed = true
	return nil
}

func (s *createSandbox) DialAgent(context.Context) (net.Conn, error) {
	host, guest := net.Pipe()
	go s.srv.ServeConn(guest)
	c := &trackedConn{Conn: host}
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
	return c, nil
}

// released reports whether the sandbox was destroyed, how many of the
// host's agent connections are still open and how many were dialled.
func (s *createSandbox) released() (destroyed bool, open, dialled int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dialled = len(s.conns)
	for _, c := range s.conns {
		if !c.isClosed() {
			open++
		}
	}
	return s.destroyed, open, dialled
}

// trackedConn is the host's end of an agent connection; it records Close.
type trackedConn struct {
	net.Conn
	mu     sync.Mutex
	closed bool
}

func (c *trackedConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return c.Conn.Close()
}

func (c *trackedConn) isClosed() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.closed }

// failingStore is a real store whose UpdateSandbox fails for a record
// about to be stored in status failOn.
type failingStore struct {
	store.Store
	failOn string
}

func (s *failingStore) UpdateSandbox(ctx context.Context, r *store.Sandbox) error {
	if r.Status == s.failOn {
		return errors.New("disk full")
	}
	return s.Store.UpdateSandbox(ctx, r)
}

// newCreateManager returns a manager with an image "default", a vault, and
// a store that fails updates to status failOn ("" = none).
func newCreateManager(t *testing.T, failOn string) (*Manager, *sqlite.Store, *vault.Vault) {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.CreateTenant(context.Background(), &store.Tenant{ID: "t1", Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	images := t.TempDir()
	if err := os.MkdirAll(filepath.Join(images, "default", "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(images, "default", "image.json"), []byte(`{"name":"default"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	key, err := vault.NewKey(make([]byte, vault.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	v := vault.New(vault.NewMemBackend(), key)
	m := New(Config{
		Store: &failingStore{Store: db, failOn: failOn}, Images: &image.Cache{Dir: images}, Vault: v,
		StateDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	t.Cleanup(m.Close)
	return m, db, v
}

func createRequest() *api.CreateSandboxRequest {
	return &api.CreateSandboxRequest{
		Runtime: createRuntimeName,
		Secrets: []api.SecretBinding{{Name: "API_TOKEN", Value: "inline-value-12345", Hosts: []string{"api.example.com"}}},
	}
}

// TestCreateUndo: a create that fails at any step after the record exists
// leaves nothing behind — the sandbox destroyed, the host's agent
// connections closed, the inline secret gone from the vault, nothing
// attached — and its record says failed, with the error, and a
// sandbox.failed event.
func TestCreateUndo(t *testing.T) {
	for _, tc := range []struct {
		name    string
		plan    createPlan
		failOn  string // status whose store update fails
		want    string // in the error
		made    bool   // the runtime made a sandbox
		dialled bool   // the agent was dialled
	}{
		{name: "runtime create fails", plan: createPlan{createErr: errors.New("no rootfs")}, want: "create createtest sandbox: no rootfs"},
		{name: "runtime state not recorded", failOn: StatusCreating, want: "record sandbox state: disk full", made: true},
		{name: "start fails", plan: createPlan{startErr: errors.New("runc says no")}, want: "start createtest sandbox: runc says no", made: true},
		{name: "agent refuses", plan: createPlan{refused: "processes would hold CAP_SETPCAP"}, want: "CAP_SETPCAP", made: true, dialled: true},
		{name: "running not recorded", failOn: StatusRunning, want: "record sandbox: disk full", made: true, dialled: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testRuntime.use(tc.plan)
			m, db, v := newCreateManager(t, tc.failOn)
			ctx := context.Background()
			_, err := m.Create(ctx, &store.Tenant{ID: "t1"}, createRequest())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("create: %v, want an error containing %q", err, tc.want)
			}
			if n := m.Count(); n != 0 {
				t.Errorf("%d sandboxes attached after a failed create", n)
			}
			sbs := testRuntime.sandboxes()
			if tc.made != (len(sbs) == 1) {
				t.Fatalf("runtime made %d sandboxes", len(sbs))
			}
			if tc.made {
				destroyed, open, dialled := sbs[0].released()
				if !destroyed {
					t.Error("the runtime's sandbox was not destroyed")
				}
				if open != 0 {
					t.Errorf("%d agent connections left open", open)
				}
				if tc.dialled && dialled == 0 {
					t.Error("the agent was never dialled")
				}
			}
			if infos, err := v.List(ctx, "t1"); err != nil || len(infos) != 0 {
				t.Errorf("vault after a failed create: %d secrets (%v), want the inline one removed", len(infos), err)
			}
			rs, lerr := db.ListSandboxes(ctx, "t1")
			if lerr != nil {
				t.Fatal(lerr)
			}
			if len(rs) != 1 || rs[0].Status != StatusFailed || rs[0].Error != err.Error() {
				t.Fatalf("records %+v, want one, failed, with the error %q", rs, err)
			}
			m.Close() // stores the queued events
			evs, err := db.ListEvents(ctx, "", rs[0].ID, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			var failed bool
			for _, e := range evs {
				failed = failed || (e.Kind == "sandbox.failed" && strings.Contains(string(e.Data), tc.want))
			}
			if !failed {
				t.Errorf("no sandbox.failed event naming %q in %d events", tc.want, len(evs))
			}
		})
	}
}

// TestCreateValidationMakesNothing: a request refused before the record
// exists leaves no record and no inline secret.
func TestCreateValidationMakesNothing(t *testing.T) {
	testRuntime.use(createPlan{})
	m, db, v := newCreateManager(t, "")
	ctx := context.Background()
	req := createRequest()
	// The second binding is refused after the first is sealed in the vault.
	req.Secrets = append(req.Secrets, api.SecretBinding{Name: "OTHER", Value: "other-value-12345"})
	if _, err := m.Create(ctx, &store.Tenant{ID: "t1"}, req); err == nil || !strings.Contains(err.Error(), "hosts") {
		t.Fatalf("create: %v, want the missing hosts refused", err)
	}
	if infos, err := v.List(ctx, "t1"); err != nil || len(infos) != 0 {
		t.Errorf("vault: %d secrets (%v), want the first inline secret removed", len(infos), err)
	}
	if rs, err := db.ListSandboxes(ctx, "t1"); err != nil || len(rs) != 0 {
		t.Errorf("records %v (%v), want none", rs, err)
	}
	if n := len(testRuntime.sandboxes()); n != 0 {
		t.Errorf("runtime made %d sandboxes", n)
	}
}

// TestCreateThenRemove: a create that succeeds keeps what it made (the
// undo steps are released), and Remove releases it.
func TestCreateThenRemove(t *testing.T) {
	testRuntime.use(createPlan{})
	m, db, v := newCreateManager(t, "")
	ctx := context.Background()
	sb, err := m.Create(ctx, &store.Tenant{ID: "t1"}, createRequest())
	if err != nil {
		t.Fatal(err)
	}
	if sb.Status != StatusRunning || m.Count() != 1 {
		t.Fatalf("sandbox %+v, %d attached, want running and attached", sb, m.Count())
	}
	made := testRuntime.sandboxes()
	if len(made) != 1 {
		t.Fatalf("runtime made %d sandboxes", len(made))
	}
	if destroyed, open, _ := made[0].released(); destroyed || open != 1 {
		t.Fatalf("after create: destroyed %v, %d agent connections open; want kept, one open", destroyed, open)
	}
	if infos, _ := v.List(ctx, "t1"); len(infos) != 1 {
		t.Fatalf("vault: %d secrets, want the inline one", len(infos))
	}
	if err := m.Remove(ctx, "t1", sb.ID); err != nil {
		t.Fatal(err)
	}
	if destroyed, open, _ := made[0].released(); !destroyed || open != 0 {
		t.Errorf("after remove: destroyed %v, %d agent connections open", destroyed, open)
	}
	if infos, _ := v.List(ctx, "t1"); len(infos) != 0 {
		t.Errorf("vault after remove: %d secrets", len(infos))
	}
	if rs, _ := db.ListSandboxes(ctx, "t1"); len(rs) != 0 {
		t.Errorf("records after remove: %d", len(rs))
	}
}

// TestRemoveAsync: a removal accepted off the caller's path is recorded at
// once, finishes in the background (nothing left: runtime destroyed, agent
// connections closed, inline secret gone, record deleted), and one that a
// stopped daemon left unfinished is finished by the next one's Recover.
func TestRemoveAsync(t *testing.T) {
	// The background destroy is held until the second removal is in: a
	// removal under way is accepted again (the first, finished, would
	// leave nothing to find).
	held := make(chan struct{})
	testRuntime.use(createPlan{destroyHeld: held})
	m, db, v := newCreateManager(t, "")
	ctx := context.Background()
	sb, err := m.Create(ctx, &store.Tenant{ID: "t1"}, createRequest())
	if err != nil {
		t.Fatal(err)
	}
	made := testRuntime.sandboxes()
	if err := m.RemoveAsync(ctx, "t2", sb.ID); err == nil {
		t.Fatal("another tenant removed the sandbox")
	}
	if err := m.RemoveAsync(ctx, "t1", sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveAsync(ctx, "t1", sb.ID); err != nil {
		t.Fatalf("removing twice: %v", err)
	}
	close(held)
	m.bg.Wait()
	if destroyed, open, _ := made[len(made)-1].released(); !destroyed || open != 0 {
		t.Errorf("after the background removal: destroyed %v, %d agent connections open", destroyed, open)
	}
	if infos, _ := v.List(ctx, "t1"); len(infos) != 0 {
		t.Errorf("vault: %d secrets", len(infos))
	}
	if rs, _ := db.ListSandboxes(ctx, "t1"); len(rs) != 0 {
		t.Errorf("records: %d", len(rs))
	}

	// A removal the daemon accepted but did not finish before it stopped.
	sb, err = m.Create(ctx, &store.Tenant{ID: "t1"}, createRequest())
	if err != nil {
		t.Fatal(err)
	}
	r, err := db.GetSandbox(ctx, "", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	r.Status = StatusRemoving
	if err := db.UpdateSandbox(ctx, r); err != nil {
		t.Fatal(err)
	}
	m2 := New(Config{Store: db, Images: m.cfg.Images, Vault: v, StateDir: m.cfg.StateDir, Logger: m.log})
	t.Cleanup(m2.Close)
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if rs, _ := db.ListSandboxes(ctx, "t1"); len(rs) != 0 {
		t.Errorf("records after recovery: %+v", rs[0])
	}
	if infos, _ := v.List(ctx, "t1"); len(infos) != 0 {
		t.Errorf("vault after recovery: %d secrets", len(infos))
	}
}
