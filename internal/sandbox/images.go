package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

// Image references: every sandbox (cold, pooled or claimed) holds a
// reference to its image's tree from before the runtime is asked to make
// it until it is destroyed (image.Cache.Acquire), so `cagebox image rm`
// refuses an image in use and a --force rebuild retires the old tree
// instead of deleting it under running sandboxes.

// refOwner is this manager's key in the image cache's references: a hash
// of its state directory, so daemons with other homes sharing the cache
// ImageRefs is the manager's service of its references on cached images
// (Manager.ImageRefs): every sandbox and snapshot holds one on its image,
// so the image is not removed under it.
type ImageRefs struct{ m *Manager }

// ImageRefs is the service of the manager's image references.
func (m *Manager) ImageRefs() *ImageRefs { return m.imageRefs }

// leave each other's references alone.
func (ir *ImageRefs) owner() string {
	m := ir.m
	h := sha256.Sum256([]byte(m.imageRefs.stateDirAbs()))
	return hex.EncodeToString(h[:8])
}

func (ir *ImageRefs) stateDirAbs() string {
	m := ir.m
	abs, err := filepath.Abs(m.cfg.StateDir)
	if err != nil {
		return m.cfg.StateDir
	}
	return abs
}

// acquire takes sandbox id's reference to img, naming this manager's
// state directory so that any process can tell whether its holder still
// exists (ImageRefAlive).
func (ir *ImageRefs) acquire(img *image.Image, id string) error {
	m := ir.m
	if err := m.cfg.Images.AcquireFor(img, m.imageRefs.owner(), m.imageRefs.stateDirAbs(), id); err != nil {
		return imageError(img.Name, err)
	}
	return nil
}

// release drops sandbox id's reference (logged, not returned: the
// sandbox is gone either way, and the next daemon start prunes).
func (ir *ImageRefs) release(id string) {
	m := ir.m
	if err := m.cfg.Images.Release(m.imageRefs.owner(), id); err != nil {
		m.log.Warn("release image reference", "sandbox", id, "err", err)
	}
}

// ImageRefs.Prune drops the references of sandboxes that no longer exist
// (a killed daemon could not release them): call it after Recover,
// before Pools.Start.
func (ir *ImageRefs) Prune(ctx context.Context) error {
	m := ir.m
	rs, err := m.cfg.Store.ListSandboxes(ctx, "")
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	alive := map[string]bool{}
	for _, r := range rs {
		if r.Status != StatusDestroyed && r.Status != StatusFailed {
			alive[r.ID] = true
		}
	}
	// Pooled sandboxes (rows of no tenant) hold their references too.
	pooled, err := m.cfg.Store.ListUnownedSandboxes(ctx)
	if err != nil {
		return fmt.Errorf("list pooled sandboxes: %w", err)
	}
	for _, r := range pooled {
		alive[r.ID] = true
	}
	// Snapshots hold references of their own.
	snaps, err := m.snapshots.snapshotIDs(ctx)
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	for _, id := range snaps {
		alive[id] = true
	}
	if err := m.cfg.Images.PruneRefs(m.imageRefs.owner(), func(id string) bool { return alive[id] }); err != nil {
		return err
	}
	// Other homes' references whose sandbox or home is gone.
	n, err := m.cfg.Images.PruneOrphans(ImageRefAlive)
	if n > 0 {
		m.log.Info("dropped image references of sandboxes that no longer exist", "count", n)
	}
	return err
}

// ImageRefAlive says whether the sandbox id of the daemon whose sandbox
// state directory is stateDir (HOME/sandboxes) still exists, for
// image.Cache.PruneOrphans. It says yes whenever it cannot tell:
//
//   - the home is gone: no;
//   - a daemon answers on the home's socket: yes (that daemon owns its
//     references, releases them and prunes its own at start; a sandbox it
//     is making has a reference before it has a record);
//   - the home has a store: whether the store (read-only) has the sandbox
//     in a state other than destroyed or failed (pooled rows count), or an
//     older layout's pool files name it;
//   - anything else (no store, an unreadable one): yes.
func ImageRefAlive(stateDir, id string) bool {
	home := filepath.Dir(stateDir)
	if _, err := os.Lstat(home); errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if c, err := net.DialTimeout("unix", filepath.Join(home, "cagebox.sock"), time.Second); err == nil {
		c.Close()
		return true
	}
	for _, p := range LegacyPoolIDs(stateDir) {
		if p == id {
			return true
		}
	}
	db := filepath.Join(home, "cagebox.db")
	if _, err := os.Stat(db); err != nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	status, found, err := sqlite.SandboxStatus(ctx, db, id)
	if err != nil {
		return true
	}
	return found && status != StatusDestroyed && status != StatusFailed
}

// imageError maps the image cache's errors to the API's kinds.
func imageError(name string, err error) error {
	switch {
	case errors.Is(err, image.ErrNotFound):
		return fmt.Errorf("%w: %v", errdefs.ErrNotFound, err)
	case errors.Is(err, image.ErrInvalid):
		return fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	case errors.Is(err, image.ErrBusy), errors.Is(err, image.ErrInUse):
		return fmt.Errorf("%w: %v", errdefs.ErrConflict, err)
	}
	return fmt.Errorf("image %s: %w", name, err)
}
