//go:build linux

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
	"github.com/cagebox/cagebox/isolation"
)

// oomSandbox is a sandbox whose agent is a real agentproto.Server in this
// process; kill does what the host does to a sandbox without a guest OOM
// killer when it reaches its memory limit: count an OOM kill and end the
// whole sandbox, agent and all. (A real one needs runsc and root: the
// gvisor conformance suite covers that.)
type oomSandbox struct {
	srv        *agentproto.Server
	killsWhole bool

	// mu guards ooms, conns, dead and destroyed.
	mu        sync.Mutex
	ooms      uint64
	conns     []net.Conn
	dead      bool
	destroyed bool
}

var (
	_ isolation.OOMCounter = (*oomSandbox)(nil)
	_ isolation.OOMScope   = (*oomSandbox)(nil)
)

func (s *oomSandbox) ID() string                                { return "fake" }
func (s *oomSandbox) State() isolation.State                    { return isolation.State{} }
func (s *oomSandbox) Start(context.Context) error               { return nil }
func (s *oomSandbox) Pause(context.Context) error               { return nil }
func (s *oomSandbox) Resume(context.Context) error              { return nil }
func (s *oomSandbox) Stop(context.Context, time.Duration) error { return nil }
func (s *oomSandbox) OOMKillsSandbox() bool                     { return s.killsWhole }
func (s *oomSandbox) OOMKills() (uint64, error)                 { s.mu.Lock(); defer s.mu.Unlock(); return s.ooms, nil }
func (s *oomSandbox) Destroy(context.Context) error {
	s.mu.Lock()
	s.destroyed = true
	s.mu.Unlock()
	return nil
}
func (s *oomSandbox) wasDestroyed() bool                          { s.mu.Lock(); defer s.mu.Unlock(); return s.destroyed }
func (s *oomSandbox) DialAgent(context.Context) (net.Conn, error) { return s.dial() }

func (s *oomSandbox) dial() (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: syscall.ECONNREFUSED}
	}
	host, guest := net.Pipe()
	s.conns = append(s.conns, guest)
	go s.srv.ServeConn(guest)
	return host, nil
}

// kill ends the agent's connections and any new ones, as the death of the
// sandbox does; oom says whether the memory limit was the cause.
func (s *oomSandbox) kill(oom bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if oom {
		s.ooms++
	}
	s.dead = true
	for _, c := range s.conns {
		c.Close()
	}
}

