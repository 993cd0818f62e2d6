package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/cagebox/cagebox/internal/store"
)

const portCols = `sandbox_id, tenant_id, port, public, token_hash, expires_at, created_at`

func scanPort(r scanner) (*store.Port, error) {
	var p store.Port
	var exp sql.NullInt64
	var c int64
	if err := r.Scan(&p.SandboxID, &p.TenantID, &p.Port, &p.Public, &p.TokenHash, &exp, &c); err != nil {
		return nil, err
	}
	p.ExpiresAt, p.CreatedAt = fromNullNanos(exp), fromNanos(c)
	return &p, nil
}

// PutPort implements store.Store.
func (s *Store) PutPort(ctx context.Context, p *store.Port) error {
	p.CreatedAt = store.NormTime(now())
	if _, err := s.w.ExecContext(ctx, `INSERT INTO ports (`+portCols+`) VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (sandbox_id, port) DO UPDATE SET public = excluded.public, token_hash = excluded.token_hash, expires_at = excluded.expires_at, created_at = excluded.created_at`,
		p.SandboxID, p.TenantID, p.Port, p.Public, p.TokenHash, normPtr(&p.ExpiresAt), toNanos(p.CreatedAt)); err != nil {
		return fmt.Errorf("port %d of %s: %w", p.Port, p.SandboxID, mapErr(err))
	}
	return nil
}

// GetPort implements store.Store.
func (s *Store) GetPort(ctx context.Context, tenantID, sandboxID string, port int) (*store.Port, error) {
	p, err := scanPort(s.r.QueryRowContext(ctx, `SELECT `+portCols+` FROM ports WHERE sandbox_id = ? AND port = ? AND (? = '' OR tenant_id = ?)`, sandboxID, port, tenantID, tenantID))
	if err != nil {
		return nil, fmt.Errorf("port %d of %s: %w", port, sandboxID, mapErr(err))
	}
	return p, nil
}

// ListPorts implements store.Store.
func (s *Store) ListPorts(ctx context.Context, tenantID, sandboxID string) ([]*store.Port, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+portCols+` FROM ports WHERE (? = '' OR sandbox_id = ?) AND (? = '' OR tenant_id = ?) ORDER BY sandbox_id, port`, sandboxID, sandboxID, tenantID, tenantID)
	if err != nil {
		return nil, fmt.Errorf("list ports: %w", err)
	}
	return scanAll(rows, scanPort)
}

// DeletePort implements store.Store.
func (s *Store) DeletePort(ctx context.Context, tenantID, sandboxID string, port int) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM ports WHERE sandbox_id = ? AND port = ? AND (? = '' OR tenant_id = ?)`, sandboxID, port, tenantID, tenantID)
	if err != nil {
		return fmt.Errorf("delete port %d of %s: %w", port, sandboxID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("port %d of %s: %w", port, sandboxID, store.ErrNotFound)
	}
	return nil
}

// DeletePorts implements store.Store.
func (s *Store) DeletePorts(ctx context.Context, sandboxID string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM ports WHERE sandbox_id = ?`, sandboxID); err != nil {
		return fmt.Errorf("delete ports of %s: %w", sandboxID, err)
	}
	return nil
}
