package credentials

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/vault"
)

// TestOpenToward: a real value opens for a write only toward a host its
// secret's hosts (and the sandbox's binding, when given) cover, over TLS;
// a refusal says what to do and never holds the value; a secret re-bound
// or revoked later refuses the next open.
func TestOpenToward(t *testing.T) {
	const real = "ghp_R3alValueThatMustOnlyGoToItsHosts0001"
	key, err := vault.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	v := vault.New(vault.NewMemBackend(), key)
	ctx := context.Background()
	if _, err := v.Put(ctx, "t1", "TOK", []byte(real), []string{"api.example.com", "*.gw.example.com"}, ""); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		url   string
		bound []string
		want  string // "" = opens
	}{
		{"wss://api.example.com/x", nil, ""},
		{"wss://API.example.com.:443/x", nil, ""},
		{"https://eu.gw.example.com/", nil, ""},
		{"wss://api.example.com/x", []string{"api.example.com"}, ""},
		{"wss://eu.gw.example.com/x", []string{"api.example.com"}, "the sandbox binds secret TOK to hosts api.example.com"},
		{"wss://attacker.example.net/x", nil, "cagebox secret add TOK --host attacker.example.net"},
		{"wss://api.example.com.attacker.net/x", nil, "not one of them"},
		{"ws://api.example.com/x", nil, "only over TLS"},
		{"http://api.example.com/x", nil, "only over TLS"},
		{"wss://127.0.0.1/x", nil, "not one of them"},
		{"not a url", nil, "not a URL"},
	} {
		sec, err := OpenToward(ctx, v, "t1", "TOK", Toward{URL: tc.url, Bound: tc.bound})
		cerr := CheckToward(ctx, v, "t1", "TOK", Toward{URL: tc.url, Bound: tc.bound})
		if tc.want == "" {
			if err != nil || cerr != nil || string(sec.Bytes()) != real {
				t.Errorf("%s: %v / %v, want opened", tc.url, err, cerr)
			}
			sec.Wipe()
			continue
		}
		if err == nil || cerr == nil {
			t.Errorf("%s: opened (check %v), want refused: %s", tc.url, cerr, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrNotBound) || strings.Contains(err.Error(), real) {
			t.Errorf("%s: %v, want %q", tc.url, err, tc.want)
		}
		if !errors.Is(err, errdefs.ErrDenied) && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v is no 4xx kind", tc.url, err)
		}
	}
	// Re-bound later: the next open refuses.
	if _, err := v.Put(ctx, "t1", "TOK", []byte(real), []string{"elsewhere.example.org"}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenToward(ctx, v, "t1", "TOK", Toward{URL: "wss://api.example.com/x"}); !errors.Is(err, ErrNotBound) {
		t.Errorf("after a re-bind: %v", err)
	}
	if err := v.Revoke(ctx, "t1", "TOK"); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenToward(ctx, v, "t1", "TOK", Toward{URL: "wss://elsewhere.example.org/x"}); err == nil {
		t.Error("a revoked secret opened")
	}
	if err := CheckToward(ctx, v, "t1", "TOK", Toward{URL: "wss://elsewhere.example.org/x"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("check of a revoked secret: %v", err)
	}
	// Another tenant's secret of the same name does not exist for t2.
	if err := CheckToward(ctx, v, "t2", "TOK", Toward{URL: "wss://api.example.com/x"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant: %v", err)
	}
}
