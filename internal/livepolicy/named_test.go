package livepolicy

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/store"
)

// TestTriggerSwapsToNamedPolicy: a trigger's `policy:` action replaces the
// sandbox's document by the tenant's named policy before the next request
// (no actor needed), the sandbox then follows it, and an edit of that
// policy reaches it (ApplyNamed) and no sandbox that does not follow it.
func TestTriggerSwapsToNamedPolicy(t *testing.T) {
	st := openStore(t, "")
	ctx := context.Background()
	strict := parse(t, "version: 1\nrules: [{name: only-b, host: b.example.com, action: allow}]")
	b, _ := json.Marshal(strict)
	if err := st.CreateTenant(ctx, &store.Tenant{ID: "t1", Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutNamedPolicy(ctx, &store.NamedPolicy{TenantID: "t1", Name: "strict", Document: b}, 0); err != nil {
		t.Fatal(err)
	}
	g := New(Config{Store: st, Act: func(context.Context, string, string, policy.TriggerAction) error {
		t.Error("Act was asked to swap a named policy")
		return nil
	}})
	s, _ := g.Attach(ctx, "sb-1", "t1", parse(t, `
version: 2
rules: [{name: a, host: a.example.com, action: allow}, {name: b, host: b.example.com, action: allow}]
triggers: [{name: lock, after: a, do: {policy: strict}}]
`), "", false)
	other, _ := g.Attach(ctx, "sb-2", "t1", parse(t, "version: 1\nrules: [{host: c.example.com, action: allow}]"), "", false)
	if !decide(t, s, get("a.example.com", "GET", "/")).Allow {
		t.Fatal("the request that fires the trigger is allowed")
	}
	if d := decide(t, s, get("a.example.com", "GET", "/")); d.Allow {
		t.Fatalf("a.example.com after the swap: %+v, want it refused by the named policy", d)
	}
	if !decide(t, s, get("b.example.com", "GET", "/")).Allow {
		t.Fatal("b.example.com is allowed by the named policy")
	}
	if s.Ref() != "strict" {
		t.Fatalf("the sandbox follows %q, want strict", s.Ref())
	}

	looser := parse(t, "version: 1\nrules: [{name: d, host: d.example.com, action: allow}]")
	updated, err := g.ApplyNamed(ctx, "t1", "strict", looser, 2)
	if err != nil || !slices.Equal(updated, []string{"sb-1"}) {
		t.Fatalf("ApplyNamed: %v %v, want only sb-1", updated, err)
	}
	if !decide(t, s, get("d.example.com", "GET", "/")).Allow || decide(t, s, get("b.example.com", "GET", "/")).Allow {
		t.Fatal("the named policy's edit did not reach its follower")
	}
	if !decide(t, other, get("c.example.com", "GET", "/")).Allow || decide(t, other, get("d.example.com", "GET", "/")).Allow {
		t.Fatal("the edit reached a sandbox that does not follow the policy")
	}
}
