// Package sqlitebackend is a vault.Backend on SQLite through
// modernc.org/sqlite, in table vault_secrets.
//
// It creates and migrates its own table (Migrate, idempotent) so that it
// can stand alone; a caller that owns the database may run Migrate itself
// and hand its connections to New. Open opens the file as
// internal/sqlitedb opens every cagebox database, like the daemon's store:
// one writer connection whose transactions BEGIN IMMEDIATE (writers queue
// in Go instead of failing with SQLITE_BUSY), a pool of query-only
// readers, WAL mode with synchronous=FULL.
//
// Only sealed values reach the database: the nonce and ciphertext as
// BLOBs, the hosts as a JSON array, times as INTEGER unix nanoseconds UTC.
package sqlitebackend

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cagebox/cagebox/internal/sqlitedb"
	"github.com/cagebox/cagebox/internal/vault"
)

var _ vault.Backend = (*Backend)(nil)

// migrations is the table's schema, oldest first, each step applied once
// and counted in PRAGMA user_version; a released step is never edited,
// only followed by a new one. The CHECK constraints repeat
// vault.Record.Validate so that a bad row cannot be written by another
// path either.
var migrations = []sqlitedb.Step{
	// 1: the table. IF NOT EXISTS: databases made before steps were
	// counted have it at user_version 0.
	{Version: 1, Name: "vault_secrets", SQL: `CREATE TABLE IF NOT EXISTS vault_secrets (
	tenant_id  TEXT NOT NULL CHECK (tenant_id <> ''),
	name       TEXT NOT NULL CHECK (name <> ''),
	hosts      TEXT NOT NULL,
	inject     TEXT NOT NULL DEFAULT '',
	preview    TEXT NOT NULL,
	key_id     TEXT NOT NULL CHECK (key_id <> ''),
	nonce      BLOB NOT NULL CHECK (length(nonce) = 12),
	ciphertext BLOB NOT NULL CHECK (length(ciphertext) > 0),
	version    INTEGER NOT NULL CHECK (version >= 1),
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	revoked_at INTEGER,
	PRIMARY KEY (tenant_id, name)
) WITHOUT ROWID`},
	// 2: whether a secret may be delivered into a guest (env mode);
	// existing secrets may not.
	{Version: 2, Name: "allow_env", SQL: `ALTER TABLE vault_secrets ADD COLUMN allow_env INTEGER NOT NULL DEFAULT 0 CHECK (allow_env IN (0, 1))`},
}

// Migrate brings the vault_secrets table of the database on w (a single
// connection whose transactions BEGIN IMMEDIATE) up to date, each step in
// its own transaction with the version it sets. A database at a version
// this code does not know was written by a newer cagebox and is refused.
func Migrate(ctx context.Context, w *sql.DB) error {
	return sqlitedb.Migrate(ctx, w, "vault database", migrations, sqlitedb.UserVersion)
}

// Backend is a vault.Backend in a SQLite database.
type Backend struct {
	w  *sql.DB      // the single writer connection; transactions BEGIN IMMEDIATE
	r  *sql.DB      // readers
	db *sqlitedb.DB // set by Open: Close closes it

	closeOnce sync.Once
	closeErr  error
}

// Open opens (creating it, mode 0600, if missing) the database at path and
// creates the table. Close the Backend when done.
func Open(path string) (_ *Backend, err error) {
	db, err := sqlitedb.Open(context.Background(), path)
	if err != nil {
		return nil, fmt.Errorf("open vault database: %w", err)
	}
	b := &Backend{db: db, w: db.W, r: db.R}
	if err := Migrate(context.Background(), b.w); err != nil {
		_ = b.Close()
		return nil, fmt.Errorf("open vault database %s: %w", path, err)
	}
	return b, nil
}

// Close closes the database Open opened. It is safe to call more than
// once.
func (b *Backend) Close() error {
	if b.db == nil {
		return nil
	}
	b.closeOnce.Do(func() {
		if err := b.db.Close(); err != nil {
			b.closeErr = fmt.Errorf("close vault database: %w", err)
		}
	})
	return b.closeErr
}

const cols = `tenant_id, name, hosts, inject, preview, key_id, nonce, ciphertext, version, created_at, updated_at, revoked_at, allow_env`

