package storetest

import (
	"encoding/json"
	"testing"

	"github.com/cagebox/cagebox/internal/store"
)

func testTools(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustTenant(t, s, "t2")
	tool := &store.Tool{TenantID: "t1", Name: "lint", Spec: json.RawMessage(`{"argv":["lint"]}`)}
	if err := s.PutTool(ctx(t), tool, false); err != nil {
		t.Fatal(err)
	}
	if tool.CreatedAt.IsZero() {
		t.Error("CreatedAt not set")
	}
	wantErr(t, "create twice", s.PutTool(ctx(t), &store.Tool{TenantID: "t1", Name: "lint", Spec: json.RawMessage(`{}`)}, false), store.ErrConflict)
	if err := s.PutTool(ctx(t), &store.Tool{TenantID: "t1", Name: "lint", Spec: json.RawMessage(`{"argv":["lint","-v"]}`)}, true); err != nil {
		t.Fatalf("replace: %v", err)
	}
	got, err := s.GetTool(ctx(t), "t1", "lint")
	if err != nil || string(got.Spec) != `{"argv":["lint","-v"]}` {
		t.Fatalf("get after replace: %+v %v", got, err)
	}
	// Tenants do not see each other's tools; names are per tenant.
	_, err = s.GetTool(ctx(t), "t2", "lint")
	wantErr(t, "other tenant's tool", err, store.ErrNotFound)
	if err := s.PutTool(ctx(t), &store.Tool{TenantID: "t2", Name: "lint", Spec: json.RawMessage(`{}`)}, false); err != nil {
		t.Fatalf("same name, other tenant: %v", err)
	}
	l, err := s.ListTools(ctx(t), "t1")
	if err != nil || len(l) != 1 {
		t.Fatalf("list t1: %d %v", len(l), err)
	}
	if all, _ := s.ListTools(ctx(t), ""); len(all) != 2 {
		t.Fatalf("list all: %d", len(all))
	}
	wantErr(t, "delete other tenant's", s.DeleteTool(ctx(t), "t2", "nope"), store.ErrNotFound)
	if err := s.DeleteTool(ctx(t), "t1", "lint"); err != nil {
		t.Fatal(err)
	}
	_, err = s.GetTool(ctx(t), "t1", "lint")
	wantErr(t, "get after delete", err, store.ErrNotFound)
}
