package sqlitedb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

func mustOpen(t *testing.T, path string) *DB {
	t.Helper()
	db, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestOpenRefusesURIs(t *testing.T) {
	for _, p := range []string{"", ":memory:", "file:x.db", "x.db?mode=ro", "x.db?_pragma=journal_mode(DELETE)"} {
		if db, err := Open(t.Context(), p); err == nil {
			db.Close()
			t.Errorf("Open(%q) succeeded", p)
		}
	}
}

func TestPragmas(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "db"))
	for _, c := range []struct {
		conn   string
		pragma string
		want   string
	}{
		{"writer", "journal_mode", "wal"},
		{"writer", "synchronous", "2"}, // FULL
		{"writer", "foreign_keys", "1"},
		{"writer", "busy_timeout", "10000"},
		{"writer", "query_only", "0"},
		{"reader", "synchronous", "2"},
		{"reader", "foreign_keys", "1"},
		{"reader", "busy_timeout", "10000"},
		{"reader", "query_only", "1"},
	} {
		conn := db.W
		if c.conn == "reader" {
			conn = db.R
		}
		var got string
		if err := conn.QueryRowContext(t.Context(), "PRAGMA "+c.pragma).Scan(&got); err != nil {
			t.Fatalf("%s PRAGMA %s: %v", c.conn, c.pragma, err)
		}
		if !strings.EqualFold(got, c.want) {
			t.Errorf("%s PRAGMA %s = %q, want %q", c.conn, c.pragma, got, c.want)
		}
	}
	if n := db.W.Stats().MaxOpenConnections; n != 1 {
		t.Errorf("writer pool of %d connections, want 1", n)
	}
	if _, err := db.R.ExecContext(t.Context(), `CREATE TABLE t (x)`); err == nil {
		t.Error("a reader wrote")
	}
}

// TestFileMode: the database and its WAL files are private whatever the
// umask.
func TestFileMode(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "db")
	db := mustOpen(t, path)
	if _, err := db.W.ExecContext(t.Context(), `CREATE TABLE t (x)`); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("%s: mode %o, want 600", filepath.Base(p), m)
		}
	}
}

// steps are a schema whose CREATE TABLEs have no IF NOT EXISTS: running
// a step twice fails.
var steps = []Step{
	{Version: 1, Name: "things", SQL: `CREATE TABLE things (id TEXT PRIMARY KEY); INSERT INTO things VALUES ('a');`},
	{Version: 2, Name: "widgets", SQL: `CREATE TABLE widgets (id TEXT PRIMARY KEY)`},
}

var ledgers = []struct {
	name string
	l    Ledger
}{{"schema_migrations", MigrationsTable}, {"user_version", UserVersion}}

// recorded is what the ledger says the database has.
func recorded(t *testing.T, db *DB, l Ledger) string {
	t.Helper()
	q := `SELECT COALESCE(group_concat(version), '') FROM (SELECT version FROM schema_migrations ORDER BY version)`
	if l == UserVersion {
		q = `PRAGMA user_version`
	}
	var got string
	if err := db.R.QueryRowContext(t.Context(), q).Scan(&got); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestMigrateAppliesOnlyNew(t *testing.T) {
	for _, lc := range ledgers {
		t.Run(lc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "db")
			db := mustOpen(t, path)
			if err := Migrate(t.Context(), db.W, "test database", steps[:1], lc.l); err != nil {
				t.Fatal(err)
			}
			for i := range 2 { // the second run must not re-run anything
				if err := Migrate(t.Context(), db.W, "test database", steps, lc.l); err != nil {
					t.Fatalf("run %d: %v", i, err)
				}
			}
			want := map[Ledger]string{MigrationsTable: "1,2", UserVersion: "2"}[lc.l]
			if got := recorded(t, db, lc.l); got != want {
				t.Errorf("recorded %q, want %q", got, want)
			}
			var n int
			if err := db.R.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM things`).Scan(&n); err != nil || n != 1 {
				t.Errorf("things: %d %v, want the one row of step 1", n, err)
			}
		})
	}
}

// TestMigrateConcurrently: two handles on one file (two daemons starting)
// migrating at once apply each step once.
func TestMigrateConcurrently(t *testing.T) {
	for _, lc := range ledgers {
		t.Run(lc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "db")
			dbs := []*DB{mustOpen(t, path), mustOpen(t, path)}
			var wg sync.WaitGroup
			errs := make([]error, len(dbs))
			for i, db := range dbs {
				wg.Go(func() { errs[i] = Migrate(context.Background(), db.W, "test database", steps, lc.l) })
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("handle %d: %v", i, err)
				}
			}
		})
	}
}

func TestMigrateRefusesNewer(t *testing.T) {
	for _, lc := range ledgers {
		t.Run(lc.name, func(t *testing.T) {
			db := mustOpen(t, filepath.Join(t.TempDir(), "db"))
			if err := Migrate(t.Context(), db.W, "test database", steps, lc.l); err != nil {
				t.Fatal(err)
			}
			err := Migrate(t.Context(), db.W, "test database", steps[:1], lc.l)
			if err == nil {
				t.Fatal("a database from a newer version was accepted")
			}
			for _, want := range []string{"test database has schema version 2", "knows versions up to 1", "newer cagebox"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
}

func TestMigrateFailedStepRollsBack(t *testing.T) {
	for _, lc := range ledgers {
		t.Run(lc.name, func(t *testing.T) {
			db := mustOpen(t, filepath.Join(t.TempDir(), "db"))
			broken := Step{Version: 3, Name: "broken", SQL: `CREATE TABLE half (id TEXT); INSERT INTO no_such_table VALUES (1);`}
			err := Migrate(t.Context(), db.W, "test database", append(append([]Step(nil), steps...), broken), lc.l)
			if err == nil || !strings.Contains(err.Error(), "migration 3 (broken)") {
				t.Fatalf("broken step: %v, want an error naming it", err)
			}
			want := map[Ledger]string{MigrationsTable: "1,2", UserVersion: "2"}[lc.l]
			if got := recorded(t, db, lc.l); got != want {
				t.Errorf("recorded %q, want %q: the broken step was recorded", got, want)
			}
			var n int
			if err := db.R.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM sqlite_master WHERE name = 'half'`).Scan(&n); err != nil || n != 0 {
				t.Errorf("table of the broken step: %d %v, want it rolled back", n, err)
			}
		})
	}
}

func TestMigrateOutOfOrderRefused(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "db"))
	bad := []Step{steps[0], {Version: 3, Name: "skips 2", SQL: `SELECT 1`}}
	for _, lc := range ledgers {
		if err := Migrate(t.Context(), db.W, "test database", bad, lc.l); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("want version %d", 2)) {
			t.Errorf("%s: out-of-order steps: %v", lc.name, err)
		}
	}
}
