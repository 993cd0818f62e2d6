// Package sqlite is the single-host implementation of store.Store, on
// SQLite through modernc.org/sqlite (pure Go, no cgo).
//
// The database is opened as internal/sqlitedb opens every cagebox
// database: WAL with synchronous=FULL (a commit the daemon was told about
// survives a power loss), one writer connection whose transactions BEGIN
// IMMEDIATE, and a pool of query-only readers. The schema's steps are
// recorded in the schema_migrations table.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/cagebox/cagebox/internal/sqlitedb"
	"github.com/cagebox/cagebox/internal/store"
)

var _ store.Store = (*Store)(nil)

// Store is a store.Store in one SQLite database file.
type Store struct {
	path string
	db   *sqlitedb.DB
	w    *sql.DB // the single writer connection (db.W)
	r    *sql.DB // query-only readers (db.R)

	closeOnce sync.Once
	closeErr  error
}

// Open opens (creating it, mode 0600, if missing) the database at path,
// applies pending schema migrations and makes sure the admin tenant exists.
// A database written by a newer cagebox (with migrations this one does not
// know) is refused.
func Open(path string) (*Store, error) {
	return openWith(context.Background(), path, migrations)
}

func openWith(ctx context.Context, path string, migs []migration) (_ *Store, err error) {
	db, err := sqlitedb.Open(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	s := &Store{path: path, db: db, w: db.W, r: db.R}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	if err := sqlitedb.Migrate(ctx, s.w, "database "+path, migs, sqlitedb.MigrationsTable); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if _, err := s.w.ExecContext(ctx,
		`INSERT INTO tenants (id, name, min_isolation, created_at) VALUES (?, ?, '', ?) ON CONFLICT (id) DO NOTHING`,
		store.AdminTenantID, store.AdminTenantID, toNanos(now())); err != nil {
		return nil, fmt.Errorf("open store %s: seed admin tenant: %w", path, err)
	}
	return s, nil
}

// Close closes the database. It is safe to call more than once.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if err := s.db.Close(); err != nil {
			s.closeErr = fmt.Errorf("close store %s: %w", s.path, err)
		}
	})
	return s.closeErr
}

// ---- tenants ----

// CreateTenant implements store.Store.
func (s *Store) CreateTenant(ctx context.Context, t *store.Tenant) error {
	if t.CreatedAt.IsZero() {
		t.CreatedAt = now()
	}
	t.CreatedAt = store.NormTime(t.CreatedAt)
	_, err := s.w.ExecContext(ctx, `INSERT INTO tenants (id, name, min_isolation, untrusted, created_at) VALUES (?, ?, ?, ?, ?)`,
		t.ID, t.Name, t.MinIsolation, t.Untrusted, toNanos(t.CreatedAt))
	if err != nil {
		return fmt.Errorf("create tenant %q: %w", t.ID, mapErr(err))
	}
	return nil
}

// GetTenant implements store.Store.
func (s *Store) GetTenant(ctx context.Context, id string) (*store.Tenant, error) {
	t, err := scanTenant(s.r.QueryRowContext(ctx,
		`SELECT id, name, min_isolation, untrusted, created_at FROM tenants WHERE id = ?`, id))
	if err != nil {
		return nil, fmt.Errorf("tenant %q: %w", id, mapErr(err))
	}
	return t, nil
}

// ListTenants implements store.Store.
func (s *Store) ListTenants(ctx context.Context) ([]*store.Tenant, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, name, min_isolation, untrusted, created_at FROM tenants ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	out, err := scanAll(rows, scanTenant)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	return out, nil
}

func scanTenant(r scanner) (*store.Tenant, error) {
	var t store.Tenant
	var created int64
	if err := r.Scan(&t.ID, &t.Name, &t.MinIsolation, &t.Untrusted, &created); err != nil {
		return nil, err
	}
	t.CreatedAt = fromNanos(created)
	return &t, nil
}

// ---- API keys ----

const apiKeyCols = `id, tenant_id, hash, prefix, created_at, revoked_at`

