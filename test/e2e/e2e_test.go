// Package e2e drives the real cagebox CLI against a real daemon, with the
// real container runtime.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/testbin"
	"github.com/cagebox/cagebox/internal/vmimage"
)

var binDir string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("e2e: skipped, needs root (namespaces, mounts, cgroups)")
		os.Exit(0)
	}
	// Our own nftables table, interface prefix and pool: tests never touch
	// a daemon that may run on this machine. Daemons started by the CLI
	// inherit these. Values already in the environment win, so two test
	// runs on one host (two checkouts) can each use their own.
	setDefaultEnv("CAGEBOX_NET_TABLE", "cagebox_e2e")
	setDefaultEnv("CAGEBOX_NET_IFPREFIX", "cbe")
	setDefaultEnv("CAGEBOX_LINK_POOL", "10.252.0.0/16")
	dir, err := testbin.Build()
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func setDefaultEnv(k, v string) {
	if os.Getenv(k) == "" {
		os.Setenv(k, v)
	}
}

// env is one daemon home with its images.
type env struct {
	t      *testing.T
	home   string
	daemon *exec.Cmd
	logBuf *bytes.Buffer
	args   []string
	// bin is the CLI cli runs ("" = the one TestMain built).
	bin string
	// tcpAddr is the daemon's --listen address, when a test gives one
	// (apiCall with a tenant's key).
	tcpAddr string
}

// reportGrace is what a test keeps of its deadline (go test -timeout) to
// report a command that is still running: its output and the daemon's log.
const reportGrace = time.Minute

