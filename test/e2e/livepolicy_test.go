package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/livepolicy"
)

// TestLivePolicy changes a running sandbox's policy through the real CLI
// while the guest talks through the gateway: an allow added between two
// requests of one open HTTP/2 connection applies to the second; a hold is
// approved from the CLI, another by a signed local webhook, another times
// out; a narrowing trigger fires; a request budget is spent and survives a
// daemon restart; freeze cuts the sandbox off and thaw restores it.
func TestLivePolicy(t *testing.T) {
	e := newDebianEnv(t)
	names := []string{"api.example.test", "other.example.test", "stripe.example.test"}
	up := newUpstream(t, names...)
	// The receiver is on loopback: the operator's flag lets a tenant's URL
	// reach it.
	e.startDaemon(append(up.daemonArgs(names...), "--tenant-urls-allow-private")...)
	ctx := context.Background()

	// The approval webhook: a local receiver that checks the signature
	// with the tenant's key (`cagebox approvals webhook-key`; not the
	// daemon's file) and allows paths under /ok.
	kr := e.cli("", "approvals", "webhook-key")
	key := []byte(strings.TrimSpace(kr.stdout))
	if kr.code != 0 || len(key) != 64 {
		t.Fatalf("approvals webhook-key: %+v", kr)
	}
	if daemonKey, err := os.ReadFile(filepath.Join(e.home, "approval-webhook.key")); err != nil || string(daemonKey) == string(key) {
		t.Fatalf("the tenant's key is the daemon's (%v)", err)
	}
	var hookCalls, badSigs atomic.Int32
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hookCalls.Add(1)
		body, _ := io.ReadAll(r.Body)
		ts, _ := strconv.ParseInt(r.Header.Get(livepolicy.HeaderTimestamp), 10, 64)
		if r.Header.Get(livepolicy.HeaderSignature) != livepolicy.Sign(key, ts, body) {
			badSigs.Add(1)
			http.Error(w, "bad signature", 401)
			return
		}
		var wr livepolicy.WebhookRequest
		_ = json.Unmarshal(body, &wr)
		dec := "deny"
		// The preview is what the guest sent: the placeholder, not the
		// real value.
		if strings.HasPrefix(wr.Request.Path, "/ok") && wr.Request.Preview == "note=hello" {
			dec = "allow"
		}
		_ = json.NewEncoder(w).Encode(livepolicy.WebhookAnswer{Decision: dec})
	}))
	defer hook.Close()

	polFile := filepath.Join(t.TempDir(), "policy.yaml")
	writePolicy := func(s string) {
		if err := os.WriteFile(polFile, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := `
version: 2
rules:
  - {name: public, host: api.example.test, paths: ["/public/**"], action: allow}
  - {name: review, host: api.example.test, methods: [DELETE], action: hold, timeout: 30s}
  - {name: quick, host: api.example.test, methods: [PUT], action: hold, timeout: 1s}
  - {name: charge, host: stripe.example.test, methods: [POST], paths: [/v1/charges], action: allow}
  - {name: stripe, host: stripe.example.test, action: allow}
  - {name: other, host: other.example.test, action: allow}
budgets:
  - {name: other-calls, hosts: [other.example.test], requests: 3}
triggers:
  - {name: lock-to-stripe, after: charge, do: {only: [stripe.example.test]}}
`
	writePolicy(base)
	r := e.cli("", "create", "--policy", polFile)
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	sh := func(script string) result {
		t.Helper()
		return e.cli("", "exec", id, "--", "sh", "-c", script)
	}
	cli := func(args ...string) result {
		t.Helper()
		r := e.cli("", args...)
		if r.code != 0 {
			t.Fatalf("cagebox %v: %+v", args, r)
		}
		return r
	}

	// 1. Allow after start, on an open HTTP/2 connection: curl makes two
	// requests 3 s apart on one connection; the second path is allowed
	// between them.
	done := make(chan result, 1)
	go func() {
		done <- e.cli("", "exec", id, "--", "curl", "-sS", "--http2", "--rate", "20/m", "-o", "/dev/null", "-o", "/dev/null",
			"-w", "|%{http_code} %{http_version} %{num_connects}\n",
			"https://api.example.test/public/1", "https://api.example.test/private/2")
	}()
	waitFor(t, 20*time.Second, "the first request upstream", func() bool {
		return strings.Contains(strings.Join(up.requests(), "\n"), "/public/1")
	})
	cli("policy", "allow", id, "api.example.test", "--path", "/private/**", "--name", "private")
	r = <-done
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 || !strings.HasSuffix(lines[0], "|200 2 1") || !strings.HasSuffix(lines[1], "|200 2 0") {
		t.Fatalf("allow after start on an open HTTP/2 connection (want 200 on the reused connection): %+v", r)
	}
	// And taking it away applies to the next request.
	cli("policy", "rm-rule", id, "private")
	if r := sh("curl -sS -o /dev/null -w '%{http_code}' https://api.example.test/private/3"); r.stdout != "403" {
		t.Fatalf("after rm-rule: %+v", r)
	}

	// 2. A hold approved from the CLI.
	done = make(chan result, 1)
	go func() {
		done <- e.cli("", "exec", id, "--", "curl", "-sS", "-X", "DELETE", "-w", "|%{http_code}", "https://api.example.test/repos/x")
	}()
	apID := waitPendingCLI(t, e, id)
	cli("approvals", "approve", apID)
	if r := <-done; !strings.HasSuffix(r.stdout, "|200") || !strings.Contains(r.stdout, "hello from upstream api.example.test /repos/x") {
		t.Fatalf("approved hold: %+v", r)
	}
	// Denied from the CLI: a 403 naming the rule.
	go func() {
		done <- e.cli("", "exec", id, "--", "curl", "-sS", "-X", "DELETE", "-w", "|%{http_code}", "https://api.example.test/repos/y")
	}()
	apID = waitPendingCLI(t, e, id)
	cli("approvals", "deny", apID)
	if r := <-done; !strings.HasSuffix(r.stdout, "|403") || !strings.Contains(r.stdout, `"review"`) {
		t.Fatalf("denied hold: %+v", r)
	}
	// A hold with a 1 s timeout: denied, naming the rule.
	start := time.Now()
	if r := sh("curl -sS -X PUT -w '|%{http_code}' https://api.example.test/put"); !strings.HasSuffix(r.stdout, "|403") || !strings.Contains(r.stdout, `"quick"`) || !strings.Contains(r.stdout, "no decision within 1s") {
		t.Fatalf("hold timeout: %+v", r)
	}
	if el := time.Since(start); el < time.Second {
		t.Fatalf("a 1s hold answered in %v", el)
	}

	// 3. A hold decided by the signed webhook: /ok allowed, the rest
	// denied. The whole document is replaced (policy set).
	writePolicy(strings.Replace(base, "rules:", "approval: {webhook: \""+hook.URL+"/hook\", timeout: 10s}\nrules:", 1))
	cli("policy", "set", id, polFile)
	cli("policy", "rm-rule", id, "review")
	cli("policy", "hold", id, "api.example.test", "--method", "POST", "--name", "hooked", "--timeout", "20s")
	if r := sh("curl -sS -X POST -d note=hello -w '|%{http_code}' https://api.example.test/ok/1"); !strings.HasSuffix(r.stdout, "|200") || !strings.Contains(strings.Join(up.requests(), "\n"), "body=note=hello") {
		t.Fatalf("webhook allow: %+v", r)
	}
	if r := sh("curl -sS -X POST -d x -w '|%{http_code}' https://api.example.test/nope"); !strings.HasSuffix(r.stdout, "|403") || !strings.Contains(r.stdout, `"hooked"`) {
		t.Fatalf("webhook deny: %+v", r)
	}
	if hookCalls.Load() != 2 || badSigs.Load() != 0 {
		t.Fatalf("webhook calls %d, bad signatures %d", hookCalls.Load(), badSigs.Load())
	}

	// 4. A request budget: 3 requests to other.example.test, then 403
	// naming the budget.
	r = sh("for i in 1 2 3 4 5; do curl -sS -o /dev/null -w '%{http_code} ' https://other.example.test/b$i; done")
	if r.stdout != "200 200 200 403 403 " {
		t.Fatalf("request budget: %+v", r)
	}
	if r := sh("curl -sS https://other.example.test/b6"); !strings.Contains(r.stdout, "budget:other-calls") {
		t.Fatalf("budget denial names the budget: %+v", r)
	}
	us, err := e.client().PolicyUsage(ctx, id)
	if err != nil || len(us) != 1 || us[0].Requests != 3 || !us[0].Exhausted {
		t.Fatalf("usage: %v %+v", err, us)
	}

	// 5. A daemon restart keeps the policy's generation and the spent
	// budget.
	before, err := e.client().Policy(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	e.stopDaemon(9)
	e.startDaemon(up.daemonArgs(names...)...)
	after, err := e.client().Policy(ctx, id)
	if err != nil || after.Generation != before.Generation {
		t.Fatalf("after restart: %v generation %d, before %d", err, after.Generation, before.Generation)
	}
	if r := sh("curl -sS -o /dev/null -w '%{http_code}' https://other.example.test/b7"); r.stdout != "403" {
		t.Fatalf("budget after restart: %+v", r)
	}

	// 6. Freeze: DNS refuses and every request is denied; thaw restores.
	cli("freeze", id)
	if r := sh("curl -sS -m 5 -o /dev/null -w '%{http_code}' https://stripe.example.test/v1/balance"); r.stdout == "200" {
		t.Fatalf("frozen sandbox got through: %+v", r)
	}
	if r := sh("getent hosts stripe.example.test"); r.code == 0 {
		t.Fatalf("frozen sandbox resolved a name: %+v", r)
	}
	cli("thaw", id)
	if r := sh("curl -sS -o /dev/null -w '%{http_code}' https://stripe.example.test/v1/balance"); r.stdout != "200" {
		t.Fatalf("after thaw: %+v", r)
	}

	// 7. The narrowing trigger: after the first charge, only
	// stripe.example.test is reachable for the rest of the session.
	if r := sh("curl -sS -o /dev/null -w '%{http_code}' https://api.example.test/public/before"); r.stdout != "200" {
		t.Fatalf("before the charge: %+v", r)
	}
	apiIP := strings.Fields(sh("getent hosts api.example.test").stdout + " x")[0]
	if r := sh("curl -sS -X POST -d amount=1 -o /dev/null -w '%{http_code}' https://stripe.example.test/v1/charges"); r.stdout != "200" {
		t.Fatalf("charge: %+v", r)
	}
	// The name stops resolving; the address the guest already had gets a
	// 403 naming the narrowing.
	if r := sh("getent hosts api.example.test"); r.code == 0 {
		t.Fatalf("after the charge, api.example.test still resolves: %+v", r)
	}
	if r := sh("curl -sS -w '|%{http_code}' --resolve api.example.test:443:" + apiIP + " https://api.example.test/public/after"); !strings.HasSuffix(r.stdout, "|403") || !strings.Contains(r.stdout, `"only"`) {
		t.Fatalf("after the charge, api.example.test: %+v", r)
	}
	if r := sh("curl -sS -o /dev/null -w '%{http_code}' https://stripe.example.test/v1/balance"); r.stdout != "200" {
		t.Fatalf("after the charge, stripe: %+v", r)
	}

	// The history names every change and who made it.
	r = cli("policy", "history", id, "--json")
	var hist []api.PolicyVersion
	if err := json.Unmarshal([]byte(r.stdout), &hist); err != nil {
		t.Fatal(err)
	}
	actors := map[string]bool{}
	for _, v := range hist {
		actors[strings.SplitN(v.Actor, ":", 2)[0]] = true
	}
	if !actors["create"] || !actors["api"] || !actors["trigger"] {
		t.Fatalf("history actors %v", actors)
	}
	evs, err := e.client().Events(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, ev := range evs {
		kinds[string(ev.Kind)] = true
	}
	for _, k := range []string{"policy.changed", "approval.pending", "approval.decided", "policy.budget_exhausted", "policy.frozen", "policy.thawed", "policy.trigger"} {
		if !kinds[k] {
			t.Errorf("no %s event", k)
		}
	}
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitPendingCLI returns the id of the sandbox's pending approval, read
// through the CLI.
func waitPendingCLI(t *testing.T, e *env, sb string) string {
	t.Helper()
	var id string
	waitFor(t, 20*time.Second, "a pending approval", func() bool {
		r := e.cli("", "approvals", "ls", "--sandbox", sb, "--json")
		var as []api.Approval
		if json.Unmarshal([]byte(r.stdout), &as) == nil && len(as) > 0 {
			id = as[0].ID
			return true
		}
		return false
	})
	return id
}
