package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/cagebox/cagebox/internal/store"
)

const snapshotCols = `id, tenant_id, name, sandbox_id, runtime, image, status, kind, size_bytes, digest, fork, spec, created_at`

func scanSnapshot(r scanner) (*store.Snapshot, error) {
	var s store.Snapshot
	var spec sql.NullString
	var c int64
	if err := r.Scan(&s.ID, &s.TenantID, &s.Name, &s.SandboxID, &s.Runtime, &s.Image, &s.Status, &s.Kind,
		&s.SizeBytes, &s.Digest, &s.Fork, &spec, &c); err != nil {
		return nil, err
	}
	if spec.Valid {
		s.Spec = []byte(spec.String)
	}
	s.CreatedAt = fromNanos(c)
	return &s, nil
}

// CreateSnapshot implements store.Store.
func (s *Store) CreateSnapshot(ctx context.Context, sn *store.Snapshot) error {
	if err := checkJSON(sn.Spec); err != nil {
		return fmt.Errorf("snapshot %q: %w", sn.Name, err)
	}
	sn.CreatedAt = store.NormTime(now())
	if _, err := s.w.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, sn.TenantID, sn.Name, sn.SandboxID, sn.Runtime, sn.Image, sn.Status, sn.Kind, sn.SizeBytes, sn.Digest, sn.Fork,
		jsonArg(sn.Spec), toNanos(sn.CreatedAt)); err != nil {
		if isFK(err) {
			return fmt.Errorf("snapshot %q: tenant %q: %w", sn.Name, sn.TenantID, store.ErrNotFound)
		}
		return fmt.Errorf("snapshot %q: %w", sn.Name, mapErr(err))
	}
	return nil
}

// UpdateSnapshot implements store.Store.
func (s *Store) UpdateSnapshot(ctx context.Context, sn *store.Snapshot) error {
	if err := checkJSON(sn.Spec); err != nil {
		return fmt.Errorf("snapshot %q: %w", sn.Name, err)
	}
	res, err := s.w.ExecContext(ctx, `UPDATE snapshots SET status = ?, kind = ?, size_bytes = ?, digest = ?, spec = ? WHERE id = ?`,
		sn.Status, sn.Kind, sn.SizeBytes, sn.Digest, jsonArg(sn.Spec), sn.ID)
	if err != nil {
		return fmt.Errorf("update snapshot %q: %w", sn.Name, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("update snapshot %q: %w", sn.Name, err)
	}
	return nil
}

// GetSnapshot implements store.Store.
func (s *Store) GetSnapshot(ctx context.Context, tenantID, name string) (*store.Snapshot, error) {
	var row *sql.Row
	if tenantID == "" {
		row = s.r.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id = ?`, name)
	} else {
		row = s.r.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE tenant_id = ? AND name = ?`, tenantID, name)
	}
	sn, err := scanSnapshot(row)
	if err != nil {
		return nil, fmt.Errorf("snapshot %q: %w", name, mapErr(err))
	}
	return sn, nil
}

// ListSnapshots implements store.Store.
func (s *Store) ListSnapshots(ctx context.Context, tenantID string) ([]*store.Snapshot, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE (? = '' OR tenant_id = ?) ORDER BY tenant_id, name`, tenantID, tenantID)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return scanAll(rows, scanSnapshot)
}

// DeleteSnapshot implements store.Store.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete snapshot %q: %w", id, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("delete snapshot %q: %w", id, err)
	}
	return nil
}