// testContext bounds a command a test waits for by the test's own
// deadline, less reportGrace — not by a fixed budget: on a loaded machine
// a command (a selftest over three runtimes, QEMU under TCG) takes as long
// as it takes, and only a command that outlives the whole run is stuck.
func testContext(t *testing.T) (context.Context, context.CancelFunc) {
	d, ok := t.Deadline()
	if !ok {
		return context.WithCancel(context.Background())
	}
	if until := time.Until(d); until > 2*reportGrace {
		d = d.Add(-reportGrace)
	} else {
		d = d.Add(-until / 2)
	}
	return context.WithDeadline(context.Background(), d)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// newEnv makes a daemon home with its own image cache.
func newEnv(t *testing.T) *env {
	t.Helper()
	home, err := os.MkdirTemp("", "cbxh")
	if err != nil {
		t.Fatal(err)
	}
	// Busybox images (under a second each) under both names, so the CLI's
	// default image works without the Debian build.
	cache := &image.Cache{Dir: filepath.Join(home, "images")}
	for _, name := range []string{"busybox", "default"} {
		if _, err := cache.BuildBusybox(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	// VM runtimes boot from the machine's shared kernel/initramfs/disk
	// cache (fetched by setup) when there is one.
	if vm := vmimage.TestCacheDir(); fileExists(filepath.Join(vm, "kernel")) {
		if err := os.Symlink(vm, filepath.Join(home, "vm")); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{t: t, home: home}
	t.Cleanup(func() {
		e.stopDaemon(syscall.SIGTERM)
		// A daemon the CLI started on its own (`run` without a daemon) is
		// no child of the test: stop it too, whatever the test did.
		e.stopOtherDaemons()
		// Remove every sandbox left, then the home.
		e.startDaemon()
		c := e.client()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if l, err := c.List(ctx); err == nil {
			for _, s := range l {
				_ = c.Remove(ctx, s.ID)
			}
		}
		e.stopDaemon(syscall.SIGTERM)
		e.stopOtherDaemons()
		if t.Failed() && e.logBuf != nil {
			t.Logf("daemon log:\n%s", e.logBuf.String())
		}
		os.RemoveAll(home)
	})
	return e
}

func (e *env) client() *client.Client { return client.Unix(filepath.Join(e.home, "cagebox.sock")) }

// e2eRuntime is the runtime the tests' sandboxes use unless a test names
// one: CAGEBOX_E2E_RUNTIME (scripts/test.sh runs the egress tests again on
// gvisor and qemu), default container.
func e2eRuntime() string {
	if r := os.Getenv("CAGEBOX_E2E_RUNTIME"); r != "" {
		return r
	}
	return "container"
}

func (e *env) startDaemon(extra ...string) {
	e.t.Helper()
	if e.logBuf == nil {
		e.logBuf = &bytes.Buffer{}
	}
	args := append([]string{"--home", e.home, "daemon", "--agent", filepath.Join(binDir, "cagebox-agent"), "--default-runtime", e2eRuntime()}, extra...)
	cmd := exec.Command(filepath.Join(binDir, "cagebox"), args...)
	cmd.Stdout, cmd.Stderr = e.logBuf, e.logBuf
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.daemon = cmd
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := e.client().Health(ctx)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("daemon did not come up:\n%s", e.logBuf.String())
}

func (e *env) stopDaemon(sig syscall.Signal) {
	if e.daemon == nil {
		return
	}
	_ = e.daemon.Process.Signal(sig)
	done := make(chan struct{})
	go func() { _ = e.daemon.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = e.daemon.Process.Kill()
		<-done
	}
	e.daemon = nil
}

// daemonsOf lists the pids of `cagebox --home HOME daemon` (and
// `cagebox-server … daemon`) processes.
func daemonsOf(home string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, en := range ents {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + en.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		isDaemon, ofHome := false, false
		for i, a := range args {
			if a == "daemon" {
				isDaemon = true
			}
			if (a == "--home" && i+1 < len(args) && args[i+1] == home) || a == "--home="+home {
				ofHome = true
			}
		}
		// The CLI execs cagebox-server for `daemon` (same pid), and starts
		// it directly when it starts a daemon itself.
		if b := filepath.Base(args[0]); isDaemon && ofHome && (b == "cagebox" || b == "cagebox-server") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stopOtherDaemons stops every daemon of this home that is not e.daemon
// (SIGTERM, then SIGKILL after 15 s) and waits until they are gone.
func (e *env) stopOtherDaemons() {
	pids := daemonsOf(e.home)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(15 * time.Second)
	for len(daemonsOf(e.home)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	for _, pid := range daemonsOf(e.home) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for i := 0; i < 100 && len(daemonsOf(e.home)) > 0; i++ {
		time.Sleep(50 * time.Millisecond)
	}
}

type result struct {
	stdout, stderr string
	code           int
}

// cli runs the real CLI.
func (e *env) cli(stdin string, args ...string) result {
	e.t.Helper()
	return e.cliEnv(nil, stdin, args...)
}

// cliEnv runs the real CLI with extra environment variables.
func (e *env) cliEnv(extra []string, stdin string, args ...string) result {
	e.t.Helper()
	ctx, cancel := testContext(e.t)
	defer cancel()
	bin := e.bin
	if bin == "" {
		bin = filepath.Join(binDir, "cagebox")
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--home", e.home}, args...)...)
	cmd.Env = append(append(os.Environ(), "CAGEBOX_AGENT="+filepath.Join(binDir, "cagebox-agent")), extra...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("cagebox %v: %v", args, err)
	}
	return result{out.String(), errb.String(), code}
}

func TestRunBasics(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	for _, tc := range []struct {
		name       string
		stdin      string
		args       []string
		wantOut    string
		wantCode   int
		wantErrSub string
	}{
		{"echo", "", []string{"run", "--", "echo", "hi"}, "hi\n", 0, ""},
		{"exit code", "", []string{"run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"}, "out\n", 7, "err"},
		{"not found", "", []string{"run", "--", "no-such-command"}, "", 127, "command not found"},
		{"stdin", "line1\nline2\n", []string{"run", "--", "wc", "-l"}, "2\n", 0, ""},
		{"env", "", []string{"run", "--env", "FOO=bar", "--", "sh", "-c", "echo $FOO"}, "bar\n", 0, ""},
		{"workdir", "", []string{"run", "-w", "/tmp", "--", "pwd"}, "/tmp\n", 0, ""},
		{"bad memory flag", "", []string{"run", "--memory", "lots", "--", "true"}, "", 125, "--memory"},
		{"bad timeout flag", "", []string{"run", "--timeout", "soon", "--", "true"}, "", 125, "--timeout"},
		{"unknown runtime", "", []string{"run", "--runtime", "nope", "--", "true"}, "", 125, "unknown runtime"},
		{"unknown image", "", []string{"run", "--image", "nope", "--", "true"}, "", 125, "image build"},
		{"oom", "", []string{"run", "--memory", "64M", "--", "sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a)"}, "", 137, "memory limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.cli(tc.stdin, tc.args...)
			if r.code != tc.wantCode || r.stdout != tc.wantOut || !strings.Contains(r.stderr, tc.wantErrSub) {
				t.Fatalf("got code %d stdout %q stderr %q; want code %d stdout %q stderr containing %q", r.code, r.stdout, r.stderr, tc.wantCode, tc.wantOut, tc.wantErrSub)
			}
		})
	}
	// run removes its sandbox.
	if r := e.cli("", "ls", "--json"); r.code != 0 || strings.Contains(r.stdout, `"running"`) {
		t.Fatalf("run left sandboxes behind: %s %s", r.stdout, r.stderr)
	}
}

func TestLifecycle(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	r := e.cli("", "create", "--memory", "128M", "--cpus", "0.5", "--pids", "100")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	if r := e.cli("", "exec", id, "--", "sh", "-c", "echo state > /tmp/keep"); r.code != 0 {
		t.Fatalf("exec: %+v", r)
	}
	if r := e.cli("", "exec", id, "--", "cat", "/tmp/keep"); r.stdout != "state\n" {
		t.Fatalf("state not kept between execs: %+v", r)
	}
	// Files through the API.
	ctx := context.Background()
	if err := e.client().WriteFile(ctx, id, "/work/in.txt", 0o600, strings.NewReader("from the host")); err != nil {
		t.Fatalf("write file: %v", err)
	}
	if r := e.cli("", "exec", id, "--", "sh", "-c", "stat -c %a /work/in.txt; cat /work/in.txt"); r.stdout != "600\nfrom the host" {
		t.Fatalf("file in guest: %+v", r)
	}
	if b, err := e.client().ReadFile(ctx, id, "/work/in.txt"); err != nil || string(b) != "from the host" {
		t.Fatalf("read file: %q %v", b, err)
	}
	if _, err := e.client().ReadFile(ctx, id, "/no/such"); !client.IsNotFound(err) {
		t.Fatalf("read a missing file: %v (want 404)", err)
	}
	r = e.cli("", "inspect", id)
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb.ID != id || sb.Status != "running" || sb.Resources.MemoryBytes != 128<<20 || sb.Resources.PIDs != 100 {
		t.Fatalf("inspect: %+v %v", r, err)
	}
	if r := e.cli("", "ls"); !strings.Contains(r.stdout, id) {
		t.Fatalf("ls lacks %s: %s", id, r.stdout)
	}
	if r := e.cli("", "pause", id); r.code != 0 {
		t.Fatalf("pause: %+v", r)
	}
	if r := e.cli("", "exec", id, "--", "true"); r.code != 125 || !strings.Contains(r.stderr, "paused") {
		t.Fatalf("exec in a paused sandbox: %+v", r)
	}
	if r := e.cli("", "resume", id); r.code != 0 {
		t.Fatalf("resume: %+v", r)
	}
	if r := e.cli("", "stop", id); r.code != 0 {
		t.Fatalf("stop: %+v", r)
	}
	if r := e.cli("", "exec", id, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "not running") {
		t.Fatalf("exec in a stopped sandbox: %+v", r)
	}
	r = e.cli("", "events", "--json", id)
	for _, kind := range []string{"sandbox.created", "sandbox.exec", "sandbox.paused", "sandbox.resumed", "sandbox.stopped"} {
		if !strings.Contains(r.stdout, `"kind":"`+kind+`"`) {
			t.Errorf("events of %s lack %s: %s", id, kind, r.stdout)
		}
	}
	if r := e.cli("", "rm", id); r.code != 0 {
		t.Fatalf("rm: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(e.home, "sandboxes", id)); !os.IsNotExist(err) {
		t.Fatalf("state dir of %s left after rm: %v", id, err)
	}
	for _, cmd := range [][]string{{"inspect", id}, {"rm", id}, {"exec", id, "--", "true"}, {"stop", id}} {
		r := e.cli("", cmd...)
		if r.code == 0 || !strings.Contains(r.stderr, "no sandbox") || !strings.Contains(r.stderr, id) {
			t.Errorf("%v on a removed sandbox: %+v (want not found naming the id)", cmd, r)
		}
	}
}

func TestAPIRejectsBadInput(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	c := e.client()
	ctx := context.Background()
	for _, tc := range []struct {
		method, path, body string
		code               int
		sub                string
	}{
		{"POST", "/v1/sandboxes", "{not json", 400, "invalid JSON"},
		{"POST", "/v1/sandboxes", `{"memory_bytes": "lots"}`, 400, "invalid JSON"},
		{"POST", "/v1/sandboxes", `{"bogus_field": 1}`, 400, "bogus_field"},
		{"POST", "/v1/sandboxes", `{"memory_bytes": 1000}`, 400, "memory"},
		{"POST", "/v1/sandboxes", `{"timeout": "forever"}`, 400, "timeout"},
		{"POST", "/v1/sandboxes", `{"env": ["NOEQUALS"]}`, 400, "env"},
		{"POST", "/v1/sandboxes", ``, 400, "empty body"},
		{"GET", "/v1/sandboxes/sb-nope", "", 404, "sb-nope"},
		{"POST", "/v1/sandboxes/sb-nope/exec", `{"argv":["true"]}` + "\n", 404, "sb-nope"},
		{"GET", "/v1/nothing", "", 404, "no endpoint"},
	} {
		resp, err := c.Raw(ctx, tc.method, tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var ae api.Error
		_ = json.NewDecoder(resp.Body).Decode(&ae)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(ae.Error, tc.sub) {
			t.Errorf("%s %s %q: %d %q, want %d containing %q", tc.method, tc.path, tc.body, resp.StatusCode, ae.Error, tc.code, tc.sub)
		}
	}
	// Nothing half-made: no sandbox records, no state dirs.
	l, _ := c.List(ctx)
	for _, s := range l {
		if s.Status != "failed" {
			t.Errorf("bad input left sandbox %+v", s)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(e.home, "sandboxes"))
	if len(ents) > 0 {
		t.Errorf("bad input left state dirs: %v", ents)
	}
}

func TestRestartReattaches(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	keep := strings.TrimSpace(e.cli("", "create").stdout)
	lost := strings.TrimSpace(e.cli("", "create").stdout)
	if keep == "" || lost == "" {
		t.Fatal("create failed")
	}
	e.cli("", "exec", keep, "--", "sh", "-c", "echo before > /tmp/mark")
	e.stopDaemon(syscall.SIGKILL)
	// While no daemon runs, the "lost" sandbox dies.
	rt := exec.Command("runc", "--root", filepath.Join(e.home, "oci"), "kill", lost, "KILL")
	if out, err := rt.CombinedOutput(); err != nil {
		t.Logf("kill %s: %v %s", lost, err, out)
	}
	time.Sleep(300 * time.Millisecond)
	e.startDaemon()
	if r := e.cli("", "exec", keep, "--", "cat", "/tmp/mark"); r.stdout != "before\n" {
		t.Fatalf("sandbox not re-attached after daemon SIGKILL: %+v", r)
	}
	r := e.cli("", "inspect", lost)
	var sb api.Sandbox
	_ = json.Unmarshal([]byte(r.stdout), &sb)
	if sb.Status != "failed" || !strings.Contains(sb.Error, "lost") {
		t.Fatalf("dead sandbox not marked: %+v", sb)
	}
	if _, err := os.Stat(filepath.Join(e.home, "sandboxes", lost)); !os.IsNotExist(err) {
		t.Fatalf("dead sandbox's state dir not cleaned up: %v", err)
	}
}

func TestTimeouts(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	ttl := strings.TrimSpace(e.cli("", "create", "--timeout", "2s").stdout)
	idle := strings.TrimSpace(e.cli("", "create", "--idle-timeout", "2s").stdout)
	busy := strings.TrimSpace(e.cli("", "create", "--idle-timeout", "2s").stdout)
	// An exec that runs longer than the idle timeout keeps its sandbox alive.
	done := make(chan result, 1)
	go func() { done <- e.cli("", "exec", busy, "--", "sleep", "4") }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		a, _ := e.client().Get(context.Background(), ttl)
		b, _ := e.client().Get(context.Background(), idle)
		if a != nil && b != nil && a.Status == "destroyed" && b.Status == "destroyed" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for id, want := range map[string]string{ttl: "maximum lifetime", idle: "idle"} {
		sb, err := e.client().Get(context.Background(), id)
		if err != nil || sb.Status != "destroyed" || !strings.Contains(sb.Error, want) {
			t.Errorf("%s: %+v %v, want destroyed for %q", id, sb, err, want)
		}
		if _, err := os.Stat(filepath.Join(e.home, "sandboxes", id)); !os.IsNotExist(err) {
			t.Errorf("%s: state dir left after timeout", id)
		}
	}
	if r := <-done; r.code != 0 {
		t.Fatalf("long exec in a sandbox with an idle timeout was cut: %+v", r)
	}
}

func TestRunStartsDaemon(t *testing.T) {
	e := newEnv(t)
	r := e.cli("", "run", "--", "echo", "auto")
	if r.code != 0 || r.stdout != "auto\n" || !strings.Contains(r.stderr, "started one") {
		t.Fatalf("run without a daemon: %+v", r)
	}
	c := e.client()
	if _, err := c.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	if pids := daemonsOf(e.home); len(pids) != 1 {
		t.Fatalf("daemons of the home after run: %v, want the one run started", pids)
	}
	// The cleanup stops it (on every path): checked here.
	e.stopOtherDaemons()
	if pids := daemonsOf(e.home); len(pids) != 0 {
		t.Fatalf("the auto-started daemon survived: %v", pids)
	}
}

// TestSecondDaemonRefused: a second daemon with another home but the same
// nftables table and interface prefix refuses to start, naming the first
// daemon's pid and home, and the first daemon's sandbox keeps its network.
func TestSecondDaemonRefused(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	ctx := context.Background()
	sb, err := e.client().Create(ctx, &api.CreateSandboxRequest{Allow: []string{"api.example.test"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Network == nil {
		t.Fatalf("sandbox has no network: %+v", sb)
	}
	links := func() string {
		out, _ := exec.Command("ip", "-o", "link", "show", "type", "veth").Output()
		var mine []string
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], os.Getenv("CAGEBOX_NET_IFPREFIX")) {
				mine = append(mine, strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":"))
			}
		}
		ns, _ := exec.Command("ip", "netns", "list").Output()
		return strings.Join(mine, ",") + " | " + string(ns)
	}
	before := links()
	if !strings.Contains(before, os.Getenv("CAGEBOX_NET_IFPREFIX")) {
		t.Fatalf("the sandbox's link is not on the host: %s", before)
	}
	other, err := os.MkdirTemp("", "cbxh2")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(other)
	ctx2, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx2, filepath.Join(binDir, "cagebox"), "--home", other, "daemon", "--agent", filepath.Join(binDir, "cagebox-agent"))
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("a second daemon on the same table and prefix started:\n%s", out)
	}
	for _, want := range []string{"another cagebox daemon", "pid " + strconv.Itoa(e.daemon.Process.Pid), "home " + e.home, os.Getenv("CAGEBOX_NET_TABLE")} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	if after := links(); after != before {
		t.Fatalf("the second daemon changed the first one's links:\nbefore %s\nafter  %s", before, after)
	}
	if r := e.cli("", "exec", sb.ID, "--", "sh", "-c", "cat /sys/class/net/eth0/operstate"); r.code != 0 || strings.TrimSpace(r.stdout) != "up" {
		t.Fatalf("the first daemon's sandbox lost its network: %+v", r)
	}
	if out, _ := exec.Command("nft", "list", "table", "inet", os.Getenv("CAGEBOX_NET_TABLE")).CombinedOutput(); !strings.Contains(string(out), "chain") {
		t.Fatalf("the first daemon's table is gone: %s", out)
	}
}

func TestRuntimesCommand(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	r := e.cli("", "runtimes", "--json")
	var l []api.Runtime
	if err := json.Unmarshal([]byte(r.stdout), &l); err != nil {
		t.Fatalf("runtimes --json: %v %+v", err, r)
	}
	found := false
	for _, rt := range l {
		if rt.Name == "container" {
			found = true
			if !rt.Available || rt.Class != "namespaces" || !rt.Default {
				t.Errorf("container runtime: %+v", rt)
			}
		}
	}
	if !found {
		t.Fatalf("no container runtime listed: %s", r.stdout)
	}
	if r := e.cli("", "runtimes"); !strings.Contains(r.stdout, "namespaces") {
		t.Fatalf("runtimes table: %+v", r)
	}
}

// TestDebianImage runs the real default image (curl, python3) when setup
// has built it.
func TestDebianImage(t *testing.T) {
	e := newDebianEnv(t)
	e.startDaemon()
	r := e.cli("", "run", "--", "sh", "-c", "python3 -c 'import ssl, sys; print(sys.version_info[0])'; curl --version >/dev/null && echo curl-ok; test -s /etc/ssl/certs/ca-certificates.crt && echo ca-ok")
	if r.code != 0 || r.stdout != "3\ncurl-ok\nca-ok\n" {
		t.Fatalf("debian image: %+v", r)
	}
	r = e.cli("", "run", "--memory", "128M", "--", "python3", "-c", "bytearray(400 << 20)")
	if r.code != 137 || !strings.Contains(r.stderr, "memory limit") {
		t.Fatalf("python over the memory limit: %+v", r)
	}
}

// newDebianEnv is newEnv with the Debian image (curl, python3) as
// "default"; it skips when setup has not built it.
func newDebianEnv(t *testing.T) *env {
	t.Helper()
	shared := os.Getenv("CAGEBOX_TEST_IMAGES")
	if shared == "" {
		t.Skip("CAGEBOX_TEST_IMAGES is not set (scripts/test.sh sets it after building the Debian image)")
	}
	if _, err := (&image.Cache{Dir: shared}).Get("default"); err != nil {
		t.Skipf("no Debian image in %s: %v", shared, err)
	}
	e := newEnv(t)
	if err := os.RemoveAll(filepath.Join(e.home, "images", "default")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(shared, "default"), filepath.Join(e.home, "images", "default")); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestCLIHasNoFixedBudget: a command the tests run through the CLI may
// take longer than any fixed budget when the machine is busy (TestSelftest
// over three runtimes once missed a 2-minute one); only the test's own
// deadline bounds it. A stand-in CLI that answers after 125 s (sleeping,
// no CPU) must be waited for. Skipped with -short (it takes that long).
func TestCLIHasNoFixedBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 125 s")
	}
	if d, ok := t.Deadline(); ok && time.Until(d) < 5*time.Minute {
		t.Skipf("the test deadline (%v away) is too close to show it", time.Until(d).Round(time.Second))
	}
	dir := t.TempDir()
	slow := filepath.Join(dir, "cagebox")
	if err := os.WriteFile(slow, []byte("#!/bin/sh\nexec sh -c 'sleep 125; echo answered'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, home: dir, bin: slow}
	if r := e.cli("", "selftest"); r.code != 0 || r.stdout != "answered\n" {
		t.Fatalf("a slow command was cut short: %+v", r)
	}
}