// newOOMManager returns a manager attached to one running sandbox sb with a
// 256 MiB memory limit.
func newOOMManager(t *testing.T, sb *oomSandbox) (*Manager, store.Store, string) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	if err := st.CreateTenant(ctx, &store.Tenant{ID: "t1", Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	const id = "sb-oom"
	spec, _ := json.Marshal(specRecord{Resources: isolation.Resources{MemoryBytes: 256 << 20}, AgentToken: sb.srv.Token})
	if err := st.CreateSandbox(ctx, &store.Sandbox{ID: id, TenantID: "t1", Runtime: "fake", Image: "busybox", Status: StatusRunning, Spec: spec}); err != nil {
		t.Fatal(err)
	}
	m := New(Config{Store: st, StateDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(m.Close)
	now := time.Now()
	m.live[id] = &entry{id: id, tenant: "t1", sb: sb, token: sb.srv.Token, active: now, persisted: now}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = sb.srv.Shutdown(ctx, syscall.SIGKILL)
	})
	return m, st, id
}

// started is a writer that says when the first output arrives.
type started struct {
	once sync.Once
	ch   chan struct{}
}

func (s *started) Write(p []byte) (int, error) {
	s.once.Do(func() { close(s.ch) })
	return len(p), nil
}

// execDuringKill runs a long command in sandbox id and kills the sandbox
// once the command runs.
func execDuringKill(t *testing.T, m *Manager, sb *oomSandbox, id string, oom bool) (*api.ExecFrame, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := &started{ch: make(chan struct{})}
	type result struct {
		f   *api.ExecFrame
		err error
	}
	done := make(chan result, 1)
	go func() {
		f, err := m.guest.Exec(ctx, "t1", id, &api.ExecRequest{Argv: []string{"sh", "-c", "echo running; exec sleep 30"}}, nil, ExecOutput{Stdout: out, Stderr: io.Discard})
		done <- result{f, err}
	}()
	select {
	case <-out.ch:
	case r := <-done:
		t.Fatalf("exec ended before the kill: %+v %v", r.f, r.err)
	}
	sb.kill(oom)
	r := <-done
	if ctx.Err() != nil {
		t.Fatal("exec did not return when the sandbox died")
	}
	return r.f, r.err
}

// TestExecSandboxKilledByOOM: when a sandbox whose runtime has no guest OOM
// killer reaches its memory limit mid-exec, the exec and the sandbox's
// record say so, in words that point at the memory limit, instead of
// passing on the protocol error the agent's death causes.
func TestExecSandboxKilledByOOM(t *testing.T) {
	sb := &oomSandbox{srv: &agentproto.Server{Token: "tok-oom"}, killsWhole: true}
	m, st, id := newOOMManager(t, sb)
	f, err := execDuringKill(t, m, sb, id, true)
	if err != nil {
		t.Fatalf("exec: %v, want an exit frame reporting the OOM kill", err)
	}
	if !f.OOMKilled || f.ExitCode == nil || *f.ExitCode != 137 || f.Signal != "SIGKILL" || !strings.Contains(f.Error, "memory limit of 256 MiB") {
		t.Fatalf("exit frame %+v (exit %v), want oom_killed, 137/SIGKILL and an error naming the 256 MiB memory limit", f, f.ExitCode)
	}
	r, err := st.GetSandbox(context.Background(), "", id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != StatusFailed || !strings.Contains(r.Error, "memory limit") {
		t.Fatalf("record: status %q error %q, want failed for the memory limit", r.Status, r.Error)
	}
	if !sb.wasDestroyed() || m.Count() != 0 {
		t.Fatalf("the dead sandbox was not released: destroyed %v, attached %d", sb.wasDestroyed(), m.Count())
	}
	// Later execs say why, at once.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = m.guest.Exec(ctx, "t1", id, &api.ExecRequest{Argv: []string{"true"}}, nil, ExecOutput{Stdout: io.Discard, Stderr: io.Discard})
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "memory limit") {
		t.Fatalf("exec in the dead sandbox: %v, want a conflict naming the memory limit", err)
	}
}

// TestExecSandboxDeadOfOOM: a sandbox that its memory limit killed between
// execs (a background process) is reported, not waited for.
func TestExecSandboxDeadOfOOM(t *testing.T) {
	sb := &oomSandbox{srv: &agentproto.Server{Token: "tok-oom"}, killsWhole: true}
	m, st, id := newOOMManager(t, sb)
	sb.kill(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := m.guest.Exec(ctx, "t1", id, &api.ExecRequest{Argv: []string{"true"}}, nil, ExecOutput{Stdout: io.Discard, Stderr: io.Discard})
	if ctx.Err() != nil {
		t.Fatal("exec waited for the agent of a dead sandbox")
	}
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "memory limit of 256 MiB") {
		t.Fatalf("exec: %v, want a conflict naming the 256 MiB memory limit", err)
	}
	if r, _ := st.GetSandbox(context.Background(), "", id); r == nil || r.Status != StatusFailed || !strings.Contains(r.Error, "memory limit") {
		t.Fatalf("record %+v, want failed for the memory limit", r)
	}
}

// TestExecAgentLostWithoutOOM: an agent that goes away with no OOM kill
// counted, or in a runtime whose OOM kills only a process, is not blamed on
// memory.
func TestExecAgentLostWithoutOOM(t *testing.T) {
	for _, tc := range []struct {
		name            string
		killsWhole, oom bool
	}{
		{"no OOM", true, false},
		{"process-scoped OOM", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := &oomSandbox{srv: &agentproto.Server{Token: "tok-oom"}, killsWhole: tc.killsWhole}
			m, st, id := newOOMManager(t, sb)
			f, err := execDuringKill(t, m, sb, id, tc.oom)
			if err == nil || strings.Contains(err.Error(), "memory") {
				t.Fatalf("exec: %+v %v, want the connection error", f, err)
			}
			if r, _ := st.GetSandbox(context.Background(), "", id); r == nil || r.Status != StatusRunning {
				t.Fatalf("record %+v, want it left running", r)
			}
		})
	}
}
