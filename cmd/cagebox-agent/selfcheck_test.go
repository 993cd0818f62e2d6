//go:build linux

package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/cagebox/cagebox/agentproto"
	"golang.org/x/sys/unix"
)

func TestParseConfinement(t *testing.T) {
	good := "CapInh:\t0000000000000000\nCapPrm:\t00000000000001c0\nCapEff:\t00000000000001c0\nCapBnd:\t00000000000001c0\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n"
	c, err := parseConfinement(good)
	if err != nil {
		t.Fatal(err)
	}
	if want := (confinement{Prm: 0x1c0, Eff: 0x1c0, Bnd: 0x1c0, NoNewPrivs: 1, Seccomp: 2}); *c != want {
		t.Fatalf("parsed %+v, want %+v", *c, want)
	}
	for name, bad := range map[string]string{
		"missing field": strings.Replace(good, "CapAmb:\t0000000000000000\n", "", 1),
		"duplicate":     good + "CapPrm:\t0000000000000000\n",
		"bad hex":       strings.Replace(good, "00000000000001c0", "0x1c0", 1),
		"unknown key":   good + "CapXyz:\t0\n",
		"empty":         "",
		"other format":  strings.ReplaceAll(good, ":\t", ": "),
	} {
		if c, err := parseConfinement(bad); err == nil {
			t.Errorf("%s: parsed %+v, want an error", name, c)
		}
	}
}

func TestUnconfined(t *testing.T) {
	if err := (&confinement{NoNewPrivs: 1, Seccomp: 2}).unconfined(); err != nil {
		t.Errorf("a confined process: %v", err)
	}
	err := (&confinement{Prm: 0x1c0, Eff: 0x1c0, Bnd: 0x1c0, NoNewPrivs: 1}).unconfined()
	if err == nil {
		t.Fatal("capabilities held, no error")
	}
	for _, want := range []string{"CapPrm=CapEff=CapBnd=00000000000001c0 (CAP_SETGID, CAP_SETUID, CAP_SETPCAP)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "CapInh") || strings.Contains(err.Error(), "NoNewPrivs") {
		t.Errorf("%q names sets that are clear", err)
	}
	err = (&confinement{Bnd: 1<<41 - 1}).unconfined()
	if err == nil || !strings.Contains(err.Error(), "CapBnd=000001ffffffffff (CAP_CHOWN, ") || !strings.Contains(err.Error(), ", CAP_CHECKPOINT_RESTORE); NoNewPrivs=0") {
		t.Errorf("full bounding set, no no_new_privs: %v", err)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: capabilities to keep and to drop")
	}
}

