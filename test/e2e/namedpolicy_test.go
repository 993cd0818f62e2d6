package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNamedPolicyAndTriggerActions: a sandbox created with --policy-ref
// follows its named policy's edits (the update lists it and it gets the
// new rules at once); a trigger of the updated policy revokes a vault
// secret and pauses the sandbox when its rule fires.
func TestNamedPolicyAndTriggerActions(t *testing.T) {
	e := newDebianEnv(t)
	names := []string{"api.example.test", "other.example.test"}
	up := newUpstream(t, names...)
	e.startDaemon(up.daemonArgs(names...)...)
	ctx := context.Background()
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cli := func(args ...string) result {
		t.Helper()
		r := e.cli("", args...)
		if r.code != 0 {
			t.Fatalf("cagebox %v: %+v", args, r)
		}
		return r
	}
	os.Setenv("CBX_E2E_TOK", "tok_RealValueNeverInTheGuest0001")
	defer os.Unsetenv("CBX_E2E_TOK")
	cli("secret", "add", "TOK", "--host", "other.example.test", "--from-env", "CBX_E2E_TOK")

	cli("policy", "create", "base", file("v1.yaml", "version: 1\nrules: [{name: api, host: api.example.test, action: allow}]\n"))
	if r := e.cli("", "policy", "create", "base", file("dup.yaml", "version: 1\nrules: []\n")); r.code == 0 || !strings.Contains(r.stderr, "exists") {
		t.Fatalf("create twice: %+v", r)
	}
	id := strings.TrimSpace(cli("create", "--policy-ref", "base").stdout)
	sh := func(script string) string {
		t.Helper()
		return e.cli("", "exec", id, "--", "sh", "-c", script).stdout
	}
	if got := sh("curl -sS -o /dev/null -w '%{http_code}' https://api.example.test/a; curl -sS -o /dev/null -w ' %{http_code}' https://other.example.test/a"); got != "200 000" { // no rule names other.example.test: it does not resolve
		t.Fatalf("under base v1: %q", got)
	}
	r := cli("policy", "update", "base", file("v2.yaml", `
version: 2
rules:
  - {name: api, host: api.example.test, action: allow}
  - {name: other, host: other.example.test, action: allow}
triggers:
  - {name: done, after: other, do: {revoke: [TOK], pause: true}}
`))
	if !strings.Contains(r.stdout, "generation 2") || !strings.Contains(r.stdout, id) {
		t.Fatalf("update did not reach the sandbox: %+v", r)
	}
	p, err := e.client().Policy(ctx, id)
	if err != nil || p.Ref != "base" || p.Generation != 2 {
		t.Fatalf("sandbox policy after the update: %v %+v", err, p)
	}
	// The request that fires the trigger is allowed; then the secret is
	// revoked and the sandbox paused.
	// (In the background: the pause freezes the guest, exec included.)
	// Its output goes nowhere, so exec does not wait on it.
	sh("(curl -sS -o /dev/null https://other.example.test/fire >/dev/null 2>&1 </dev/null &) ; true")
	waitFor(t, 20*time.Second, "the firing request upstream", func() bool {
		return strings.Contains(strings.Join(up.requests(), "\n"), "/fire")
	})
	waitFor(t, 20*time.Second, "the trigger's pause and revoke", func() bool {
		sb, err := e.client().Get(ctx, id)
		if err != nil || sb.Status != "paused" {
			return false
		}
		ss, err := e.client().Secrets(ctx)
		if err != nil {
			return false
		}
		for _, s := range ss {
			if s.Name == "TOK" {
				return s.RevokedAt != nil
			}
		}
		return false
	})
	// A named policy followed by a running sandbox cannot be deleted.
	if r := e.cli("", "policy", "delete", "base"); r.code == 0 || !strings.Contains(r.stderr, "follow") {
		t.Fatalf("delete while followed: %+v", r)
	}
	cli("rm", id)
}
