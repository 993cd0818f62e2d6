//go:build linux

package sandbox

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

func TestValidateLabels(t *testing.T) {
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   string // "" = valid
	}{
		{"none", nil, ""},
		{"fleet", map[string]string{"cagebox.dev/uid": "0b8f-11", "cagebox.dev/managed-by": "cagebox-controller", "empty": ""}, ""},
		{"longest", map[string]string{strings.Repeat("a", 253): strings.Repeat("b", 63)}, ""},
		{"too many", many, "at most 16"},
		{"empty key", map[string]string{"": "v"}, `key ""`},
		{"long key", map[string]string{strings.Repeat("a", 254): "v"}, "1-253"},
		{"key space", map[string]string{"a b": "v"}, `"a b"`},
		{"key equals", map[string]string{"a=b": "v"}, `"a=b"`},
		{"long value", map[string]string{"app": strings.Repeat("v", 64)}, `"app" is 64 characters`},
		{"value slash", map[string]string{"app": "a/b"}, `"a/b" of "app"`},
		{"value newline", map[string]string{"app": "a\nb"}, `of "app"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateLabels(tc.labels)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
}

func TestParseLabelSelector(t *testing.T) {
	got, err := ParseLabelSelector([]string{"cagebox.dev/uid=u1", "app=", "app="})
	if err != nil || !maps.Equal(got, map[string]string{"cagebox.dev/uid": "u1", "app": ""}) {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range [][]string{{"novalue"}, {"=v"}, {"a=b/c"}, {"a=1", "a=2"}, {"k y=v"}} {
		if _, err := ParseLabelSelector(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", bad, err)
		}
	}
}

// TestLabels: labels given at create are stored, returned and matched —
// for cold creates and creates served from a warm pool — and a daemon
// restart keeps them; bad labels make nothing.
func TestLabels(t *testing.T) {
	testRuntime.use(createPlan{})
	m, db, _ := newCreateManager(t, "")
	ctx := context.Background()
	t1 := &store.Tenant{ID: "t1"}

	bad := createRequest()
	bad.Labels = map[string]string{"app": "no spaces"}
	if _, err := m.Create(ctx, t1, bad); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `"app"`) {
		t.Fatalf("bad label: %v", err)
	}
	if n := len(testRuntime.sandboxes()); n != 0 {
		t.Fatalf("a refused create made %d sandboxes", n)
	}

	// A tenant may not set the fleet's labels (it could pass its sandbox
	// off as the controller's).
	spoof := createRequest()
	spoof.Labels = map[string]string{"cagebox.dev/uid": "someone-elses", "app": "web"}
	if _, err := m.Create(ctx, t1, spoof); !errors.Is(err, errdefs.ErrDenied) || !strings.Contains(err.Error(), "cagebox.dev/uid") {
		t.Fatalf("a tenant's cagebox.dev/ label: %v, want ErrDenied naming it", err)
	}
	if n := len(testRuntime.sandboxes()); n != 0 {
		t.Fatalf("a refused create made %d sandboxes", n)
	}
	if err := db.CreateTenant(ctx, &store.Tenant{ID: store.AdminTenantID}); err != nil && !errors.Is(err, store.ErrConflict) {
		t.Fatal(err)
	}
	t1 = &store.Tenant{ID: store.AdminTenantID}

	req := createRequest()
	req.Labels = map[string]string{"cagebox.dev/uid": "u-1", "app": "web"}
	cold, err := m.Create(ctx, t1, req)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(cold.Labels, req.Labels) {
		t.Fatalf("create answered labels %v, want %v", cold.Labels, req.Labels)
	}

	startTestPool(t, m)
	pooledID := testRuntime.sandboxes()[len(testRuntime.sandboxes())-1].id
	req = createRequest()
	req.Labels = map[string]string{"cagebox.dev/uid": "u-2", "app": "web"}
	warm, err := m.Create(ctx, t1, req)
	if err != nil {
		t.Fatal(err)
	}
	if warm.ID != pooledID {
		t.Fatalf("the second create was not served from the pool (%s, pooled %s)", warm.ID, pooledID)
	}
	if !maps.Equal(warm.Labels, req.Labels) {
		t.Fatalf("pooled create answered labels %v, want %v", warm.Labels, req.Labels)
	}

	ids := func(m *Manager, tenant string, sel map[string]string) []string {
		t.Helper()
		l, err := m.ListLabeled(ctx, tenant, sel)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, v := range l {
			out = append(out, v.ID)
		}
		return out
	}
	check := func(m *Manager) {
		t.Helper()
		if got := ids(m, store.AdminTenantID, map[string]string{"app": "web"}); len(got) != 2 {
			t.Errorf("app=web: %v, want both", got)
		}
		if got := ids(m, "", map[string]string{"cagebox.dev/uid": "u-2"}); len(got) != 1 || got[0] != warm.ID {
			t.Errorf("uid=u-2: %v, want %s", got, warm.ID)
		}
		if got := ids(m, "t2", map[string]string{"app": "web"}); len(got) != 0 {
			t.Errorf("another tenant sees %v", got)
		}
		if v, err := m.Get(ctx, store.AdminTenantID, cold.ID); err != nil || v.Labels["cagebox.dev/uid"] != "u-1" {
			t.Errorf("get: %v, %v", v, err)
		}
	}
	check(m)

	// A restarted daemon (a new manager on the same store) keeps them.
	m2 := New(Config{Store: db, Images: m.cfg.Images, StateDir: m.cfg.StateDir, Logger: m.log})
	t.Cleanup(m2.Close)
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	check(m2)
}
