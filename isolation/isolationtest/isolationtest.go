// Package isolationtest is the conformance suite every runtime must pass:
// the same assertions, through the same agent protocol, for containers,
// gVisor and microVMs: exec, files, limits, confinement, the guest's
// files, a routed network link, pause, stop, recovery after a daemon
// restart, hibernation (isolation.Hibernator, where implemented), and
// nothing left behind.
//
// A runtime that cannot run on a host skips the suite saying why, unless
// CAGEBOX_REQUIRE_RUNTIMES (a comma list of runtime names) lists it: then
// the suite fails with the reason, so that CI on a host that must have the
// runtime notices it is missing.
package isolationtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/isolation"
)

// Options tell the suite what to run sandboxes from.
type Options struct {
	// RootFS is an image root with a POSIX shell and coreutils (busybox will do).
	RootFS string
	// AgentPath is a static cagebox-agent binary.
	AgentPath string
	// StartTimeout bounds create+start+first agent answer (VMs under TCG
	// need seconds).
	StartTimeout time.Duration
	// Restarted returns a new runtime over the same host state, as a
	// restarted daemon makes, to recover sandboxes with (nil: the same
	// runtime).
	Restarted func() isolation.Runtime
	// Pooled makes every sandbox as a warm pool does: started with no
	// environment, nameserver or CA and its agent awaiting its claim
	// (isolation.Spec.AwaitClaim), then claimed with the spec's token,
	// environment and guest files — so the suite proves a claimed sandbox
	// is the sandbox its spec describes.
	Pooled bool
}

// RequireEnv names the environment variable listing the runtimes that must
// be available (comma-separated, e.g. "container,gvisor,qemu").
const RequireEnv = "CAGEBOX_REQUIRE_RUNTIMES"

// Required reports whether RequireEnv lists the runtime name.
func Required(name string) bool {
	for _, r := range strings.Split(os.Getenv(RequireEnv), ",") {
		if strings.TrimSpace(r) == name {
			return true
		}
	}
	return false
}

// Unavailable ends a test of runtime name, which cannot run here (why): it
// fails when RequireEnv lists the runtime, and skips otherwise.
func Unavailable(t testing.TB, name string, why any) {
	t.Helper()
	if Required(name) {
		t.Fatalf("runtime %s is required here (%s) but not available: %v", name, RequireEnv, why)
	}
	t.Skipf("runtime %s not available here: %v", name, why)
}

// CheckAvailable ends the test (Unavailable) unless rt can run here.
func CheckAvailable(t testing.TB, rt isolation.Runtime) {
	t.Helper()
	if err := rt.Available(); err != nil {
		Unavailable(t, rt.Name(), err)
	}
}

// Guest is a started sandbox with a connected agent client.
type Guest struct {
	Sandbox isolation.Sandbox
	Client  *agentproto.Client
	Token   string
}

