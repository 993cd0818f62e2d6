package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// migration is one step of the schema. Versions are 1, 2, 3, … in order;
// a released migration is never edited, only followed by a new one.
type migration struct {
	version int
	name    string
	sql     string // may hold several statements
}

// migrations is the schema, oldest first. Times are INTEGER unix
// nanoseconds in UTC; JSON is TEXT.
var migrations = []migration{
	{version: 1, name: "initial schema", sql: `
CREATE TABLE tenants (
	id            TEXT PRIMARY KEY,
	name          TEXT NOT NULL,
	min_isolation TEXT NOT NULL DEFAULT '',
	created_at    INTEGER NOT NULL
);

CREATE TABLE api_keys (
	id         TEXT PRIMARY KEY,
	tenant_id  TEXT NOT NULL REFERENCES tenants(id),
	hash       BLOB NOT NULL UNIQUE,
	prefix     TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	revoked_at INTEGER
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at);

CREATE TABLE sandboxes (
	id           TEXT PRIMARY KEY,
	tenant_id    TEXT NOT NULL REFERENCES tenants(id),
	runtime      TEXT NOT NULL,
	image        TEXT NOT NULL,
	status       TEXT NOT NULL,
	spec         TEXT,
	state        TEXT,
	error        TEXT NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL,
	updated_at   INTEGER NOT NULL,
	expires_at   INTEGER,
	idle_timeout INTEGER NOT NULL DEFAULT 0,
	last_active  INTEGER NOT NULL
);
CREATE INDEX sandboxes_tenant ON sandboxes (tenant_id, created_at);

-- Events outlive their sandbox (it is an audit log), so no foreign keys.
CREATE TABLE events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	time       INTEGER NOT NULL,
	tenant_id  TEXT NOT NULL DEFAULT '',
	sandbox_id TEXT NOT NULL DEFAULT '',
	kind       TEXT NOT NULL,
	data       TEXT
);
CREATE INDEX events_tenant ON events (tenant_id, seq);
CREATE INDEX events_sandbox ON events (sandbox_id, seq);
`},
	{version: 2, name: "untrusted tenants", sql: `
ALTER TABLE tenants ADD COLUMN untrusted INTEGER NOT NULL DEFAULT 0;
`},
	{version: 3, name: "event retention", sql: `
CREATE INDEX events_time ON events (time);
`},
}

const createMigrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	applied_at INTEGER NOT NULL
)`

// migrate brings the database at path (open on db, the single writer
// connection) up to date with migs. Each migration runs in its own
// transaction together with the row that records it, so a crash leaves
// either all of a migration or none of it. A database that records a
// version migs does not know was written by a newer cagebox and is refused.
func migrate(ctx context.Context, db *sql.DB, path string, migs []migration) error {
	for i, m := range migs {
		if m.version != i+1 {
			return fmt.Errorf("migration %d (%s) is out of order: want version %d", m.version, m.name, i+1)
		}
	}
	if _, err := db.ExecContext(ctx, createMigrationsTable); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	applied, err := appliedVersions(ctx, db)
	if err != nil {
		return err
	}
	for v := range applied {
		if v < 1 || v > len(migs) {
			return fmt.Errorf("database %s has schema version %d but this cagebox knows versions up to %d: "+
				"it was written by a newer cagebox; run that version or restore a matching backup", path, v, len(migs))
		}
	}
	for _, m := range migs {
		if applied[m.version] {
			continue
		}
		if err := applyMigration(ctx, db, m); err != nil {
			return err
		}
	}
	return nil
}

func appliedVersions(ctx context.Context, db *sql.DB) (map[int]bool, error) {
	rows, err := db.QueryContext(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	defer rows.Close()
	applied := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read schema_migrations: %w", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	return applied, nil
}

func applyMigration(ctx context.Context, db *sql.DB, m migration) (err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migration %d (%s): begin: %w", m.version, m.name, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	// Another process may have applied it since we looked (the transaction
	// is BEGIN IMMEDIATE, so from here on nobody else can).
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, m.version).Scan(&n); err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.version, m.name, err)
	}
	if n > 0 {
		return tx.Commit()
	}
	if _, err := tx.ExecContext(ctx, m.sql); err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.version, m.name, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
		m.version, m.name, time.Now().UTC().UnixNano()); err != nil {
		return fmt.Errorf("migration %d (%s): record: %w", m.version, m.name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migration %d (%s): commit: %w", m.version, m.name, err)
	}
	return nil
}
