//go:build linux

package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/syscallaudit"
	"github.com/cagebox/cagebox/isolation"
)

// auditRuntime is createRuntime that audits: it keeps the sinks it is
// given, and cannot record the priv class.
type auditRuntime struct {
	*createRuntime
	// mu guards sinks.
	mu    sync.Mutex
	sinks map[string]isolation.Audit
}

const auditRuntimeName = "audittest"

var testAuditRuntime = &auditRuntime{createRuntime: &createRuntime{}, sinks: map[string]isolation.Audit{}}

func init() { isolation.Register(testAuditRuntime) }

var _ isolation.AuditGaps = (*auditRuntime)(nil)

func (r *auditRuntime) Name() string { return auditRuntimeName }

func (r *auditRuntime) Unrecorded(set syscallaudit.Set) (syscallaudit.Set, string) {
	p, _ := syscallaudit.Parse([]string{"priv"})
	return set & p, "not here"
}

func (r *auditRuntime) Create(ctx context.Context, spec *isolation.Spec) (isolation.Sandbox, error) {
	r.mu.Lock()
	r.sinks[spec.ID] = spec.Audit
	r.mu.Unlock()
	return r.createRuntime.Create(ctx, spec)
}

func (r *auditRuntime) sink(id string) isolation.Audit {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sinks[id]
}

func TestAuditValidation(t *testing.T) {
	testRuntime.use(createPlan{})
	m, db, _ := newCreateManager(t, "")
	ctx := context.Background()
	for _, tc := range []struct {
		runtime string
		audit   []string
		want    string
	}{
		{auditRuntimeName, []string{"exec", "bogus"}, `unknown audit class "bogus"`},
		{auditRuntimeName, []string{"priv"}, "records none of [priv]"},
		{createRuntimeName, []string{"exec"}, "cannot audit system calls"},
	} {
		_, err := m.Create(ctx, &store.Tenant{ID: "t1"}, &api.CreateSandboxRequest{Runtime: tc.runtime, Audit: tc.audit})
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("audit %v on %s: %v, want invalid %q", tc.audit, tc.runtime, err, tc.want)
		}
	}
	if rs, _ := db.ListSandboxes(ctx, "t1"); len(rs) != 0 {
		t.Errorf("refused creates left records: %d", len(rs))
	}
}

func TestAuditSink(t *testing.T) {
	testAuditRuntime.use(createPlan{})
	m, db, _ := newCreateManager(t, "")
	ctx := context.Background()
	sb, err := m.Create(ctx, &store.Tenant{ID: "t1"}, &api.CreateSandboxRequest{Runtime: auditRuntimeName, Audit: []string{"exec,priv"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Audit == nil || strings.Join(sb.Audit.Classes, ",") != "exec,priv" || strings.Join(sb.Audit.Unrecorded, ",") != "priv" || sb.Audit.Note != "not here" {
		t.Fatalf("view: %+v", sb.Audit)
	}
	a := testAuditRuntime.sink(sb.ID)
	if a.Sink == nil || !a.Classes.Has(syscallaudit.Exec) || a.Classes.Has(syscallaudit.Net) {
		t.Fatalf("spec audit %+v", a)
	}
	// A flood: the bucket lets the burst through and counts the rest.
	for i := 0; i < syscallaudit.DefaultBurst+500; i++ {
		a.Sink(syscallaudit.Record{Class: syscallaudit.Exec, Syscall: "execve", PID: 7, Argv: []string{"/bin/true"}})
	}
	v, err := m.Get(ctx, "t1", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Audit.Recorded < syscallaudit.DefaultBurst || v.Audit.Recorded > syscallaudit.DefaultBurst+10 || v.Audit.Dropped < 490 {
		t.Fatalf("counters after %d records: %+v", syscallaudit.DefaultBurst+500, v.Audit)
	}
	if err := m.Remove(ctx, "t1", sb.ID); err != nil {
		t.Fatal(err)
	}
	// The events: syscall.exec records, and the drops reported.
	deadline := time.Now().Add(10 * time.Second)
	var execs, dropped int
	for time.Now().Before(deadline) {
		execs, dropped = 0, 0
		var after int64
		for {
			evs, err := db.ListEvents(ctx, "t1", sb.ID, after, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) == 0 {
				break
			}
			for _, e := range evs {
				switch e.Kind {
				case string(api.EventSyscallExec):
					execs++
					if !strings.Contains(string(e.Data), `"argv":["/bin/true"]`) || !strings.Contains(string(e.Data), `"pid":7`) {
						t.Fatalf("syscall.exec data %s", e.Data)
					}
				case string(api.EventSyscallDropped):
					dropped++
				}
			}
			after = evs[len(evs)-1].Seq
		}
		if execs > 0 && dropped > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if execs == 0 || dropped == 0 {
		t.Fatalf("events: %d syscall.exec, %d syscall.dropped", execs, dropped)
	}
	t.Logf("%d syscall.exec events stored (the event log's own syscall budget applies too), %d syscall.dropped", execs, dropped)
}
