package storetest

import (
	"encoding/json"
	"testing"

	"github.com/cagebox/cagebox/internal/store"
)

func testSnapshots(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustTenant(t, s, "t2")
	sn := &store.Snapshot{ID: "s1", TenantID: "t1", Name: "base", SandboxID: "sb1", Runtime: "container", Image: "default",
		Status: "creating", Spec: json.RawMessage(`{"env":["A=1"]}`)}
	if err := s.CreateSnapshot(ctx(t), sn); err != nil {
		t.Fatal(err)
	}
	if sn.CreatedAt.IsZero() {
		t.Error("CreatedAt not set")
	}
	wantErr(t, "same name twice", s.CreateSnapshot(ctx(t), &store.Snapshot{ID: "s2", TenantID: "t1", Name: "base", Status: "creating"}), store.ErrConflict)
	wantErr(t, "same id twice", s.CreateSnapshot(ctx(t), &store.Snapshot{ID: "s1", TenantID: "t2", Name: "other", Status: "creating"}), store.ErrConflict)
	wantErr(t, "unknown tenant", s.CreateSnapshot(ctx(t), &store.Snapshot{ID: "s3", TenantID: "nope", Name: "x", Status: "creating"}), store.ErrNotFound)
	if err := s.CreateSnapshot(ctx(t), &store.Snapshot{ID: "s4", TenantID: "t2", Name: "base", Status: "ready", Fork: true}); err != nil {
		t.Fatalf("same name, other tenant: %v", err)
	}
	sn.Status, sn.Kind, sn.SizeBytes, sn.Digest = "ready", "filesystem", 4096, "sha256:ab"
	if err := s.UpdateSnapshot(ctx(t), sn); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "update missing", s.UpdateSnapshot(ctx(t), &store.Snapshot{ID: "nope"}), store.ErrNotFound)
	got, err := s.GetSnapshot(ctx(t), "t1", "base")
	if err != nil || got.ID != "s1" || got.Status != "ready" || got.Kind != "filesystem" || got.SizeBytes != 4096 ||
		got.Digest != "sha256:ab" || got.Fork || got.SandboxID != "sb1" || string(got.Spec) != `{"env":["A=1"]}` || !got.CreatedAt.Equal(sn.CreatedAt) {
		t.Fatalf("get: %+v %v", got, err)
	}
	if got, err := s.GetSnapshot(ctx(t), "", "s4"); err != nil || got.TenantID != "t2" || !got.Fork {
		t.Fatalf("get by id: %+v %v", got, err)
	}
	_, err = s.GetSnapshot(ctx(t), "t2", "nope")
	wantErr(t, "unknown name", err, store.ErrNotFound)
	if l, err := s.ListSnapshots(ctx(t), "t1"); err != nil || len(l) != 1 || l[0].ID != "s1" {
		t.Fatalf("list t1: %+v %v", l, err)
	}
	if l, _ := s.ListSnapshots(ctx(t), ""); len(l) != 2 {
		t.Fatalf("list all: %d", len(l))
	}
	if err := s.DeleteSnapshot(ctx(t), "s1"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "delete twice", s.DeleteSnapshot(ctx(t), "s1"), store.ErrNotFound)
	if _, err := s.GetSnapshot(ctx(t), "t2", "base"); err != nil {
		t.Errorf("deleting t1's snapshot touched t2's: %v", err)
	}
}
