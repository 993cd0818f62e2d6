package qemu

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// vmmProc identifies a running QEMU across daemon restarts: pid plus the
// process's start time (so a reused pid is never mistaken for it).
type vmmProc struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

// procStartTime is field 22 of /proc/PID/stat (clock ticks since boot).
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields resume after ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); start time is field 22.
	if len(f) < 20 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("process %d has exited", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether the recorded process still runs.
func (p *vmmProc) alive() bool {
	if p == nil || p.PID <= 0 {
		return false
	}
	st, err := procStartTime(p.PID)
	return err == nil && st == p.StartTime
}

// kill sends SIGKILL through a pidfd after checking the start time, so the
// signal cannot reach a process that reused the pid.
func (p *vmmProc) kill() error {
	if p == nil || p.PID <= 0 {
		return nil
	}
	pfd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("pidfd of qemu %d: %w", p.PID, err)
	}
	defer unix.Close(pfd)
	if !p.alive() {
		return nil
	}
	if err := unix.PidfdSendSignal(pfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill qemu %d: %w", p.PID, err)
	}
	return nil
}

// waitGone waits until the process is gone (or d passes).
func (p *vmmProc) waitGone(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for p.alive() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

func writePidfile(path string, p *vmmProc) error {
	return os.WriteFile(path, []byte(fmt.Sprintf("%d %d\n", p.PID, p.StartTime)), 0o600)
}

func readPidfile(path string) (*vmmProc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return nil, fmt.Errorf("malformed pid file %s", path)
	}
	pid, err1 := strconv.Atoi(f[0])
	st, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("malformed pid file %s", path)
	}
	return &vmmProc{PID: pid, StartTime: st}, nil
}

// uidsInUse lists the uids that own processes now.
func uidsInUse() map[uint32]bool {
	out := map[uint32]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if fi, err := os.Stat(filepath.Join("/proc", e.Name())); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				out[st.Uid] = true
			}
		}
	}
	return out
}

// pickUID chooses a uid for a sandbox's QEMU from [base, base+count): one
// derived from the id, or the next one that no process and no other
// sandbox of this runtime uses. Each VMM having its own uid means a VMM
// that a guest took over cannot signal, ptrace or read another one.
func pickUID(id string, base, count uint32, reserved map[uint32]bool) (uint32, error) {
	h := fnv.New32a()
	h.Write([]byte(id))
	start := h.Sum32() % count
	used := uidsInUse()
	for i := uint32(0); i < count; i++ {
		uid := base + (start+i)%count
		if !used[uid] && !reserved[uid] {
			return uid, nil
		}
	}
	return 0, fmt.Errorf("all %d vmm uids from %d are in use", count, base)
}

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
