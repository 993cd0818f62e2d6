package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/cagebox/cagebox/internal/store"
)

const webhookCols = `id, tenant_id, sandbox_id, name, port, path, verify, secret, token_hash, created_at`

func scanWebhook(r scanner) (*store.Webhook, error) {
	var w store.Webhook
	var c int64
	if err := r.Scan(&w.ID, &w.TenantID, &w.SandboxID, &w.Name, &w.Port, &w.Path, &w.Verify, &w.Secret, &w.TokenHash, &c); err != nil {
		return nil, err
	}
	w.CreatedAt = fromNanos(c)
	return &w, nil
}

// CreateWebhook implements store.Store.
func (s *Store) CreateWebhook(ctx context.Context, w *store.Webhook) error {
	w.CreatedAt = store.NormTime(now())
	_, err := s.w.ExecContext(ctx, `INSERT INTO webhooks (`+webhookCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		w.ID, w.TenantID, w.SandboxID, w.Name, w.Port, w.Path, w.Verify, w.Secret, w.TokenHash, toNanos(w.CreatedAt))
	if err != nil {
		return fmt.Errorf("webhook %q: %w", w.Name, mapErr(err))
	}
	return nil
}

// ListWebhooks implements store.Store.
func (s *Store) ListWebhooks(ctx context.Context, tenantID, sandboxID string) ([]*store.Webhook, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+webhookCols+` FROM webhooks WHERE (? = '' OR tenant_id = ?) AND (? = '' OR sandbox_id = ?) ORDER BY sandbox_id, name`,
		tenantID, tenantID, sandboxID, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	return scanAll(rows, scanWebhook)
}

// WebhookByToken implements store.Store.
func (s *Store) WebhookByToken(ctx context.Context, hash []byte) (*store.Webhook, error) {
	w, err := scanWebhook(s.r.QueryRowContext(ctx, `SELECT `+webhookCols+` FROM webhooks WHERE token_hash = ?`, hash))
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", mapErr(err))
	}
	return w, nil
}

// DeleteWebhook implements store.Store.
func (s *Store) DeleteWebhook(ctx context.Context, tenantID, sandboxID, name string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM webhooks WHERE (? = '' OR tenant_id = ?) AND sandbox_id = ? AND name = ?`, tenantID, tenantID, sandboxID, name)
	if err != nil {
		return fmt.Errorf("delete webhook %q: %w", name, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("delete webhook %q: %w", name, err)
	}
	return nil
}

const deliveryCols = `id, webhook_id, sandbox_id, key, method, header, body, received_at, next_at, attempts, state, result, finished_at`

func scanDelivery(r scanner) (*store.Delivery, error) {
	var d store.Delivery
	var hdr string
	var recv, next int64
	var fin sql.NullInt64
	if err := r.Scan(&d.ID, &d.WebhookID, &d.SandboxID, &d.Key, &d.Method, &hdr, &d.Body, &recv, &next, &d.Attempts, &d.State, &d.Result, &fin); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(hdr), &d.Header); err != nil {
		return nil, fmt.Errorf("delivery %d header: %w", d.ID, err)
	}
	d.ReceivedAt, d.NextAt = fromNanos(recv), fromNanos(next)
	if fin.Valid {
		d.FinishedAt = fromNanos(fin.Int64)
	}
	return &d, nil
}

// EnqueueDelivery implements store.Store. The bound and the insert are one
// transaction (the writer connection is the only one that writes).
func (s *Store) EnqueueDelivery(ctx context.Context, d *store.Delivery, maxPending int) error {
	hdr, err := json.Marshal(d.Header)
	if err != nil {
		return fmt.Errorf("delivery header: %w", err)
	}
	if d.Header == nil {
		hdr = []byte("{}")
	}
	if d.Body == nil {
		d.Body = []byte{}
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM webhook_deliveries WHERE webhook_id = ? AND state = ?`, d.WebhookID, store.DeliveryPending).Scan(&n); err != nil {
		return fmt.Errorf("count deliveries: %w", err)
	}
	if maxPending > 0 && n >= maxPending {
		return fmt.Errorf("webhook %s has %d undelivered deliveries: %w", d.WebhookID, n, store.ErrFull)
	}
	if d.ReceivedAt.IsZero() {
		d.ReceivedAt = now()
	}
	d.ReceivedAt = store.NormTime(d.ReceivedAt)
	if d.NextAt.IsZero() {
		d.NextAt = d.ReceivedAt
	}
	d.State = store.DeliveryPending
	res, err := tx.ExecContext(ctx, `INSERT INTO webhook_deliveries (webhook_id, sandbox_id, key, method, header, body, received_at, next_at, attempts, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?)`,
		d.WebhookID, d.SandboxID, d.Key, d.Method, string(hdr), d.Body, toNanos(d.ReceivedAt), toNanos(d.NextAt), d.State)
	if err != nil {
		if isFK(err) {
			return fmt.Errorf("delivery: webhook %s: %w", d.WebhookID, store.ErrNotFound)
		}
		return fmt.Errorf("delivery: %w", mapErr(err))
	}
	if d.ID, err = res.LastInsertId(); err != nil {
		return err
	}
	return tx.Commit()
}

