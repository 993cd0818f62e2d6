package sqlite

import (
	"context"
	"fmt"

	"github.com/cagebox/cagebox/internal/store"
)

// CreateRelay implements store.Store.
func (s *Store) CreateRelay(ctx context.Context, r *store.Relay) error {
	w := &r.Hook
	w.CreatedAt = store.NormTime(now())
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("relay %q: %w", w.Name, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO webhooks (`+webhookCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		w.ID, w.TenantID, w.SandboxID, w.Name, w.Port, w.Path, w.Verify, w.Secret, w.TokenHash, toNanos(w.CreatedAt)); err != nil {
		return fmt.Errorf("relay %q: %w", w.Name, mapErr(err))
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO relays (webhook_id, kind, config, created_at) VALUES (?, ?, ?, ?)`,
		w.ID, r.Kind, r.Config, toNanos(w.CreatedAt)); err != nil {
		return fmt.Errorf("relay %q: %w", w.Name, mapErr(err))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("relay %q: %w", w.Name, err)
	}
	return nil
}

// ListRelays implements store.Store.
func (s *Store) ListRelays(ctx context.Context, tenantID, sandboxID string) ([]*store.Relay, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT w.id, w.tenant_id, w.sandbox_id, w.name, w.port, w.path, w.verify, w.secret, w.token_hash, w.created_at, r.kind, r.config
FROM relays r JOIN webhooks w ON w.id = r.webhook_id
WHERE (? = '' OR w.tenant_id = ?) AND (? = '' OR w.sandbox_id = ?) ORDER BY w.sandbox_id, w.name`,
		tenantID, tenantID, sandboxID, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("list relays: %w", err)
	}
	return scanAll(rows, func(r scanner) (*store.Relay, error) {
		var x store.Relay
		var c int64
		w := &x.Hook
		if err := r.Scan(&w.ID, &w.TenantID, &w.SandboxID, &w.Name, &w.Port, &w.Path, &w.Verify, &w.Secret, &w.TokenHash, &c, &x.Kind, &x.Config); err != nil {
			return nil, err
		}
		w.CreatedAt = fromNanos(c)
		return &x, nil
	})
}
