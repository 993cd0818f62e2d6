package oci

import (
	"encoding/binary"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/syscallaudit"
	"github.com/cagebox/cagebox/isolation"
)

// Every priv syscall is refused by the profile: the listener answers
// EPERM to all of them, so one the profile allowed would be refused only
// under audit (and one it refused must stay refused).
func TestPrivSyscallsAreDenied(t *testing.T) {
	denied := map[string]bool{}
	for _, n := range deniedSyscalls {
		denied[n] = true
	}
	for _, n := range syscallaudit.PrivSyscalls {
		if !denied[n] {
			t.Errorf("priv syscall %s is not in the profile's denied list", n)
		}
	}
	for _, n := range syscallaudit.SyscallsOf(syscallaudit.Set(0xff)) {
		if syscallaudit.Number(n) < 0 {
			t.Errorf("audited syscall %s has no x86_64 number", n)
		}
	}
}

func TestAuditProfile(t *testing.T) {
	set, _ := syscallaudit.Parse([]string{"exec,priv"})
	sp := Spec(&isolation.Spec{ID: "x"}, BundleOptions{})
	AuditProfile(sp, set, "/state/seccomp.sock")
	sc := sp.Linux.Seccomp
	if sc.ListenerPath != "/state/seccomp.sock" {
		t.Fatalf("listener %q", sc.ListenerPath)
	}
	notified := map[string]bool{}
	for _, r := range sc.Syscalls {
		for _, n := range r.Names {
			if r.Action == specs.ActNotify {
				notified[n] = true
			} else if len(r.Args) == 0 && (n == "mount" || n == "unshare" || n == "execve") {
				t.Errorf("%s still has an unconditional %s rule besides the notify rule", n, r.Action)
			}
		}
	}
	for _, n := range []string{"execve", "execveat", "mount", "unshare", "ptrace", "bpf"} {
		if !notified[n] {
			t.Errorf("%s not notified", n)
		}
	}
	for _, n := range []string{"connect", "openat", "reboot", "sethostname"} {
		if notified[n] {
			t.Errorf("%s notified without its class", n)
		}
	}
	// What audit does not notify keeps its rule: reboot is still refused,
	// clone with namespace flags too.
	var reboot, clone bool
	for _, r := range sc.Syscalls {
		for _, n := range r.Names {
			reboot = reboot || (n == "reboot" && r.Action == specs.ActErrno)
			clone = clone || (n == "clone" && r.Action == specs.ActErrno && len(r.Args) > 0)
		}
	}
	if !reboot || !clone {
		t.Errorf("profile lost rules: reboot %v clone %v", reboot, clone)
	}
	off := Spec(&isolation.Spec{ID: "x"}, BundleOptions{})
	AuditProfile(off, 0, "/x")
	if off.Linux.Seccomp.ListenerPath != "" {
		t.Error("empty set changed the profile")
	}
}

func TestParseSockaddr(t *testing.T) {
	in4 := make([]byte, 16)
	binary.LittleEndian.PutUint16(in4, unix.AF_INET)
	binary.BigEndian.PutUint16(in4[2:], 443)
	copy(in4[4:], []byte{10, 1, 2, 3})
	if r := syscallaudit.ParseSockaddr(in4); r.Family != "inet" || r.Address != "10.1.2.3" || r.Port != 443 {
		t.Errorf("inet: %+v", r)
	}
	in6 := make([]byte, 28)
	binary.LittleEndian.PutUint16(in6, unix.AF_INET6)
	binary.BigEndian.PutUint16(in6[2:], 80)
	in6[8], in6[23] = 0xfd, 1
	if r := syscallaudit.ParseSockaddr(in6); r.Family != "inet6" || r.Address != "fd00::1" || r.Port != 80 {
		t.Errorf("inet6: %+v", r)
	}
	un := append([]byte{unix.AF_UNIX, 0}, []byte("/run/x.sock\x00junk")...)
	if r := syscallaudit.ParseSockaddr(un); r.Family != "unix" || r.Address != "/run/x.sock" {
		t.Errorf("unix: %+v", r)
	}
	abs := append([]byte{unix.AF_UNIX, 0, 0}, []byte("abstract")...)
	if r := syscallaudit.ParseSockaddr(abs); r.Address != "@abstract" {
		t.Errorf("abstract: %+v", r)
	}
	short := []byte{unix.AF_INET, 0, 1}
	if r := syscallaudit.ParseSockaddr(short); r.Family != "inet" || r.Address != "" {
		t.Errorf("short: %+v", r)
	}
}
