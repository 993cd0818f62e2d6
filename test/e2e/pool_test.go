package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
)

// pools reads `cagebox pool ls --json`.
func (e *env) pools() api.Pools {
	e.t.Helper()
	r := e.cli("", "pool", "ls", "--json")
	if r.code != 0 {
		e.t.Fatalf("pool ls: %+v", r)
	}
	var p api.Pools
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
		e.t.Fatalf("pool ls --json: %v: %s", err, r.stdout)
	}
	return p
}

func (e *env) waitPoolReady(class string, n int) api.PoolStatus {
	e.t.Helper()
	ctx, cancel := testContext(e.t)
	defer cancel()
	for {
		for _, s := range e.pools().Pools {
			if s.Class == class && s.Ready >= n {
				return s
			}
		}
		if ctx.Err() != nil {
			e.t.Fatalf("pool %s never had %d ready: %+v", class, n, e.pools())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func eventKinds(e *env, id string) []string {
	var evs []api.Event
	_ = json.Unmarshal([]byte(e.cli("", "events", "--json", id).stdout), &evs)
	var k []string
	for _, ev := range evs {
		k = append(k, string(ev.Kind))
	}
	return k
}

// TestWarmPool: a create of a pooled class is served from the pool and is
// a full sandbox — its own gateway, CA, policy and credential swap, no
// capabilities, nothing left of the warm-up — while other classes are made
// cold; a daemon killed with sandboxes in its pool leaves nothing behind.
func TestWarmPool(t *testing.T) {
	e := newDebianEnv(t)
	up := newUpstream(t, "api.example.test")
	rt := e2eRuntime()
	class := rt + ":default"
	e.startDaemon(append(up.daemonArgs("api.example.test"), "--pool", class+"=2")...)
	st := e.waitPoolReady(class, 2)
	if st.Target != 2 || st.Runtime != rt || st.Image != "default" || st.Failures != 0 {
		t.Fatalf("pool status %+v", st)
	}
	// Pooled sandboxes count toward no tenant.
	if r := e.cli("", "ls"); strings.Count(r.stdout, "sb-") != 0 {
		t.Fatalf("pooled sandboxes are listed: %s", r.stdout)
	}

	const real = "ghp_R3alT0kenThatMustNeverEnterTheGuest01"
	os.Setenv("GITHUB_TOKEN", real)
	defer os.Unsetenv("GITHUB_TOKEN")
	var ids []string
	for i := 0; i < 2; i++ {
		r := e.cli("", "create", "--allow", "api.example.test", "--secret", "GITHUB_TOKEN@api.example.test", "--env", "WHO=claim"+string(rune('0'+i)))
		if r.code != 0 {
			t.Fatalf("create: %+v", r)
		}
		ids = append(ids, strings.TrimSpace(r.stdout))
	}
	cas := map[string]bool{}
	for i, id := range ids {
		e.waitEvent(id, "pool.claimed", func(ev api.Event) bool { return ev.Kind == api.EventPoolClaimed })
		e.waitEvent(id, "sandbox.created", func(ev api.Event) bool { return ev.Kind == api.EventSandboxCreated })
		sh := func(script string) result { t.Helper(); return e.cli("", "exec", id, "--", "sh", "-c", script) }
		// Its own environment, and the credential swap through its own
		// gateway with its own CA (curl verifies the proxy's certificate).
		if r := sh(`echo "$WHO"`); strings.TrimSpace(r.stdout) != "claim"+string(rune('0'+i)) {
			t.Errorf("%s: env WHO = %q", id, r.stdout)
		}
		n0 := len(up.requests())
		if r := sh(`curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://api.example.test/pooled`); r.code != 0 || strings.Contains(r.stdout, "denied") {
			t.Errorf("%s: request through the gateway: %+v", id, r)
		}
		if got := up.requests(); len(got) != n0+1 || !strings.Contains(got[len(got)-1], "auth=Bearer "+real) {
			t.Errorf("%s: upstream saw %q: want the real token swapped in", id, got[n0:])
		}
		if r := sh(`printf %s "$GITHUB_TOKEN"`); r.stdout == real || !strings.HasPrefix(r.stdout, "ghp_") {
			t.Errorf("%s: guest holds %q", id, r.stdout)
		}
		// Policy is this sandbox's: anything else is refused.
		if r := sh(`curl -sS https://other.example.test/ 2>&1; echo rc=$?`); !strings.Contains(r.stdout, "rc=6") && !strings.Contains(r.stdout, "denied") {
			t.Errorf("%s: a host the policy does not allow: %+v", id, r)
		}
		// Nameserver is its own gateway; the CA is its own.
		sb, err := e.client().Get(context.Background(), id)
		if err != nil || sb.Network == nil {
			t.Fatalf("inspect %s: %v %+v", id, err, sb)
		}
		if r := sh(`cat /etc/resolv.conf`); !strings.Contains(r.stdout, "nameserver "+sb.Network.Gateway+"\n") {
			t.Errorf("%s: resolv.conf %q, want its gateway %s", id, r.stdout, sb.Network.Gateway)
		}
		ca := sh(`cat /etc/cagebox/ca.crt`).stdout
		if !strings.Contains(ca, "BEGIN CERTIFICATE") || cas[ca] {
			t.Errorf("%s: CA %q is missing or shared with another sandbox", id, ca)
		}
		cas[ca] = true
		// Nothing of the warm-up: no capabilities, no token file, no
		// process but the agent and this shell's.
		if r := sh(`grep CapEff /proc/self/status; ls /.cagebox/run/; ls /proc | grep -c '^[0-9]'`); !strings.Contains(r.stdout, "CapEff:\t0000000000000000") || strings.Contains(r.stdout, "token") {
			t.Errorf("%s: guest state %q", id, r.stdout)
		}
	}
	// Another size is another class: made cold, not from the pool.
	r := e.cli("", "create", "--memory", "256m")
	if r.code != 0 {
		t.Fatalf("create 256m: %+v", r)
	}
	cold := strings.TrimSpace(r.stdout)
	e.waitEvent(cold, "sandbox.created", func(ev api.Event) bool { return ev.Kind == api.EventSandboxCreated })
	if k := eventKinds(e, cold); contains(k, "pool.claimed") {
		t.Errorf("a 256m create was served from the default-size pool: %v", k)
	}
	st = e.waitPoolReady(class, 2)
	if st.Claims+st.Misses != 2 || st.Claims == 0 || st.Fills < 2+st.Claims {
		t.Errorf("pool counters %+v after 2 creates", st)
	}
	// The pooled sandboxes are store rows of no tenant: the pool's status
	// names them; no tenant, the admin included, can see or remove them.
	pooled := st.Sandboxes
	if len(pooled) != 2 {
		t.Fatalf("pooled sandboxes %v, want 2", pooled)
	}
	for _, id := range pooled {
		if r := e.cli("", "inspect", id); r.code == 0 {
			t.Errorf("inspect of pooled %s: %+v", id, r)
		}
		if r := e.cli("", "rm", id); r.code == 0 {
			t.Errorf("rm of pooled %s: %+v", id, r)
		}
	}

	// Kill the daemon with two sandboxes in the pool: the next start
	// destroys them (state dir, link, container) and re-attaches the
	// claimed ones.
	if n := len(hostIfs()); n != 5 {
		t.Errorf("%d sandbox interfaces before the restart, want 5 (3 sandboxes, 2 pooled)", n)
	}
	e.stopDaemon(syscall.SIGKILL)
	for _, id := range pooled {
		if rt == "container" && len(cgroupsOf(id)) == 0 {
			t.Errorf("pooled %s has no cgroup before the restart: the check below would prove nothing", id)
		}
	}
	e.startDaemon(up.daemonArgs("api.example.test")...)
	for _, id := range pooled {
		if _, err := os.Stat(filepath.Join(e.home, "sandboxes", id)); err == nil {
			t.Errorf("state dir of pooled %s left after restart", id)
		}
		if left := cgroupsOf(id); len(left) != 0 {
			t.Errorf("pooled %s left after restart: %v", id, left)
		}
	}
	if _, err := os.Stat(filepath.Join(e.home, "sandboxes", "pool")); err == nil {
		t.Error("a pool record directory exists")
	}
	if n := len(hostIfs()); n != 3 {
		t.Errorf("%d sandbox interfaces after the restart, want 3: %v", n, hostIfs())
	}
	if got := len(e.pools().Pools); got != 0 {
		t.Errorf("a daemon started without --pool has %d pools", got)
	}
	if r := e.cli("", "exec", ids[0], "--", "sh", "-c", `curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://api.example.test/after-restart`); r.code != 0 || strings.Contains(r.stdout, "denied") {
		t.Errorf("claimed sandbox after a restart: %+v", r)
	}
}

// TestPoolFlagErrors: a bad --pool stops the daemon with a message that
// says what to write.
func TestPoolFlagErrors(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ arg, want string }{
		{"container=2", "RUNTIME:IMAGE"},
		{"container:busybox=x", "RUNTIME:IMAGE"},
		{"nosuch:busybox=1", `no runtime "nosuch"`},
		{"container:nosuchimage=1", "image"},
	} {
		r := e.cli("", "daemon", "--agent", filepath.Join(binDir, "cagebox-agent"), "--pool", tc.arg)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("--pool %s: %+v (want an error mentioning %q)", tc.arg, r, tc.want)
		}
	}
}

// cgroupsOf lists the cgroups named for sandbox id (cgroup v1
// controllers or v2, below the runtime's parent) and the live processes
// in them (a zombie is dead: its new parent, the host's init after the
// daemon was killed, reaps it).
func cgroupsOf(id string) []string {
	var out []string
	for _, pat := range []string{"/sys/fs/cgroup/*/*/" + id, "/sys/fs/cgroup/*/" + id} {
		dirs, _ := filepath.Glob(pat)
		out = append(out, dirs...)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "/"+id) {
			continue
		}
		dir := filepath.Dir(p)
		stat, _ := os.ReadFile(filepath.Join(dir, "stat"))
		if _, after, ok := strings.Cut(string(stat), ") "); ok && strings.HasPrefix(after, "Z") {
			continue
		}
		out = append(out, fmt.Sprintf("process %s (%s)", filepath.Base(dir), stat))
	}
	return out
}

