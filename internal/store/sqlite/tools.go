package sqlite

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cagebox/cagebox/internal/store"
)

const toolCols = `tenant_id, name, spec, created_at`

func scanTool(r scanner) (*store.Tool, error) {
	var t store.Tool
	var spec string
	var c int64
	if err := r.Scan(&t.TenantID, &t.Name, &spec, &c); err != nil {
		return nil, err
	}
	t.Spec, t.CreatedAt = json.RawMessage(spec), fromNanos(c)
	return &t, nil
}

// PutTool implements store.Store.
func (s *Store) PutTool(ctx context.Context, t *store.Tool, replace bool) error {
	t.CreatedAt = store.NormTime(now())
	q := `INSERT INTO tools (tenant_id, name, spec, created_at) VALUES (?, ?, ?, ?)`
	if replace {
		q += ` ON CONFLICT (tenant_id, name) DO UPDATE SET spec = excluded.spec, created_at = excluded.created_at`
	}
	if _, err := s.w.ExecContext(ctx, q, t.TenantID, t.Name, string(t.Spec), toNanos(t.CreatedAt)); err != nil {
		return fmt.Errorf("tool %q: %w", t.Name, mapErr(err))
	}
	return nil
}

// GetTool implements store.Store.
func (s *Store) GetTool(ctx context.Context, tenantID, name string) (*store.Tool, error) {
	t, err := scanTool(s.r.QueryRowContext(ctx, `SELECT `+toolCols+` FROM tools WHERE tenant_id = ? AND name = ?`, tenantID, name))
	if err != nil {
		return nil, fmt.Errorf("tool %q: %w", name, mapErr(err))
	}
	return t, nil
}

// ListTools implements store.Store.
func (s *Store) ListTools(ctx context.Context, tenantID string) ([]*store.Tool, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+toolCols+` FROM tools WHERE (? = '' OR tenant_id = ?) ORDER BY tenant_id, name`, tenantID, tenantID)
	if err != nil {
		return nil, fmt.Errorf("list tools: %w", err)
	}
	return scanAll(rows, scanTool)
}

// DeleteTool implements store.Store.
func (s *Store) DeleteTool(ctx context.Context, tenantID, name string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM tools WHERE tenant_id = ? AND name = ?`, tenantID, name)
	if err != nil {
		return fmt.Errorf("delete tool %q: %w", name, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("delete tool %q: %w", name, err)
	}
	return nil
}
