//go:build linux

package main

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/syncbuf"
)

// TestDependencies guards what the agent links: the standard library,
// golang.org/x/sys, yamux, agentproto, rootfs and tarx, and nothing of the
// daemon.
func TestDependencies(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as it is built
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := []string{
		"golang.org/x/sys/",
		"github.com/hashicorp/yamux",
		"github.com/cagebox/cagebox/agentproto",
		// The description of the guest's files, shared with the host
		// (itself only the standard library and golang.org/x/sys).
		"github.com/cagebox/cagebox/internal/rootfs",
		// Tar streams in and out of the guest (itself only the standard
		// library and golang.org/x/sys).
		"github.com/cagebox/cagebox/internal/tarx",
		"github.com/cagebox/cagebox/cmd/cagebox-agent",
	}
	// os/user is let in for archive/tar alone, which names a file's owner
	// with it (built without cgo it only reads /etc/passwd and /etc/group);
	// the agent's own user lookups stay in agentproto/passwd.go.
	forbiddenStd := []string{"database/sql", "net/http", "plugin", "runtime/cgo", "crypto/tls"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, std, _ := strings.Cut(line, " ")
		if std == "true" {
			for _, f := range forbiddenStd {
				if pkg == f || strings.HasPrefix(pkg, f+"/") {
					t.Errorf("agent links %s", pkg)
				}
			}
			continue
		}
		ok := false
		for _, a := range allowed {
			if pkg == strings.TrimSuffix(a, "/") || strings.HasPrefix(pkg, a) {
				ok = true
			}
		}
		if !ok {
			t.Errorf("agent links %s, which is not allowed", pkg)
		}
	}
}

var (
	// buildMu guards builds and buildDir.
	buildMu  sync.Mutex
	builds   = map[string]*agentBuild{}
	buildDir string
)