// hostIfs lists the host's sandbox interfaces (this run's prefix).
func hostIfs() []string {
	ifs, _ := net.Interfaces()
	var out []string
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, os.Getenv("CAGEBOX_NET_IFPREFIX")) {
			out = append(out, i.Name)
		}
	}
	return out
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// TestIdleActionPause: --idle-action pause freezes an idle sandbox (its
// processes stop: a counter does not advance) and the next exec wakes it
// with its state intact; `inspect` and the events say why.
func TestIdleActionPause(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	r := e.cli("", "create", "--idle-timeout", "2s", "--idle-action", "pause")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	if r := e.cli("", "exec", id, "--", "sh", "-c", "echo kept > /tmp/state; (while :; do echo x >> /tmp/ticks; sleep 0.2; done) >/dev/null 2>&1 &"); r.code != 0 {
		t.Fatalf("exec: %+v", r)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		sb, err := e.client().Get(context.Background(), id)
		if err == nil && sb.Status == "paused" {
			if sb.IdleAction != "pause" {
				t.Errorf("inspect: idle action %q", sb.IdleAction)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not paused after its idle timeout: %+v %v", sb, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.waitEvent(id, "sandbox.paused with the idle reason", func(ev api.Event) bool {
		return ev.Kind == api.EventSandboxPaused && strings.Contains(string(dataOf(ev)), "idle for more than 2s")
	})
	// Frozen: the guest's loop does not run. The exec that looks wakes it,
	// so count right after waking and compare with a second look.
	time.Sleep(time.Second)
	r = e.cli("", "exec", id, "--", "sh", "-c", "cat /tmp/state; wc -l < /tmp/ticks")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "kept\n") {
		t.Fatalf("exec on an idle-paused sandbox: %+v", r)
	}
	e.waitEvent(id, "sandbox.resumed by exec", func(ev api.Event) bool {
		return ev.Kind == api.EventSandboxResumed && strings.Contains(string(dataOf(ev)), `"exec"`)
	})
	if sb, _ := e.client().Get(context.Background(), id); sb.Status != "running" {
		t.Fatalf("after the exec: %s", sb.Status)
	}
	// Pausing by hand is not undone by an exec.
	if r := e.cli("", "pause", id); r.code != 0 {
		t.Fatal(r)
	}
	if r := e.cli("", "exec", id, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "cagebox resume") {
		t.Fatalf("exec on a sandbox paused by hand: %+v", r)
	}
	if r := e.cli("", "create", "--idle-action", "pause"); r.code == 0 || !strings.Contains(r.stderr, "idle_timeout") {
		t.Fatalf("--idle-action without --idle-timeout: %+v", r)
	}
}