// Exec runs argv and returns stdout, stderr and the result.
func (g *Guest) Exec(t testing.TB, argv ...string) (string, string, *agentproto.ExecResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	res, err := g.Client.Exec(ctx, &agentproto.ExecRequest{Argv: argv}, nil, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return out.String(), errb.String(), res
}

// Start creates and starts a sandbox and connects to its agent; cleanup
// destroys it and checks that nothing is left.
func Start(t testing.TB, rt isolation.Runtime, o Options, res isolation.Resources, env ...string) *Guest {
	t.Helper()
	return StartSpec(t, rt, o, func(s *isolation.Spec) {
		s.Resources, s.Env = res, env
	})
}

// StartSpec is Start with the spec's fields changed by mod.
func StartSpec(t testing.TB, rt isolation.Runtime, o Options, mod func(*isolation.Spec)) *Guest {
	t.Helper()
	timeout := o.StartTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	idb := make([]byte, 6)
	_, _ = rand.Read(idb)
	id := "t" + hex.EncodeToString(idb)
	spec := &isolation.Spec{
		ID:         id,
		StateDir:   filepath.Join(stateRoot(t), id),
		RootFS:     o.RootFS,
		AgentPath:  o.AgentPath,
		AgentToken: hex.EncodeToString(tok),
		Hostname:   "conformance",
	}
	if mod != nil {
		mod(spec)
	}
	made := spec
	if o.Pooled {
		fill := *spec
		ftok := make([]byte, 16)
		_, _ = rand.Read(ftok)
		fill.AgentToken, fill.Env, fill.Nameserver, fill.TrustedCAPEM, fill.AwaitClaim = hex.EncodeToString(ftok), nil, "", nil, true
		made = &fill
	}
	sb, err := rt.Create(ctx, made)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	g := &Guest{Sandbox: sb, Token: spec.AgentToken}
	t.Cleanup(func() {
		if g.Client != nil {
			g.Client.Close()
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		if err := sb.Destroy(dctx); err != nil {
			t.Errorf("destroy: %v", err)
		}
		if lc, ok := sb.(isolation.LeakChecker); ok {
			if left := lc.Leftovers(dctx); len(left) > 0 {
				t.Errorf("destroy left things behind: %q", left)
			}
		}
	})
	if err := sb.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	// A sandbox restored from a template, or made for a pool, is claimed
	// first, as the daemon's manager does.
	if o.Pooled {
		claimPooled(t, ctx, sb, made, spec)
	} else {
		claim(t, ctx, sb, spec)
	}
	g.Client = Connect(t, ctx, sb, spec.AgentToken)
	return g
}

// Connect dials the agent and waits until it answers Health.
func Connect(t testing.TB, ctx context.Context, sb isolation.Sandbox, token string) *agentproto.Client {
	t.Helper()
	var lastErr error
	for ctx.Err() == nil {
		conn, err := sb.DialAgent(ctx)
		if err == nil {
			var c *agentproto.Client
			c, err = agentproto.NewClient(ctx, conn, token)
			if err == nil {
				if _, err = c.Health(ctx); err == nil {
					return c
				}
				c.Close()
			} else {
				conn.Close()
			}
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("agent never answered: %v", lastErr)
	return nil
}

// stateRoot is a short directory for sandbox state: unix socket paths have
// a 108-byte limit that t.TempDir() paths can exceed. Destroy removes each
// sandbox's own directory below it.
func stateRoot(t testing.TB) string {
	d := filepath.Join(os.TempDir(), "cbx-state")
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// Run runs the whole suite against rt.
func Run(t *testing.T, rt isolation.Runtime, o Options) {
	CheckAvailable(t, rt)
	t.Run("FailedStartLeavesNothing", func(t *testing.T) { failedStart(t, rt, o) })
	limits := isolation.Resources{MemoryBytes: 256 << 20, PIDs: 64, CPUs: 1}
	caPEM := testCA(t)
	g := StartSpec(t, rt, o, func(s *isolation.Spec) {
		s.Resources, s.Env = limits, []string{"CBX_BASE=base-value"}
		s.Nameserver, s.TrustedCAPEM = guestFilesNameserver, caPEM
	})

	t.Run("GuestFiles", func(t *testing.T) { guestFiles(t, g, o, caPEM) })
	t.Run("Network", func(t *testing.T) { network(t, rt, o) })
	t.Run("Recover", func(t *testing.T) { recoverSandbox(t, rt, o) })
	t.Run("Hibernate", func(t *testing.T) { hibernate(t, rt, o) })
	t.Run("Snapshot", func(t *testing.T) { snapshot(t, rt, o) })

	t.Run("ExecEcho", func(t *testing.T) {
		out, _, res := g.Exec(t, "echo", "hello", "world")
		if out != "hello world\n" || res.ExitCode != 0 {
			t.Fatalf("got %q exit %d", out, res.ExitCode)
		}
	})
	t.Run("ExitCodes", func(t *testing.T) {
		for _, tc := range []struct {
			argv []string
			code int
		}{
			{[]string{"true"}, 0},
			{[]string{"false"}, 1},
			{[]string{"sh", "-c", "exit 42"}, 42},
			{[]string{"sh", "-c", "kill -9 $$"}, 137},
			{[]string{"/no/such/command"}, 127},
		} {
			_, _, res := g.Exec(t, tc.argv...)
			if res.ExitCode != tc.code {
				t.Errorf("%q: exit %d, want %d (%+v)", tc.argv, res.ExitCode, tc.code, res)
			}
		}
	})
	t.Run("Stdin", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var out bytes.Buffer
		payload := strings.Repeat("stdin-line\n", 10000)
		res, err := g.Client.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"wc", "-l"}, Stdin: true}, strings.NewReader(payload), &out, io.Discard)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %v %+v", err, res)
		}
		if strings.TrimSpace(out.String()) != "10000" {
			t.Fatalf("wc -l = %q, want 10000", out.String())
		}
	})
	t.Run("Streaming", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			_, err := g.Client.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"sh", "-c", "echo first; sleep 3; echo second"}}, nil, pw, io.Discard)
			pw.CloseWithError(err)
			done <- err
		}()
		start := time.Now()
		buf := make([]byte, 6)
		if _, err := io.ReadFull(pr, buf); err != nil || string(buf) != "first\n" {
			t.Fatalf("read first line: %q %v", buf, err)
		}
		if d := time.Since(start); d > 2500*time.Millisecond {
			t.Fatalf("first line took %v: output is buffered, not streamed", d)
		}
		rest, _ := io.ReadAll(pr)
		if string(rest) != "second\n" {
			t.Fatalf("rest = %q", rest)
		}
		<-done
	})
	t.Run("Env", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var out bytes.Buffer
		_, err := g.Client.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"sh", "-c", "echo $CBX_BASE $CBX_EXEC; pwd"}, Env: []string{"CBX_EXEC=exec-value"}, Cwd: "/tmp"}, nil, &out, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if out.String() != "base-value exec-value\n/tmp\n" {
			t.Fatalf("got %q", out.String())
		}
	})
	t.Run("Files", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		data := bytes.Repeat([]byte("0123456789"), 300000) // 3 MB: several frames
		if err := g.Client.WriteFile(ctx, "/work/sub/data.bin", 0o640, bytes.NewReader(data)); err != nil {
			t.Fatalf("write: %v", err)
		}
		var back bytes.Buffer
		if err := g.Client.ReadFile(ctx, "/work/sub/data.bin", &back, 10<<20); err != nil {
			t.Fatalf("read: %v", err)
		}
		if !bytes.Equal(back.Bytes(), data) {
			t.Fatalf("read back %d bytes, want %d identical", back.Len(), len(data))
		}
		if err := g.Client.ReadFile(ctx, "/work/sub/data.bin", io.Discard, 1000); err == nil {
			t.Fatal("read over max succeeded")
		}
		list, err := g.Client.ListDir(ctx, "/work/sub")
		if err != nil || len(list) != 1 || list[0].Name != "data.bin" || list[0].Size != int64(len(data)) {
			t.Fatalf("list: %+v %v", list, err)
		}
		out, _, _ := g.Exec(t, "sh", "-c", "stat -c %a /work/sub/data.bin; md5sum < /work/sub/data.bin")
		if !strings.HasPrefix(out, "640\n") {
			t.Fatalf("mode/contents in guest: %q", out)
		}
		if err := g.Client.ReadFile(ctx, "/no/such/file", io.Discard, 100); err == nil {
			t.Fatal("reading a missing file succeeded")
		}
	})
	t.Run("ConcurrentExecs", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				var out bytes.Buffer
				res, err := g.Client.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("sleep 0.5; echo %d", i)}}, nil, &out, io.Discard)
				if err != nil || res.ExitCode != 0 || out.String() != fmt.Sprintf("%d\n", i) {
					errs <- fmt.Errorf("exec %d: %q %+v %v", i, out.String(), res, err)
				}
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		res, err := g.Client.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 30 & sleep 30"}, Timeout: 500 * time.Millisecond}, nil, io.Discard, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if !res.TimedOut || time.Since(start) > 10*time.Second {
			t.Fatalf("timeout not enforced: %+v after %v", res, time.Since(start))
		}
		out, _, _ := g.Exec(t, "sh", "-c", "cat /proc/[0-9]*/comm 2>/dev/null | grep -c sleep || true")
		if n, _ := strconv.Atoi(strings.TrimSpace(out)); n > 0 {
			t.Fatalf("%d sleep processes survived the timeout (the whole group must die)", n)
		}
	})
	t.Run("Confinement", func(t *testing.T) {
		// What the guest's kernel enforces, read with system calls by a
		// guest process (the agent binary in probe mode): the same for
		// every kernel, whatever its /proc shows.
		probe := probeConfinement(t, g, o.AgentPath)
		for _, f := range confinementFields {
			if probe[f.name] != f.want {
				t.Errorf("guest process %s = %q, want %s (probe output %q)", f.name, probe[f.name], f.want, probe)
			}
		}
		if rt.Class() == isolation.Namespaces && probe["Seccomp"] != "2" {
			t.Errorf("no seccomp filter on guest process: Seccomp = %q, want 2", probe["Seccomp"])
		}
		// What the guest's /proc says must agree, for every field it shows
		// (gVisor's omits CapAmb and NoNewPrivs).
		out, _, _ := g.Exec(t, "sh", "-c", "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status")
		status := statusFields(out)
		for _, f := range confinementFields {
			if v, ok := status[f.name]; ok && v != f.want {
				t.Errorf("guest process status says %s = %q, want %s:\n%s", f.name, v, f.want, out)
			}
		}
		if v, ok := status["Seccomp"]; ok && v != "2" && rt.Class() == isolation.Namespaces {
			t.Errorf("no seccomp filter on guest process:\n%s", out)
		}
		for _, attack := range []struct {
			name string
			argv []string
		}{
			{"mount", []string{"mount", "-t", "tmpfs", "none", "/mnt"}},
			{"unshare-user", []string{"unshare", "-U", "true"}},
			{"unshare-net", []string{"unshare", "-n", "true"}},
			{"chroot", []string{"chroot", "/", "true"}},
			{"write-sysrq", []string{"sh", "-c", "echo h > /proc/sysrq-trigger"}},
			{"mknod", []string{"mknod", "/tmp/sda", "b", "8", "0"}},
		} {
			out, errOut, res := g.Exec(t, attack.argv...)
			if res.ExitCode == 0 {
				t.Errorf("%s succeeded inside the sandbox: %q %q", attack.name, out, errOut)
			}
		}
		out, _, _ = g.Exec(t, "cat", "/proc/net/dev")
		lines := strings.Split(out, "\n")
		if len(lines) < 3 {
			t.Fatalf("/proc/net/dev: %q", out)
		}
		for _, line := range lines[2:] {
			name, _, _ := strings.Cut(strings.TrimSpace(line), ":")
			if name != "" && name != "lo" {
				t.Errorf("guest sees network interface %q with no link configured", name)
			}
		}
		out, _, _ = g.Exec(t, "sh", "-c", "ls /proc | grep -c '^[0-9]'")
		if n, _ := strconv.Atoi(strings.TrimSpace(out)); n > 10 {
			t.Errorf("guest sees %d processes: host pid namespace leaks", n)
		}
		out, _, _ = g.Exec(t, "hostname")
		if strings.TrimSpace(out) != "conformance" {
			t.Errorf("hostname %q", out)
		}
	})
	t.Run("AgentTokenHidden", func(t *testing.T) {
		// Every place a guest process could look for the agent's token.
		out, errOut, _ := g.Exec(t, "sh", "-c", "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline /.cagebox/run/* 2>&1; ls -la /.cagebox/run 2>&1; env")
		if strings.Contains(out+errOut, g.Token) {
			t.Fatal("the agent token is readable inside the guest")
		}
	})
	t.Run("PIDsLimit", func(t *testing.T) {
		// Each iteration prints how many processes exist (globbing is a
		// builtin: counting needs no fork). Shells differ on whether a
		// failed fork ends the script; the count never passes the limit.
		out, _, _ := g.Exec(t, "sh", "-c", "for i in $(seq 1 200); do sleep 3 & set -- /proc/[0-9]*; echo $#; done 2>/dev/null")
		maxN := 0
		for _, f := range strings.Fields(out) {
			if n, err := strconv.Atoi(f); err == nil && n > maxN {
				maxN = n
			}
		}
		if maxN < 20 || maxN > 64 {
			t.Fatalf("guest ran up to %d processes with a pids limit of 64 (out %q)", maxN, out)
		}
		// Once the sleeps are gone, the sandbox works again. (kill -9 -1
		// signals everything but the caller and PID 1.)
		deadline := time.Now().Add(15 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var buf bytes.Buffer
			res, err := g.Client.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"sh", "-c", "kill -9 -1; echo ok"}}, nil, &buf, io.Discard)
			cancel()
			if err == nil && res.ExitCode == 0 && buf.String() == "ok\n" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox did not recover from its pids limit: %+v %v", res, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	t.Run("MemoryOOM", func(t *testing.T) {
		if sc, ok := g.Sandbox.(isolation.OOMScope); ok && sc.OOMKillsSandbox() {
			memoryOOMKillsSandbox(t, rt, o, limits, g)
			return
		}
		var before uint64
		oc, hasOOM := g.Sandbox.(isolation.OOMCounter)
		if hasOOM {
			before, _ = oc.OOMKills()
		}
		_, _, res := g.Exec(t, "sh", "-c", allocOverLimit)
		if res.ExitCode == 0 {
			t.Fatalf("allocating 384 MiB under a 256 MiB limit succeeded")
		}
		if hasOOM {
			after, err := oc.OOMKills()
			if err != nil || after <= before {
				t.Fatalf("OOM kill not reported: before %d after %d err %v (exit %+v)", before, after, err, res)
			}
		}
		if out, _, _ := g.Exec(t, "echo", "alive"); out != "alive\n" {
			t.Fatalf("agent did not survive the guest OOM: %q", out)
		}
	})
	t.Run("PauseResume", func(t *testing.T) {
		g.Exec(t, "sh", "-c", "rm -f /tmp/ticks; (while true; do echo t >> /tmp/ticks; sleep 0.05; done) >/dev/null 2>&1 &")
		count := func() int {
			out, _, _ := g.Exec(t, "sh", "-c", "wc -l < /tmp/ticks")
			n, _ := strconv.Atoi(strings.TrimSpace(out))
			return n
		}
		time.Sleep(300 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		before := count()
		if before == 0 {
			t.Fatal("ticker did not start")
		}
		if err := g.Sandbox.Pause(ctx); err != nil {
			t.Fatalf("pause: %v", err)
		}
		time.Sleep(time.Second)
		if err := g.Sandbox.Resume(ctx); err != nil {
			t.Fatalf("resume: %v", err)
		}
		during := count() - before
		// Running, the ticker adds ~20 lines a second.
		if during > 5 {
			t.Fatalf("guest kept running while paused: %d ticks during a 1 s pause", during)
		}
		time.Sleep(500 * time.Millisecond)
		if after := count() - before - during; after < 3 {
			t.Fatalf("guest did not resume: %d ticks in 0.5 s after resume", after)
		}
		g.Exec(t, "sh", "-c", "kill -9 -1; true")
	})
	t.Run("StopAndDestroy", func(t *testing.T) {
		g2 := Start(t, rt, o, isolation.Resources{})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := g2.Sandbox.Stop(ctx, 2*time.Second); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if err := g2.Sandbox.Destroy(ctx); err != nil {
			t.Fatalf("destroy: %v", err)
		}
		if err := g2.Sandbox.Destroy(ctx); err != nil {
			t.Fatalf("second destroy (must be idempotent): %v", err)
		}
		if lc, ok := g2.Sandbox.(isolation.LeakChecker); ok {
			if left := lc.Leftovers(ctx); len(left) > 0 {
				t.Fatalf("left behind: %q", left)
			}
		}
	})
}

