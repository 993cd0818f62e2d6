package isolationtest

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/syscallaudit"
	"github.com/cagebox/cagebox/isolation"
)

// AuditSink collects a sandbox's syscall records.
type AuditSink struct {
	// mu guards recs.
	mu   sync.Mutex
	recs []syscallaudit.Record
}

// Sink is the function to put in isolation.Audit.
func (a *AuditSink) Sink(r syscallaudit.Record) {
	a.mu.Lock()
	a.recs = append(a.recs, r)
	a.mu.Unlock()
}

// Records returns what arrived so far.
func (a *AuditSink) Records() []syscallaudit.Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]syscallaudit.Record(nil), a.recs...)
}

// Await waits up to 10 s for a record that match accepts.
func (a *AuditSink) Await(t testing.TB, what string, match func(syscallaudit.Record) bool) syscallaudit.Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, r := range a.Records() {
			if match(r) {
				return r
			}
		}
		if time.Now().After(deadline) {
			recs := a.Records()
			if len(recs) > 40 {
				recs = recs[len(recs)-40:]
			}
			t.Fatalf("no %s record; last records: %+v", what, recs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func set(t testing.TB, classes ...string) syscallaudit.Set {
	s, err := syscallaudit.Parse(classes)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// StartAudited starts a sandbox of rt auditing classes into a new sink.
func StartAudited(t *testing.T, rt isolation.Runtime, o Options, classes ...string) (*Guest, *AuditSink) {
	t.Helper()
	set, err := syscallaudit.Parse(classes)
	if err != nil {
		t.Fatal(err)
	}
	sink := &AuditSink{}
	g := StartSpec(t, rt, o, func(s *isolation.Spec) {
		s.Audit = isolation.Audit{Classes: set, Sink: sink.Sink}
	})
	if aa, ok := rt.(isolation.AgentAudit); ok && aa.AuditsThroughAgent() {
		// The guest agent streams the records: subscribe over the
		// session, as the daemon does.
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = g.Client.Audit(ctx, func(r *agentproto.AuditRecord) {
				if rec, ok := syscallaudit.FromAgent(r, set); ok {
					sink.Sink(rec)
				}
			})
		}()
		t.Cleanup(func() { cancel(); <-done })
	}
	return g, sink
}

// Audit checks a runtime's syscall audit (busybox guest): an exec's
// argv, a connect's address, an open of /etc/shadow, refused mount and
// unshare attempts, and that a sandbox auditing only exec records nothing
// else.
func Audit(t *testing.T, rt isolation.Runtime, o Options) {
	t.Run("all", func(t *testing.T) {
		g, sink := StartAudited(t, rt, o, "exec,net,file,priv")
		if out, _, res := g.Exec(t, "sh", "-c", "/bin/echo hi"); strings.TrimSpace(out) != "hi" || res.ExitCode != 0 {
			t.Fatalf("echo: %q %+v", out, res)
		}
		sink.Await(t, "exec of /bin/echo hi", func(r syscallaudit.Record) bool {
			return r.Class == syscallaudit.Exec && reflect.DeepEqual(r.Argv, []string{"/bin/echo", "hi"}) && r.PID > 1
		})
		g.Exec(t, "sh", "-c", "cat /etc/shadow; true")
		sink.Await(t, "open of /etc/shadow", func(r syscallaudit.Record) bool {
			return r.Class == syscallaudit.File && r.Path == "/etc/shadow" && !r.Write
		})
		g.Exec(t, "sh", "-c", "cd /etc && echo x > hosts.new; true")
		sink.Await(t, "write under /etc (relative path)", func(r syscallaudit.Record) bool {
			return r.Class == syscallaudit.File && r.Path == "/etc/hosts.new" && r.Write
		})
		g.Exec(t, "sh", "-c", "nc -w 1 127.0.0.1 9 </dev/null; true")
		sink.Await(t, "connect to 127.0.0.1:9", func(r syscallaudit.Record) bool {
			return r.Class == syscallaudit.Net && r.Family == "inet" && r.Address == "127.0.0.1" && r.Port == 9
		})
		// Ordinary opens (libraries, /dev/null) are not recorded.
		t.Logf("%d records, e.g. %+v", len(sink.Records()), sink.Records()[:min(4, len(sink.Records()))])
		for _, r := range sink.Records() {
			if r.Class == syscallaudit.File && !syscallaudit.SensitiveOpen(r.Path, r.Write) {
				t.Errorf("insensitive open recorded: %+v", r)
			}
		}
		if gaps, ok := rt.(isolation.AuditGaps); ok {
			if gap, why := gaps.Unrecorded(set(t, "priv")); gap.Has(syscallaudit.Priv) {
				t.Logf("priv not recorded: %s", why)
				return
			}
		}
		if _, _, res := g.Exec(t, "mount", "-t", "tmpfs", "none", "/tmp"); res.ExitCode == 0 {
			t.Fatal("mount succeeded in the guest")
		}
		sink.Await(t, "denied mount", func(r syscallaudit.Record) bool {
			return r.Class == syscallaudit.Priv && r.Syscall == "mount" && r.Result == syscallaudit.ResultDenied
		})
		if _, _, res := g.Exec(t, "unshare", "-r", "true"); res.ExitCode == 0 {
			t.Fatal("unshare -r succeeded in the guest")
		}
		// Refused: by seccomp (EPERM, "denied"), or in a VM guest by its
		// kernel (no user namespaces: ENOSPC, "error").
		sink.Await(t, "refused unshare", func(r syscallaudit.Record) bool {
			return r.Class == syscallaudit.Priv && r.Syscall == "unshare" && r.Result != "" && r.Result != syscallaudit.ResultOK
		})
	})
	t.Run("exec only", func(t *testing.T) {
		g, sink := StartAudited(t, rt, o, "exec")
		g.Exec(t, "sh", "-c", "cat /etc/shadow; nc -w 1 127.0.0.1 9 </dev/null; mount -t tmpfs none /mnt; /bin/echo done")
		sink.Await(t, "exec of /bin/echo done", func(r syscallaudit.Record) bool {
			return r.Class == syscallaudit.Exec && reflect.DeepEqual(r.Argv, []string{"/bin/echo", "done"})
		})
		for _, r := range sink.Records() {
			if r.Class != syscallaudit.Exec {
				t.Errorf("record of class %s in a sandbox auditing exec only: %+v", r.Class, r)
			}
		}
	})
}
