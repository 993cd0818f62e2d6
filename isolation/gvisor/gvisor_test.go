package gvisor_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/gvisor"
	"github.com/cagebox/cagebox/isolation/isolationtest"
)

func newRuntime(t *testing.T) *gvisor.Runtime {
	t.Helper()
	if os.Geteuid() != 0 {
		isolationtest.Unavailable(t, gvisor.Name, "the gvisor runtime needs root")
	}
	rt := gvisor.New(gvisor.Options{StateRoot: t.TempDir()})
	isolationtest.CheckAvailable(t, rt)
	t.Logf("gvisor runtime: %s", rt.Detail())
	return rt
}

func TestConformance(t *testing.T) {
	rt := newRuntime(t)
	isolationtest.Run(t, rt, isolationtest.Options{
		RootFS:    isolationtest.BusyboxRoot(t),
		AgentPath: isolationtest.BuildAgent(t),
		Restarted: func() isolation.Runtime { return gvisor.New(gvisor.Options{StateRoot: rt.StateRoot()}) },
	})
}

// TestConformancePooled: the suite on sandboxes made as a warm pool makes
// them (agent awaiting its claim, no identity) and then claimed.
func TestConformancePooled(t *testing.T) {
	rt := newRuntime(t)
	isolationtest.Run(t, rt, isolationtest.Options{
		RootFS:    isolationtest.BusyboxRoot(t),
		AgentPath: isolationtest.BuildAgent(t),
		Restarted: func() isolation.Runtime { return gvisor.New(gvisor.Options{StateRoot: rt.StateRoot()}) },
		Pooled:    true,
	})
}

// fakeRunsc stands in for runsc on a host whose /dev/kvm opens but cannot
// run gVisor's kvm platform: with --platform=kvm it does what kvmScript
// says; otherwise it runs the real runsc.
func fakeRunsc(t *testing.T, kvmScript string) string {
	t.Helper()
	real, err := exec.LookPath("runsc")
	if err != nil {
		isolationtest.Unavailable(t, gvisor.Name, "runsc is not installed")
	}
	p := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in --platform=kvm) " + kvmScript + ";; esac; done\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKVMPlatformFallback simulates the two failures seen on a paravirtual
// nested KVM (the sentry fails at once; the sentry hangs) and a host
// without /dev/kvm: the runtime falls back to systrap or ptrace, says why
// quoting the probe, and runs a sandbox.
func TestKVMPlatformFallback(t *testing.T) {
	if os.Geteuid() != 0 {
		isolationtest.Unavailable(t, gvisor.Name, "the gvisor runtime needs root")
	}
	for _, tc := range []struct {
		name, script, device, want string
	}{
		{"sentry fails", `echo "creating container: cannot create sandbox: cannot read client sync file: waiting for sandbox to start: EOF" >&2; exit 128`, "/dev/null", "cannot read client sync file"},
		{"sentry hangs", `exec sleep 60`, "/dev/null", "did not finish within 1.5s"},
		{"no device", `exit 99`, "/nonexistent/kvm", "no usable /nonexistent/kvm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			rt := gvisor.New(gvisor.Options{StateRoot: t.TempDir(), Binary: fakeRunsc(t, tc.script), Device: tc.device, ProbeTimeout: 1500 * time.Millisecond})
			if err := rt.Available(); err != nil {
				t.Fatalf("unavailable after a failed kvm probe (it should fall back): %v", err)
			}
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("probing took %v with a bound of 1.5s", took)
			}
			if p := rt.Platform(); p == "kvm" {
				t.Fatalf("platform kvm after a failed probe")
			}
			if d := rt.Detail(); !strings.Contains(d, tc.want) {
				t.Fatalf("Detail %q does not say %q", d, tc.want)
			}
			g := isolationtest.Start(t, rt, isolationtest.Options{RootFS: isolationtest.BusyboxRoot(t), AgentPath: isolationtest.BuildAgent(t)}, isolation.Resources{})
			if out, _, res := g.Exec(t, "echo", "fallback"); out != "fallback\n" || res.ExitCode != 0 {
				t.Fatalf("exec on the fallback platform: %q %+v", out, res)
			}
		})
	}
}

// TestKVMProbeLeavesNothing runs the real kvm platform probe (on a host
// where the platform hangs it is killed at its bound) and checks that no
// process of it is left: runsc's sandbox and gofer leave the probe's
// process group and lose their parent-death signal.
func TestKVMProbeLeavesNothing(t *testing.T) {
	rt := newRuntime(t)
	t.Logf("platform %s", rt.Platform())
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(fmt.Sprintf("cbx-runsc-kvm-probe-%d-", os.Getpid()))) {
			st, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
			if !bytes.Contains(st, []byte(") Z ")) {
				t.Errorf("the kvm probe left process %s: %s", e.Name(), bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
			}
		}
	}
}

// TestMounts: bind mounts (served by the gofer), volumes and a read-only
// root (isolationtest.Mounts).
func TestMounts(t *testing.T) {
	rt := gvisor.New(gvisor.Options{StateRoot: t.TempDir()})
	isolationtest.Mounts(t, rt, isolationtest.Options{
		RootFS:    isolationtest.BusyboxRoot(t),
		AgentPath: isolationtest.BuildAgent(t),
	})
}
