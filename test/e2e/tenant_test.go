package e2e

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestTenantIsolation: tenant B can neither see nor touch tenant A's
// sandbox through any endpoint, and a non-admin cannot manage tenants.
func TestTenantIsolation(t *testing.T) {
	e := newEnv(t)
	addr := freePort(t)
	e.startDaemon("--listen", addr)
	ctx := context.Background()
	admin := e.client()
	keys := map[string]string{}
	for _, name := range []string{"alpha", "beta"} {
		if _, err := admin.CreateTenant(ctx, &api.CreateTenantRequest{Name: name}); err != nil {
			t.Fatal(err)
		}
		k, err := admin.CreateKey(ctx, name)
		if err != nil || !strings.HasPrefix(k.Key, "cbk_") {
			t.Fatalf("key: %+v %v", k, err)
		}
		keys[name] = k.Key
	}
	a := client.TCP("http://"+addr, keys["alpha"])
	b := client.TCP("http://"+addr, keys["beta"])
	sb, err := a.Create(ctx, &api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Tenant != "alpha" {
		t.Fatalf("sandbox tenant %q", sb.Tenant)
	}
	id := sb.ID
	p := "/v1/sandboxes/" + id
	for _, tc := range []struct{ method, path, body string }{
		{"GET", p, ""},
		{"DELETE", p, ""},
		{"POST", p + "/exec", `{"argv":["true"]}` + "\n"},
		{"POST", p + "/stop", ""},
		{"POST", p + "/pause", ""},
		{"POST", p + "/resume", ""},
		{"GET", p + "/files?path=/etc/hostname", ""},
		{"PUT", p + "/files?path=/tmp/x", "data"},
		{"GET", p + "/dir?path=/", ""},
		{"GET", "/v1/events?sandbox=" + id, ""},
		{"DELETE", p + "/secrets/ANY", ""},
		{"GET", p + "/policy", ""},
		{"PUT", p + "/policy", `{"version":1,"default":"allow","rules":[]}`},
		{"PATCH", p + "/policy", `{"op":"add","rule":{"host":"evil.test","action":"allow"}}`},
		{"GET", p + "/policy/history", ""},
		{"GET", p + "/policy/usage", ""},
		{"POST", "/v1/freeze", `{"sandbox":"` + id + `"}`},
		{"POST", "/v1/freeze", `{"tenant":"alpha"}`},
		{"POST", "/v1/thaw", `{"sandbox":"` + id + `"}`},
		{"POST", p + "/ports", `{"port":8080}`},
		{"GET", p + "/ports", ""},
		{"DELETE", p + "/ports/8080", ""},
		{"POST", p + "/ports/8080/url", `{}`},
	} {
		resp, err := b.Raw(ctx, tc.method, tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var ae api.Error
		_ = json.NewDecoder(resp.Body).Decode(&ae)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("tenant beta: %s %s answered %d (%s), want 404", tc.method, tc.path, resp.StatusCode, ae.Error)
		}
	}
	// Freezing everything is the admin's.
	if _, err := b.Freeze(ctx, &api.FreezeRequest{All: true}); err == nil || !strings.Contains(err.Error(), "admin") {
		t.Errorf("tenant beta froze all: %v", err)
	}
	if pol, err := a.Policy(ctx, id); err != nil || pol.Frozen || pol.Generation != 1 {
		t.Errorf("alpha's policy after beta's attempts: %+v %v", pol, err)
	}
	// Named policies are the tenant's own.
	if _, err := a.CreateNamedPolicy(ctx, "alpha-pol", []byte(`{"version":1,"rules":[]}`)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/v1/policies/alpha-pol", ""},
		{"PUT", "/v1/policies/alpha-pol", `{"version":1,"default":"allow","rules":[]}`},
		{"DELETE", "/v1/policies/alpha-pol", ""},
		{"POST", "/v1/approvals/ap-0000000000000000", `{"decision":"allow"}`},
	} {
		resp, err := b.Raw(ctx, tc.method, tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("tenant beta: %s %s answered %d, want 404", tc.method, tc.path, resp.StatusCode)
		}
	}
	if l, err := b.NamedPolicies(ctx); err != nil || len(l) != 0 {
		t.Errorf("tenant beta lists policies %+v %v", l, err)
	}
	if l, err := b.Approvals(ctx, "", ""); err != nil || len(l) != 0 {
		t.Errorf("tenant beta lists approvals %+v %v", l, err)
	}
	if np, err := a.NamedPolicy(ctx, "alpha-pol"); err != nil || np.Generation != 1 {
		t.Errorf("alpha's named policy after beta's attempts: %+v %v", np, err)
	}
	if _, err := a.PutSecret(ctx, &api.PutSecretRequest{Name: "ALPHA_KEY", Value: "alpha-secret-value-1234", Hosts: []string{"api.alpha.test"}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/v1/secrets/ALPHA_KEY", ""},
		{"PUT", "/v1/secrets/ALPHA_KEY", `{"value":"overwritten-by-beta"}`},
		{"POST", "/v1/secrets/ALPHA_KEY/revoke", ""},
		{"DELETE", "/v1/secrets/ALPHA_KEY", ""},
	} {
		resp, err := b.Raw(ctx, tc.method, tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("tenant beta: %s %s answered %d, want 404", tc.method, tc.path, resp.StatusCode)
		}
	}
	if l, err := b.Secrets(ctx); err != nil || len(l) != 0 {
		t.Errorf("tenant beta lists secrets %+v %v", l, err)
	}
	if l, err := a.Secrets(ctx); err != nil || len(l) != 1 || l[0].Version != 1 || l[0].RevokedAt != nil {
		t.Errorf("alpha's secret after beta's attempts: %+v %v", l, err)
	}
	if l, err := b.List(ctx); err != nil || len(l) != 0 {
		t.Errorf("tenant beta lists %+v %v", l, err)
	}
	if evs, err := b.Events(ctx, "", 0); err != nil || len(evs) != 0 {
		t.Errorf("tenant beta sees events %+v %v", evs, err)
	}
	// The sandbox is intact for its owner.
	var out strings.Builder
	res, err := a.Exec(ctx, id, &api.ExecRequest{Argv: []string{"echo", "mine"}}, nil, &out, &out)
	if err != nil || *res.ExitCode != 0 || out.String() != "mine\n" {
		t.Fatalf("owner exec after attacks: %q %+v %v", out.String(), res, err)
	}
	if l, err := a.List(ctx); err != nil || len(l) != 1 {
		t.Fatalf("owner list: %+v %v", l, err)
	}
	// Admin endpoints.
	if _, err := b.CreateTenant(ctx, &api.CreateTenantRequest{Name: "evil"}); err == nil || !strings.Contains(err.Error(), "admin") {
		t.Errorf("non-admin created a tenant: %v", err)
	}
	if _, err := b.CreateKey(ctx, "alpha"); err == nil {
		t.Error("tenant beta minted a key for alpha")
	}
	// No key, a wrong key.
	for _, key := range []string{"", "cbk_" + strings.Repeat("0", 64)} {
		c := client.TCP("http://"+addr, key)
		if _, err := c.List(ctx); err == nil || !strings.Contains(err.Error(), "API key") {
			t.Errorf("key %q: %v", key, err)
		}
	}
	if err := a.Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// TestTenantFloors: an untrusted (multi-tenant) tenant's floor is
// hypervisor: a weaker runtime it names is refused with the floor in the
// message, the daemon's default gives way to the strongest runtime that
// meets it, and `runtimes` says so.
func TestTenantFloors(t *testing.T) {
	e := newEnv(t)
	addr := freePort(t)
	e.startDaemon("--listen", addr)
	ctx := context.Background()
	admin := e.client()
	if _, err := admin.CreateTenant(ctx, &api.CreateTenantRequest{Name: "mixed", Untrusted: true, MinIsolation: "namespaces"}); err == nil || !strings.Contains(err.Error(), "untrusted") {
		t.Fatalf("untrusted tenant with a namespaces floor: %v", err)
	}
	tn, err := admin.CreateTenant(ctx, &api.CreateTenantRequest{Name: "agents", Untrusted: true})
	if err != nil || !tn.Untrusted || tn.Floor != "hypervisor" {
		t.Fatalf("untrusted tenant: %+v %v", tn, err)
	}
	if r := e.cli("", "tenant", "ls"); !strings.Contains(r.stdout, "agents") || !strings.Contains(r.stdout, "hypervisor") {
		t.Errorf("tenant ls: %+v", r)
	}
	k, err := admin.CreateKey(ctx, "agents")
	if err != nil {
		t.Fatal(err)
	}
	c := client.TCP("http://"+addr, k.Key)
	rts, err := c.Runtimes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	weaker := 0
	for _, rt := range rts {
		if rt.Class == "hypervisor" {
			continue
		}
		weaker++
		_, err := c.Create(ctx, &api.CreateSandboxRequest{Runtime: rt.Name})
		if err == nil || !strings.Contains(err.Error(), "below the isolation floor hypervisor") {
			t.Errorf("untrusted tenant asking for %s: %v", rt.Name, err)
		}
	}
	if weaker == 0 {
		t.Fatalf("no runtime below hypervisor listed: %+v", rts)
	}
	for _, rt := range rts {
		if rt.Class != "hypervisor" && (rt.Default || (rt.Available && !strings.Contains(rt.Reason, "floor"))) {
			t.Errorf("runtimes for an untrusted tenant: %+v", rt)
		}
	}
	if r := e.cli("", "ls", "--json"); strings.Contains(r.stdout, `"id"`) {
		t.Fatalf("refused creates left sandboxes: %s", r.stdout)
	}
	// The daemon's default (container in these tests) gives way to auto:
	// a hypervisor sandbox where one can run, else a clear refusal.
	sb, err := c.Create(ctx, &api.CreateSandboxRequest{Image: "busybox", Timeout: "2m"})
	if err != nil {
		if !strings.Contains(err.Error(), "hypervisor") {
			t.Fatalf("default runtime for an untrusted tenant: %v", err)
		}
		return
	}
	defer c.Remove(ctx, sb.ID)
	if sb.Class != "hypervisor" {
		t.Fatalf("untrusted tenant's sandbox runs on %s (%s)", sb.Runtime, sb.Class)
	}
}

// TestFreezeOwner: the operator's freeze stands. Through the real CLI, a
// tenant (API key over TCP) can thaw neither a sandbox nor its tenant the
// admin (unix socket) froze — the 403 says who froze it and that only they
// or the admin thaw it; its thaw of its own tenant leaves the admin's
// sandbox-level freeze in place; freezing an admin-frozen sandbox again
// does not make the freeze the tenant's. What a tenant froze it thaws.
func TestFreezeOwner(t *testing.T) {
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
	sb, err := a.Create(ctx, &api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	asAdmin := func(args ...string) result {
		t.Helper()
		r := e.cli("", args...)
		if r.code != 0 {
			t.Fatalf("admin: cagebox %v: %+v", args, r)
		}
		return r
	}
	asAlpha := func(args ...string) result {
		t.Helper()
		return e.cliEnv([]string{"CAGEBOX_HOST=http://" + addr, "CAGEBOX_API_KEY=" + k.Key}, "", args...)
	}
	refused := func(r result, args ...string) {
		t.Helper()
		if r.code == 0 || !strings.Contains(r.stderr, "frozen by the admin") || !strings.Contains(r.stderr, "only the admin can thaw") {
			t.Fatalf("alpha: cagebox %v: %+v; want a refusal naming the admin", args, r)
		}
	}
	frozen := func(want bool) {
		t.Helper()
		p, err := a.Policy(ctx, id)
		if err != nil || p.Frozen != want {
			t.Fatalf("policy: %+v %v; want frozen %v", p, err, want)
		}
	}

	// The admin freezes the sandbox.
	asAdmin("freeze", id)
	refused(asAlpha("thaw", id), "thaw", id)
	resp, err := a.Raw(ctx, "POST", "/v1/thaw", "application/json", strings.NewReader(`{"sandbox":"`+id+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("alpha's POST /v1/thaw answered %d, want 403", resp.StatusCode)
	}
	if r := asAlpha("thaw", "--tenant", "alpha"); r.code != 0 || !strings.Contains(r.stdout, "still frozen") || !strings.Contains(r.stdout, id) {
		t.Fatalf("alpha thaws its tenant: %+v; want success listing %s as still frozen", r, id)
	}
	frozen(true)
	if r := asAlpha("freeze", id); r.code != 0 {
		t.Fatalf("alpha freezes its own sandbox: %+v", r)
	}
	refused(asAlpha("thaw", id), "thaw", id)
	frozen(true)
	asAdmin("thaw", id)
	frozen(false)

	// The admin freezes the tenant: neither the tenant nor one sandbox
	// of it thaws for the tenant.
	asAdmin("freeze", "--tenant", "alpha")
	refused(asAlpha("thaw", "--tenant", "alpha"), "thaw", "--tenant", "alpha")
	refused(asAlpha("thaw", id), "thaw", id)
	frozen(true)
	asAdmin("thaw", "--tenant", "alpha")
	frozen(false)

	// What the tenant froze, it thaws.
	if r := asAlpha("freeze", "--tenant", "alpha"); r.code != 0 {
		t.Fatalf("alpha freezes its tenant: %+v", r)
	}
	frozen(true)
	if r := asAlpha("thaw", "--tenant", "alpha"); r.code != 0 || strings.Contains(r.stdout, "still frozen") {
		t.Fatalf("alpha thaws its own freeze: %+v", r)
	}
	frozen(false)
}