// allocOverLimit holds 384 MiB, over the suite's 256 MiB limit, with few
// system calls (an application kernel on ptrace pays ~80 µs for each): a
// pipeline of three dd processes, each holding a 128 MiB buffer it has
// filled. No single allocation is near the limit, so a VM guest's overcommit
// check lets each one through and its OOM killer, not malloc, ends the
// command. pipefail makes the killed stage's status the pipeline's.
const allocOverLimit = "set -o pipefail; dd if=/dev/zero bs=128M count=3 | dd bs=128M iflag=fullblock | dd bs=128M iflag=fullblock of=/dev/null"

// memoryOOMKillsSandbox is MemoryOOM for a runtime without a guest OOM
// killer (isolation.OOMScope): on a sandbox of its own, the allocation must
// fail, the OOM must be counted, and the whole sandbox must be gone, with
// Stop and Destroy leaving nothing; other sandboxes (g) live on.
func memoryOOMKillsSandbox(t *testing.T, rt isolation.Runtime, o Options, limits isolation.Resources, g *Guest) {
	victim := Start(t, rt, o, limits)
	oc, ok := victim.Sandbox.(isolation.OOMCounter)
	if !ok {
		t.Fatalf("%s sandboxes die of OOM (isolation.OOMScope) but cannot count OOM kills (isolation.OOMCounter)", rt.Name())
	}
	before, err := oc.OOMKills()
	if err != nil {
		t.Fatalf("OOM counter: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := victim.Client.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"sh", "-c", allocOverLimit}}, nil, io.Discard, io.Discard)
	if ctx.Err() != nil {
		t.Fatalf("allocation still running after 60 s: %v", err)
	}
	if err == nil && res.ExitCode == 0 {
		t.Fatalf("allocating 384 MiB under a 256 MiB limit succeeded")
	}
	after, cerr := oc.OOMKills()
	if cerr != nil || after <= before {
		t.Fatalf("OOM kill not reported: before %d after %d err %v (exec %+v, %v)", before, after, cerr, res, err)
	}
	// The sandbox is gone: its agent stops answering.
	deadline := time.Now().Add(15 * time.Second)
	for agentAnswers(victim) {
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox's agent still answers after the OOM kill (exec %+v, %v): a runtime that reports OOMKillsSandbox must lose the whole sandbox", res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := victim.Sandbox.Stop(ctx, time.Second); err != nil {
		t.Errorf("stop after the OOM kill: %v", err)
	}
	if err := victim.Sandbox.Destroy(ctx); err != nil {
		t.Fatalf("destroy after the OOM kill: %v", err)
	}
	if lc, ok := victim.Sandbox.(isolation.LeakChecker); ok {
		if left := lc.Leftovers(ctx); len(left) > 0 {
			t.Fatalf("left behind after the OOM kill: %q", left)
		}
	}
	if out, _, _ := g.Exec(t, "echo", "alive"); out != "alive\n" {
		t.Fatalf("another sandbox did not survive the OOM kill: %q", out)
	}
}

// agentAnswers reports whether a new connection to g's agent answers Health.
func agentAnswers(g *Guest) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := g.Sandbox.DialAgent(ctx)
	if err != nil {
		return false
	}
	c, err := agentproto.NewClient(ctx, conn, g.Token)
	if err != nil {
		conn.Close()
		return false
	}
	defer c.Close()
	_, err = c.Health(ctx)
	return err == nil
}

// confinementFields are what every guest process must show, whatever the
// runtime: no capability in any set, and no_new_privs.
var confinementFields = []struct{ name, want string }{
	{"CapInh", "0000000000000000"},
	{"CapPrm", "0000000000000000"},
	{"CapEff", "0000000000000000"},
	{"CapBnd", "0000000000000000"},
	{"CapAmb", "0000000000000000"},
	{"NoNewPrivs", "1"},
}

// probeGuestPath is where the suite puts the agent binary to probe with.
const probeGuestPath = "/tmp/cbx-probe"

// probeConfinement copies the agent binary at agentPath (on the host) into
// the guest and runs it there as an ordinary guest process in probe mode
// (`cagebox-agent --probe-confinement`), which prints its confinement from
// system calls in /proc/[pid]/status format.
func probeConfinement(t *testing.T, g *Guest, agentPath string) map[string]string {
	t.Helper()
	f, err := os.Open(agentPath)
	if err != nil {
		t.Fatalf("open agent binary: %v", err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := g.Client.WriteFile(ctx, probeGuestPath, 0o755, f); err != nil {
		t.Fatalf("copy the agent binary into the guest: %v", err)
	}
	defer g.Exec(t, "rm", "-f", probeGuestPath)
	out, errOut, res := g.Exec(t, probeGuestPath, "--probe-confinement")
	if res.ExitCode != 0 {
		t.Fatalf("confinement probe failed: %+v: %s%s", res, out, errOut)
	}
	fields := statusFields(out)
	for _, name := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"} {
		if _, ok := fields[name]; !ok {
			t.Fatalf("confinement probe printed no %s:\n%s", name, out)
		}
	}
	return fields
}

// statusFields parses "Name:\tvalue" lines (/proc/[pid]/status format).
func statusFields(out string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, ":\t"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// failedStart starts a sandbox whose agent exits at once (a static binary
// that is not an agent): Start must fail within its bound, and Destroy must
// leave nothing behind (state, cgroups, mounts, processes, runtime
// records, uids).
func failedStart(t *testing.T, rt isolation.Runtime, o Options) {
	timeout := o.StartTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	dud := buildDud(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+30*time.Second)
	defer cancel()
	idb := make([]byte, 6)
	_, _ = rand.Read(idb)
	id := "f" + hex.EncodeToString(idb)
	spec := &isolation.Spec{
		ID: id, StateDir: filepath.Join(stateRoot(t), id), RootFS: o.RootFS,
		AgentPath: dud, AgentToken: "0123456789abcdef0123456789abcdef", Hostname: "dud",
		Resources: isolation.Resources{MemoryBytes: 256 << 20},
	}
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	sctx, scancel := context.WithTimeout(ctx, timeout)
	err = sb.Start(sctx)
	scancel()
	if err == nil {
		// Some runtimes return before the agent answers; it never will.
		if c, derr := sb.DialAgent(sctx); derr == nil {
			hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = agentproto.NewClient(hctx, c, spec.AgentToken)
			hcancel()
			c.Close()
			if err == nil {
				t.Fatal("a sandbox whose agent exits at once answered")
			}
		}
	}
	t.Logf("start of a sandbox whose agent exits: %v", err)
	if err := sb.Destroy(ctx); err != nil {
		t.Errorf("destroy after a failed start: %v", err)
	}
	if lc, ok := sb.(isolation.LeakChecker); ok {
		if left := lc.Leftovers(ctx); len(left) > 0 {
			t.Errorf("a failed start left things behind: %q", left)
		}
	}
	if _, err := os.Stat(spec.StateDir); err == nil {
		t.Errorf("a failed start left its state dir %s", spec.StateDir)
	}
}

// buildDud builds a static binary that exits 3 at once (once per test
// binary).
var buildDudOnce = sync.OnceValues(func() (string, error) {
	src, err := os.MkdirTemp("", "cbxdud")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	os.WriteFile(filepath.Join(src, "go.mod"), []byte("module dud\n\ngo 1.21\n"), 0o644)
	os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n\nimport \"os\"\n\nfunc main() { os.Exit(3) }\n"), 0o644)
	return buildStatic("dud-agent", src, ".", "GOFLAGS=", "GOWORK=off")
})

func buildDud(t testing.TB) string {
	t.Helper()
	p, err := buildDudOnce()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var buildAgentOnce = sync.OnceValues(func() (string, error) {
	return buildStatic("cagebox-agent", "", "github.com/cagebox/cagebox/cmd/cagebox-agent")
})

// BuildAgent builds a static cagebox-agent once per test binary.
func BuildAgent(t testing.TB) string {
	t.Helper()
	p, err := buildAgentOnce()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// buildStatic builds pkg (in dir; "" = here) with CGO_ENABLED=0 and env
// to one fixed path per name, replaced atomically: test binaries of
// several packages may build it at once, and nothing is left per run.
func buildStatic(name, dir, pkg string, env ...string) (string, error) {
	bin := filepath.Join(os.TempDir(), "cagebox-test-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(bin, "."+name+"-*")
	if err != nil {
		return "", err
	}
	tmp.Close()
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp.Name(), pkg)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "CGO_ENABLED=0"), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("build %s: %v: %s", name, err, out)
	}
	p := filepath.Join(bin, name)
	if err := os.Rename(tmp.Name(), p); err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return p, nil
}

var (
	imgOnce sync.Once
	imgPath string
	imgErr  error
)

// BusyboxRoot returns the rootfs of a busybox image: the one under
// $CAGEBOX_TEST_IMAGES if setup built it, else one built now (under a second).
func BusyboxRoot(t testing.TB) string {
	t.Helper()
	imgOnce.Do(func() {
		if dir := os.Getenv("CAGEBOX_TEST_IMAGES"); dir != "" {
			if img, err := (&image.Cache{Dir: dir}).Get("busybox"); err == nil {
				imgPath = img.Path
				return
			}
		}
		// A fixed cache (the image package locks builds by name), reused.
		cache := &image.Cache{Dir: filepath.Join(os.TempDir(), "cagebox-test-images")}
		if img, err := cache.Get("busybox"); err == nil {
			imgPath = img.Path
			return
		}
		img, err := cache.BuildBusybox(context.Background(), "busybox")
		if err != nil {
			imgErr = err
			return
		}
		imgPath = img.Path
	})
	if imgErr != nil {
		t.Fatalf("busybox image: %v", imgErr)
	}
	return imgPath
}