type agentBuild struct {
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// agentBinary builds the agent the way it ships: CGO_ENABLED=0.
func agentBinary(t *testing.T) string {
	t.Helper()
	return agentBinaryBuilt(t, "cagebox-agent", "CGO_ENABLED=0")
}

// agentBinaryBuilt builds the agent once per name, with env added to the
// environment of go build and args before the package.
func agentBinaryBuilt(t *testing.T, name string, env string, args ...string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	b := builds[name]
	if b == nil {
		b = &agentBuild{}
		builds[name] = b
		if buildDir == "" {
			buildDir, b.err = os.MkdirTemp("", "cagebox-agent-test")
		}
		if b.err == nil {
			b.path = filepath.Join(buildDir, name)
			cmd := exec.Command("go", append(append([]string{"build", "-o", b.path}, args...), ".")...)
			cmd.Env = append(os.Environ(), env)
			if out, err := cmd.CombinedOutput(); err != nil {
				b.err = fmt.Errorf("%s go build %v: %v\n%s", env, args, err, out)
			}
		}
	}
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func TestStaticBinary(t *testing.T) {
	f, err := elf.Open(agentBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("agent binary has a PT_INTERP segment: it is dynamically linked")
		}
		if p.Type == elf.PT_DYNAMIC {
			t.Error("agent binary has a PT_DYNAMIC segment")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("agent binary needs shared libraries %v", libs)
	}
}

type agent struct {
	cmd       *exec.Cmd
	stderr    *syncbuf.Buffer
	tokenFile string
	token     string
	sock      string
	exited    chan struct{}
}

const testToken = "tok-3f9a1c0d5e7b"

// startAgent runs the built agent on a unix socket with extra flags.
func startAgent(t *testing.T, extra ...string) *agent {
	t.Helper()
	return startAgentWith(t, agentBinary(t), nil, extra...)
}

// startAgentWith runs the agent binary bin; start, if not nil, starts the
// command instead of cmd.Start.
func startAgentWith(t *testing.T, bin string, start func(*exec.Cmd) error, extra ...string) *agent {
	t.Helper()
	dir := t.TempDir()
	a := &agent{
		stderr:    &syncbuf.Buffer{},
		tokenFile: filepath.Join(dir, "token"),
		token:     testToken,
		sock:      filepath.Join(dir, "agent.sock"),
		exited:    make(chan struct{}),
	}
	if err := os.WriteFile(a.tokenFile, []byte(a.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--listen", "unix:" + a.sock, "--token-file", a.tokenFile, "--log-level", "debug"}, extra...)
	a.cmd = exec.Command(bin, args...)
	a.cmd.Env = []string{"CAGEBOX_AGENT_GRACE=5s", "AGENT_ONLY_VAR=1"}
	a.cmd.Stderr = a.stderr
	if start == nil {
		start = (*exec.Cmd).Start
	}
	if err := start(a.cmd); err != nil {
		t.Fatal(err)
	}
	go func() { a.cmd.Wait(); close(a.exited) }()
	t.Cleanup(func() {
		a.cmd.Process.Kill()
		<-a.exited
		if t.Failed() {
			t.Logf("agent log:\n%s", a.stderr.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(a.sock); err == nil {
			break
		}
		select {
		case <-a.exited:
			t.Fatalf("agent exited: %v\n%s", a.cmd.ProcessState, a.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("agent socket did not appear")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return a
}

func (a *agent) client(t *testing.T) *agentproto.Client {
	t.Helper()
	// The socket file appears at bind, a moment before listen: a busy
	// host can put a dial in between (connection refused).
	var conn net.Conn
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if conn, err = net.Dial("unix", a.sock); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	c, err := agentproto.NewClient(ctxT(t), conn, a.token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func run1(t *testing.T, c *agentproto.Client, req *agentproto.ExecRequest) (*agentproto.ExecResult, string) {
	t.Helper()
	var out bytes.Buffer
	res, err := c.Exec(ctxT(t), req, nil, &out, &out)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return res, out.String()
}

func TestAgent(t *testing.T) {
	a := startAgent(t)
	if _, err := os.Stat(a.tokenFile); !os.IsNotExist(err) {
		t.Errorf("token file still there after start: %v", err)
	}
	c := a.client(t)
	h, err := c.Health(ctxT(t))
	if err != nil || h.PID != a.cmd.Process.Pid {
		t.Fatalf("health %+v %v", h, err)
	}
	res, env := run1(t, c, &agentproto.ExecRequest{Argv: []string{"env"}})
	if res.ExitCode != 0 {
		t.Fatalf("env: %+v", res)
	}
	if strings.Contains(env, a.token) || strings.Contains(env, "CAGEBOX_AGENT") || strings.Contains(env, "AGENT_ONLY_VAR") {
		t.Errorf("agent environment leaked to a process:\n%s", env)
	}
	if !strings.Contains(env, "PATH=/usr/local/sbin:") {
		t.Errorf("no default PATH:\n%s", env)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", a.cmd.Process.Pid))
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", a.cmd.Process.Pid))
	if bytes.Contains(cmdline, []byte(a.token)) || bytes.Contains(environ, []byte(a.token)) {
		t.Error("token in the agent's command line or environment")
	}

	// A second connection at the same time, and a wrong token.
	c2 := a.client(t)
	if res, out := run1(t, c2, &agentproto.ExecRequest{Argv: []string{"echo", "hi"}}); res.ExitCode != 0 || out != "hi\n" {
		t.Errorf("second connection: %+v %q", res, out)
	}
	conn, err := net.Dial("unix", a.sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agentproto.NewClient(ctxT(t), conn, "wrong"); err == nil {
		t.Error("wrong token accepted")
	}
	if strings.Contains(a.stderr.String(), a.token) {
		t.Error("token in the agent's log")
	}
}

func TestAgentEmptyEnvFile(t *testing.T) {
	envFile := filepath.Join(t.TempDir(), "env")
	os.WriteFile(envFile, nil, 0o644)
	a := startAgent(t, "--env-file", envFile)
	res, out := run1(t, a.client(t), &agentproto.ExecRequest{Argv: []string{"env"}})
	if res.ExitCode != 0 || !strings.Contains(out, "PATH=/usr/local/sbin") {
		t.Fatalf("env = %+v %q", res, out)
	}
}

func TestAgentEnvFile(t *testing.T) {
	envFile := filepath.Join(t.TempDir(), "env")
	os.WriteFile(envFile, []byte("# base\nPATH=/usr/bin:/bin\nFOO=from-file\n"), 0o644)
	a := startAgent(t, "--env-file", envFile)
	res, out := run1(t, a.client(t), &agentproto.ExecRequest{Argv: []string{"env"}})
	// The file layers over the defaults: PATH overridden, HOME and LANG kept.
	if res.ExitCode != 0 || strings.TrimSpace(out) != "PATH=/usr/bin:/bin\nHOME=/root\nLANG=C.UTF-8\nFOO=from-file" {
		t.Fatalf("env = %+v %q", res, out)
	}
}

func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+1:])
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], ppid, true
}

func TestAgentReapsOrphans(t *testing.T) {
	a := startAgent(t)
	c := a.client(t)
	res, out := run1(t, c, &agentproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 0.5 >/dev/null 2>&1 & echo $!"}})
	if res.ExitCode != 0 {
		t.Fatalf("%+v", res)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	if _, ppid, ok := procStat(orphan); ok && ppid != a.cmd.Process.Pid {
		t.Errorf("orphan's parent is %d, want the agent %d", ppid, a.cmd.Process.Pid)
	}

	// Meanwhile, exit statuses of exec'd processes must not be stolen by
	// the reaper while orphans come and go.
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Exec(ctxT(t), &agentproto.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("sleep 0.0%d >/dev/null 2>&1 & exit %d", i%10, i)}}, nil, nil, nil)
			if err != nil || res.ExitCode != i {
				t.Errorf("exec %d: %+v %v", i, res, err)
			}
		}()
	}
	wg.Wait()

	deadline := time.Now().Add(5 * time.Second)
	for {
		state, _, ok := procStat(orphan)
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d not reaped (state %c)", orphan, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// No zombie children left behind.
	time.Sleep(200 * time.Millisecond)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, ppid, ok := procStat(pid); ok && ppid == a.cmd.Process.Pid && state == 'Z' {
			t.Errorf("zombie child %d of the agent", pid)
		}
	}
}

func capLines(status string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && (strings.HasPrefix(k, "Cap") || k == "NoNewPrivs") {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func TestAgentCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent is started with capabilities to drop")
	}
	a := startAgent(t)
	c := a.client(t)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	self := capLines(string(b))
	want := map[string]string{
		"CapInh": "0000000000000000", "CapPrm": "00000000000000c0", "CapEff": "00000000000000c0",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
	}
	for k, v := range want {
		if self[k] != v {
			t.Errorf("agent %s = %s, want %s", k, self[k], v)
		}
	}
	zero := "0000000000000000"
	for _, user := range []string{"", "0", "65534", "65534:65534"} {
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
	}
	// Switching users still works with only CAP_SETUID and CAP_SETGID left.
	res, out := run1(t, c, &agentproto.ExecRequest{Argv: []string{"sh", "-c", "id -u"}, User: "65534"})
	if res.ExitCode != 0 || strings.TrimSpace(out) != "65534" {
		t.Errorf("run as 65534: %+v %q", res, out)
	}
}

func TestAgentSIGTERM(t *testing.T) {
	a := startAgent(t)
	c := a.client(t)
	type result struct {
		res *agentproto.ExecResult
		out string
		err error
	}
	done := make(chan result, 1)
	ready := make(chan struct{})
	go func() {
		w := &readyWriter{ready: ready}
		res, err := c.Exec(ctxT(t), &agentproto.ExecRequest{Argv: []string{"sh", "-c", `trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.05; done`}}, nil, w, nil)
		done <- result{res, w.String(), err}
	}()
	select {
	case <-ready:
	case <-time.After(5 * time.Second):
		t.Fatal("process did not start")
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	r := <-done
	if r.err != nil || r.res.ExitCode != 7 || !strings.Contains(r.out, "got TERM") {
		t.Errorf("exec after SIGTERM: %+v %q %v", r.res, r.out, r.err)
	}
	select {
	case <-a.exited:
		if code := a.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("agent exit code %d", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not exit after SIGTERM")
	}
}

func TestAgentGraceKill(t *testing.T) {
	a := startAgent(t, "--grace", "300ms")
	c := a.client(t)
	ready := make(chan struct{})
	done := make(chan *agentproto.ExecResult, 1)
	go func() {
		w := &readyWriter{ready: ready}
		res, _ := c.Exec(ctxT(t), &agentproto.ExecRequest{Argv: []string{"sh", "-c", `trap '' TERM; echo ready; while :; do sleep 0.05; done`}}, nil, w, nil)
		done <- res
	}()
	<-ready
	start := time.Now()
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not exit after its grace period")
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("agent exited after %v, before its grace period", d)
	}
	<-done
}

type readyWriter struct {
	mu    sync.Mutex
	b     bytes.Buffer
	ready chan struct{}
	once  sync.Once
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	w.once.Do(func() { close(w.ready) })
	return len(p), nil
}

func (w *readyWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestAgentFD serves a connection over an inherited socket, as a VM
// runtime hands over a byte stream.
func TestAgentFD(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	hostEnd := os.NewFile(uintptr(fds[0]), "host")
	guestEnd := os.NewFile(uintptr(fds[1]), "guest")
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte(testToken), 0o600)
	cmd := exec.Command(agentBinary(t), "--listen", "fd:3", "--token-file", tokenFile)
	cmd.ExtraFiles = []*os.File{guestEnd}
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	guestEnd.Close()
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	conn, err := net.FileConn(hostEnd)
	hostEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	c, err := agentproto.NewClient(ctxT(t), conn, testToken)
	if err != nil {
		time.Sleep(100 * time.Millisecond)
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	defer c.Close()
	if res, out := run1(t, c, &agentproto.ExecRequest{Argv: []string{"echo", "over fd"}}); res.ExitCode != 0 || out != "over fd\n" {
		t.Fatalf("%+v %q", res, out)
	}
}

func TestAgentBadFlags(t *testing.T) {
	bin := agentBinary(t)
	for _, args := range [][]string{
		{},
		{"--listen", "unix:/tmp/x.sock"},
		{"--listen", "tcp:1.2.3.4:5", "--token-file", "/nonexistent"},
		{"--listen", "unix:/tmp/x.sock", "--token-file", "/nonexistent/token"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{}
		if err := cmd.Run(); err == nil {
			t.Errorf("agent %q succeeded", args)
		}
	}
}

func TestParseListen(t *testing.T) {
	for spec, ok := range map[string]bool{
		"unix:/run/a.sock": true, "fd:3": true, "dev:/dev/virtio-ports/cagebox": true, "vsock:1024": true,
		"fd:1": false, "fd:x": false, "unix:": false, "tcp:1.2.3.4:5": false, "vsock:x": false, "vsock:-1": false, "vsock:4294967295": false, "vsock:4294967296": false, "nothing": false,
	} {
		if _, err := parseListen(spec); (err == nil) != ok {
			t.Errorf("parseListen(%q) err = %v", spec, err)
		}
	}
}

func TestReadEnvFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "env")
	os.WriteFile(p, []byte("A=1\n\n# c\nB=x=y\n"), 0o644)
	env, err := readEnvFile(p)
	if err != nil || strings.Join(env, ",") != "A=1,B=x=y" {
		t.Fatalf("%q %v", env, err)
	}
	os.WriteFile(p, []byte("A=1\nnot an assignment\n"), 0o644)
	if _, err := readEnvFile(p); err == nil {
		t.Fatal("accepted a bad line")
	}
}

// TestPrewarmThreads: the spare threads exist after prewarming (the
// process's thread count grows by at least n) and stay.
func TestPrewarmThreads(t *testing.T) {
	count := func() int {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Skip(err)
		}
		return len(ents)
	}
	before := count()
	prewarmThreads(spareThreads)
	if after := count(); after < spareThreads {
		t.Fatalf("%d threads after prewarming %d (before: %d)", after, spareThreads, before)
	}
}

// TestAgentAwaitClaimCapabilities: an agent started with --await-claim
// keeps its capabilities until the claim (a VM's applies the claim's
// network, entropy and clock with them) and runs nothing; the claim drops
// them on every thread — its launcher's too, which already starts
// processes with none — without the Go runtime aborting on threads that
// disagree; afterwards the agent and its processes hold what an agent
// that was never waiting holds.
func TestAgentAwaitClaimCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent is started with capabilities to drop")
	}
	// A container's agent awaiting its claim has dropped them already (the
	// host owns its network and kernel), as an ordinary one.
	ct := startAgent(t, "--await-claim")
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", ct.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if st := capLines(string(b)); st["CapEff"] != "00000000000000c0" || st["CapBnd"] != "0000000000000000" {
		t.Errorf("a container's agent awaiting its claim keeps capabilities: %v", st)
	}
	// A VM guest's keeps them until the claim.
	a := startAgent(t, "--await-claim", "--claim-keeps-caps")
	c := a.client(t)
	status := func() map[string]string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		return capLines(string(b))
	}
	// It keeps what the claim needs (CAP_NET_ADMIN, CAP_SYS_ADMIN,
	// CAP_SYS_TIME) in its effective set; its bounding set is empty
	// already (all but the last step of the drop are done at start, so
	// the claim's is short).
	if st := status(); !hasCaps(st["CapEff"], 12, 21, 25) || st["CapBnd"] != "0000000000000000" {
		t.Errorf("an agent awaiting its claim: %v, want the claim's capabilities effective and the bounding set empty", st)
	}
	if _, err := c.Exec(ctxT(t), &agentproto.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard); err == nil {
		t.Fatal("an unclaimed agent ran a process")
	}
	cl := &agentproto.Claim{Token: "claimed-token-0123", Env: []string{"CLAIMED=1"}, Entropy: make([]byte, 32), Time: time.Now()}
	if err := c.Claim(ctxT(t), cl); err != nil {
		t.Fatalf("claim: %v\n%s", err, a.stderr.String())
	}
	// Every thread of the agent holds only CAP_SETUID and CAP_SETGID.
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", a.cmd.Process.Pid))
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", a.cmd.Process.Pid, task.Name()))
		if err != nil {
			continue
		}
		st := capLines(string(b))
		if st["CapEff"] != "00000000000000c0" || st["CapPrm"] != "00000000000000c0" || st["CapBnd"] != "0000000000000000" {
			t.Errorf("agent thread %s after the claim: %v", task.Name(), st)
		}
	}
	a.token = cl.Token
	c2 := a.client(t)
	res, out := run1(t, c2, &agentproto.ExecRequest{Argv: []string{"sh", "-c", "echo $CLAIMED; grep -E '^Cap(Prm|Eff|Bnd)' /proc/self/status"}})
	if res.ExitCode != 0 || !strings.HasPrefix(out, "1\n") {
		t.Fatalf("exec after the claim: %+v %q", res, out)
	}
	for k, v := range capLines(out) {
		if v != "0000000000000000" {
			t.Errorf("a process started after the claim holds %s = %s", k, v)
		}
	}
}

// hasCaps reports whether the hex capability mask holds every cap.
func hasCaps(mask string, caps ...int) bool {
	v, err := strconv.ParseUint(mask, 16, 64)
	if err != nil {
		return false
	}
	for _, c := range caps {
		if v&(1<<c) == 0 {
			return false
		}
	}
	return true
}
