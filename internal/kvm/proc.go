package kvm

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/cagebox/cagebox/internal/vmproc"
)

// DefaultStateDir holds what this package keeps per host boot: the records
// of probe VMMs that run now (probes/) and the verdicts of this boot
// (verdicts.json). /run is cleared at every boot.
const DefaultStateDir = "/run/cagebox/kvm"

// A probe VMM on a KVM that cannot run the guest does not end by itself (it
// spins, and ignores SIGTERM). Nothing may leave one behind, so a probe's
// process is
//
//   - killed by the kernel when the process that probes dies, however it
//     dies (SIGKILL included): PR_SET_PDEATHSIG, set after the child's
//     credentials change (Go's fork does so) and fired when the *thread*
//     that forked it exits, so the fork happens on a goroutine locked to
//     its OS thread until the child is reaped;
//   - recorded (its pid and start time, and its prober's) under the state
//     dir while it runs, so a later daemon kills one that escaped anyway
//     (SweepProbes); identity by start time and pidfd signals mean a reused
//     pid is never hit.

// Probe is a running probe VMM.
type Probe struct {
	// Proc is the VMM.
	Proc   vmproc.Proc
	record string
	done   chan struct{}
	err    error
}

// StartProbe starts cmd (a probe VMM, its own session or process group
// already set by the caller or not) so that it dies with this process, and
// records it under dir ("" = DefaultStateDir). The caller must call Kill
// (or wait for Done and then Kill) to end it and remove its record.
func StartProbe(cmd *exec.Cmd, dir string) (*Probe, error) {
	if dir == "" {
		dir = DefaultStateDir
	}
	rdir := filepath.Join(dir, "probes")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		return nil, fmt.Errorf("probe records: %w", err)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	p := &Probe{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The parent-death signal follows this thread, not the process:
		// it stays locked (and alive) until the child is reaped, and is
		// ended with the goroutine (returning while locked).
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	p.Proc.PID = pid
	if st, err := vmproc.StartTime(pid); err == nil {
		p.Proc.StartTime = st
	}
	self := os.Getpid()
	selfStart, err := vmproc.StartTime(self)
	if err != nil {
		p.Kill()
		return nil, fmt.Errorf("own start time: %w", err)
	}
	p.record = filepath.Join(rdir, strconv.Itoa(pid))
	rec := fmt.Sprintf("%d %d %d %d\n", pid, p.Proc.StartTime, self, selfStart)
	if err := writeAtomic(p.record, []byte(rec)); err != nil {
		p.record = ""
		p.Kill()
		return nil, fmt.Errorf("record probe vmm: %w", err)
	}
	return p, nil
}

// Done is closed once the VMM has exited and been reaped.
func (p *Probe) Done() <-chan struct{} { return p.done }

// Err is how the VMM exited (after Done).
func (p *Probe) Err() error {
	<-p.done
	return p.err
}

// Kill ends the VMM (and its process group, when it leads one), waits for
// it to be reaped and removes its record.
func (p *Probe) Kill() {
	select {
	case <-p.done:
	default:
		// Reaping is what Wait does; until then the pid cannot be reused,
		// so signalling it is safe.
		_ = syscall.Kill(-p.Proc.PID, syscall.SIGKILL)
		_ = syscall.Kill(p.Proc.PID, syscall.SIGKILL)
		<-p.done
	}
	if p.record != "" {
		os.Remove(p.record)
	}
}

// SweepProbes kills the probe VMMs recorded under dir ("" =
// DefaultStateDir) whose prober is gone (a daemon killed mid-probe on a
// kernel where the parent-death signal did not reach them) and removes
// their records. It returns how many it killed. Records of live probers
// are left alone: another daemon may be probing now.
func SweepProbes(dir string, log *slog.Logger) int {
	if dir == "" {
		dir = DefaultStateDir
	}
	if log == nil {
		log = slog.Default()
	}
	rdir := filepath.Join(dir, "probes")
	ents, err := os.ReadDir(rdir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("kvm: cannot read probe records", "dir", rdir, "err", err)
		}
		return 0
	}
	killed := 0
	for _, e := range ents {
		path := filepath.Join(rdir, e.Name())
		if strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		vmm, owner, err := readRecord(path)
		if err != nil {
			log.Warn("kvm: removing a malformed probe record", "path", path, "err", err)
			os.Remove(path)
			continue
		}
		if owner.Alive() {
			continue
		}
		if vmm.Alive() {
			if err := vmm.Kill(); err != nil {
				log.Warn("kvm: cannot kill a stale probe vmm", "pid", vmm.PID, "err", err)
				continue
			}
			killed++
			log.Warn("kvm: killed a probe vmm its daemon left running", "pid", vmm.PID, "daemon_pid", owner.PID)
		}
		os.Remove(path)
	}
	return killed
}

func readRecord(path string) (vmm, owner *vmproc.Proc, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	f := strings.Fields(string(b))
	if len(f) != 4 {
		return nil, nil, fmt.Errorf("want 4 fields, have %d", len(f))
	}
	var n [4]uint64
	for i, s := range f {
		if n[i], err = strconv.ParseUint(s, 10, 64); err != nil {
			return nil, nil, fmt.Errorf("field %d: %w", i+1, err)
		}
	}
	if n[0] == 0 || n[2] == 0 || n[0] > 1<<22 || n[2] > 1<<22 {
		return nil, nil, errors.New("bad pid")
	}
	return &vmproc.Proc{PID: int(n[0]), StartTime: n[1]}, &vmproc.Proc{PID: int(n[2]), StartTime: n[3]}, nil
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
