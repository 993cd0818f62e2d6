package qemu

import (
	"github.com/cagebox/cagebox/internal/vmproc"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// vmmProc is the QEMU process.
type vmmProc = vmproc.Proc

// kvmGroup is the group owning /dev/kvm (QEMU needs it to open the device),
// or -1.
func kvmGroup() int {
	fi, err := os.Stat("/dev/kvm")
	if err != nil {
		return -1
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Gid)
	}
	return -1
}

// kvmUsable reports whether /dev/kvm can be opened for use.
func kvmUsable() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// vmmCommand is QEMU's exec.Cmd, confined: its own uid and gid (and the
// kvm group if needed) with no supplementary groups and so no
// capabilities, its own session and IPC/UTS namespaces, and a new empty
// network namespace unless it is started inside the sandbox's.
func vmmCommand(binary string, args []string, uid uint32, kvm bool, newNet bool) *exec.Cmd {
	cmd := exec.Command(binary, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	cmd.Dir = "/"
	groups := []uint32{}
	if g := kvmGroup(); kvm && g >= 0 {
		groups = append(groups, uint32(g))
	}
	flags := uintptr(unix.CLONE_NEWIPC | unix.CLONE_NEWUTS)
	if newNet {
		flags |= unix.CLONE_NEWNET
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: groups},
		Setsid:     true,
		Cloneflags: flags,
	}
	return cmd
}
