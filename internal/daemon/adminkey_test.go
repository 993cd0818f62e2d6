package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

const testAdminKey = "fleet-admin-key-0123456789abcdef0123456789"

func writeKeyFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "admin.key")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadAdminKey(t *testing.T) {
	if d, err := LoadAdminKey(writeKeyFile(t, "  "+testAdminKey+"\n")); err != nil || string(d) != string(HashKey(testAdminKey)) {
		t.Fatalf("a good key with surrounding whitespace: %v", err)
	}
	for _, tc := range []struct{ name, content, want string }{
		{"short", "short-key-0123456789", "at least 32"},
		{"blank", "\n\n", "at least 32"},
		{"two lines", testAdminKey + "\n" + testAdminKey, "one key"},
		{"huge", strings.Repeat("k", maxAdminKeyFile+10), "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadAdminKey(writeKeyFile(t, tc.content))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
			if len(tc.content) > 8 && strings.Contains(err.Error(), strings.TrimSpace(tc.content)[:8]) {
				t.Fatalf("the error quotes the key: %v", err)
			}
		})
	}
	if _, err := LoadAdminKey(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "--admin-key-file") {
		t.Fatalf("a missing file: %v", err)
	}
}

// TestAdminKeyOverTCP: the fleet admin key is the admin over TCP (admin
// routes answer); a wrong key is 401; a tenant's key still cannot reach
// admin routes.
func TestAdminKeyOverTCP(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "cagebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	if err := st.CreateTenant(ctx, &store.Tenant{ID: "acme", Name: "acme"}); err != nil {
		t.Fatal(err)
	}
	tenantKey, rec := NewAPIKey("acme")
	if err := st.CreateAPIKey(ctx, rec); err != nil {
		t.Fatal(err)
	}
	mgr := sandbox.New(sandbox.Config{Store: st, StateDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(mgr.Close)
	srv := NewServer(st, mgr, nil, nil, slog.New(slog.DiscardHandler))
	digest, err := LoadAdminKey(writeKeyFile(t, testAdminKey+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv.SetAdminKey(digest)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	dial := func(key string) *client.Client {
		c, err := client.NewTCP(hs.URL, key, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	admin := dial(testAdminKey)
	tn, err := admin.CreateTenant(ctx, &api.CreateTenantRequest{Name: "made-by-fleet"})
	if err != nil {
		t.Fatalf("admin route with the admin key: %v", err)
	}
	if tn.ID != "made-by-fleet" {
		t.Fatalf("tenant %+v", tn)
	}
	if ts, err := admin.Tenants(ctx); err != nil || len(ts) < 3 {
		t.Fatalf("list tenants with the admin key: %d, %v", len(ts), err)
	}

	for _, key := range []string{testAdminKey + "x", testAdminKey[:len(testAdminKey)-1], "cbk_" + strings.Repeat("0", 64)} {
		_, err := dial(key).Tenants(ctx)
		var ae *client.Error
		if !errors.As(err, &ae) || ae.Status != 401 {
			t.Fatalf("a wrong key: %v, want 401", err)
		}
	}
	_, err = dial(tenantKey).Tenants(ctx)
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != 403 {
		t.Fatalf("a tenant key on an admin route: %v, want 403", err)
	}

	// The fleet's routes: labels and pools.
	if _, err := admin.ListLabeled(ctx, map[string]string{"cagebox.dev/uid": "bad value"}); !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Msg, "cagebox.dev/uid") {
		t.Fatalf("a malformed label selector: %v, want a 400 naming it", err)
	}
	if l, err := admin.ListLabeled(ctx, map[string]string{"cagebox.dev/uid": "u-1"}); err != nil || len(l) != 0 {
		t.Fatalf("a label selector: %v, %v", l, err)
	}
	if _, err := dial(tenantKey).SetPools(ctx, &api.SetPoolsRequest{}); !errors.As(err, &ae) || ae.Status != 403 {
		t.Fatalf("PUT /v1/pools with a tenant key: %v, want 403", err)
	}
	if err := mgr.Pools().Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SetPools(ctx, &api.SetPoolsRequest{Targets: []api.PoolTarget{{Runtime: "nope", Image: "default", Size: 1}}}); !errors.As(err, &ae) || ae.Status != 400 {
		t.Fatalf("PUT /v1/pools, unknown runtime: %v, want 400", err)
	}
	if p, err := admin.SetPools(ctx, &api.SetPoolsRequest{}); err != nil || len(p.Pools) != 0 {
		t.Fatalf("PUT /v1/pools, no targets: %+v, %v", p, err)
	}
}