// DueDeliveries implements store.Store.
func (s *Store) DueDeliveries(ctx context.Context, sandboxID string, t time.Time, limit int) ([]*store.Delivery, error) {
	if limit <= 0 {
		limit = -1
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+deliveryCols+` FROM webhook_deliveries d WHERE state = ? AND next_at <= ? AND (? = '' OR sandbox_id = ?)
		AND id = (SELECT MIN(id) FROM webhook_deliveries h WHERE h.sandbox_id = d.sandbox_id AND h.state = ?) ORDER BY next_at, id LIMIT ?`,
		store.DeliveryPending, toNanos(t), sandboxID, sandboxID, store.DeliveryPending, limit)
	if err != nil {
		return nil, fmt.Errorf("due deliveries: %w", err)
	}
	return scanAll(rows, scanDelivery)
}

// FinishDelivery implements store.Store.
func (s *Store) FinishDelivery(ctx context.Context, id int64, ok bool, result string, at time.Time) error {
	state := store.DeliveryDead
	if ok {
		state = store.DeliveryDelivered
	}
	res, err := s.w.ExecContext(ctx, `UPDATE webhook_deliveries SET state = ?, result = ?, attempts = attempts + 1, finished_at = ? WHERE id = ? AND state = ?`,
		state, result, toNanos(at), id, store.DeliveryPending)
	if err != nil {
		return fmt.Errorf("finish delivery %d: %w", id, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("finish delivery %d: %w", id, err)
	}
	return nil
}

// RetryDelivery implements store.Store.
func (s *Store) RetryDelivery(ctx context.Context, id int64, result string, next time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE webhook_deliveries SET result = ?, attempts = attempts + 1, next_at = ? WHERE id = ? AND state = ?`,
		result, toNanos(next), id, store.DeliveryPending)
	if err != nil {
		return fmt.Errorf("retry delivery %d: %w", id, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("retry delivery %d: %w", id, err)
	}
	return nil
}

// PendingDeliveries implements store.Store.
func (s *Store) PendingDeliveries(ctx context.Context, webhookID string) (int, error) {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM webhook_deliveries WHERE webhook_id = ? AND state = ?`, webhookID, store.DeliveryPending).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count deliveries: %w", err)
	}
	return n, nil
}

// PruneDeliveries implements store.Store.
func (s *Store) PruneDeliveries(ctx context.Context, before time.Time, limit int) (int64, error) {
	if limit <= 0 {
		limit = -1
	}
	res, err := s.w.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM webhook_deliveries WHERE state != ? AND received_at < ? ORDER BY id LIMIT ?)`,
		store.DeliveryPending, toNanos(before), limit)
	if err != nil {
		return 0, fmt.Errorf("prune deliveries: %w", err)
	}
	return res.RowsAffected()
}
