package kvm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/vmproc"
)

// TestSweepProbesKillsWhatADeadDaemonLeft: a probe VMM recorded by a
// prober that is gone (a stand-in: `sleep`, which ignores SIGTERM here and
// was started without a parent-death signal, as if it had escaped one) is
// killed by the sweep and its record removed; a live prober's probe is
// left alone.
func TestSweepProbesKillsWhatADeadDaemonLeft(t *testing.T) {
	dir := t.TempDir()
	rdir := filepath.Join(dir, "probes")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		t.Fatal(err)
	}
	start := func() (*exec.Cmd, *vmproc.Proc, chan struct{}) {
		cmd := exec.Command("sh", "-c", "trap '' TERM; exec sleep 100000")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() { cmd.Process.Kill(); <-done })
		st, err := vmproc.StartTime(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		return cmd, &vmproc.Proc{PID: cmd.Process.Pid, StartTime: st}, done
	}
	// A dead owner: a process that ran and was reaped.
	gone := exec.Command("true")
	if err := gone.Start(); err != nil {
		t.Fatal(err)
	}
	gonePID := gone.Process.Pid
	goneStart, _ := vmproc.StartTime(gonePID)
	gone.Wait()
	_, stale, staleDone := start()
	write := func(vmm *vmproc.Proc, ownerPID int, ownerStart uint64) {
		rec := []byte(strconv.Itoa(vmm.PID) + " " + strconv.FormatUint(vmm.StartTime, 10) + " " + strconv.Itoa(ownerPID) + " " + strconv.FormatUint(ownerStart, 10) + "\n")
		if err := os.WriteFile(filepath.Join(rdir, strconv.Itoa(vmm.PID)), rec, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(stale, gonePID, goneStart+1) // +1: never this pid's identity, even reused
	_, live, liveDone := start()
	selfStart, _ := vmproc.StartTime(os.Getpid())
	write(live, os.Getpid(), selfStart)
	os.WriteFile(filepath.Join(rdir, "junk"), []byte("x"), 0o600)

	if n := SweepProbes(dir, nil); n != 1 {
		t.Fatalf("SweepProbes killed %d, want 1", n)
	}
	<-staleDone // reaped: the sweep killed it
	select {
	case <-liveDone:
		t.Fatal("the sweep killed the probe of a live prober")
	default:
	}
	for name, want := range map[string]bool{strconv.Itoa(stale.PID): false, strconv.Itoa(live.PID): true, "junk": false} {
		if _, err := os.Stat(filepath.Join(rdir, name)); (err == nil) != want {
			t.Errorf("record %s exists=%v, want %v", name, err == nil, want)
		}
	}
}

// TestStartProbe: the VMM is recorded while it runs, Kill ends it and its
// process group and removes the record, and the parent-death signal is set.
func TestStartProbe(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", "trap '' TERM; sleep 100000 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	p, err := StartProbe(cmd, dir)
	if err != nil {
		t.Fatal(err)
	}
	if cmd.SysProcAttr.Pdeathsig != syscall.SIGKILL {
		t.Fatalf("Pdeathsig = %v", cmd.SysProcAttr.Pdeathsig)
	}
	rec := filepath.Join(dir, "probes", strconv.Itoa(p.Proc.PID))
	vmm, owner, err := readRecord(rec)
	if err != nil || *vmm != p.Proc || owner.PID != os.Getpid() || !owner.Alive() {
		t.Fatalf("record: %+v %+v %v", vmm, owner, err)
	}
	p.Kill()
	if _, err := os.Stat(rec); err == nil {
		t.Fatal("Kill left the record")
	}
	// Its session's other process went with it (SIGKILLed: at most a
	// zombie until init reaps it).
	for _, pid := range sessionMembers(p.Proc.PID) {
		if state, _, err := vmproc.Stat(pid); err == nil && state != "Z" && state != "X" {
			t.Errorf("process %d (%s) of the probe's session remains", pid, state)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// sessionMembers lists the processes of session sid.
func sessionMembers(sid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := unix.Getsid(pid); err == nil && s == sid {
			out = append(out, pid)
		}
	}
	return out
}

// TestCacheKeepsVerdictsPerBoot: with a Dir, a probe's verdict is kept
// for the host boot (a restarted daemon, a new Cache, does not probe
// again), not one of a probe that could not run, and not across boots.
func TestCacheKeepsVerdictsPerBoot(t *testing.T) {
	dir := t.TempDir()
	boot := filepath.Join(dir, "boot_id")
	os.WriteFile(boot, []byte("boot-1\n"), 0o644)
	old := bootIDFile
	bootIDFile = boot
	t.Cleanup(func() { bootIDFile = old })
	runs := 0
	probe := func(v Verdict) func(context.Context) Verdict {
		return func(context.Context) Verdict { runs++; return v }
	}
	failed := Verdict{Reason: "KVM probe failed: hung", Probed: true}
	if v := (&Cache{Dir: dir}).Do("k", time.Second, probe(failed)); v.Cached || runs != 1 {
		t.Fatalf("first probe: %+v, runs %d", v, runs)
	}
	v := (&Cache{Dir: dir}).Do("k", time.Second, probe(Verdict{Usable: true, Probed: true}))
	if runs != 1 || !v.Cached || v.Usable || v.Evidence != failed.Evidence {
		t.Fatalf("a restart probed again or lost the verdict: %+v, runs %d", v, runs)
	}
	(&Cache{Dir: dir}).Do("other", time.Second, probe(Verdict{Reason: "KVM not probed: no uid"}))
	(&Cache{Dir: dir}).Do("other", time.Second, probe(Verdict{Reason: "KVM not probed: no uid"}))
	if runs != 3 {
		t.Fatalf("a probe that could not run was kept (runs %d, want 3)", runs)
	}
	os.WriteFile(boot, []byte("boot-2\n"), 0o644)
	if v := (&Cache{Dir: dir}).Do("k", time.Second, probe(Verdict{Usable: true, Probed: true})); !v.Usable || v.Cached || runs != 4 {
		t.Fatalf("a new boot kept the old verdict: %+v, runs %d", v, runs)
	}
}
