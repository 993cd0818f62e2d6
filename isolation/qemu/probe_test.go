package qemu

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

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
	probes.Forget()
	t.Cleanup(probes.Forget)
	return New(Options{Dir: base.cache.Dir, Binary: fakeQEMU(t, kvmScript), Device: "/dev/null", ProbeTimeout: timeout})
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
	v := rt.KVM()
	if v.Usable || !strings.Contains(v.Reason, "no usable /nonexistent/kvm") {
		t.Fatalf("verdict without a device: %s", v)
	}
	if d := rt.Detail(); !strings.Contains(d, "tcg") || !strings.Contains(d, "/nonexistent/kvm") {
		t.Fatalf("Detail %q", d)
	}
}
