package sqlitedb

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Step is one step of a schema. Versions are 1, 2, 3, … in order; a
// released step is never edited, only followed by a new one.
type Step struct {
	Version int
	Name    string
	SQL     string // may hold several statements
}

// Ledger is how a database records the steps it has.
type Ledger int

const (
	// MigrationsTable records each step as a row of schema_migrations
	// (version, name, applied_at).
	MigrationsTable Ledger = iota
	// UserVersion records the last step in PRAGMA user_version.
	UserVersion
)

const createMigrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	applied_at INTEGER NOT NULL
)`

// Migrate brings the database on w (a single connection whose
// transactions BEGIN IMMEDIATE) up to date with steps, recorded in ledger.
// Each step runs in its own transaction together with its record, so a
// crash leaves either all of a step or none of it, and a step another
// process applied meanwhile is not applied again. A database that records
// a version steps does not know was written by a newer cagebox and is
// refused. what names the database in errors.
func Migrate(ctx context.Context, w *sql.DB, what string, steps []Step, ledger Ledger) error {
	for i, s := range steps {
		if s.Version != i+1 {
			return fmt.Errorf("migration %d (%s) is out of order: want version %d", s.Version, s.Name, i+1)
		}
	}
	applied, err := ledger.applied(ctx, w)
	if err != nil {
		return err
	}
	for v := range applied {
		if v < 1 || v > len(steps) {
			return fmt.Errorf("%s has schema version %d but this cagebox knows versions up to %d: "+
				"it was written by a newer cagebox; run that version or restore a matching backup", what, v, len(steps))
		}
	}
	for _, s := range steps {
		if applied[s.Version] {
			continue
		}
		if err := ledger.apply(ctx, w, s); err != nil {
			return err
		}
	}
	return nil
}

// applied returns the versions the database records.
func (l Ledger) applied(ctx context.Context, w *sql.DB) (map[int]bool, error) {
	out := map[int]bool{}
	if l == UserVersion {
		var have int
		if err := w.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&have); err != nil {
			return nil, fmt.Errorf("read schema version: %w", err)
		}
		for v := 1; v <= have; v++ {
			out[v] = true
		}
		if have < 0 {
			out[have] = true
		}
		return out, nil
	}
	if _, err := w.ExecContext(ctx, createMigrationsTable); err != nil {
		return nil, fmt.Errorf("create schema_migrations: %w", err)
	}
	rows, err := w.QueryContext(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read schema_migrations: %w", err)
		}
		out[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	return out, nil
}

// apply runs one step and records it, in one transaction.
func (l Ledger) apply(ctx context.Context, w *sql.DB, s Step) (err error) {
	tx, err := w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migration %d (%s): begin: %w", s.Version, s.Name, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	// Another process may have applied it since we looked (the transaction
	// is BEGIN IMMEDIATE, so from here on nobody else can).
	var have bool
	if l == UserVersion {
		var v int
		err = tx.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v)
		have = v >= s.Version
	} else {
		var n int
		err = tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, s.Version).Scan(&n)
		have = n > 0
	}
	if err != nil {
		return fmt.Errorf("migration %d (%s): %w", s.Version, s.Name, err)
	}
	if have {
		return tx.Commit()
	}
	if _, err := tx.ExecContext(ctx, s.SQL); err != nil {
		return fmt.Errorf("migration %d (%s): %w", s.Version, s.Name, err)
	}
	if l == UserVersion {
		// PRAGMA takes no parameters; the version is a small integer of ours.
		_, err = tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, s.Version))
	} else {
		_, err = tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
			s.Version, s.Name, time.Now().UTC().UnixNano())
	}
	if err != nil {
		return fmt.Errorf("migration %d (%s): record: %w", s.Version, s.Name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migration %d (%s): commit: %w", s.Version, s.Name, err)
	}
	return nil
}