const upsert = `INSERT INTO vault_secrets (` + cols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant_id, name) DO UPDATE SET
	hosts = excluded.hosts, inject = excluded.inject, preview = excluded.preview,
	key_id = excluded.key_id, nonce = excluded.nonce, ciphertext = excluded.ciphertext,
	version = excluded.version, created_at = excluded.created_at,
	updated_at = excluded.updated_at, revoked_at = excluded.revoked_at,
	allow_env = excluded.allow_env`

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func put(ctx context.Context, db execer, r *vault.Record) error {
	if err := r.Validate(); err != nil {
		return err
	}
	hosts := r.Hosts
	if hosts == nil {
		hosts = []string{}
	}
	hj, err := json.Marshal(hosts)
	if err != nil {
		return fmt.Errorf("record %q: hosts: %w", r.Name, err)
	}
	var revoked any
	if r.RevokedAt != nil {
		revoked = r.RevokedAt.UnixNano()
	}
	_, err = db.ExecContext(ctx, upsert, r.Tenant, r.Name, string(hj), r.Inject, r.Preview, r.KeyID,
		r.Nonce, r.Ciphertext, r.Version, r.CreatedAt.UnixNano(), r.UpdatedAt.UnixNano(), revoked, r.AllowEnv)
	if err != nil {
		return fmt.Errorf("write record %q of tenant %q: %w", r.Name, r.Tenant, err)
	}
	return nil
}

// Put implements vault.Backend.
func (b *Backend) Put(ctx context.Context, r *vault.Record) error {
	if err := put(ctx, b.w, r); err != nil {
		return fmt.Errorf("put: %w", err)
	}
	return nil
}

// Get implements vault.Backend.
func (b *Backend) Get(ctx context.Context, tenant, name string) (*vault.Record, error) {
	r, err := scan(b.r.QueryRowContext(ctx, `SELECT `+cols+` FROM vault_secrets WHERE tenant_id = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("record %q of tenant %q: %w", name, tenant, vault.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("record %q of tenant %q: %w", name, tenant, err)
	}
	return r, nil
}

// List implements vault.Backend.
func (b *Backend) List(ctx context.Context, tenant string) ([]*vault.Record, error) {
	out, err := query(ctx, b.r, `SELECT `+cols+` FROM vault_secrets WHERE tenant_id = ? ORDER BY name`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list records of tenant %q: %w", tenant, err)
	}
	return out, nil
}

// All implements vault.Backend.
func (b *Backend) All(ctx context.Context) ([]*vault.Record, error) {
	out, err := query(ctx, b.r, `SELECT `+cols+` FROM vault_secrets ORDER BY tenant_id, name`)
	if err != nil {
		return nil, fmt.Errorf("list all records: %w", err)
	}
	return out, nil
}

// Delete implements vault.Backend.
func (b *Backend) Delete(ctx context.Context, tenant, name string) error {
	res, err := b.w.ExecContext(ctx, `DELETE FROM vault_secrets WHERE tenant_id = ? AND name = ?`, tenant, name)
	if err != nil {
		return fmt.Errorf("delete record %q of tenant %q: %w", name, tenant, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("delete record %q of tenant %q: %w", name, tenant, err)
	} else if n == 0 {
		return fmt.Errorf("delete record %q of tenant %q: %w", name, tenant, vault.ErrNotFound)
	}
	return nil
}

// ReplaceAll implements vault.Backend: one transaction, rolled back on the
// first record that fails (validation, constraint or I/O).
func (b *Backend) ReplaceAll(ctx context.Context, recs []*vault.Record) (err error) {
	tx, err := b.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("replace records: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	for _, r := range recs {
		if err := put(ctx, tx, r); err != nil {
			return fmt.Errorf("replace records (nothing changed): %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("replace records: commit: %w", err)
	}
	return nil
}

type scanner interface{ Scan(dest ...any) error }

func scan(s scanner) (*vault.Record, error) {
	var r vault.Record
	var hosts string
	var created, updated int64
	var revoked sql.NullInt64
	if err := s.Scan(&r.Tenant, &r.Name, &hosts, &r.Inject, &r.Preview, &r.KeyID, &r.Nonce, &r.Ciphertext,
		&r.Version, &created, &updated, &revoked, &r.AllowEnv); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(hosts), &r.Hosts); err != nil {
		return nil, fmt.Errorf("record %q: hosts: %w", r.Name, err)
	}
	r.CreatedAt = time.Unix(0, created).UTC()
	r.UpdatedAt = time.Unix(0, updated).UTC()
	if revoked.Valid {
		t := time.Unix(0, revoked.Int64).UTC()
		r.RevokedAt = &t
	}
	return &r, nil
}

func query(ctx context.Context, db *sql.DB, q string, args ...any) ([]*vault.Record, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []*vault.Record{}
	for rows.Next() {
		r, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
