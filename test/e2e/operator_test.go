package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// tenantEnv is a daemon listening on TCP too (daemon args extra), with
// tenant alpha and its API key: asAdmin runs the CLI as the admin (the
// unix socket), asAlpha as alpha (its key over TCP), and alpha is alpha's
// Go client.
type tenantEnv struct {
	*env
	args    []string
	alpha   *client.Client
	asAdmin func(args ...string) result
	asAlpha func(args ...string) result
}

func newTenantEnv(t *testing.T, e *env, extra ...string) *tenantEnv {
	t.Helper()
	addr := freePort(t)
	te := &tenantEnv{env: e, args: append([]string{"--listen", addr}, extra...)}
	e.startDaemon(te.args...)
	ctx := context.Background()
	if _, err := e.client().CreateTenant(ctx, &api.CreateTenantRequest{Name: "alpha"}); err != nil {
		t.Fatal(err)
	}
	k, err := e.client().CreateKey(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	te.alpha = client.TCP("http://"+addr, k.Key)
	te.asAdmin = func(args ...string) result {
		t.Helper()
		r := e.cli("", args...)
		if r.code != 0 {
			t.Fatalf("admin: cagebox %v: %+v", args, r)
		}
		return r
	}
	te.asAlpha = func(args ...string) result {
		t.Helper()
		return e.cliEnv([]string{"CAGEBOX_HOST=http://" + addr, "CAGEBOX_API_KEY=" + k.Key}, "", args...)
	}
	return te
}

// restart kills the daemon (SIGKILL: nothing is written on the way out)
// and starts it again with the same flags.
func (te *tenantEnv) restart() {
	te.stopDaemon(syscall.SIGKILL)
	te.startDaemon(te.args...)
}

// alphaPost is alpha's POST of body to path over its key; it returns the
// status code.
func (te *tenantEnv) alphaPost(t *testing.T, path, body string) int {
	t.Helper()
	resp, err := te.alpha.Raw(context.Background(), "POST", path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestFreezeSurvivesRestart: the operator's freeze outlives the daemon.
// The admin freezes a tenant's sandbox through the real CLI; after a
// daemon restart (SIGKILL) the sandbox is still frozen — policy get says
// so, its egress is refused by the freeze rule — and the tenant's thaw is
// still refused with 403 while the admin's thaw works.
func TestFreezeSurvivesRestart(t *testing.T) {
	names := []string{"api.example.test"}
	e := newDebianEnv(t)
	up := newUpstream(t, names...)
	te := newTenantEnv(t, e, up.daemonArgs(names...)...)
	ctx := context.Background()
	sb, err := te.alpha.Create(ctx, &api.CreateSandboxRequest{Allow: names})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	sh := func(script string) result {
		t.Helper()
		return te.asAlpha("exec", id, "--", "sh", "-c", script)
	}
	if r := sh("curl -sS -o /dev/null -w '%{http_code}' https://api.example.test/before"); r.stdout != "200" {
		t.Fatalf("before the freeze: %+v", r)
	}
	// The address the guest was given (the gateway journals it: a
	// restart keeps it), to reach the proxy while DNS refuses.
	ip := strings.Fields(sh("getent hosts api.example.test").stdout + " x")[0]
	frozen := func(want bool) {
		t.Helper()
		p, err := te.alpha.Policy(ctx, id)
		if err != nil || p.Frozen != want {
			t.Fatalf("policy: frozen %v (%v); want frozen %v", p != nil && p.Frozen, err, want)
		}
	}

	te.asAdmin("freeze", id)
	frozen(true)
	te.restart()
	frozen(true)
	if r := te.asAlpha("policy", "get", id); r.code != 0 || !strings.Contains(r.stdout, "FROZEN") {
		t.Fatalf("policy get after the restart: %+v; want it to say frozen", r)
	}
	after := lastSeq(t, e, id)
	if r := sh("curl -sS -m 10 -o /dev/null -w '%{http_code}' --resolve api.example.test:443:" + ip + " https://api.example.test/after"); r.stdout == "200" {
		t.Fatalf("the frozen sandbox got through after a restart: %+v", r)
	}
	// The event path is asynchronous: wait for the deny to be recorded.
	e.waitEvent(id, "egress.deny by the freeze rule after the restart", func(ev api.Event) bool {
		return ev.Seq > after && egressDeniedBy(ev, "freeze")
	})
	if r := sh("getent hosts api.example.test"); r.code == 0 {
		t.Fatalf("the frozen sandbox resolved a name after a restart: %+v", r)
	}

	// The tenant still cannot thaw it, by sandbox or by tenant.
	if r := te.asAlpha("thaw", id); r.code == 0 || !strings.Contains(r.stderr, "frozen by the admin") {
		t.Fatalf("alpha's thaw after the restart: %+v; want a refusal naming the admin", r)
	}
	if code := te.alphaPost(t, "/v1/thaw", `{"sandbox":"`+id+`"}`); code != http.StatusForbidden {
		t.Fatalf("alpha's POST /v1/thaw after the restart answered %d, want 403", code)
	}
	if r := te.asAlpha("thaw", "--tenant", "alpha"); r.code != 0 || !strings.Contains(r.stdout, "still frozen") {
		t.Fatalf("alpha thaws its tenant after the restart: %+v; want %s still frozen", r, id)
	}
	frozen(true)

	// The admin's thaw works, and it too outlives the daemon.
	te.asAdmin("thaw", id)
	frozen(false)
	te.restart()
	frozen(false)
	if r := sh("curl -sS -o /dev/null -w '%{http_code}' https://api.example.test/thawed"); r.stdout != "200" {
		t.Fatalf("after the admin's thaw and a restart: %+v", r)
	}
}

// lastSeq is the newest event's sequence number of sandbox id.
func lastSeq(t *testing.T, e *env, id string) int64 {
	t.Helper()
	evs, err := e.client().Events(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) == 0 {
		return 0
	}
	return evs[len(evs)-1].Seq
}

// egressDeniedBy reports whether ev is an egress.deny by rule.
func egressDeniedBy(ev api.Event, rule string) bool {
	if ev.Kind != api.EventEgressDeny {
		return false
	}
	var d api.Egress
	return json.Unmarshal(dataOf(ev), &d) == nil && d.Rule == rule
}

// TestOperatorPauseStands: what the operator pauses only the operator
// resumes. Through the real CLI, the admin pauses a tenant's sandbox (one
// whose idle action is pause, so an implicit wake would be easy); the
// tenant's `cagebox resume` is refused with 403 saying only the operator
// can resume it, and its exec does not wake the sandbox — before and
// after a daemon restart. The admin's resume works; the tenant's own
// pause is its own to resume, until the admin pauses it too.
func TestOperatorPauseStands(t *testing.T) {
	te := newTenantEnv(t, newEnv(t))
	ctx := context.Background()
	r := te.asAlpha("create", "--idle-timeout", "10m", "--idle-action", "pause")
	if r.code != 0 {
		t.Fatalf("alpha: create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	status := func() *api.Sandbox {
		t.Helper()
		sb, err := te.client().Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	stands := func(when string) {
		t.Helper()
		if r := te.asAlpha("resume", id); r.code == 0 || !strings.Contains(r.stderr, "only the operator can resume it") {
			t.Fatalf("%s: alpha's cagebox resume: %+v; want a refusal saying only the operator can resume it", when, r)
		}
		if code := te.alphaPost(t, "/v1/sandboxes/"+id+"/resume", ""); code != http.StatusForbidden {
			t.Fatalf("%s: alpha's POST /v1/sandboxes/%s/resume answered %d, want 403", when, id, code)
		}
		if r := te.asAlpha("exec", id, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "paused by the operator") {
			t.Fatalf("%s: alpha's exec on the admin's pause: %+v; want refused, paused by the operator", when, r)
		}
		if sb := status(); sb.Status != "paused" || sb.PausedBy != "admin" {
			t.Fatalf("%s: %s, paused by %q; want paused by admin", when, sb.Status, sb.PausedBy)
		}
	}

	te.asAdmin("pause", id)
	stands("after the admin's pause")
	te.restart()
	stands("after a daemon restart")
	te.asAdmin("resume", id)
	if r := te.asAlpha("exec", id, "--", "echo", "ok"); r.code != 0 || r.stdout != "ok\n" {
		t.Fatalf("alpha's exec after the admin's resume: %+v", r)
	}

	// The tenant's own pause: its exec is told to resume, and its resume
	// works.
	if r := te.asAlpha("pause", id); r.code != 0 {
		t.Fatalf("alpha pauses its sandbox: %+v", r)
	}
	if sb := status(); sb.PausedBy != "alpha" {
		t.Fatalf("alpha's pause: paused by %q", sb.PausedBy)
	}
	if r := te.asAlpha("exec", id, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "cagebox resume") {
		t.Fatalf("alpha's exec on its own pause: %+v", r)
	}
	if r := te.asAlpha("resume", id); r.code != 0 {
		t.Fatalf("alpha resumes its own pause: %+v", r)
	}
	if r := te.asAlpha("exec", id, "--", "echo", "ok"); r.code != 0 || r.stdout != "ok\n" {
		t.Fatalf("alpha's exec after its resume: %+v", r)
	}

	// The admin pausing what the tenant paused takes the pause over.
	if r := te.asAlpha("pause", id); r.code != 0 {
		t.Fatalf("alpha pauses its sandbox: %+v", r)
	}
	te.asAdmin("pause", id)
	stands("after the admin's pause over alpha's")
	te.asAdmin("resume", id)
}
