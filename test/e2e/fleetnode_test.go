package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// TestFleetNodeAPI: what the fleet controller drives on a node, through
// the real daemon and CLI: the fleet admin key over TCP (a wrong key is a
// 401, a tenant's key cannot reach admin routes), pool targets set at
// runtime on a daemon started without --pool, a labelled create served
// from that pool and found by its labels (also after a daemon restart),
// a tenant refused the fleet's labels, and dropping the pool destroying
// its sandboxes.
func TestFleetNodeAPI(t *testing.T) {
	e := newEnv(t)
	addr := freePort(t)
	const key = "fleet-admin-key-e2e-0123456789abcdefghijkl"
	kf := filepath.Join(t.TempDir(), "admin.key")
	if err := os.WriteFile(kf, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.startDaemon("--listen", addr, "--admin-key-file", kf)
	ctx := context.Background()
	url := "http://" + addr
	admin := client.TCP(url, key)

	var ae *client.Error
	if _, err := client.TCP(url, key+"x").Tenants(ctx); !errors.As(err, &ae) || ae.Status != 401 {
		t.Fatalf("a wrong admin key: %v, want 401", err)
	}
	if _, err := admin.CreateTenant(ctx, &api.CreateTenantRequest{Name: "other"}); err != nil {
		t.Fatalf("an admin route with the fleet key: %v", err)
	}
	tk, err := admin.CreateKey(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	tenant := client.TCP(url, tk.Key)
	if _, err := tenant.SetPools(ctx, &api.SetPoolsRequest{}); !errors.As(err, &ae) || ae.Status != 403 {
		t.Fatalf("PUT /v1/pools with a tenant key: %v, want 403", err)
	}
	if _, err := tenant.Create(ctx, &api.CreateSandboxRequest{Labels: map[string]string{"cagebox.dev/uid": "u-1"}}); !errors.As(err, &ae) || ae.Status != 403 {
		t.Fatalf("a tenant's cagebox.dev/ label: %v, want 403", err)
	}

	rt := e2eRuntime()
	class := rt + ":default"
	if _, err := admin.SetPools(ctx, &api.SetPoolsRequest{Targets: []api.PoolTarget{{Runtime: rt, Image: "nope", Size: 1}}}); !errors.As(err, &ae) || ae.Status != 400 {
		t.Fatalf("a pool of a missing image: %v, want 400", err)
	}
	if _, err := admin.SetPools(ctx, &api.SetPoolsRequest{Targets: []api.PoolTarget{{Runtime: rt, Image: "default", Size: 1}}}); err != nil {
		t.Fatal(err)
	}
	e.waitPoolReady(class, 1)

	env := []string{"CAGEBOX_HOST=" + url, "CAGEBOX_API_KEY=" + key}
	r := e.cliEnv(env, "", "create", "--runtime", rt, "--label", "cagebox.dev/uid=u-1", "--label", "app=web")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	e.waitEvent(id, "pool.claimed", func(ev api.Event) bool { return ev.Kind == api.EventPoolClaimed })
	if r := e.cliEnv(env, "", "ls", "--label", "cagebox.dev/uid=u-1"); r.code != 0 || !strings.Contains(r.stdout, id) {
		t.Fatalf("ls --label: %+v", r)
	}
	if r := e.cliEnv(env, "", "ls", "--label", "cagebox.dev/uid=u-2"); r.code != 0 || strings.Contains(r.stdout, id) {
		t.Fatalf("ls --label of another uid: %+v", r)
	}
	if r := e.cliEnv(env, "", "ls", "--label", "app=a b"); r.code == 0 || !strings.Contains(r.stderr, `"app"`) {
		t.Fatalf("ls with a malformed label: %+v", r)
	}

	// A restart keeps the labels (and the sandbox); the pool set over the
	// API is not kept (the controller sets it again).
	e.stopDaemon(syscall.SIGTERM)
	e.startDaemon("--listen", addr, "--admin-key-file", kf)
	l, err := admin.ListLabeled(ctx, map[string]string{"cagebox.dev/uid": "u-1", "app": "web"})
	if err != nil || len(l) != 1 || l[0].ID != id || l[0].Labels["app"] != "web" {
		t.Fatalf("after a restart: %+v, %v", l, err)
	}
	if r := e.cliEnv(env, "", "exec", id, "--", "echo", "still here"); r.code != 0 || r.stdout != "still here\n" {
		t.Fatalf("exec after a restart: %+v", r)
	}
	if got := len(e.pools().Pools); got != 0 {
		t.Errorf("pools after a restart: %d, want none", got)
	}

	// Set, then drop: the pooled sandboxes go.
	if _, err := admin.SetPools(ctx, &api.SetPoolsRequest{Targets: []api.PoolTarget{{Runtime: rt, Image: "default", Size: 2}}}); err != nil {
		t.Fatal(err)
	}
	pooled := e.waitPoolReady(class, 2).Sandboxes
	if p, err := admin.SetPools(ctx, &api.SetPoolsRequest{}); err != nil || len(p.Pools) != 0 {
		t.Fatalf("drop the pools: %+v, %v", p, err)
	}
	waitFor(t, 30*time.Second, "pooled sandboxes destroyed", func() bool {
		for _, id := range pooled {
			if _, err := os.Stat(filepath.Join(e.home, "sandboxes", id)); err == nil {
				return false
			}
		}
		return len(pooled) == 2 && len(hostIfs()) == 1
	})
	if err := admin.Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
}