// CreateAPIKey implements store.Store.
func (s *Store) CreateAPIKey(ctx context.Context, k *store.APIKey) error {
	if len(k.Hash) == 0 {
		return fmt.Errorf("create api key %q: empty hash", k.ID)
	}
	if k.CreatedAt.IsZero() {
		k.CreatedAt = now()
	}
	k.CreatedAt = store.NormTime(k.CreatedAt)
	var revoked any
	if k.RevokedAt != nil {
		r := store.NormTime(*k.RevokedAt)
		k.RevokedAt = &r
		revoked = toNanos(r)
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO api_keys (`+apiKeyCols+`) VALUES (?, ?, ?, ?, ?, ?)`,
		k.ID, k.TenantID, k.Hash, k.Prefix, toNanos(k.CreatedAt), revoked)
	if err != nil {
		if isFK(err) {
			return fmt.Errorf("create api key %q: tenant %q: %w", k.ID, k.TenantID, store.ErrNotFound)
		}
		return fmt.Errorf("create api key %q: %w", k.ID, mapErr(err))
	}
	return nil
}

// APIKeyByHash implements store.Store.
func (s *Store) APIKeyByHash(ctx context.Context, hash []byte) (*store.APIKey, error) {
	k, err := scanAPIKey(s.r.QueryRowContext(ctx,
		`SELECT `+apiKeyCols+` FROM api_keys WHERE hash = ? AND revoked_at IS NULL`, hash))
	if err != nil {
		// Never put the hash (or the secret) in the error.
		return nil, fmt.Errorf("api key: %w", mapErr(err))
	}
	return k, nil
}

// RevokeAPIKey implements store.Store.
func (s *Store) RevokeAPIKey(ctx context.Context, id string) error {
	res, err := s.w.ExecContext(ctx,
		`UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?`, toNanos(now()), id)
	if err != nil {
		return fmt.Errorf("revoke api key %q: %w", id, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("revoke api key %q: %w", id, err)
	}
	return nil
}

// ListAPIKeys implements store.Store.
func (s *Store) ListAPIKeys(ctx context.Context, tenantID string) ([]*store.APIKey, error) {
	var rows *sql.Rows
	var err error
	if tenantID == "" {
		rows, err = s.r.QueryContext(ctx, `SELECT `+apiKeyCols+` FROM api_keys ORDER BY created_at, id`)
	} else {
		rows, err = s.r.QueryContext(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE tenant_id = ? ORDER BY created_at, id`, tenantID)
	}
	if err != nil {
		return nil, fmt.Errorf("list api keys of tenant %q: %w", tenantID, err)
	}
	out, err := scanAll(rows, scanAPIKey)
	if err != nil {
		return nil, fmt.Errorf("list api keys of tenant %q: %w", tenantID, err)
	}
	return out, nil
}

func scanAPIKey(r scanner) (*store.APIKey, error) {
	var k store.APIKey
	var created int64
	var revoked sql.NullInt64
	if err := r.Scan(&k.ID, &k.TenantID, &k.Hash, &k.Prefix, &created, &revoked); err != nil {
		return nil, err
	}
	k.CreatedAt = fromNanos(created)
	k.RevokedAt = fromNullNanos(revoked)
	return &k, nil
}

// ---- sandboxes ----

const sandboxCols = `id, tenant_id, runtime, image, status, spec, state, error,
	created_at, updated_at, expires_at, idle_timeout, last_active, labels`

// prepareSandbox checks a row's JSON and normalises its times (created
// and last active default to now) for an insert or a bind; it returns the
// expiry and the labels' JSON (nil for none) as the columns take them.
func prepareSandbox(sb *store.Sandbox) (expires, labels any, err error) {
	if err := checkJSON(sb.Spec, sb.State); err != nil {
		return nil, nil, err
	}
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = now()
	}
	sb.CreatedAt = store.NormTime(sb.CreatedAt)
	sb.UpdatedAt = store.NormTime(now())
	if sb.LastActive.IsZero() {
		sb.LastActive = sb.CreatedAt
	}
	sb.LastActive = store.NormTime(sb.LastActive)
	if len(sb.Labels) > 0 {
		b, err := json.Marshal(sb.Labels)
		if err != nil {
			return nil, nil, fmt.Errorf("labels: %w", err)
		}
		labels = string(b)
	}
	return normPtr(&sb.ExpiresAt), labels, nil
}

