package syscallaudit

import (
	"path"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/agentproto"
)

// FromAgent turns a VM guest agent's (untrusted) record into a Record of
// set's classes; ok is false for one outside them, of another ABI, or an
// insensitive open.
func FromAgent(r *agentproto.AuditRecord, set Set) (Record, bool) {
	// The guest's rule names syscall numbers of every ABI: only x86_64's
	// are the syscalls asked for.
	if r.Syscall < 0 || r.Syscall > 1<<16 || r.Arch != unix.AUDIT_ARCH_X86_64 {
		return Record{}, false
	}
	name := NameOf(int32(r.Syscall))
	class := ClassOf(name)
	if class == "" || !set.Has(class) {
		return Record{}, false
	}
	rec := Record{Class: class, Syscall: name, PID: r.PID}
	if r.Exited {
		switch {
		case r.Success:
			rec.Result = ResultOK
		case r.Exit == -int64(unix.EPERM) && class == Priv:
			rec.Result, rec.Errno = ResultDenied, int(unix.EPERM)
		default:
			rec.Result = ResultError
			if r.Exit < 0 && r.Exit > -4096 {
				rec.Errno = int(-r.Exit)
			}
		}
	}
	first := ""
	if len(r.Paths) > 0 {
		first = r.Paths[0]
	}
	switch class {
	case Exec:
		rec.Argv, rec.ArgvTruncated, rec.Path = r.Argv, r.ArgvTruncated, first
	case Net:
		sa := ParseSockaddr(r.Saddr)
		rec.Family, rec.Address, rec.Port = sa.Family, sa.Address, sa.Port
	case File:
		// The object is the last PATH item: a create logs the parent
		// directory first, then the new file.
		if len(r.Paths) > 0 {
			rec.Path = r.Paths[len(r.Paths)-1]
		}
		if rec.Path != "" && !path.IsAbs(rec.Path) && path.IsAbs(r.Cwd) && (name == "open" || name == "creat" || int32(uint32(r.Args[0])) == unix.AT_FDCWD) {
			rec.Path = path.Join(r.Cwd, rec.Path)
		}
		var flags uint64
		switch name {
		case "open":
			flags = r.Args[1]
		case "openat":
			flags = r.Args[2]
		}
		rec.Write = name == "creat" || flags&unix.O_ACCMODE != unix.O_RDONLY || flags&(unix.O_CREAT|unix.O_TRUNC) != 0
		if !SensitiveOpen(rec.Path, rec.Write) {
			return Record{}, false
		}
	}
	return rec.Bounded(), true
}
