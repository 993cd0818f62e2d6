package qemu

import (
	"os/exec"
	"syscall"

	"github.com/cagebox/cagebox/internal/vmproc"

	"golang.org/x/sys/unix"
)

// vmmProc is the QEMU process.
type vmmProc = vmproc.Proc

// vmmCommand is QEMU's exec.Cmd, confined: its own uid and gid with no
// supplementary group but kvmGID (>= 0 only when it runs under KVM: the
// group kvm.VMMAccess chose, never root's) and so no capabilities, its own
// session and IPC/UTS namespaces, and a new empty network namespace unless
// it is started inside the sandbox's.
func vmmCommand(binary string, args []string, uid uint32, kvmGID int, newNet bool) *exec.Cmd {
	cmd := exec.Command(binary, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	cmd.Dir = "/"
	groups := []uint32{}
	if kvmGID > 0 {
		groups = append(groups, uint32(kvmGID))
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
