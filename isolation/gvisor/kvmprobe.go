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
	"github.com/cagebox/cagebox/internal/syncbuf"
)

// kvmProbes caches the kvm platform's verdict per host boot and runsc.
var kvmProbes = kvm.Cache{Dir: kvm.DefaultStateDir}

// kvmVerdict proves runsc's kvm platform by running a trivial sandbox on it
// (`runsc do /bin/true` over a read-only view of the host, no network, no
// cgroups), bounded by the probe timeout, once per daemon start and runsc.
// A /dev/kvm that opens is not enough: on a paravirtual nested KVM the
// sentry cannot start ("cannot read client sync file") or hangs.
func (rt *Runtime) kvmVerdict() kvm.Verdict {
	if err := kvm.Open(rt.device); err != nil {
		return kvm.Unusable("no usable " + rt.device + ": " + err.Error())
	}
	return kvmProbes.Do("runsc|"+kvm.BinaryID(rt.binary)+"|"+rt.version+"|"+rt.device, rt.probeTimeout, rt.probeKVM)
}

func (rt *Runtime) probeKVM(ctx context.Context) kvm.Verdict {
	start := time.Now()
	fail := func(reason, evidence string) kvm.Verdict {
		return kvm.Verdict{Reason: reason, Evidence: evidence, Took: time.Since(start)}
	}
	sweepOrphans()
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", probeDirPrefix, os.Getpid()))
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
	// Its own process group, and killed if the daemon dies first
	// (kvm.StartProbe; its sandbox and gofer, which lose the parent-death
	// signal when they change credentials, are swept by the next probe:
	// sweepOrphans).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	p, err := kvm.StartProbe(cmd, kvmProbes.Dir)
	if err != nil {
		return fail("kvm platform not probed: "+err.Error(), "")
	}
	defer p.Kill()
	select {
	case <-p.Done():
	case <-ctx.Done():
		killProbe(p.Proc.PID, dir)
		p.Kill()
		v := fail(fmt.Sprintf("kvm platform probe failed: a trivial sandbox did not finish within %v", rt.probeTimeout), probeEvidence(out.String(), logDir))
		v.Probed = true
		return v
	}
	killProbe(p.Proc.PID, dir)
	if werr := p.Err(); werr != nil {
		v := fail("kvm platform probe failed: a trivial sandbox did not run ("+werr.Error()+")", probeEvidence(out.String(), logDir))
		v.Probed = true
		return v
	}
	return kvm.Verdict{Usable: true, Reason: fmt.Sprintf("a trivial sandbox ran on the kvm platform in %v (probe)", time.Since(start).Round(time.Millisecond)), Took: time.Since(start), Probed: true}
}

// probeDirPrefix starts the probe's temporary directory, followed by the
// probing process's pid: every process of a probe carries it in its
// command line (runsc's --debug-log).
const probeDirPrefix = "cbx-runsc-kvm-probe-"

// sweepOrphans kills what probes of processes that are gone left behind (a
// daemon killed in the middle of a probe: runsc's sandbox process spins on
// a KVM that cannot run it) and removes their directories.
func sweepOrphans() {
	marker := []byte(filepath.Join(os.TempDir(), probeDirPrefix))
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		i := bytes.Index(b, marker)
		if i < 0 {
			continue
		}
		rest := b[i+len(marker):]
		j := bytes.IndexByte(rest, '-')
		owner, err := strconv.Atoi(string(rest[:max(j, 0)]))
		if err != nil || owner == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(owner)); err == nil {
			continue // its prober still runs and will clean up
		}
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	dirs, _ := filepath.Glob(string(marker) + "*")
	for _, d := range dirs {
		rest := strings.TrimPrefix(d, string(marker))
		owner, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || owner == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(owner)); err != nil {
			_ = os.RemoveAll(d)
		}
	}
}

// killProbe ends the probe's process group and every runsc process of the
// probe that left it: runsc starts its sandbox and gofer in sessions of
// their own, and their parent-death signal is lost when they change
// credentials, so they are found by the probe's directory in their command
// line (which each of them carries) and killed until none is left; a
// process caught between fork and exec is found by the next pass.
func killProbe(pid int, dir string) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	deadline := time.Now().Add(5 * time.Second)
	clean := 0
	for clean < 3 && time.Now().Before(deadline) {
		if n := killByArg(dir); n == 0 {
			clean++
		} else {
			clean = 0
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killByArg SIGKILLs every process whose command line contains s and says
// how many it found.
func killByArg(s string) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(s)) {
			if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && bytes.Contains(st, []byte(") Z ")) {
				continue // a zombie, waiting for its parent
			}
			_ = syscall.Kill(p, syscall.SIGKILL)
			n++
		}
	}
	return n
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
