package oci

import (
	"golang.org/x/sys/unix"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// deniedSyscalls fail with EPERM in every guest. The list covers what lets a
// process change the kernel or escape its namespaces: mounts and the new
// mount API, ptrace and cross-process memory access, bpf, kexec, kernel
// keyrings, module loading, namespace creation and joining, clock and
// system changes, and interfaces with a record of kernel exploits
// (userfaultfd, perf_event_open, open_by_handle_at, io_uring: its
// operations bypass this very filter, and Docker's profile denies it too;
// found by `cagebox selftest`).
var deniedSyscalls = []string{
	"acct", "add_key", "bpf", "chroot", "clock_adjtime", "clock_settime",
	"create_module", "delete_module", "finit_module", "fsconfig", "fsmount",
	"fsopen", "fspick", "get_kernel_syms", "get_mempolicy", "init_module",
	"ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load", "keyctl",
	"lookup_dcookie", "mbind", "mount", "mount_setattr", "move_mount",
	"move_pages", "name_to_handle_at", "nfsservctl", "open_by_handle_at",
	"open_tree", "perf_event_open", "personality", "pivot_root",
	"process_vm_readv", "process_vm_writev", "ptrace", "query_module",
	"quotactl", "quotactl_fd", "reboot", "request_key", "set_mempolicy",
	"setns", "settimeofday", "stime", "swapoff", "swapon", "sysfs",
	"_sysctl", "syslog", "umount", "umount2", "unshare", "uselib",
	"userfaultfd", "ustat", "vhangup", "vm86", "vm86old", "adjtimex",
	"fanotify_init", "pidfd_getfd",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
}

// nsFlags are the clone flags that create namespaces.
var nsFlags = []uint64{unix.CLONE_NEWNS, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC,
	unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET,
	unix.CLONE_NEWCGROUP, unix.CLONE_NEWTIME}

// Seccomp returns the default seccomp profile. It allows by default and
// denies a fixed list, for every x86 ABI (x86_64, i386 and x32 are all
// listed, so a 32-bit syscall cannot slip past a rule written for 64-bit).
// clone with a namespace flag is refused, and clone3 (whose flags live in
// memory a filter cannot read) fails with ENOSYS so libc falls back to clone.
// mknod and mknodat of a character or block device are refused: under runc
// the missing CAP_MKNOD already stops them, but gVisor's sentry (runsc
// 20221219, which applies this profile with --oci-seccomp) makes no such
// check. FIFOs and sockets stay allowed.
func Seccomp() *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	rules := []specs.LinuxSyscall{
		{Names: deniedSyscalls, Action: specs.ActErrno, ErrnoRet: &eperm},
		{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
	}
	// libseccomp has no "masked not equal": one rule per flag, (flags &
	// flag) == flag, and rules for one syscall are OR'ed.
	for _, f := range nsFlags {
		rules = append(rules, specs.LinuxSyscall{
			Names:    []string{"clone"},
			Action:   specs.ActErrno,
			ErrnoRet: &eperm,
			Args:     []specs.LinuxSeccompArg{{Index: 0, Value: f, ValueTwo: f, Op: specs.OpMaskedEqual}},
		})
	}
	for _, dev := range []uint64{unix.S_IFCHR, unix.S_IFBLK} {
		for _, sc := range []struct {
			name string
			mode uint
		}{{"mknod", 1}, {"mknodat", 2}} {
			rules = append(rules, specs.LinuxSyscall{
				Names:    []string{sc.name},
				Action:   specs.ActErrno,
				ErrnoRet: &eperm,
				Args:     []specs.LinuxSeccompArg{{Index: sc.mode, Value: unix.S_IFMT, ValueTwo: dev, Op: specs.OpMaskedEqual}},
			})
		}
	}
	return &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		Syscalls:      rules,
	}
}
