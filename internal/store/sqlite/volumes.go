package sqlite

import (
	"context"
	"fmt"

	"github.com/cagebox/cagebox/internal/store"
)

const volumeCols = `tenant_id, name, size_bytes, vm_written, created_at`

func scanVolume(r scanner) (*store.Volume, error) {
	var v store.Volume
	var c int64
	if err := r.Scan(&v.TenantID, &v.Name, &v.SizeBytes, &v.VMWritten, &c); err != nil {
		return nil, err
	}
	v.CreatedAt = fromNanos(c)
	return &v, nil
}

// CreateVolume implements store.Store.
func (s *Store) CreateVolume(ctx context.Context, v *store.Volume) error {
	v.CreatedAt = store.NormTime(now())
	if _, err := s.w.ExecContext(ctx, `INSERT INTO volumes (`+volumeCols+`) VALUES (?, ?, ?, ?, ?)`,
		v.TenantID, v.Name, v.SizeBytes, v.VMWritten, toNanos(v.CreatedAt)); err != nil {
		if isFK(err) {
			return fmt.Errorf("volume %q: tenant %q: %w", v.Name, v.TenantID, store.ErrNotFound)
		}
		return fmt.Errorf("volume %q: %w", v.Name, mapErr(err))
	}
	return nil
}

// GetVolume implements store.Store.
func (s *Store) GetVolume(ctx context.Context, tenantID, name string) (*store.Volume, error) {
	v, err := scanVolume(s.r.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE tenant_id = ? AND name = ?`, tenantID, name))
	if err != nil {
		return nil, fmt.Errorf("volume %q: %w", name, mapErr(err))
	}
	return v, nil
}

// ListVolumes implements store.Store.
func (s *Store) ListVolumes(ctx context.Context, tenantID string) ([]*store.Volume, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE (? = '' OR tenant_id = ?) ORDER BY tenant_id, name`, tenantID, tenantID)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	return scanAll(rows, scanVolume)
}

// SetVolumeVMWritten implements store.Store.
func (s *Store) SetVolumeVMWritten(ctx context.Context, tenantID, name string) error {
	res, err := s.w.ExecContext(ctx, `UPDATE volumes SET vm_written = 1 WHERE tenant_id = ? AND name = ?`, tenantID, name)
	if err != nil {
		return fmt.Errorf("volume %q: %w", name, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("volume %q: %w", name, err)
	}
	return nil
}

// DeleteVolume implements store.Store.
func (s *Store) DeleteVolume(ctx context.Context, tenantID, name string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM volumes WHERE tenant_id = ? AND name = ?`, tenantID, name)
	if err != nil {
		return fmt.Errorf("delete volume %q: %w", name, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("delete volume %q: %w", name, err)
	}
	return nil
}
