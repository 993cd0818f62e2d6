//go:build linux

package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/cagebox/cagebox/agentproto"
	"golang.org/x/sys/unix"
)

// probeFields are the lines the probe prints, in /proc/[pid]/status order.
var probeFields = []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"}

// statusLines picks the probe's fields out of a /proc/[pid]/status text.
func statusLines(status string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		for _, f := range probeFields {
			if k == f {
				m[k] = strings.TrimSpace(v)
			}
		}
	}
	return m
}

var probeLine = regexp.MustCompile(`^(CapInh|CapPrm|CapEff|CapBnd|CapAmb):\t[0-9a-f]{16}$|^(NoNewPrivs|Seccomp):\t[0-9]+$`)

// checkProbeFormat checks out is exactly the seven lines, in order, each in
// /proc/[pid]/status's format.
func checkProbeFormat(t *testing.T, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if !strings.HasSuffix(out, "\n") || len(lines) != len(probeFields) {
		t.Fatalf("probe printed %d lines, want %d newline-terminated:\n%s", len(lines), len(probeFields), out)
	}
	for i, line := range lines {
		if !strings.HasPrefix(line, probeFields[i]+":\t") || !probeLine.MatchString(line) {
			t.Errorf("line %d = %q, want %s in /proc/[pid]/status format", i+1, line, probeFields[i])
		}
	}
}

func TestProbeFormat(t *testing.T) {
	c := confinement{Inh: 0x1, Prm: 0xc0, Eff: 0x40, Bnd: 0x1ffffffffff, Amb: 0x400, NoNewPrivs: 1, Seccomp: 2}
	var b bytes.Buffer
	if err := c.format(&b); err != nil {
		t.Fatal(err)
	}
	want := "CapInh:\t0000000000000001\nCapPrm:\t00000000000000c0\nCapEff:\t0000000000000040\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000400\nNoNewPrivs:\t1\nSeccomp:\t2\n"
	if b.String() != want {
		t.Fatalf("format:\n%q\nwant\n%q", b.String(), want)
	}
	checkProbeFormat(t, b.String())
}

// TestProbeMatchesStatus reads the test's own thread with the probe's
// system calls and compares every field the host kernel's status shows.
func TestProbeMatchesStatus(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c, err := readConfinement()
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := c.format(&b); err != nil {
		t.Fatal(err)
	}
	checkProbeFormat(t, b.String())
	want, got := statusLines(string(status)), statusLines(b.String())
	if len(want) < 5 {
		t.Fatalf("host status shows only %v", want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("probe %s = %s, /proc status says %s", k, got[k], v)
		}
	}
}

// TestProbeBinary runs the built agent in probe mode: as a child given an
// ambient capability (which the probe must see), and as a process started
// by a running agent (everything dropped, no_new_privs set).
func TestProbeBinary(t *testing.T) {
	bin := agentBinary(t)
	out, err := exec.Command(bin, probeArg).Output()
	if err != nil {
		t.Fatalf("%s %s: %v", bin, probeArg, err)
	}
	checkProbeFormat(t, string(out))
	if os.Geteuid() != 0 {
		t.Skip("needs root for the rest: capabilities to give and to drop")
	}

	cmd := exec.Command(bin, probeArg)
	cmd.SysProcAttr = &syscall.SysProcAttr{AmbientCaps: []uintptr{unix.CAP_NET_BIND_SERVICE}}
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("probe with an ambient capability: %v", err)
	}
	if got := statusLines(string(out))["CapAmb"]; got != "0000000000000400" {
		t.Errorf("probe with CAP_NET_BIND_SERVICE ambient: CapAmb = %s, want 0000000000000400\n%s", got, out)
	}

	a := startAgent(t)
	cl := a.client(t)
	zero := "0000000000000000"
	res, sout := run1(t, cl, &agentproto.ExecRequest{Argv: []string{bin, probeArg}})
	if res.ExitCode != 0 {
		t.Fatalf("probe under the agent: %+v %s", res, sout)
	}
	checkProbeFormat(t, sout)
	got := statusLines(sout)
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if got[k] != zero {
			t.Errorf("probe under the agent: %s = %s, want none", k, got[k])
		}
	}
	if got["NoNewPrivs"] != "1" {
		t.Errorf("probe under the agent: NoNewPrivs = %s, want 1", got["NoNewPrivs"])
	}
}
