package storetest

import (
	"bytes"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/store"
)

func testPorts(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustTenant(t, s, "t2")
	exp := time.Now().Add(time.Hour)
	p := &store.Port{SandboxID: "sb-1", TenantID: "t1", Port: 8080, TokenHash: bytes.Repeat([]byte{1}, 32), ExpiresAt: &exp}
	if err := s.PutPort(ctx(t), p); err != nil {
		t.Fatal(err)
	}
	if p.CreatedAt.IsZero() {
		t.Error("CreatedAt not set")
	}
	got, err := s.GetPort(ctx(t), "t1", "sb-1", 8080)
	if err != nil || got.Public || !bytes.Equal(got.TokenHash, p.TokenHash) || got.ExpiresAt == nil || !got.ExpiresAt.Equal(*p.ExpiresAt) {
		t.Fatalf("get: %+v %v", got, err)
	}
	// Replacing rotates the token and drops the expiry.
	if err := s.PutPort(ctx(t), &store.Port{SandboxID: "sb-1", TenantID: "t1", Port: 8080, Public: true, TokenHash: bytes.Repeat([]byte{2}, 32)}); err != nil {
		t.Fatal(err)
	}
	got, err = s.GetPort(ctx(t), "", "sb-1", 8080)
	if err != nil || !got.Public || got.TokenHash[0] != 2 || got.ExpiresAt != nil {
		t.Fatalf("get after replace: %+v %v", got, err)
	}
	_, err = s.GetPort(ctx(t), "t2", "sb-1", 8080)
	wantErr(t, "other tenant's port", err, store.ErrNotFound)
	_, err = s.GetPort(ctx(t), "t1", "sb-1", 9090)
	wantErr(t, "unpublished port", err, store.ErrNotFound)
	if err := s.PutPort(ctx(t), &store.Port{SandboxID: "sb-1", TenantID: "t1", Port: 22}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutPort(ctx(t), &store.Port{SandboxID: "sb-2", TenantID: "t2", Port: 80}); err != nil {
		t.Fatal(err)
	}
	l, err := s.ListPorts(ctx(t), "t1", "sb-1")
	if err != nil || len(l) != 2 || l[0].Port != 22 || l[1].Port != 8080 {
		t.Fatalf("list: %+v %v", l, err)
	}
	if l, _ := s.ListPorts(ctx(t), "t2", "sb-1"); len(l) != 0 {
		t.Fatalf("other tenant lists %d ports", len(l))
	}
	if l, _ := s.ListPorts(ctx(t), "", ""); len(l) != 3 {
		t.Fatalf("list all: %d", len(l))
	}
	wantErr(t, "delete other tenant's", s.DeletePort(ctx(t), "t2", "sb-1", 22), store.ErrNotFound)
	if err := s.DeletePort(ctx(t), "t1", "sb-1", 22); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "delete twice", s.DeletePort(ctx(t), "t1", "sb-1", 22), store.ErrNotFound)
	if err := s.DeletePorts(ctx(t), "sb-1"); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.ListPorts(ctx(t), "", ""); len(l) != 1 || l[0].SandboxID != "sb-2" {
		t.Fatalf("after DeletePorts: %+v", l)
	}
}