// CreateSandbox implements store.Store.
func (s *Store) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	expires, labels, err := prepareSandbox(sb)
	if err != nil {
		return fmt.Errorf("create sandbox %q: %w", sb.ID, err)
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxCols+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, tenantArg(sb.TenantID), sb.Runtime, sb.Image, sb.Status, jsonArg(sb.Spec), jsonArg(sb.State), sb.Error,
		toNanos(sb.CreatedAt), toNanos(sb.UpdatedAt), expires, int64(sb.IdleTimeout), toNanos(sb.LastActive), labels)
	if err != nil {
		if isFK(err) {
			return fmt.Errorf("create sandbox %q: tenant %q: %w", sb.ID, sb.TenantID, store.ErrNotFound)
		}
		return fmt.Errorf("create sandbox %q: %w", sb.ID, mapErr(err))
	}
	return nil
}

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(ctx context.Context, tenantID, id string) (*store.Sandbox, error) {
	var row *sql.Row
	if tenantID == "" {
		row = s.r.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ? AND tenant_id IS NOT NULL`, id)
	} else {
		row = s.r.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ? AND tenant_id = ?`, id, tenantID)
	}
	sb, err := scanSandbox(row)
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", id, mapErr(err))
	}
	return sb, nil
}

// ListSandboxes implements store.Store.
func (s *Store) ListSandboxes(ctx context.Context, tenantID string) ([]*store.Sandbox, error) {
	return s.ListSandboxesLabeled(ctx, tenantID, nil)
}

