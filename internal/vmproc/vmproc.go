// Package vmproc identifies, signals and houses the VMM processes of the
// microVM runtimes (qemu, firecracker): a process is known by its pid and
// the start time the kernel gives it, so a reused pid is never taken for
// it; each VMM gets a uid of its own.
package vmproc

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Proc is a VMM process.
type Proc struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

// Stat is the state and start time of pid from /proc/PID/stat.
func Stat(pid int) (state string, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, err
	}
	// The command name (field 2) may hold spaces; fields resume after ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); the start time is field 22.
	if len(f) < 20 {
		return "", 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return f[0], start, err
}

// StartTime is the start time of a running (not exited) pid.
func StartTime(pid int) (uint64, error) {
	state, start, err := Stat(pid)
	if err != nil {
		return 0, err
	}
	if state == "Z" || state == "X" {
		return 0, fmt.Errorf("process %d has exited", pid)
	}
	return start, nil
}

// Alive reports whether the recorded process still runs.
func (p *Proc) Alive() bool {
	if p == nil || p.PID <= 0 {
		return false
	}
	st, err := StartTime(p.PID)
	return err == nil && st == p.StartTime
}

// Kill sends SIGKILL through a pidfd opened before the start time is
// checked, so the signal cannot reach a process that reused the pid.
func (p *Proc) Kill() error {
	if p == nil || p.PID <= 0 {
		return nil
	}
	pfd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("pidfd of vmm %d: %w", p.PID, err)
	}
	defer unix.Close(pfd)
	if !p.Alive() {
		return nil
	}
	if err := unix.PidfdSendSignal(pfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill vmm %d: %w", p.PID, err)
	}
	return nil
}

// WaitGone waits until the process is gone (or d passes).
func (p *Proc) WaitGone(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for p.Alive() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// WriteFile records p at path ("PID STARTTIME\n", 0600, atomically).
func WriteFile(path string, p *Proc) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%d %d\n", p.PID, p.StartTime), 0o600); err != nil {
		return fmt.Errorf("record vmm pid: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("record vmm pid: %w", err)
	}
	return nil
}

// ReadFile reads what WriteFile recorded.
func ReadFile(path string) (*Proc, error) {
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
	if err1 != nil || err2 != nil || pid <= 0 {
		return nil, fmt.Errorf("malformed pid file %s", path)
	}
	return &Proc{PID: pid, StartTime: st}, nil
}

// UIDsInUse lists the uids that own processes now.
func UIDsInUse() map[uint32]bool {
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

// UIDPool hands out the uids VMM processes run as, one per sandbox, from
// [base, base+count) (a range no user owns). A uid is one derived from the
// sandbox's id, or the next one that no process and no other sandbox of
// the pool uses. A VMM that a guest took over then shares its uid with
// nothing it could signal, ptrace or read.
type UIDPool struct {
	base, count uint32

	// mu guards reserved.
	mu sync.Mutex
	// reserved are the uids of sandboxes created or recovered and not yet
	// destroyed (a VM made but not started has no process that would show
	// its uid as taken).
	reserved map[uint32]bool
}

// NewUIDPool returns the pool of count uids from base.
func NewUIDPool(base, count uint32) *UIDPool {
	return &UIDPool{base: base, count: count, reserved: map[uint32]bool{}}
}

// Pick chooses and reserves the uid of sandbox id.
func (p *UIDPool) Pick(id string) (uint32, error) {
	h := fnv.New32a()
	h.Write([]byte(id))
	start := h.Sum32() % p.count
	used := UIDsInUse()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := uint32(0); i < p.count; i++ {
		uid := p.base + (start+i)%p.count
		if !used[uid] && !p.reserved[uid] {
			p.reserved[uid] = true
			return uid, nil
		}
	}
	return 0, fmt.Errorf("all %d VMM uids from %d are in use: destroy some sandboxes", p.count, p.base)
}

// Reserve marks uid as taken (a recovered sandbox's).
func (p *UIDPool) Reserve(uid uint32) {
	p.mu.Lock()
	p.reserved[uid] = true
	p.mu.Unlock()
}

// Release gives uid back once its sandbox is destroyed.
func (p *UIDPool) Release(uid uint32) {
	p.mu.Lock()
	delete(p.reserved, uid)
	p.mu.Unlock()
}

// Reserved reports whether uid is taken by a sandbox of the pool.
func (p *UIDPool) Reserved(uid uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reserved[uid]
}
