//go:build linux

package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

// TestOperatorPauseStands: what the operator pauses only the operator
// resumes. A tenant's Resume of a sandbox the admin paused (or
// hibernated… the same record) is refused with ErrDenied, and no exec or
// file operation of the tenant wakes it — even with idle action pause,
// and after a daemon restart (who paused is in the record). The tenant's
// own pause is its own to resume (the admin pausing it takes it over),
// and an idle pause still wakes on the next call, before and after a
// restart.
func TestOperatorPauseStands(t *testing.T) {
	testRuntime.use(createPlan{recoverable: true})
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
	id := sb.ID
	made := testRuntime.sandboxes()[0]
	resumes := func() int { made.mu.Lock(); defer made.mu.Unlock(); return made.resumes }
	status := func() string {
		t.Helper()
		r, err := db.GetSandbox(ctx, "t1", id)
		if err != nil {
			t.Fatal(err)
		}
		return r.Status
	}
	// restart is a daemon restart: a new manager over the same store and
	// runtime, recovering.
	restart := func() {
		t.Helper()
		cfg := m.cfg
		m.Close()
		m = New(cfg)
		t.Cleanup(m.Close)
		if err := m.Recover(ctx); err != nil {
			t.Fatal(err)
		}
	}
	operatorPaused := func(when string) {
		t.Helper()
		n0 := resumes()
		if _, err := m.Resume(ctx, "t1", id); !errors.Is(err, errdefs.ErrDenied) || !strings.Contains(err.Error(), "only the operator can resume it") {
			t.Fatalf("%s: the tenant's resume of the admin's pause: %v; want ErrDenied, only the operator", when, err)
		}
		if _, err := m.guest.ListDir(ctx, "t1", id, "/"); err == nil || !strings.Contains(err.Error(), "paused by the operator") {
			t.Fatalf("%s: a file operation of the tenant on the admin's pause: %v; want refused, paused by the operator", when, err)
		}
		if v, _ := m.Get(ctx, "t1", id); v.PausedBy != store.AdminTenantID {
			t.Fatalf("%s: inspect says paused by %q; want admin", when, v.PausedBy)
		}
		if st, n := status(), resumes(); st != StatusPaused || n != n0 {
			t.Fatalf("%s: %s after %d resumes; want paused, not resumed", when, st, n-n0)
		}
	}

	// The admin pauses it (tenant "" is the admin).
	if _, err := m.Pause(ctx, "", id); err != nil {
		t.Fatal(err)
	}
	operatorPaused("admin pause")
	restart()
	operatorPaused("admin pause, after a restart")
	if _, err := m.Resume(ctx, "", id); err != nil || status() != StatusRunning {
		t.Fatalf("the admin's resume: %v, %s", err, status())
	}

	// The tenant's own pause: the tenant resumes it; no call wakes it.
	if _, err := m.Pause(ctx, "t1", id); err != nil {
		t.Fatal(err)
	}
	restart()
	if _, err := m.guest.ListDir(ctx, "t1", id, "/"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "cagebox resume") {
		t.Fatalf("a file operation on the tenant's own pause after a restart: %v", err)
	}
	if _, err := m.Resume(ctx, "t1", id); err != nil || status() != StatusRunning {
		t.Fatalf("the tenant's resume of its own pause: %v, %s", err, status())
	}

	// The admin pausing what the tenant paused takes the pause over.
	if _, err := m.Pause(ctx, "t1", id); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Pause(ctx, "", id); err != nil {
		t.Fatalf("the admin pauses a sandbox the tenant paused: %v", err)
	}
	operatorPaused("the admin's pause over the tenant's")
	if _, err := m.Pause(ctx, "", id); err != nil {
		t.Fatalf("the admin pauses its own pause again: %v", err)
	}
	if _, err := m.Resume(ctx, "", id); err != nil || status() != StatusRunning {
		t.Fatalf("the admin's resume: %v, %s", err, status())
	}

	// An idle pause is nobody's: the next call wakes it, after a
	// restart too.
	m.cfg.Now = clock
	advance(2 * time.Minute)
	m.Reap(ctx)
	if status() != StatusPaused {
		t.Fatalf("after the idle timeout: %s", status())
	}
	restart()
	before := resumes()
	if _, err := m.guest.ListDir(ctx, "t1", id, "/"); err != nil || status() != StatusRunning || resumes() != before+1 {
		t.Fatalf("a file operation on an idle pause after a restart: %v, %s", err, status())
	}
}
