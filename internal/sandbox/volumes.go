package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/isolation"
)

// Volumes and mounts.
//
// Which sandboxes hold a volume is read from the sandbox records (their
// applied spec names their mounts), never kept apart: a record exists from
// before anything is made on the host until the sandbox is removed, so a
// crash or a restart releases a volume exactly when the sandbox that held
// it goes. A sandbox holds its volumes from create until it is removed
// (stopped included: its mounts stay until rm). The rule is a readers-
// writer lock per volume: one holder read-write, or any number read-only,
// never both. Volumes.mu makes check-then-record atomic within this daemon.

// Volumes is the manager's service of the tenants' volumes and of the
// mounts a create asks for (Manager.Volumes): volumes made, listed and
// removed, mounts checked and resolved, and the check-then-record of a
// sandbox that mounts volumes, which create calls.
type Volumes struct {
	m *Manager
	// mu serialises volume creates, removals and the check-and-record of
	// a sandbox that mounts volumes.
	mu sync.Mutex
}

// Volumes is the service of the tenants' volumes.
func (m *Manager) Volumes() *Volumes { return m.volumes }

// mountErr turns a mounts error into the API's kinds.
func mountErr(err error) error {
	if errors.Is(err, mounts.ErrInvalid) {
		return fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	return err
}

// checkMounts checks a create request's mounts: syntax, targets, that each
// volume exists and may be mounted by rt, and that bind mounts are allowed
// at all. Bind sources are resolved later (resolveMounts), at create.
func (vs *Volumes) checkMounts(ctx context.Context, tenant *store.Tenant, req *api.CreateSandboxRequest, rt isolation.Runtime) ([]mounts.Spec, error) {
	if len(req.Mounts) == 0 && !req.ReadOnlyRoot {
		return nil, nil
	}
	if mr, ok := rt.(isolation.MountingRuntime); !ok || !mr.SupportsMounts() {
		return nil, invalid("the %s runtime does not take mounts or a read-only root yet: use --runtime container, gvisor or qemu", rt.Name())
	}
	in := make([]mounts.Spec, len(req.Mounts))
	for i, am := range req.Mounts {
		in[i] = mounts.Spec{Type: am.Type, Source: am.Src, Target: am.Dst, RW: am.RW, Exec: am.Exec}
	}
	specs, err := mounts.CheckAll(in)
	if err != nil {
		return nil, mountErr(err)
	}
	vm := rt.Class() == isolation.Hypervisor
	for _, s := range specs {
		if s.Type == mounts.Bind && s.RW && vm {
			return nil, invalid("mount %s: a microVM gets a read-only copy of a host directory: drop rw (a volume holds data the sandbox writes)", s)
		}
		if s.Type != mounts.Volume {
			continue
		}
		v, err := vs.m.cfg.Store.GetVolume(ctx, tenant.ID, s.Source)
		if errors.Is(err, store.ErrNotFound) {
			return nil, invalid("mount %s: no volume is named %q: create it with `cagebox volume create %s`", s, s.Source, s.Source)
		}
		if err != nil {
			return nil, err
		}
		if v.VMWritten && rt.Class() != isolation.Hypervisor {
			return nil, invalid("mount %s: a microVM has written volume %s, so the host kernel will not mount it; mount it in a microVM sandbox (--runtime qemu)", s, s.Source)
		}
	}
	return specs, nil
}

// volumePath is where a tenant's volume image lives.
func (vs *Volumes) volumePath(tenant, name string) string {
	return filepath.Join(vs.m.cfg.VolumeDir, tenant, name+".ext4")
}

// resolveMounts resolves specs for a sandbox of tenant: bind sources are
// opened beneath the daemon's mount roots (mounts.Roots.Resolve: the
// runtime mounts through the descriptor, so a path swapped after the check
// changes nothing). The caller closes what it returns (closeMounts) once
// the runtime's Create has returned.
func (vs *Volumes) resolveMounts(tenant string, specs []mounts.Spec, rt isolation.Runtime) ([]isolation.Mount, error) {
	var out []isolation.Mount
	for _, s := range specs {
		im := isolation.Mount{Type: s.Type, Name: s.Source, Target: s.Target, RW: s.RW, Exec: s.Exec}
		switch s.Type {
		case mounts.Bind:
			src, err := vs.m.cfg.MountRoots.Resolve(s.Source)
			if err != nil {
				closeMounts(out)
				return nil, mountErr(err)
			}
			if !src.Dir && rt.Class() == isolation.Hypervisor {
				_ = src.Close()
				closeMounts(out)
				return nil, invalid("mount %s: a microVM mounts host directories (copied into a disk), not single files: bind the file's directory", s)
			}
			im.Bind = src
		case mounts.Volume:
			im.Image = vs.volumePath(tenant, s.Source)
		}
		out = append(out, im)
	}
	return out, nil
}

func closeMounts(ms []isolation.Mount) {
	for _, im := range ms {
		_ = im.Bind.Close()
	}
}

// volumeHolder is a sandbox holding a volume, and the sandbox's status.
type volumeHolder struct {
	api.VolumeAttachment
	status string
}

// holders lists the sandboxes of tenant (not yet removed) that mount
// volume name.
func (vs *Volumes) holders(ctx context.Context, tenant, name string) ([]volumeHolder, error) {
	all, err := vs.volumeHolders(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return all[name], nil
}

// volumeHolders maps each of tenant's mounted volumes to the sandboxes
// holding it.
func (vs *Volumes) volumeHolders(ctx context.Context, tenant string) (map[string][]volumeHolder, error) {
	rs, err := vs.m.cfg.Store.ListSandboxes(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	out := map[string][]volumeHolder{}
	for _, r := range rs {
		if r.Status == StatusDestroyed || r.Status == StatusFailed {
			continue
		}
		var sr specRecord
		if json.Unmarshal(r.Spec, &sr) != nil {
			continue
		}
		for _, s := range sr.Mounts {
			if s.Type == mounts.Volume {
				out[s.Source] = append(out[s.Source], volumeHolder{api.VolumeAttachment{Sandbox: r.ID, RW: s.RW}, r.Status})
			}
		}
	}
	return out, nil
}

// removalWait bounds how long a create waits for a sandbox being removed
// (RemoveAsync: `cagebox run` ends with one) to release a volume.
const removalWait = 30 * time.Second

// recordWithVolumes creates rec (whose spec names its mounts) once every
// volume it mounts is free for it: no other holder at all for a read-write
// mount, no read-write holder for a read-only one (ErrConflict otherwise;
// a holder being removed is waited for). A volume a microVM mounts
// read-write is marked VMWritten first.
func (vs *Volumes) recordWithVolumes(ctx context.Context, rec *store.Sandbox, specs []mounts.Spec, rt isolation.Runtime) error {
	deadline := time.Now().Add(removalWait)
	for {
		removing, err := vs.tryRecordWithVolumes(ctx, rec, specs, rt)
		if !removing || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tryRecordWithVolumes is one attempt of recordWithVolumes; removing
// reports a conflict only with sandboxes being removed.
func (vs *Volumes) tryRecordWithVolumes(ctx context.Context, rec *store.Sandbox, specs []mounts.Spec, rt isolation.Runtime) (removing bool, err error) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	var held map[string][]volumeHolder
	removing = true
	for _, s := range specs {
		if s.Type != mounts.Volume {
			continue
		}
		if held == nil {
			if held, err = vs.volumeHolders(ctx, rec.TenantID); err != nil {
				return false, err
			}
		}
		for _, h := range held[s.Source] {
			if !s.RW && !h.RW {
				continue
			}
			removing = removing && h.status == StatusRemoving
			if err == nil {
				mode := "read-only"
				if h.RW {
					mode = "read-write"
				}
				err = fmt.Errorf("%w: volume %s is mounted %s by sandbox %s: a volume is mounted read-write by one sandbox, or read-only by any number; remove %s first (cagebox rm %s) or mount the volume read-only", errdefs.ErrConflict, s.Source, mode, h.Sandbox, h.Sandbox, h.Sandbox)
			}
		}
	}
	if err != nil {
		return removing, err
	}
	for _, s := range specs {
		if s.Type == mounts.Volume && s.RW && rt.Class() == isolation.Hypervisor {
			if err := vs.m.cfg.Store.SetVolumeVMWritten(ctx, rec.TenantID, s.Source); err != nil {
				return false, fmt.Errorf("mark volume %s: %w", s.Source, err)
			}
		}
	}
	if err := vs.m.cfg.Store.CreateSandbox(ctx, rec); err != nil {
		return false, fmt.Errorf("record sandbox: %w", err)
	}
	return false, nil
}

// CreateVolume makes a tenant's named volume: a sparse ext4 image under
// the daemon's home.
func (vs *Volumes) CreateVolume(ctx context.Context, tenant *store.Tenant, req *api.CreateVolumeRequest) (*api.Volume, error) {
	if vs.m.cfg.VolumeDir == "" {
		return nil, fmt.Errorf("%w: this daemon keeps no volumes", errdefs.ErrUnavailable)
	}
	if err := mounts.ValidVolumeName(req.Name); err != nil {
		return nil, mountErr(err)
	}
	size, err := mounts.CheckVolumeSize(req.SizeBytes)
	if err != nil {
		return nil, mountErr(err)
	}
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v := &store.Volume{TenantID: tenant.ID, Name: req.Name, SizeBytes: size}
	if err := vs.m.cfg.Store.CreateVolume(ctx, v); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: volume %s exists: pick another name, or remove it first (cagebox volume rm %s)", errdefs.ErrConflict, req.Name, req.Name)
		}
		return nil, err
	}
	p := vs.volumePath(tenant.ID, req.Name)
	err = statedir.Make(filepath.Dir(p))
	if err == nil {
		// A file left by a create that crashed between the two steps.
		_ = os.Remove(p)
		err = mounts.CreateImage(context.WithoutCancel(ctx), p, size, req.Name)
	}
	if err != nil {
		_ = vs.m.cfg.Store.DeleteVolume(context.WithoutCancel(ctx), tenant.ID, req.Name)
		return nil, fmt.Errorf("create volume %s: %w", req.Name, err)
	}
	vs.m.log.Info("volume created", "tenant", tenant.ID, "volume", req.Name, "size", size)
	return &api.Volume{Name: v.Name, SizeBytes: v.SizeBytes, CreatedAt: v.CreatedAt}, nil
}

// ListVolumes lists a tenant's volumes and what holds them.
func (vs *Volumes) ListVolumes(ctx context.Context, tenant string) ([]api.Volume, error) {
	rows, err := vs.m.cfg.Store.ListVolumes(ctx, tenant)
	if err != nil {
		return nil, err
	}
	held, err := vs.volumeHolders(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]api.Volume, 0, len(rows))
	for _, v := range rows {
		av := api.Volume{Name: v.Name, SizeBytes: v.SizeBytes, CreatedAt: v.CreatedAt, VMOnly: v.VMWritten}
		for _, h := range held[v.Name] {
			av.AttachedTo = append(av.AttachedTo, h.VolumeAttachment)
		}
		out = append(out, av)
	}
	return out, nil
}

// RemoveVolume deletes a tenant's volume and its data; a volume a sandbox
// still mounts is a conflict (a sandbox being removed is waited for).
func (vs *Volumes) RemoveVolume(ctx context.Context, tenant, name string) error {
	deadline := time.Now().Add(removalWait)
	for {
		removing, err := vs.tryRemoveVolume(ctx, tenant, name)
		if !removing || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (vs *Volumes) tryRemoveVolume(ctx context.Context, tenant, name string) (removing bool, err error) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if _, err := vs.m.cfg.Store.GetVolume(ctx, tenant, name); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return false, fmt.Errorf("%w: no volume is named %q (cagebox volume ls lists them)", errdefs.ErrNotFound, name)
		}
		return false, err
	}
	hs, err := vs.holders(ctx, tenant, name)
	if err != nil {
		return false, err
	}
	if len(hs) > 0 {
		removing = true
		ids := make([]string, len(hs))
		for i, h := range hs {
			ids[i] = h.Sandbox
			removing = removing && h.status == StatusRemoving
		}
		return removing, fmt.Errorf("%w: volume %s is mounted by %s: remove the sandbox first (cagebox rm %s)", errdefs.ErrConflict, name, strings.Join(ids, ", "), ids[0])
	}
	p := vs.volumePath(tenant, name)
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("remove volume image: %w", err)
	}
	if err := vs.m.cfg.Store.DeleteVolume(ctx, tenant, name); err != nil {
		return false, err
	}
	vs.m.log.Info("volume removed", "tenant", tenant, "volume", name)
	return false, nil
}

// mountsView is the API form of a sandbox's recorded mounts.
func mountsView(specs []mounts.Spec) []api.Mount {
	var out []api.Mount
	for _, s := range specs {
		out = append(out, api.Mount{Type: s.Type, Src: s.Source, Dst: s.Target, RW: s.RW, Exec: s.Exec})
	}
	return out
}
