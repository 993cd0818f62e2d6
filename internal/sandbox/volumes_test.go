//go:build linux

package sandbox

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/isolation"
)

// mountRuntime is createRuntime taking mounts (it makes none: the
// manager's checks and its one-writer rule are under test here; the real
// runtimes' mounts are isolationtest.Mounts'), of a given class.
type mountRuntime struct {
	*createRuntime
	name  string
	class isolation.Class
}

func (r *mountRuntime) Name() string           { return r.name }
func (r *mountRuntime) Class() isolation.Class { return r.class }
func (r *mountRuntime) SupportsMounts() bool   { return true }

func init() {
	isolation.Register(&mountRuntime{createRuntime: testRuntime, name: "mounttest", class: isolation.Namespaces})
	isolation.Register(&mountRuntime{createRuntime: testRuntime, name: "mounttest-vm", class: isolation.Hypervisor})
}

func TestVolumesAndMounts(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 is not installed (e2fsprogs)")
	}
	testRuntime.use(createPlan{})
	m, _, _ := newCreateManager(t, "")
	m.cfg.VolumeDir = t.TempDir()
	ctx := context.Background()
	tn := &store.Tenant{ID: "t1"}
	kind := func(t *testing.T, what string, err, want error, says string) {
		t.Helper()
		if !errors.Is(err, want) || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want %v saying %q", what, err, want, says)
		}
	}
	create := func(rt string, ms ...api.Mount) (*api.Sandbox, error) {
		return m.Create(ctx, tn, &api.CreateSandboxRequest{Runtime: rt, Mounts: ms})
	}
	vol := func(rw bool) api.Mount { return api.Mount{Type: "volume", Src: "data", Dst: "/data", RW: rw} }

	if _, err := m.volumes.CreateVolume(ctx, tn, &api.CreateVolumeRequest{Name: "data", SizeBytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(m.volumes.volumePath("t1", "data")); err != nil || fi.Size() != 32<<20 {
		t.Fatalf("volume image: %v %v", fi, err)
	}
	_, err := m.volumes.CreateVolume(ctx, tn, &api.CreateVolumeRequest{Name: "data"})
	kind(t, "create twice", err, errdefs.ErrConflict, "exists")
	_, err = m.volumes.CreateVolume(ctx, tn, &api.CreateVolumeRequest{Name: "Data/../x"})
	kind(t, "bad name", err, errdefs.ErrInvalid, "volume name")
	_, err = m.volumes.CreateVolume(ctx, tn, &api.CreateVolumeRequest{Name: "huge", SizeBytes: 1 << 50})
	kind(t, "too big", err, errdefs.ErrInvalid, "GiB")

	// A runtime that takes no mounts is told so.
	_, err = create(createRuntimeName, vol(false))
	kind(t, "runtime without mounts", err, errdefs.ErrInvalid, "does not take mounts")
	_, err = m.Create(ctx, tn, &api.CreateSandboxRequest{Runtime: createRuntimeName, ReadOnlyRoot: true})
	kind(t, "read-only root on a runtime without", err, errdefs.ErrInvalid, "does not take mounts")
	_, err = create("mounttest", api.Mount{Type: "volume", Src: "nope", Dst: "/data"})
	kind(t, "missing volume", err, errdefs.ErrInvalid, "cagebox volume create nope")
	_, err = create("mounttest", api.Mount{Type: "bind", Src: "/srv", Dst: "/code"})
	kind(t, "bind without roots", err, errdefs.ErrInvalid, "--mount-root")
	_, err = create("mounttest", vol(false), api.Mount{Type: "volume", Src: "data", Dst: "/other"})
	kind(t, "one volume twice", err, errdefs.ErrInvalid, "mounted twice")

	// One writer, or readers.
	a, err := create("mounttest", vol(true))
	if err != nil {
		t.Fatal(err)
	}
	_, err = create("mounttest", vol(true))
	kind(t, "second writer", err, errdefs.ErrConflict, "mounted read-write by sandbox "+a.ID)
	_, err = create("mounttest", vol(false))
	kind(t, "reader while a writer", err, errdefs.ErrConflict, "mounted read-write by sandbox "+a.ID)
	err = m.volumes.RemoveVolume(ctx, "t1", "data")
	kind(t, "rm while mounted", err, errdefs.ErrConflict, "cagebox rm "+a.ID)
	if l, _ := m.volumes.ListVolumes(ctx, "t1"); len(l) != 1 || len(l[0].AttachedTo) != 1 || l[0].AttachedTo[0] != (api.VolumeAttachment{Sandbox: a.ID, RW: true}) {
		t.Errorf("list: %+v", l)
	}
	if got, _ := m.Get(ctx, "t1", a.ID); len(got.Mounts) != 1 || got.Mounts[0] != vol(true) {
		t.Errorf("the sandbox's view: %+v", got.Mounts)
	}
	// Another tenant's volume of the same name is another volume.
	if _, err := m.volumes.ListVolumes(ctx, "t2"); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(ctx, "t1", a.ID); err != nil {
		t.Fatal(err)
	}
	r1, err := create("mounttest", vol(false))
	if err != nil {
		t.Fatalf("reader after the writer's removal: %v", err)
	}
	r2, err := create("mounttest", vol(false))
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	_, err = create("mounttest", vol(true))
	kind(t, "writer while readers", err, errdefs.ErrConflict, "mounted read-only by sandbox")
	for _, id := range []string{r1.ID, r2.ID} {
		if err := m.Remove(ctx, "t1", id); err != nil {
			t.Fatal(err)
		}
	}

	// A microVM that writes a volume makes it microVM-only; a microVM
	// takes no writable bind.
	_, err = create("mounttest-vm", api.Mount{Type: "bind", Src: "/srv/x", Dst: "/code", RW: true})
	kind(t, "rw bind in a VM", err, errdefs.ErrInvalid, "read-only copy")
	v, err := create("mounttest-vm", vol(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(ctx, "t1", v.ID); err != nil {
		t.Fatal(err)
	}
	if l, _ := m.volumes.ListVolumes(ctx, "t1"); len(l) != 1 || !l[0].VMOnly {
		t.Errorf("a volume a VM wrote is not marked: %+v", l)
	}
	_, err = create("mounttest", vol(false))
	kind(t, "host mount of a VM-written volume", err, errdefs.ErrInvalid, "microVM")

	if err := m.volumes.RemoveVolume(ctx, "t1", "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.volumes.volumePath("t1", "data")); !os.IsNotExist(err) {
		t.Errorf("image left after rm: %v", err)
	}
	kind(t, "rm twice", m.volumes.RemoveVolume(ctx, "t1", "data"), errdefs.ErrNotFound, "no volume")
}
