package sandbox

import (
	"context"
	"sync"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/syscallaudit"
	"github.com/cagebox/cagebox/isolation"
)

// Syscall audit (`--audit`): a sandbox's runtime delivers records to the
// sink made here, which passes them through the sandbox's token bucket
// (syscallaudit.Limiter: 200 a second, bursts of 1000), emits each as a
// syscall.* event, and reports drops as syscall.dropped at most once a
// second. The counters are in the sandbox's view (GET, `cagebox
// inspect`) while this daemon runs it.

// auditor is one audited sandbox's limiter and drop reporter.
type auditor struct {
	set  syscallaudit.Set
	lim  *syscallaudit.Limiter
	stop chan struct{}
	once sync.Once
}

// auditSet checks a create request's audit classes, and whether the
// runtime has what it takes.
func auditSet(req *api.CreateSandboxRequest) (syscallaudit.Set, error) {
	set, err := syscallaudit.Parse(req.Audit)
	if err != nil {
		return 0, invalid("audit: %v", err)
	}
	return set, nil
}

// auditSupported refuses an audit the runtime cannot record: runtimes
// that audit say so by implementing isolation.AuditGaps.
func auditSupported(rt isolation.Runtime, set syscallaudit.Set) error {
	if set.Empty() {
		return nil
	}
	g, ok := rt.(isolation.AuditGaps)
	if !ok {
		return invalid("audit: the %s runtime cannot audit system calls yet; use --runtime container, gvisor or qemu, or leave out --audit", rt.Name())
	}
	if gap, why := g.Unrecorded(set); gap == set {
		return invalid("audit: the %s runtime records none of %v (%s); use --runtime container", rt.Name(), set.Strings(), why)
	}
	return nil
}

// audits.start makes the auditor of sandbox id of tenant and returns the
// audits is the manager's service of syscall audit: each audited
// sandbox's sink.
type audits struct {
	m *Manager
	// byID holds the auditor of each audited sandbox.
	byID sync.Map
}

// spec's Audit (zero when set is empty).
func (sa *audits) start(tenant, id string, set syscallaudit.Set) isolation.Audit {
	m := sa.m
	if set.Empty() {
		return isolation.Audit{}
	}
	a := &auditor{set: set, lim: syscallaudit.NewLimiter(0, 0), stop: make(chan struct{})}
	sa.byID.Store(id, a)
	report := func(force bool) {
		if n, total, ok := a.lim.Report(m.cfg.Now(), force); ok {
			m.Emit(tenant, id, api.SyscallDropped{Count: n, Total: total, Rate: a.lim.Rate(), Burst: a.lim.Burst()})
		}
	}
	go func() {
		t := time.NewTicker(syscallaudit.ReportEvery)
		defer t.Stop()
		for {
			select {
			case <-a.stop:
				report(true)
				return
			case <-t.C:
				report(false)
			}
		}
	}()
	return isolation.Audit{Classes: set, Sink: func(r syscallaudit.Record) {
		if !a.lim.Allow(m.cfg.Now()) {
			return
		}
		if ev := auditEvent(r); ev != nil {
			m.Emit(tenant, id, ev)
		}
	}}
}

// agentAudit subscribes to the audit records of sandbox id's guest agent
// (runtimes that implement isolation.AgentAudit: VMs) over the entry's
// agent session, resubscribing after a broken session, until audits.end.
func (sa *audits) agent(id string, e *entry, a isolation.Audit) {
	m := sa.m
	v, ok := sa.byID.Load(id)
	if !ok {
		return
	}
	au := v.(*auditor)
	go func() {
		for {
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-au.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			cl, err := e.agent(ctx)
			if err == nil {
				err = cl.Audit(ctx, func(r *agentproto.AuditRecord) {
					if r.Lost > 0 && r.Lost < 1<<32 {
						au.lim.Drop(r.Lost) // the agent's ring overflowed
					}
					if rec, ok := syscallaudit.FromAgent(r, a.Classes); ok {
						a.Sink(rec)
					}
				})
			}
			cancel()
			select {
			case <-au.stop:
				return
			case <-time.After(time.Second):
				m.log.Debug("audit subscription ended; resubscribing", "sandbox", id, "err", err)
			}
		}
	}()
}

// recoverAudit resumes the audit of a sandbox re-attached after a daemon
// restart where that is possible: a VM's agent kept its records (a ring
// of the newest 4096), so the subscription starts again. A container's
// notify listener and gVisor's log reader died with the old daemon (see
// audits.view's note).
func (sa *audits) recover(r *store.Sandbox, classes []string, e *entry) {
	if len(classes) == 0 {
		return
	}
	rt, ok := isolation.Lookup(r.Runtime)
	if !ok {
		return
	}
	aa, ok := rt.(isolation.AgentAudit)
	if !ok || !aa.AuditsThroughAgent() {
		return
	}
	set, err := syscallaudit.Parse(classes)
	if err != nil || set.Empty() {
		return
	}
	sa.agent(r.ID, e, sa.start(r.TenantID, r.ID, set))
}

// audits.end stops sandbox id's auditor, reporting its last drops.
func (sa *audits) end(id string) {
	if v, ok := sa.byID.LoadAndDelete(id); ok {
		a := v.(*auditor)
		a.once.Do(func() { close(a.stop) })
	}
}

// audits.view is the audit part of a sandbox's view.
func (sa *audits) view(id, runtime string, classes []string) *api.SandboxAudit {
	if len(classes) == 0 {
		return nil
	}
	set, _ := syscallaudit.Parse(classes)
	v := &api.SandboxAudit{Classes: set.Strings(), Rate: syscallaudit.DefaultRate, Burst: syscallaudit.DefaultBurst}
	if rt, ok := isolation.Lookup(runtime); ok {
		if g, ok := rt.(isolation.AuditGaps); ok {
			gap, why := g.Unrecorded(set)
			v.Unrecorded, v.Note = gap.Strings(), why
		}
	}
	if a, ok := sa.byID.Load(id); ok {
		st := a.(*auditor).lim.Stats()
		v.Recorded, v.Dropped = st.Recorded, st.Dropped
	} else {
		v.Note = joinNote(v.Note, "no records since the daemon restarted: a container's audited syscalls fail (ENOSYS) and gVisor's go unrecorded until the sandbox is recreated")
	}
	return v
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// auditEvent is the event of a record.
func auditEvent(r syscallaudit.Record) api.EventPayload {
	switch r.Class {
	case syscallaudit.Exec:
		argv := r.Argv
		if argv == nil {
			argv = []string{}
		}
		return api.SyscallExec{PID: r.PID, Path: r.Path, Argv: argv, ArgvTruncated: r.ArgvTruncated, Result: r.Result, Errno: r.Errno}
	case syscallaudit.Net:
		return api.SyscallConnect{PID: r.PID, Family: r.Family, Address: r.Address, Port: r.Port, Result: r.Result, Errno: r.Errno}
	case syscallaudit.File:
		return api.SyscallOpen{PID: r.PID, Syscall: r.Syscall, Path: r.Path, Write: r.Write, Result: r.Result, Errno: r.Errno}
	case syscallaudit.Priv:
		return api.SyscallPriv{PID: r.PID, Syscall: r.Syscall, Result: r.Result, Errno: r.Errno}
	}
	return nil
}
