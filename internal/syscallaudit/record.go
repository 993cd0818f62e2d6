package syscallaudit

import (
	"path"
	"strings"
	"unicode/utf8"
)

// Bounds on what one record carries: a guest chooses its arguments, so a
// record never grows with them.
const (
	MaxArgs     = 32   // argv entries kept
	MaxArgBytes = 256  // bytes kept of one argv entry
	MaxArgvSum  = 2048 // bytes kept of all argv entries together
	MaxPath     = 512  // bytes kept of a path
)

// Result values.
const (
	ResultOK     = "ok"
	ResultDenied = "denied" // refused by the sandbox's seccomp profile
	ResultError  = "error"  // the kernel refused it (Errno says why)
)

// Record is one audited system call, as a runtime saw it. Which fields are
// set depends on Class. Result is "" when the runtime cannot know it (a
// container's syscall is recorded at entry and then continues).
type Record struct {
	Class   Class
	Syscall string
	// PID is the process id inside the guest (0 when unknown).
	PID int
	// Exec.
	Argv          []string
	ArgvTruncated bool
	// File (and the program of an exec when argv is empty).
	Path  string
	Write bool
	// Net.
	Family  string // "inet", "inet6", "unix", or the number
	Address string
	Port    int

	Result string
	Errno  int
}

// Bounded returns r with every guest-chosen field cut to the bounds above
// and made valid UTF-8 (invalid bytes become U+FFFD).
func (r Record) Bounded() Record {
	if len(r.Argv) > 0 {
		n := min(len(r.Argv), MaxArgs)
		out := make([]string, 0, n)
		sum := 0
		for _, a := range r.Argv[:n] {
			a = truncate(a, MaxArgBytes)
			if sum+len(a) > MaxArgvSum {
				r.ArgvTruncated = true
				break
			}
			sum += len(a)
			out = append(out, a)
		}
		if len(r.Argv) > n {
			r.ArgvTruncated = true
		}
		for i := range out {
			if len(out[i]) < len(r.Argv[i]) {
				r.ArgvTruncated = true
			}
		}
		r.Argv = out
	}
	r.Path = truncate(r.Path, MaxPath)
	r.Address = truncate(r.Address, MaxPath)
	r.Family = truncate(r.Family, 16)
	r.Syscall = truncate(r.Syscall, 32)
	return r
}

// truncate cuts s to at most n bytes of valid UTF-8.
func truncate(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// harmlessDevices are the /dev entries every program opens.
var harmlessDevices = map[string]bool{
	"/dev/null": true, "/dev/zero": true, "/dev/full": true,
	"/dev/random": true, "/dev/urandom": true, "/dev/tty": true,
	"/dev/ptmx": true, "/dev/console": true,
}

// SensitiveOpen reports whether an open of p (absolute, as the guest
// names it; write = opened for writing, creating or truncating) is worth
// an event: credentials and account files (/etc/shadow, /etc/gshadow,
// /etc/sudoers and anything written under /etc), process memory and
// kernel knobs (/proc/*/mem and environ, writes under /proc/sys and /sys,
// /proc/kcore, the kernel's debug and firmware files), devices other
// than the harmless ones, and the agent's run directory. A relative path
// (the runtime could not resolve it) is judged by its name alone.
func SensitiveOpen(p string, write bool) bool {
	if p == "" {
		return false
	}
	if !strings.HasPrefix(p, "/") {
		base := path.Base(p)
		return base == "shadow" || base == "gshadow" || base == "sudoers" || base == "mem"
	}
	p = path.Clean(p)
	switch {
	case p == "/etc/shadow", p == "/etc/gshadow", p == "/etc/sudoers",
		strings.HasPrefix(p, "/etc/sudoers.d/"), strings.HasPrefix(p, "/etc/shadow"),
		strings.HasPrefix(p, "/etc/gshadow"):
		return true
	case strings.HasPrefix(p, "/etc/"):
		return write
	case strings.HasPrefix(p, "/proc/"):
		rest := strings.TrimPrefix(p, "/proc/")
		if strings.HasPrefix(rest, "sys/") {
			return write
		}
		if rest == "kcore" ||
			rest == "sysrq-trigger" || rest == "kallsyms" || strings.HasPrefix(rest, "1/") {
			return true
		}
		_, last := path.Split(rest)
		return last == "mem" || last == "environ" || last == "maps" && write
	case strings.HasPrefix(p, "/sys/"):
		// Every Go and libc program reads /sys (cgroup limits, CPU and
		// hugepage sizes): writes, and reads of the kernel's debug and
		// firmware interfaces, are worth a record.
		return write || strings.HasPrefix(p, "/sys/kernel/debug") ||
			strings.HasPrefix(p, "/sys/kernel/security") || strings.HasPrefix(p, "/sys/firmware") ||
			strings.HasPrefix(p, "/sys/kernel/tracing")
	case strings.HasPrefix(p, "/dev/"):
		if harmlessDevices[p] || strings.HasPrefix(p, "/dev/pts/") ||
			strings.HasPrefix(p, "/dev/shm/") || strings.HasPrefix(p, "/dev/fd/") ||
			strings.HasPrefix(p, "/dev/std") || strings.HasPrefix(p, "/dev/mqueue/") {
			return false
		}
		return true
	case strings.HasPrefix(p, "/.cagebox/"), strings.HasPrefix(p, "/run/cagebox/"):
		return true
	}
	return false
}
