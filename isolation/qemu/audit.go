package qemu

import (
	"github.com/cagebox/cagebox/internal/syscallaudit"
	"github.com/cagebox/cagebox/isolation"
)

// Syscall audit for microVMs: the guest kernel audits (see
// agentproto/audit.go and cmd/cagebox-agent/audit_linux.go) and the agent
// streams the records; the host subscribes over its agent session (a
// virtio-serial port carries one connection, so the subscription shares
// the sandbox manager's) and turns each into a syscallaudit.Record
// (syscallaudit.FromAgent), trusting none of it. An audited sandbox always
// boots cold: a template's guest was booted without audit.

var _ isolation.AgentAudit = (*Runtime)(nil)

// AuditsThroughAgent implements isolation.AgentAudit.
func (rt *Runtime) AuditsThroughAgent() bool { return true }

// Unrecorded implements isolation.AuditGaps: the guest kernel records
// every class.
func (rt *Runtime) Unrecorded(syscallaudit.Set) (syscallaudit.Set, string) { return 0, "" }

// auditSyscalls are the x86_64 numbers of set's syscalls.
func auditSyscalls(set syscallaudit.Set) []int {
	var out []int
	for _, n := range syscallaudit.SyscallsOf(set) {
		if nr := syscallaudit.Number(n); nr >= 0 {
			out = append(out, nr)
		}
	}
	return out
}
