package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cagebox/cagebox/internal/kvm"
)

// kvmProbes caches the kvm platform's verdict per process and runsc.
var kvmProbes kvm.Cache

// kvmVerdict proves runsc's kvm platform by running a trivial sandbox on it
// (`runsc do /bin/true` over a read-only view of the host, no network, no
// cgroups), bounded by the probe timeout, once per daemon start and runsc.
// A /dev/kvm that opens is not enough: on a paravirtual nested KVM the
// sentry cannot start ("cannot read client sync file") or hangs.
func (rt *Runtime) kvmVerdict() kvm.Verdict {
	if err := kvm.Open(rt.device); err != nil {
		return kvm.Unusable("no usable " + rt.device + ": " + err.Error())
	}
	return kvmProbes.Do(rt.binary+"|"+rt.version+"|"+rt.device, rt.probeTimeout, rt.probeKVM)
}

func (rt *Runtime) probeKVM(ctx context.Context) kvm.Verdict {
	start := time.Now()
	fail := func(reason, evidence string) kvm.Verdict {
		return kvm.Verdict{Reason: reason, Evidence: evidence, Took: time.Since(start)}
	}
	dir, err := os.MkdirTemp("", "cbx-runsc-kvm-probe")
	if err != nil {
		return fail("kvm platform not probed: "+err.Error(), "")
	}
	defer os.RemoveAll(dir)
	logDir := filepath.Join(dir, "log") + "/"
	args := []string{"--root", filepath.Join(dir, "state"), "--platform=kvm", "--network=none", "--ignore-cgroups",
		"--debug", "--debug-log=" + logDir}
	if rt.device != kvm.DefaultDevice {
		args = append(args, "--platform_device_path="+rt.device)
	}
	args = append(args, "do", "--quiet", "--cwd=/", "/bin/true")
	cmd := exec.Command(rt.binary, args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fail("kvm platform not probed: "+err.Error(), "")
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var werr error
	select {
	case werr = <-waited:
	case <-ctx.Done():
		killProbe(cmd.Process.Pid, dir)
		<-waited
		return fail(fmt.Sprintf("kvm platform probe failed: a trivial sandbox did not finish within %v", rt.probeTimeout), probeEvidence(out.String(), logDir))
	}
	killProbe(cmd.Process.Pid, dir)
	if werr != nil {
		return fail("kvm platform probe failed: a trivial sandbox did not run ("+werr.Error()+")", probeEvidence(out.String(), logDir))
	}
	return kvm.Verdict{Usable: true, Reason: fmt.Sprintf("a trivial sandbox ran on the kvm platform in %v (probe)", time.Since(start).Round(time.Millisecond)), Took: time.Since(start)}
}

// killProbe ends the probe's process group and any runsc process of the
// probe that left it (runsc starts its sandbox and gofer in sessions of
// their own; they die with their parent, but the probe makes sure).
func killProbe(pid int, dir string) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(dir)) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

// probeEvidence is runsc's own output plus the last line of the sentry's
// debug log (where it stopped).
func probeEvidence(out, logDir string) string {
	ev := strings.TrimSpace(out)
	if ms, _ := filepath.Glob(filepath.Join(logDir, "*.boot.txt")); len(ms) > 0 {
		if b, err := os.ReadFile(ms[0]); err == nil {
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) > 2 {
				lines = lines[len(lines)-2:]
			}
			for i, l := range lines {
				if _, msg, ok := strings.Cut(l, "] "); ok {
					lines[i] = msg
				}
			}
			ev = strings.TrimSpace(ev + "\nsentry log ends: " + strings.Join(lines, " / "))
		}
	}
	return ev
}