// ListSandboxesLabeled implements store.Store: one EXISTS over the row's
// labels object per label asked for.
func (s *Store) ListSandboxesLabeled(ctx context.Context, tenantID string, labels map[string]string) ([]*store.Sandbox, error) {
	where := []string{"tenant_id IS NOT NULL"}
	var args []any
	if tenantID != "" {
		where = []string{"tenant_id = ?"}
		args = append(args, tenantID)
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		where = append(where, "EXISTS (SELECT 1 FROM json_each(sandboxes.labels) AS l WHERE l.key = ? AND l.type = 'text' AND l.value = ?)")
		args = append(args, k, labels[k])
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes WHERE ` + strings.Join(where, " AND ")
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of tenant %q: %w", tenantID, err)
	}
	out, err := scanAll(rows, scanSandbox)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of tenant %q: %w", tenantID, err)
	}
	return out, nil
}

// UpdateSandbox implements store.Store. LastActive only moves forward, as
// in TouchSandbox, so a read-modify-write does not undo a concurrent touch;
// the row's TenantID, CreatedAt and LastActive are written back into sb.
func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	if err := checkJSON(sb.Spec, sb.State); err != nil {
		return fmt.Errorf("update sandbox %q: %w", sb.ID, err)
	}
	updated := store.NormTime(now())
	last := toNanos(store.NormTime(sb.LastActive))
	expires := normPtr(&sb.ExpiresAt)
	q := `UPDATE sandboxes SET runtime = ?, image = ?, status = ?, spec = ?, state = ?, error = ?,
		updated_at = ?, expires_at = ?, idle_timeout = ?,
		last_active = CASE WHEN last_active < ? THEN ? ELSE last_active END
		WHERE id = ?`
	args := []any{sb.Runtime, sb.Image, sb.Status, jsonArg(sb.Spec), jsonArg(sb.State), sb.Error,
		toNanos(updated), expires, int64(sb.IdleTimeout), last, last, sb.ID}
	if sb.TenantID != "" {
		q += ` AND tenant_id = ?`
		args = append(args, sb.TenantID)
	}
	q += ` RETURNING COALESCE(tenant_id, ''), created_at, last_active`
	var tenant string
	var created, active int64
	if err := s.w.QueryRowContext(ctx, q, args...).Scan(&tenant, &created, &active); err != nil {
		return fmt.Errorf("update sandbox %q: %w", sb.ID, mapErr(err))
	}
	sb.TenantID = tenant
	sb.CreatedAt = fromNanos(created)
	sb.UpdatedAt = updated
	sb.LastActive = fromNanos(active)
	return nil
}

// ListUnownedSandboxes implements store.Store.
func (s *Store) ListUnownedSandboxes(ctx context.Context) ([]*store.Sandbox, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE tenant_id IS NULL ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of no tenant: %w", err)
	}
	out, err := scanAll(rows, scanSandbox)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of no tenant: %w", err)
	}
	return out, nil
}

// BindSandbox implements store.Store: one UPDATE of the row while it has
// no tenant, so two binds of one row cannot both succeed.
func (s *Store) BindSandbox(ctx context.Context, sb *store.Sandbox) error {
	if sb.TenantID == "" {
		return fmt.Errorf("bind sandbox %q: no tenant given: %w", sb.ID, store.ErrNotFound)
	}
	expires, labels, err := prepareSandbox(sb)
	if err != nil {
		return fmt.Errorf("bind sandbox %q: %w", sb.ID, err)
	}
	res, err := s.w.ExecContext(ctx, `UPDATE sandboxes SET tenant_id = ?, runtime = ?, image = ?, status = ?, spec = ?, state = ?, error = ?,
		created_at = ?, updated_at = ?, expires_at = ?, idle_timeout = ?, last_active = ?, labels = ?
		WHERE id = ? AND tenant_id IS NULL`,
		sb.TenantID, sb.Runtime, sb.Image, sb.Status, jsonArg(sb.Spec), jsonArg(sb.State), sb.Error,
		toNanos(sb.CreatedAt), toNanos(sb.UpdatedAt), expires, int64(sb.IdleTimeout), toNanos(sb.LastActive), labels, sb.ID)
	if err != nil {
		if isFK(err) {
			return fmt.Errorf("bind sandbox %q: tenant %q: %w", sb.ID, sb.TenantID, store.ErrNotFound)
		}
		return fmt.Errorf("bind sandbox %q: %w", sb.ID, mapErr(err))
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("bind sandbox %q: %w", sb.ID, err)
	}
	return nil
}

// tenantArg is a sandbox's tenant_id: NULL for no tenant.
func tenantArg(id string) any {
	if id == "" {
		return nil
	}
	return id
}

// TouchSandbox implements store.Store.
func (s *Store) TouchSandbox(ctx context.Context, id string, t time.Time) error {
	n := toNanos(store.NormTime(t))
	res, err := s.w.ExecContext(ctx,
		`UPDATE sandboxes SET last_active = CASE WHEN last_active < ? THEN ? ELSE last_active END WHERE id = ?`, n, n, id)
	if err != nil {
		return fmt.Errorf("touch sandbox %q: %w", id, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("touch sandbox %q: %w", id, err)
	}
	return nil
}

// DeleteSandbox implements store.Store.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete sandbox %q: %w", id, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("delete sandbox %q: %w", id, err)
	}
	return nil
}

func scanSandbox(r scanner) (*store.Sandbox, error) {
	var sb store.Sandbox
	var tenant, spec, state, labels sql.NullString
	var created, updated, idle, active int64
	var expires sql.NullInt64
	if err := r.Scan(&sb.ID, &tenant, &sb.Runtime, &sb.Image, &sb.Status, &spec, &state, &sb.Error,
		&created, &updated, &expires, &idle, &active, &labels); err != nil {
		return nil, err
	}
	sb.TenantID = tenant.String
	if labels.Valid && labels.String != "" {
		if err := json.Unmarshal([]byte(labels.String), &sb.Labels); err != nil {
			return nil, fmt.Errorf("sandbox %q: labels: %w", sb.ID, err)
		}
		if len(sb.Labels) == 0 {
			sb.Labels = nil
		}
	}
	sb.Spec = jsonResult(spec)
	sb.State = jsonResult(state)
	sb.CreatedAt = fromNanos(created)
	sb.UpdatedAt = fromNanos(updated)
	sb.ExpiresAt = fromNullNanos(expires)
	sb.IdleTimeout = time.Duration(idle)
	sb.LastActive = fromNanos(active)
	return &sb, nil
}

// ---- events ----

// AppendEvent implements store.Store.
func (s *Store) AppendEvent(ctx context.Context, e *store.Event) error {
	if err := checkJSON(e.Data); err != nil {
		return fmt.Errorf("append event %q: %w", e.Kind, err)
	}
	if e.Time.IsZero() {
		e.Time = now()
	}
	e.Time = store.NormTime(e.Time)
	err := s.w.QueryRowContext(ctx,
		`INSERT INTO events (time, tenant_id, sandbox_id, kind, data) VALUES (?, ?, ?, ?, ?) RETURNING seq`,
		toNanos(e.Time), e.TenantID, e.SandboxID, e.Kind, jsonArg(e.Data)).Scan(&e.Seq)
	if err != nil {
		return fmt.Errorf("append event %q: %w", e.Kind, err)
	}
	return nil
}

// AppendEvents implements store.Store: one transaction, one fsync, for the
// whole batch (the daemon's event writer drains its queue into it).
func (s *Store) AppendEvents(ctx context.Context, es []*store.Event) error {
	for _, e := range es {
		if err := checkJSON(e.Data); err != nil {
			return fmt.Errorf("append event %q: %w", e.Kind, err)
		}
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	defer tx.Rollback()
	seqs := make([]int64, len(es))
	times := make([]time.Time, len(es))
	for i, e := range es {
		t := e.Time
		if t.IsZero() {
			t = now()
		}
		times[i] = store.NormTime(t)
		if err := tx.QueryRowContext(ctx,
			`INSERT INTO events (time, tenant_id, sandbox_id, kind, data) VALUES (?, ?, ?, ?, ?) RETURNING seq`,
			toNanos(times[i]), e.TenantID, e.SandboxID, e.Kind, jsonArg(e.Data)).Scan(&seqs[i]); err != nil {
			return fmt.Errorf("append event %q: %w", e.Kind, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	// Only a committed batch changes the callers' structs.
	for i, e := range es {
		e.Seq, e.Time = seqs[i], times[i]
	}
	return nil
}

// ListEvents implements store.Store.
func (s *Store) ListEvents(ctx context.Context, tenantID, sandboxID string, afterSeq int64, limit int) ([]*store.Event, error) {
	q := `SELECT seq, time, tenant_id, sandbox_id, kind, data FROM events WHERE seq > ?`
	args := []any{afterSeq}
	if tenantID != "" {
		q += ` AND tenant_id = ?`
		args = append(args, tenantID)
	}
	if sandboxID != "" {
		q += ` AND sandbox_id = ?`
		args = append(args, sandboxID)
	}
	q += ` ORDER BY seq`
	if limit > 0 {
		q += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	out, err := scanAll(rows, func(r scanner) (*store.Event, error) {
		var e store.Event
		var t int64
		var data sql.NullString
		if err := r.Scan(&e.Seq, &t, &e.TenantID, &e.SandboxID, &e.Kind, &data); err != nil {
			return nil, err
		}
		e.Time = fromNanos(t)
		e.Data = jsonResult(data)
		return &e, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return out, nil
}

// DeleteEventsBefore implements store.Store: the oldest first, by the
// events_time index, one transaction per call.
func (s *Store) DeleteEventsBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	q := `DELETE FROM events WHERE time < ?`
	args := []any{toNanos(before)}
	if limit > 0 {
		q = `DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE time < ? ORDER BY time, seq LIMIT ?)`
		args = append(args, limit)
	}
	res, err := s.w.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("delete events before %s: %w", before.UTC().Format(time.RFC3339), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("delete events before %s: %w", before.UTC().Format(time.RFC3339), err)
	}
	return n, nil
}

// ---- helpers ----

type scanner interface{ Scan(dest ...any) error }

func scanAll[T any](rows *sql.Rows, scan func(scanner) (*T, error)) ([]*T, error) {
	defer rows.Close()
	var out []*T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func now() time.Time { return time.Now() }

// toNanos is the column encoding of a (normalised) time: unix nanoseconds
// in UTC. Times outside 1678–2262 do not fit; the store never sees them.
func toNanos(t time.Time) int64 { return t.UnixNano() }

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

func fromNullNanos(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromNanos(n.Int64)
	return &t
}

// normPtr normalises *p in place (if set) and returns its column value.
func normPtr(p **time.Time) any {
	if *p == nil {
		return nil
	}
	t := store.NormTime(**p)
	*p = &t
	return toNanos(t)
}

func checkJSON(docs ...json.RawMessage) error {
	for _, d := range docs {
		if len(d) > 0 && !json.Valid(d) {
			return errors.New("invalid json document")
		}
	}
	return nil
}

func jsonArg(m json.RawMessage) any {
	if len(m) == 0 {
		return nil
	}
	return string(m)
}

func jsonResult(s sql.NullString) json.RawMessage {
	if !s.Valid || s.String == "" {
		return nil
	}
	return json.RawMessage(s.String)
}

func wantOneRow(res sql.Result) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// mapErr turns a missing row into store.ErrNotFound and a uniqueness
// violation into store.ErrConflict; other errors pass through.
func mapErr(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() {
		case sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_UNIQUE:
			return store.ErrConflict
		}
	}
	return err
}

func isFK(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}