// TestCheckChildren runs the check in the test process: a probe started
// from a thread that keeps the test's capabilities is refused, one started
// from the agent's confined launcher passes.
func TestCheckChildren(t *testing.T) {
	needRoot(t)
	argv := []string{agentBinary(t), probeArg}
	err := checkChildren(context.Background(), &agentproto.Server{}, argv)
	if err == nil {
		t.Fatal("a probe started with the test's capabilities passed the check")
	}
	for _, want := range []string{"CapPrm=", "CapBnd=", "CAP_CHOWN", "NoNewPrivs=0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	l, err := newLauncher(true, 0)
	if err != nil {
		t.Fatalf("confine the launcher's thread: %v", err)
	}
	if err := checkChildren(context.Background(), &agentproto.Server{StartProcess: l.startProcess}, argv); err != nil {
		t.Fatalf("a probe started by the confined launcher: %v", err)
	}
	// A probe that does not run is a failure, not a pass.
	err = checkChildren(context.Background(), &agentproto.Server{StartProcess: l.startProcess}, []string{"/no/such/probe", probeArg})
	if err == nil || !strings.Contains(err.Error(), "/no/such/probe") {
		t.Fatalf("missing probe: %v", err)
	}
}

// checkRefused checks that every operation but health fails with the
// agent's refusal naming the capabilities, and that nothing ran.
func checkRefused(t *testing.T, a *agent, wantCaps ...string) {
	t.Helper()
	c := a.client(t)
	refusal := c.Refused()
	if refusal == nil || !errors.Is(refusal, agentproto.ErrRefused) {
		t.Fatalf("handshake announced no refusal: %v", refusal)
	}
	for _, want := range append([]string{"CapPrm=", "CapBnd="}, wantCaps...) {
		if !strings.Contains(refusal.Error(), want) {
			t.Errorf("refusal %q lacks %q", refusal, want)
		}
	}
	t.Logf("refusal: %v", refusal)
	if _, err := c.Health(ctxT(t)); err != nil {
		t.Errorf("health of a refusing agent: %v", err)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	ops := map[string]func() error{
		"exec": func() error {
			_, err := c.Exec(ctxT(t), &agentproto.ExecRequest{Argv: []string{"touch", marker}}, nil, io.Discard, io.Discard)
			return err
		},
		"write_file": func() error {
			return c.WriteFile(ctxT(t), marker, 0o644, strings.NewReader("x"))
		},
		"read_file": func() error { return c.ReadFile(ctxT(t), "/etc/hostname", io.Discard, 0) },
		"list_dir": func() error {
			_, err := c.ListDir(ctxT(t), "/")
			return err
		},
	}
	for name, op := range ops {
		err := op()
		if !errors.Is(err, agentproto.ErrRefused) || !strings.Contains(err.Error(), "CapPrm=") {
			t.Errorf("%s on a refusing agent: %v, want the refusal naming the capabilities", name, err)
		}
	}
	if _, err := os.Stat(marker); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refusing agent ran something: %v", err)
	}
	if !strings.Contains(a.stderr.String(), "refusing to run processes") {
		t.Errorf("agent did not log its refusal:\n%s", a.stderr.String())
	}
}

// TestAgentRefusesCapableChildren: an agent whose children would keep
// capabilities runs nothing. A test build skips the drop; a release build
// started without CAP_SETPCAP cannot drop its bounding set, so root
// children would get it back at exec.
func TestAgentRefusesCapableChildren(t *testing.T) {
	needRoot(t)
	t.Run("drop skipped", func(t *testing.T) {
		bin := agentBinaryBuilt(t, "cagebox-agent-keepcaps", "CGO_ENABLED=0", "-tags", "cagebox_fault_keepcaps")
		checkRefused(t, startAgentWith(t, bin, nil), "CAP_SYS_ADMIN", "NoNewPrivs=0")
	})
	t.Run("no CAP_SETPCAP", func(t *testing.T) {
		start := func(cmd *exec.Cmd) error {
			errc := make(chan error, 1)
			go func() {
				// Never unlocked: the thread's bounding set is changed, and
				// the thread ends with the goroutine.
				runtime.LockOSThread()
				if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SETPCAP, 0, 0, 0); err != nil {
					errc <- err
					return
				}
				errc <- cmd.Start()
			}()
			return <-errc
		}
		a := startAgentWith(t, agentBinary(t), start)
		checkRefused(t, a, "CAP_SYS_ADMIN")
	})
}

// TestCgoAgent: built with cgo (go build's default where a C compiler is
// found, and then dynamically linked) the agent cannot drop capabilities on
// all its threads; the processes it starts must hold none all the same.
func TestCgoAgent(t *testing.T) {
	needRoot(t)
	if out, err := exec.Command("go", "env", "CC").Output(); err != nil {
		t.Skipf("go env CC: %v", err)
	} else if _, err := exec.LookPath(strings.TrimSpace(string(out))); err != nil {
		t.Skipf("no C compiler: %v", err)
	}
	bin := agentBinaryBuilt(t, "cagebox-agent-cgo", "CGO_ENABLED=1")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	dynamic := false
	for _, p := range f.Progs {
		dynamic = dynamic || p.Type == elf.PT_INTERP
	}
	f.Close()
	if !dynamic {
		t.Fatal("the cgo build is static: this test would prove nothing")
	}
	a := startAgentWith(t, bin, nil)
	c := a.client(t)
	if err := c.Refused(); err != nil {
		t.Fatalf("cgo agent refuses: %v\n%s", err, a.stderr.String())
	}
	zero := "0000000000000000"
	for _, user := range []string{"", "0", "65534"} {
		res, out := run1(t, c, &agentproto.ExecRequest{Argv: []string{"cat", "/proc/self/status"}, User: user})
		if res.ExitCode != 0 {
			t.Fatalf("user %q: %+v %s", user, res, out)
		}
		got := capLines(out)
		for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			if got[k] != zero {
				t.Errorf("user %q: child %s = %s, want none", user, k, got[k])
			}
		}
		if got["NoNewPrivs"] != "1" {
			t.Errorf("user %q: child NoNewPrivs = %s", user, got["NoNewPrivs"])
		}
	}
	// Processes started at once all come from the confined thread.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			res, err := c.Exec(ctxT(t), &agentproto.ExecRequest{Argv: []string{"grep", "CapEff", "/proc/self/status"}}, nil, &out, &out)
			if err != nil || res.ExitCode != 0 || out.String() != "CapEff:\t"+zero+"\n" {
				t.Errorf("concurrent exec: %+v %v %q", res, err, out.String())
			}
		}()
	}
	wg.Wait()
}
