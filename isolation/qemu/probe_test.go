package qemu

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/kvm"
)

// stateDirEnv hands a helper process (a stand-in daemon) the test's KVM
// state directory, so what it records is the test's to check and remove.
const stateDirEnv = "CBX_TEST_KVM_STATE"

// TestMain keeps the tests' probe verdicts and probe records out of the
// host's (kvm.DefaultStateDir): a temporary state directory, removed after.
func TestMain(m *testing.M) {
	dir := os.Getenv(stateDirEnv)
	own := dir == ""
	if own {
		var err error
		if dir, err = os.MkdirTemp("", "cbx-kvm-state-"); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
	}
	probes.Dir = dir
	code := m.Run()
	if own {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// fakeQEMU writes a QEMU stand-in that behaves like the real one on a host
// whose /dev/kvm cannot run a standard guest (a paravirtual nested KVM):
// under `-accel kvm` it does what kvmScript says; otherwise it runs the
// real QEMU (TCG). It lives in a directory VMM uids can traverse.
func fakeQEMU(t *testing.T, kvmScript string) string {
	t.Helper()
	real, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	dir, err := os.MkdirTemp("", "cbxfakeqemu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "qemu-system-x86_64")
	script := "#!/bin/sh\n" +
		"for a in \"$@\"; do case \"$a\" in kvm|kvm,*) " + kvmScript + ";; esac; done\n" +
		"exec " + real + " \"$@\"\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// simulatedRuntime is a runtime on a host whose KVM device opens (here
// /dev/null stands in: it opens read-write and needs no group) but cannot
// boot the guest: kvmScript is what QEMU does under KVM.
func simulatedRuntime(t *testing.T, kvmScript string, timeout time.Duration) *Runtime {
	t.Helper()
	base := testRuntime(t)
	forgetProbes(t)
	// Cold boots: a background template build would outlive the test
	// (its run directory left in /tmp when the test binary exits).
	return New(Options{Dir: base.cache.Dir, Binary: fakeQEMU(t, kvmScript), Device: "/dev/null", ProbeTimeout: timeout, DisableTemplates: true})
}

// TestKVMProbeFallbackOnAbort simulates the paravirtual nested KVM where
// `-cpu host` aborts on an MSR: the probe fails fast, the runtime falls
// back to TCG, says so quoting QEMU, and a sandbox still runs.
func TestKVMProbeFallbackOnAbort(t *testing.T) {
	rt := simulatedRuntime(t,
		`echo "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69" >&2; kill -ABRT $$`, 5*time.Second)
	v := rt.KVM()
	if v.Usable {
		t.Fatalf("the probe passed on a KVM that aborts: %s", v)
	}
	for _, want := range []string{"KVM probe failed", "QEMU could not boot the guest kernel under KVM", "failed to set MSR 0x10a"} {
		if !strings.Contains(v.String(), want) {
			t.Errorf("verdict %q does not say %q", v, want)
		}
	}
	d := rt.Detail()
	if !strings.Contains(d, "tcg") || !strings.Contains(d, "failed to set MSR 0x10a") {
		t.Errorf("Detail %q does not name the fallback and quote the probe", d)
	}
	if err := rt.Available(); err != nil {
		t.Fatalf("the runtime is unavailable after a failed KVM probe (it should fall back): %v", err)
	}
	s, c, _ := startGuest(t, rt, nil)
	if out, code := execOut(t, c, "echo", "tcg"); out != "tcg\n" || code != 0 {
		t.Fatalf("exec under the fallback: %q %d", out, code)
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(s.proc.PID) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.ReplaceAll(string(cmdline), "\x00", " "); !strings.Contains(args, "-accel tcg") {
		t.Fatalf("the sandbox's QEMU does not run under TCG: %s", args)
	}
}

// TestKVMProbeBoundedOnHang simulates the other failure of that host (a
// CPU model that hangs early in boot): the probe gives up at its bound,
// says so, and leaves no process behind.
func TestKVMProbeBoundedOnHang(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	if err := os.WriteFile(pidFile, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(pidFile, 0o666)
	os.Chmod(filepath.Dir(pidFile), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(pidFile)), 0o755)
	rt := simulatedRuntime(t, `echo "Probing EDD (edd=off to disable)... ok"; echo $$ > `+pidFile+`; exec sleep 60`, 1500*time.Millisecond)
	start := time.Now()
	v := rt.KVM()
	if v.Usable {
		t.Fatalf("the probe passed on a hanging KVM: %s", v)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the probe took %v with a bound of 1.5s", took)
	}
	if !strings.Contains(v.Reason, "did not finish booting under KVM within 1.5s") || !strings.Contains(v.Evidence, "Probing EDD") {
		t.Fatalf("verdict %q does not explain the hang", v)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		t.Fatalf("the fake QEMU did not run as a VMM (pid file: %q, %v)", b, err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Fatalf("the hung probe left process %d behind", pid)
	}
}

// TestKVMProbeWithoutDevice: a host without /dev/kvm runs TCG and says why.
func TestKVMProbeWithoutDevice(t *testing.T) {
	base := testRuntime(t)
	rt := New(Options{Dir: base.cache.Dir, Device: "/nonexistent/kvm"})
	t.Cleanup(rt.Close) // a background template build ends with the test
	v := rt.KVM()
	if v.Usable || !strings.Contains(v.Reason, "no usable /nonexistent/kvm") {
		t.Fatalf("verdict without a device: %s", v)
	}
	if d := rt.Detail(); !strings.Contains(d, "tcg") || !strings.Contains(d, "/nonexistent/kvm") {
		t.Fatalf("Detail %q", d)
	}
}

// forgetProbes makes the next KVM() probe again: no verdict in memory or
// kept for the boot.
func forgetProbes(t *testing.T) {
	t.Helper()
	probes.Forget()
	os.Remove(filepath.Join(probes.Dir, "verdicts.json"))
	t.Cleanup(func() {
		probes.Forget()
		os.Remove(filepath.Join(probes.Dir, "verdicts.json"))
	})
}

// daemonEnv makes the test binary, started with it, a stand-in daemon
// that probes KVM with a stand-in QEMU (the script in the variable) and
// never returns (TestKVMProbeDiesWithItsDaemon).
const daemonEnv = "CBX_TEST_PROBE_DAEMON"

// TestKVMProbeDiesWithItsDaemon: a daemon killed (SIGKILL) in the middle
// of its KVM probe leaves no VMM. This host has no /dev/kvm, so the host
// whose KVM cannot boot the guest (a paravirtual nested KVM: QEMU spins
// forever under -accel kvm) is simulated: /dev/null stands in for the
// device and a stand-in QEMU ignores SIGTERM and never ends (it sleeps
// rather than spins, to spare a shared machine's CPU; nothing else
// differs). The daemon is a child process of this test (the test binary
// again) probing with a 10-minute bound; once its VMM runs, the daemon is
// SIGKILLed, and the VMM must be gone with it — no sweep, no later
// daemon. The record the probe left is then swept by the next start.
func TestKVMProbeDiesWithItsDaemon(t *testing.T) {
	if script := os.Getenv(daemonEnv); script != "" {
		rt := simulatedRuntime(t, script, 10*time.Minute)
		v := rt.KVM()
		t.Fatalf("the probe returned (%s): it should have been killed first", v)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (VMM uids)")
	}
	testRuntime(t) // skips without QEMU or the guest kernel
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	pidFile := filepath.Join(dir, "vmm.pid")
	if err := os.WriteFile(pidFile, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(pidFile, 0o666)
	script := `trap '' TERM; echo $$ > ` + pidFile + `; exec sleep 100000`

	daemon := exec.Command(os.Args[0], "-test.run=^TestKVMProbeDiesWithItsDaemon$", "-test.count=1")
	// Whatever the killed daemon leaves in its temporary directories (the
	// stand-in QEMU's) is under dir, which this test removes.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	daemon.Env = append(os.Environ(), daemonEnv+"="+script, stateDirEnv+"="+probes.Dir, "TMPDIR="+tmp)
	var out strings.Builder
	daemon.Stdout, daemon.Stderr = &out, &out
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { daemon.Wait(); close(exited) }()
	var vmm int
	t.Cleanup(func() {
		daemon.Process.Kill()
		<-exited
		if vmm > 0 {
			syscall.Kill(vmm, syscall.SIGKILL)
		}
	})

	// The VMM announces itself (or the daemon ends first: a failure).
	pfd := waitVMM(t, pidFile, exited, &out, &vmm)
	defer unix.Close(pfd)
	if err := daemon.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	// A pidfd becomes readable when its process exits.
	fds := []unix.PollFd{{Fd: int32(pfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(time.Minute/time.Millisecond))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(vmm) + "/status")
			t.Fatalf("the probe's VMM (pid %d) outlived its daemon by a minute:\n%s", vmm, b)
		}
		break
	}
	// The record it left names a dead daemon and a dead VMM: the next
	// daemon's sweep removes it (and would kill a VMM that escaped).
	if n := kvm.SweepProbes(probes.Dir, nil); n != 0 {
		t.Errorf("the sweep killed %d VMMs; the parent-death signal should have", n)
	}
	if ents, _ := os.ReadDir(filepath.Join(probes.Dir, "probes")); len(ents) != 0 {
		t.Errorf("probe records left after the sweep: %v", ents)
	}
}

// waitVMM waits until the stand-in VMM has written its pid, opens a pidfd
// on it and returns it; it fails if the daemon exits first.
func waitVMM(t *testing.T, pidFile string, exited <-chan struct{}, out *strings.Builder, vmm *int) int {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-exited:
			t.Fatalf("the stand-in daemon ended before its probe's VMM ran:\n%s", out.String())
		case <-tick.C:
		}
		b, _ := os.ReadFile(pidFile)
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		*vmm = pid
		pfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			t.Fatalf("pidfd of the VMM %d: %v", pid, err)
		}
		return pfd
	}
}
