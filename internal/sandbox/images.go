package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/image"
)

// Image references: every sandbox (cold, pooled or claimed) holds a
// reference to its image's tree from before the runtime is asked to make
// it until it is destroyed (image.Cache.Acquire), so `cagebox image rm`
// refuses an image in use and a --force rebuild retires the old tree
// instead of deleting it under running sandboxes.

// refOwner is this manager's key in the image cache's references: a hash
// of its state directory, so daemons with other homes sharing the cache
// leave each other's references alone.
func (m *Manager) refOwner() string {
	abs, err := filepath.Abs(m.cfg.StateDir)
	if err != nil {
		abs = m.cfg.StateDir
	}
	h := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(h[:8])
}

// acquireImage takes sandbox id's reference to img.
func (m *Manager) acquireImage(img *image.Image, id string) error {
	if err := m.cfg.Images.Acquire(img, m.refOwner(), id); err != nil {
		return imageError(img.Name, err)
	}
	return nil
}

// releaseImage drops sandbox id's reference (logged, not returned: the
// sandbox is gone either way, and the next daemon start prunes).
func (m *Manager) releaseImage(id string) {
	if err := m.cfg.Images.Release(m.refOwner(), id); err != nil {
		m.log.Warn("release image reference", "sandbox", id, "err", err)
	}
}

// PruneImageRefs drops the references of sandboxes that no longer exist
// (a killed daemon could not release them): call it after Recover,
// before StartPool.
func (m *Manager) PruneImageRefs(ctx context.Context) error {
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
	return m.cfg.Images.PruneRefs(m.refOwner(), func(id string) bool { return alive[id] })
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
