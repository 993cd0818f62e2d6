package syscallaudit

import (
	"testing"

	"github.com/cagebox/cagebox/agentproto"
)

func TestFromAgent(t *testing.T) {
	all, _ := Parse([]string{"all"})
	execOnly, _ := Parse([]string{"exec"})
	exec := &agentproto.AuditRecord{Arch: 0xc000003e, Syscall: 59, PID: 40, Exited: true, Success: true, Argv: []string{"/bin/echo", "hi"}, Paths: []string{"/bin/echo", "/lib64/ld.so"}}
	if r, ok := FromAgent(exec, all); !ok || r.Class != Exec || r.Path != "/bin/echo" || r.Result != "ok" || len(r.Argv) != 2 {
		t.Fatalf("exec: %+v %v", r, ok)
	}
	shadow := &agentproto.AuditRecord{Arch: 0xc000003e, Syscall: 257, PID: 41, Exited: true, Exit: -2, Args: [4]uint64{0xffffff9c, 1, 0, 0}, Paths: []string{"shadow"}, Cwd: "/etc"}
	if r, ok := FromAgent(shadow, all); !ok || r.Path != "/etc/shadow" || r.Write || r.Result != "error" || r.Errno != 2 {
		t.Fatalf("open: %+v %v", r, ok)
	}
	if _, ok := FromAgent(shadow, execOnly); ok {
		t.Fatal("open recorded without the file class")
	}
	create := &agentproto.AuditRecord{Arch: 0xc000003e, Syscall: 257, Exited: true, Success: true, Args: [4]uint64{0xffffff9c, 1, 577, 438}, Paths: []string{"/etc", "hosts.new"}, Cwd: "/etc"}
	if r, ok := FromAgent(create, all); !ok || r.Path != "/etc/hosts.new" || !r.Write {
		t.Fatalf("create: %+v %v", r, ok)
	}
	lib := &agentproto.AuditRecord{Arch: 0xc000003e, Syscall: 257, Exited: true, Success: true, Paths: []string{"/lib/libc.so.6"}}
	if _, ok := FromAgent(lib, all); ok {
		t.Fatal("insensitive open recorded")
	}
	mount := &agentproto.AuditRecord{Arch: 0xc000003e, Syscall: 165, PID: 42, Exited: true, Exit: -1}
	if r, ok := FromAgent(mount, all); !ok || r.Class != Priv || r.Result != "denied" {
		t.Fatalf("mount: %+v %v", r, ok)
	}
	conn := &agentproto.AuditRecord{Arch: 0xc000003e, Syscall: 42, Exited: true, Exit: -111, Saddr: []byte{2, 0, 1, 187, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}}
	if r, ok := FromAgent(conn, all); !ok || r.Address != "10.0.0.1" || r.Port != 443 || r.Errno != 111 {
		t.Fatalf("connect: %+v %v", r, ok)
	}
	i386 := &agentproto.AuditRecord{Arch: 0x40000003, Syscall: 59, Exited: true, Success: true, Argv: []string{"x"}}
	if _, ok := FromAgent(i386, all); ok {
		t.Fatal("a record of another ABI taken for its x86_64 namesake")
	}
	for _, bad := range []*agentproto.AuditRecord{{Syscall: -1}, {Syscall: 1 << 20}, {Syscall: 0}, {Syscall: 42, Saddr: []byte{1}}} {
		if r, ok := FromAgent(bad, all); ok && r.Class != Net {
			t.Errorf("record of %d: %+v", bad.Syscall, r)
		}
	}
}
