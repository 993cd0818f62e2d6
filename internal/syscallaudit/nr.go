package syscallaudit

import (
	"encoding/binary"
	"net/netip"
	"strconv"

	"golang.org/x/sys/unix"
)

// x86_64 numbers the syscalls of every audit class.
var x86_64Names = map[int32]string{
	unix.SYS_EXECVE: "execve", unix.SYS_EXECVEAT: "execveat",
	unix.SYS_CONNECT: "connect",
	unix.SYS_OPEN:    "open", unix.SYS_OPENAT: "openat", unix.SYS_OPENAT2: "openat2", unix.SYS_CREAT: "creat",
	unix.SYS_ADD_KEY: "add_key", unix.SYS_BPF: "bpf", unix.SYS_CHROOT: "chroot",
	unix.SYS_DELETE_MODULE: "delete_module", unix.SYS_FINIT_MODULE: "finit_module",
	unix.SYS_FSMOUNT: "fsmount", unix.SYS_FSOPEN: "fsopen", unix.SYS_INIT_MODULE: "init_module",
	unix.SYS_KEXEC_FILE_LOAD: "kexec_file_load", unix.SYS_KEXEC_LOAD: "kexec_load",
	unix.SYS_KEYCTL: "keyctl", unix.SYS_MOUNT: "mount", unix.SYS_MOVE_MOUNT: "move_mount",
	unix.SYS_OPEN_BY_HANDLE_AT: "open_by_handle_at", unix.SYS_OPEN_TREE: "open_tree",
	unix.SYS_PERF_EVENT_OPEN: "perf_event_open", unix.SYS_PIVOT_ROOT: "pivot_root",
	unix.SYS_PROCESS_VM_READV: "process_vm_readv", unix.SYS_PROCESS_VM_WRITEV: "process_vm_writev",
	unix.SYS_PTRACE: "ptrace", unix.SYS_REQUEST_KEY: "request_key", unix.SYS_SETNS: "setns",
	unix.SYS_UMOUNT2: "umount2", unix.SYS_UNSHARE: "unshare", unix.SYS_USERFAULTFD: "userfaultfd",
}

// NameOf names an audited x86_64 syscall number ("" for any other).
func NameOf(nr int32) string { return x86_64Names[nr] }

// Number is the x86_64 number of an audited syscall (-1 if unknown).
func Number(name string) int {
	for nr, n := range x86_64Names {
		if n == name {
			return int(nr)
		}
	}
	return -1
}

// ParseSockaddr reads a guest's struct sockaddr (little-endian family)
// into a record's Family, Address and Port.
func ParseSockaddr(sa []byte) Record {
	if len(sa) < 2 {
		return Record{Family: "unknown"}
	}
	fam := binary.LittleEndian.Uint16(sa)
	r := Record{Family: strconv.Itoa(int(fam))}
	switch fam {
	case unix.AF_INET:
		r.Family = "inet"
		if len(sa) >= 8 {
			r.Port = int(binary.BigEndian.Uint16(sa[2:]))
			r.Address = netip.AddrFrom4([4]byte(sa[4:8])).String()
		}
	case unix.AF_INET6:
		r.Family = "inet6"
		if len(sa) >= 24 {
			r.Port = int(binary.BigEndian.Uint16(sa[2:]))
			r.Address = netip.AddrFrom16([16]byte(sa[8:24])).String()
		}
	case unix.AF_UNIX:
		r.Family = "unix"
		p := sa[2:]
		if len(p) > 0 && p[0] == 0 {
			r.Address = "@" + string(p[1:])
		} else {
			if i := indexNUL(p); i >= 0 {
				p = p[:i]
			}
			r.Address = string(p)
		}
	}
	return r
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}
