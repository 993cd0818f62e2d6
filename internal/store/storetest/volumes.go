package storetest

import (
	"testing"

	"github.com/cagebox/cagebox/internal/store"
)

func testVolumes(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustTenant(t, s, "t2")
	v := &store.Volume{TenantID: "t1", Name: "cache", SizeBytes: 1 << 30}
	if err := s.CreateVolume(ctx(t), v); err != nil {
		t.Fatal(err)
	}
	if v.CreatedAt.IsZero() {
		t.Error("CreatedAt not set")
	}
	wantErr(t, "create twice", s.CreateVolume(ctx(t), &store.Volume{TenantID: "t1", Name: "cache", SizeBytes: 1}), store.ErrConflict)
	wantErr(t, "unknown tenant", s.CreateVolume(ctx(t), &store.Volume{TenantID: "nope", Name: "x", SizeBytes: 1}), store.ErrNotFound)
	got, err := s.GetVolume(ctx(t), "t1", "cache")
	if err != nil || got.SizeBytes != 1<<30 || got.VMWritten || !got.CreatedAt.Equal(v.CreatedAt) {
		t.Fatalf("get: %+v %v", got, err)
	}
	// Names are per tenant; tenants do not see each other's.
	_, err = s.GetVolume(ctx(t), "t2", "cache")
	wantErr(t, "other tenant's volume", err, store.ErrNotFound)
	if err := s.CreateVolume(ctx(t), &store.Volume{TenantID: "t2", Name: "cache", SizeBytes: 2}); err != nil {
		t.Fatalf("same name, other tenant: %v", err)
	}
	if err := s.SetVolumeVMWritten(ctx(t), "t1", "cache"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "mark missing", s.SetVolumeVMWritten(ctx(t), "t1", "nope"), store.ErrNotFound)
	if got, _ := s.GetVolume(ctx(t), "t1", "cache"); got == nil || !got.VMWritten {
		t.Errorf("VMWritten not kept: %+v", got)
	}
	if got, _ := s.GetVolume(ctx(t), "t2", "cache"); got == nil || got.VMWritten {
		t.Errorf("marking t1's volume marked t2's: %+v", got)
	}
	l, err := s.ListVolumes(ctx(t), "t1")
	if err != nil || len(l) != 1 || l[0].Name != "cache" {
		t.Fatalf("list t1: %+v %v", l, err)
	}
	if all, _ := s.ListVolumes(ctx(t), ""); len(all) != 2 {
		t.Fatalf("list all: %d", len(all))
	}
	wantErr(t, "delete other tenant's", s.DeleteVolume(ctx(t), "t2", "nope"), store.ErrNotFound)
	if err := s.DeleteVolume(ctx(t), "t1", "cache"); err != nil {
		t.Fatal(err)
	}
	_, err = s.GetVolume(ctx(t), "t1", "cache")
	wantErr(t, "get after delete", err, store.ErrNotFound)
	if _, err := s.GetVolume(ctx(t), "t2", "cache"); err != nil {
		t.Errorf("deleting t1's volume touched t2's: %v", err)
	}
}
