// Package syscallaudit is the runtime-independent half of syscall auditing
// (`cagebox create --audit exec,net,file,priv`): the audit classes and the
// system calls each one covers, the Record every runtime delivers (bounded
// here, whatever the guest did to its arguments), the list of sensitive
// paths whose opens are worth an event, the per-sandbox rate limit with its
// drop counters, and the parser of gVisor's strace log. It is a leaf: the
// runtimes (isolation/oci for runc's seccomp user notification,
// isolation/gvisor for runsc's strace) and the sandbox manager import it.
package syscallaudit

import (
	"fmt"
	"sort"
	"strings"
)

// Class is a group of audited system calls.
type Class string

// The classes.
const (
	// Exec: execve, execveat (argv).
	Exec Class = "exec"
	// Net: connect (family, address, port).
	Net Class = "net"
	// File: opens of sensitive paths (SensitiveOpen).
	File Class = "file"
	// Priv: mount, ptrace, bpf, unshare, setns, module loading, keyrings
	// and the like — every one refused in every guest; the event records
	// the attempt and its result.
	Priv Class = "priv"
)

// AllClasses lists the classes in their canonical order.
var AllClasses = []Class{Exec, Net, File, Priv}

// Set is a set of classes; the zero Set audits nothing.
type Set uint8

func bit(c Class) Set {
	for i, k := range AllClasses {
		if k == c {
			return 1 << i
		}
	}
	return 0
}

// Has reports whether c is in s.
func (s Set) Has(c Class) bool { b := bit(c); return b != 0 && s&b != 0 }

// Empty reports whether s audits nothing.
func (s Set) Empty() bool { return s == 0 }

// Strings lists s's classes in canonical order.
func (s Set) Strings() []string {
	var out []string
	for _, c := range AllClasses {
		if s.Has(c) {
			out = append(out, string(c))
		}
	}
	return out
}

// Parse reads a list of class names (each may itself be a comma-separated
// list, as `--audit exec,net` gives it). Duplicates are fine; an unknown
// or empty name is an error that lists the valid ones. "all" means every
// class.
func Parse(names []string) (Set, error) {
	var s Set
	for _, n := range names {
		for _, part := range strings.Split(n, ",") {
			part = strings.ToLower(strings.TrimSpace(part))
			if part == "all" {
				for _, c := range AllClasses {
					s |= bit(c)
				}
				continue
			}
			b := bit(Class(part))
			if b == 0 {
				return 0, fmt.Errorf("unknown audit class %q: use exec, net, file, priv (or all)", truncate(part, 32))
			}
			s |= b
		}
	}
	return s, nil
}

// Syscalls are the system calls class c audits (x86_64 names), sorted.
func Syscalls(c Class) []string {
	var out []string
	switch c {
	case Exec:
		out = []string{"execve", "execveat"}
	case Net:
		out = []string{"connect"}
	case File:
		out = []string{"creat", "open", "openat", "openat2"}
	case Priv:
		out = append(out, PrivSyscalls...)
	}
	sort.Strings(out)
	return out
}

// SyscallsOf is the union of Syscalls over s, sorted.
func SyscallsOf(s Set) []string {
	var out []string
	for _, c := range AllClasses {
		if s.Has(c) {
			out = append(out, Syscalls(c)...)
		}
	}
	sort.Strings(out)
	return out
}

// PrivSyscalls are the privileged operations the priv class records. Every
// guest's seccomp profile refuses all of them (isolation/oci), so a record
// of one is an attempt, and its result is "denied".
var PrivSyscalls = []string{
	"add_key", "bpf", "chroot", "delete_module", "finit_module", "fsmount",
	"fsopen", "init_module", "kexec_file_load", "kexec_load", "keyctl",
	"mount", "move_mount", "open_by_handle_at", "open_tree",
	"perf_event_open", "pivot_root", "process_vm_readv", "process_vm_writev",
	"ptrace", "request_key", "setns", "umount2", "unshare", "userfaultfd",
}

// ClassOf is the class that audits syscall name, or "".
func ClassOf(name string) Class {
	for _, c := range AllClasses {
		for _, n := range Syscalls(c) {
			if n == name {
				return c
			}
		}
	}
	return ""
}
