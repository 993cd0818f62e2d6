package sandbox

import (
	"context"
	"time"

	"github.com/cagebox/cagebox/api"
)

// SetTimeout moves the end of a sandbox's lifetime to d from now (the
// reaper destroys it then), as E2B's setTimeout does; it may shorten or
// lengthen it.
func (m *Manager) SetTimeout(ctx context.Context, tenant, id string, d time.Duration) (*api.Sandbox, error) {
	if d <= 0 {
		return nil, invalid("timeout: give a positive duration")
	}
	r, err := m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return nil, notFound(id, err)
	}
	now := m.cfg.Now()
	exp := now.Add(d)
	r.ExpiresAt = &exp
	r.UpdatedAt = now.UTC()
	if err := m.cfg.Store.UpdateSandbox(ctx, r); err != nil {
		return nil, err
	}
	return m.view(r), nil
}
