//go:build linux

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/cagebox/cagebox/agentproto"
	"golang.org/x/sys/unix"
)

// Securebits (linux/securebits.h).
const (
	secbitNoroot                  = 1 << 0
	secbitNorootLocked            = 1 << 1
	secbitNoSetuidFixupLocked     = 1 << 3
	secbitKeepCapsLocked          = 1 << 5
	secbitNoCapAmbientRaise       = 1 << 6
	secbitNoCapAmbientRaiseLocked = 1 << 7

	// agentSecurebits makes root gain no capabilities on execve (NOROOT),
	// keeps the uid-change fixup on (so a switch away from uid 0 clears
	// capabilities), forbids ambient capabilities, and locks all of it.
	agentSecurebits = secbitNoroot | secbitNorootLocked |
		secbitNoSetuidFixupLocked | secbitKeepCapsLocked |
		secbitNoCapAmbientRaise | secbitNoCapAmbientRaiseLocked
)

// keptCaps are the capabilities the agent keeps, to run processes as other
// users (SysProcAttr.Credential).
const keptCaps = 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID

// dropCapabilities arranges that processes the agent starts, as root or not,
// have no capabilities in any set, and that the agent keeps only CAP_SETUID
// and CAP_SETGID. Credentials are per thread in Linux, so every step is
// applied to all threads of the process. That needs a cgo-free build: with
// cgo (a dynamically linked agent) AllThreadsSyscall fails with ENOTSUP and
// the agent's threads keep their capabilities; the launcher's thread, which
// starts every process, is confined on its own either way. Each step is
// attempted; the errors of those that failed are returned.
func dropCapabilities() error {
	return confine(allThreads, keptCaps, true)
}

// predropCapabilities is dropCapabilities but for the last step: every
// thread keeps its permitted and effective sets (a VM guest's agent
// applies its claim's network, clock and entropy with them), but its
// bounding set is empty, securebits locked and ambient cleared already.
// The drop at the claim is then three all-threads steps, not one per
// capability: under TCG each step over every thread costs milliseconds.
func predropCapabilities() error {
	return confine(allThreads, keptCaps, false)
}

func allThreads(trap uintptr, a [6]uintptr) syscall.Errno {
	_, _, e := syscall.AllThreadsSyscall6(trap, a[0], a[1], a[2], a[3], a[4], a[5])
	return e
}

// capSetPCap is CAP_SETPCAP as a capability mask.
const capSetPCap = 1 << unix.CAP_SETPCAP

// confineThread is dropCapabilities for the calling OS thread only; the
// caller must have locked its goroutine to the thread. The thread keeps
// extra in its permitted and effective sets besides keptCaps: with the
// bounding set empty, no inheritable or ambient capability and NOROOT
// locked, what it starts gets none of them.
func confineThread(extra uint64) error {
	return confine(func(trap uintptr, a [6]uintptr) syscall.Errno {
		_, _, e := unix.RawSyscall6(trap, a[0], a[1], a[2], a[3], a[4], a[5])
		return e
	}, keptCaps|extra, true)
}

// confine runs the steps of the capability drop through sys, which applies
// one system call to all threads or to the calling one. What is already
// done (securebits set, a capability out of the bounding set) is skipped:
// redoing it would need CAP_SETPCAP, which the first pass gave up.
func confine(sys func(trap uintptr, a [6]uintptr) syscall.Errno, kept uint64, setCaps bool) error {
	var errs []error
	step := func(what string, trap uintptr, a ...uintptr) {
		var args [6]uintptr
		copy(args[:], a)
		if e := sys(trap, args); e != 0 {
			errs = append(errs, fmt.Errorf("%s: %w", what, e))
		}
	}
	step("set no_new_privs", unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1)
	if cur, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0); err != nil || cur&agentSecurebits != agentSecurebits {
		step("set securebits", unix.SYS_PRCTL, unix.PR_SET_SECUREBITS, agentSecurebits)
	}
	// One error for the bounding set, not one per capability.
	var bndFailed []string
	var bndErr syscall.Errno
	for c := 0; c <= lastCap(); c++ {
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err == nil && in == 0 {
			continue
		}
		if e := sys(unix.SYS_PRCTL, [6]uintptr{unix.PR_CAPBSET_DROP, uintptr(c)}); e != 0 {
			bndFailed, bndErr = append(bndFailed, strconv.Itoa(c)), e
		}
	}
	if len(bndFailed) > 0 {
		errs = append(errs, fmt.Errorf("drop capabilities %s from the bounding set: %w", strings.Join(bndFailed, ","), bndErr))
	}
	step("clear ambient capabilities", unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL)
	if !setCaps {
		return errors.Join(errs...)
	}

	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		errs = append(errs, fmt.Errorf("capget: %w", err))
	} else {
		keep := (uint64(data[1].Permitted)<<32 | uint64(data[0].Permitted)) & kept
		data[0] = unix.CapUserData{Effective: uint32(keep), Permitted: uint32(keep)}
		data[1] = unix.CapUserData{Effective: uint32(keep >> 32), Permitted: uint32(keep >> 32)}
		step("set capabilities", unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])))
	}
	return errors.Join(errs...)
}

// lastCap is the highest capability number the kernel knows.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 && n < 64 {
			return n
		}
	}
	return unix.CAP_LAST_CAP
}

// startReaper makes the agent reap orphans: as PID 1 they come to it; any
// other process first has to become a child subreaper.
func startReaper(log *slog.Logger) (*agentproto.Reaper, error) {
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("become child subreaper: %w", err)
		}
	}
	return agentproto.NewReaper(log), nil
}
