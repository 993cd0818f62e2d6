// Package sqlitedb opens cagebox's SQLite databases (modernc.org/sqlite,
// pure Go) the one way they are all opened, and migrates their schemas.
//
// Durability: WAL mode with synchronous=FULL, so every committed
// transaction has been fsynced to the WAL before the call returns (the
// daemon acts on what it wrote, so a commit it was told about must survive
// a power loss).
//
// Concurrency: all writes go through one connection (a pool of size one)
// whose transactions BEGIN IMMEDIATE, so writers queue in Go instead of
// racing for the SQLite write lock and failing with SQLITE_BUSY. Reads use
// a separate pool of query-only connections, which WAL lets run alongside
// the writer. busy_timeout covers the remaining waits (another process,
// WAL checkpoints).
//
// The file (and the -wal/-shm files, which SQLite gives the main file's
// mode) is private to the daemon: mode 0600.
package sqlitedb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// BusyTimeout is how long a connection waits for a lock held by another
// connection (or process) before giving up with SQLITE_BUSY.
const BusyTimeout = 10 * time.Second

// DB is one database file: its writer connection and its readers.
type DB struct {
	Path string
	// W is the single writer connection; its transactions BEGIN IMMEDIATE.
	W *sql.DB
	// R is a pool of query-only connections.
	R *sql.DB
}

// Open opens the database at path, creating it with mode 0600 if missing.
// path must be a plain file path: no ":memory:", "file:" URI or '?'
// parameters, which would bypass the pragmas. Close the DB when done.
func Open(ctx context.Context, path string) (_ *DB, err error) {
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") || strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("invalid database path %q: want a plain file path without '?'", path)
	}
	// SQLite would create the file with the umask's mode; create it first
	// so that it is private to the daemon.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	db := &DB{Path: path}
	defer func() {
		if err != nil {
			_ = db.Close()
		}
	}()
	pragmas := func(extra ...string) url.Values {
		q := url.Values{}
		q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()))
		q.Add("_pragma", "foreign_keys(1)")
		q.Add("_pragma", "synchronous(FULL)")
		for _, p := range extra {
			q.Add("_pragma", p)
		}
		return q
	}
	wq := pragmas("journal_mode(WAL)")
	wq.Set("_txlock", "immediate")
	if db.W, err = sql.Open("sqlite", path+"?"+wq.Encode()); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	db.W.SetMaxOpenConns(1)
	db.W.SetMaxIdleConns(1)
	db.W.SetConnMaxLifetime(0)
	db.W.SetConnMaxIdleTime(0)
	var mode string
	if err := db.W.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !strings.EqualFold(mode, "wal") {
		return nil, fmt.Errorf("%s: journal mode is %q, want wal (is the file on a filesystem without shared memory?)", path, mode)
	}
	if db.R, err = sql.Open("sqlite", path+"?"+pragmas("query_only(1)").Encode()); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	db.R.SetMaxOpenConns(n)
	db.R.SetMaxIdleConns(n)
	return db, nil
}

// Close closes the readers and the writer.
func (db *DB) Close() error {
	var errs []error
	if db.R != nil {
		errs = append(errs, db.R.Close())
	}
	if db.W != nil {
		errs = append(errs, db.W.Close())
	}
	return errors.Join(errs...)
}
