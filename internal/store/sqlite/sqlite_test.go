package sqlite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(filepath.Join(t.TempDir(), "cagebox.db"))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	})
}

func mustOpen(t *testing.T, path string, migs []migration) *Store {
	t.Helper()
	s, err := openWith(t.Context(), path, migs)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	return s
}

func versions(t *testing.T, s *Store) []int {
	t.Helper()
	rows, err := s.r.QueryContext(t.Context(), `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPragmas(t *testing.T) {
	s := mustOpen(t, filepath.Join(t.TempDir(), "db"), migrations)
	defer s.Close()
	for _, c := range []struct {
		db     string
		pragma string
		want   string
	}{
		{"writer", "journal_mode", "wal"},
		{"writer", "synchronous", "2"}, // FULL
		{"writer", "foreign_keys", "1"},
		{"writer", "busy_timeout", "10000"},
		{"reader", "synchronous", "2"},
		{"reader", "busy_timeout", "10000"},
		{"reader", "query_only", "1"},
	} {
		db := s.w
		if c.db == "reader" {
			db = s.r
		}
		var got string
		if err := db.QueryRowContext(t.Context(), "PRAGMA "+c.pragma).Scan(&got); err != nil {
			t.Fatalf("%s PRAGMA %s: %v", c.db, c.pragma, err)
		}
		if !strings.EqualFold(got, c.want) {
			t.Errorf("%s PRAGMA %s = %q, want %q", c.db, c.pragma, got, c.want)
		}
	}
}

func TestFileMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cagebox.db")
	s := mustOpen(t, path, migrations)
	defer s.Close()
	// A write makes sure the WAL exists.
	if err := s.CreateTenant(t.Context(), &store.Tenant{ID: "t", Name: "t"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("stat %s: %v", p, err)
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("%s has mode %v, want 0600", filepath.Base(p), m)
		}
	}
}

func TestOpenRejectsBadPaths(t *testing.T) {
	for _, p := range []string{"", ":memory:", "file:x.db", filepath.Join(t.TempDir(), "a?b"),
		filepath.Join(t.TempDir(), "missing-dir", "db")} {
		if s, err := Open(p); err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", p)
		}
	}
}

func TestReopenKeepsCommittedData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cagebox.db")
	ctx := context.Background()
	s := mustOpen(t, path, migrations)
	if err := s.CreateTenant(ctx, &store.Tenant{ID: "t1", Name: "one"}); err != nil {
		t.Fatal(err)
	}
	sb := &store.Sandbox{ID: "sb1", TenantID: "t1", Runtime: "container", Image: "busybox", Status: "running",
		State: []byte(`{"pid":7}`)}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	ev := &store.Event{TenantID: "t1", SandboxID: "sb1", Kind: "sandbox.created"}
	if err := s.AppendEvent(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	s2 := mustOpen(t, path, migrations)
	defer s2.Close()
	got, err := s2.GetSandbox(ctx, "t1", "sb1")
	if err != nil {
		t.Fatalf("GetSandbox after reopen: %v", err)
	}
	if got.Status != "running" || string(got.State) != `{"pid":7}` || !got.CreatedAt.Equal(sb.CreatedAt) {
		t.Errorf("after reopen: %+v, want %+v", got, sb)
	}
	tenants, err := s2.ListTenants(ctx)
	if err != nil || len(tenants) != 2 {
		t.Errorf("tenants after reopen = %v, %v; want admin and t1 (admin seeded once)", tenants, err)
	}
	// Seqs continue after the reopen.
	ev2 := &store.Event{Kind: "daemon.started"}
	if err := s2.AppendEvent(ctx, ev2); err != nil {
		t.Fatal(err)
	}
	if ev2.Seq <= ev.Seq {
		t.Errorf("seq after reopen %d, want > %d", ev2.Seq, ev.Seq)
	}
}

// TestCommittedDataSurvivesExit has a child process commit and exit
// without closing the store (so the data is only in the WAL, never
// checkpointed), then reopens the database.
func TestCommittedDataSurvivesExit(t *testing.T) {
	if path := os.Getenv("CAGEBOX_STORE_CHILD_DB"); path != "" {
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.CreateTenant(context.Background(), &store.Tenant{ID: "child", Name: "child"}); err != nil {
			t.Fatal(err)
		}
		os.Exit(0) // no Close
	}
	path := filepath.Join(t.TempDir(), "cagebox.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCommittedDataSurvivesExit$")
	cmd.Env = append(os.Environ(), "CAGEBOX_STORE_CHILD_DB="+path)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if fi, err := os.Stat(path + "-wal"); err != nil || fi.Size() == 0 {
		t.Logf("note: WAL after child exit: %v, %v", fi, err)
	}
	s := mustOpen(t, path, migrations)
	defer s.Close()
	if _, err := s.GetTenant(t.Context(), "child"); err != nil {
		t.Errorf("tenant committed by the exited child: %v", err)
	}
}

func TestReopenWhileOpenElsewhere(t *testing.T) {
	// Committed data is visible to a second handle without any close, as
	// after a daemon crash: WAL contents are part of the database.
	path := filepath.Join(t.TempDir(), "cagebox.db")
	s := mustOpen(t, path, migrations)
	defer s.Close()
	if err := s.CreateTenant(t.Context(), &store.Tenant{ID: "t1", Name: "one"}); err != nil {
		t.Fatal(err)
	}
	s2 := mustOpen(t, path, migrations)
	defer s2.Close()
	if _, err := s2.GetTenant(t.Context(), "t1"); err != nil {
		t.Errorf("second handle: %v", err)
	}
}

// extra is a migration a later cagebox might add. Its CREATE TABLE has no
// IF NOT EXISTS, so running it twice would fail.
var extra = migration{Version: len(migrations) + 1, Name: "add widgets", SQL: `
CREATE TABLE widgets (id TEXT PRIMARY KEY);
INSERT INTO widgets (id) VALUES ('w1');
`}

func TestMigrationsApplyOnlyNew(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cagebox.db")
	s := mustOpen(t, path, migrations)
	if got := versions(t, s); !equalInts(got, allVersions(len(migrations))) {
		t.Fatalf("versions = %v, want %v", got, allVersions(len(migrations)))
	}
	if err := s.CreateTenant(t.Context(), &store.Tenant{ID: "t1", Name: "one"}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	withExtra := append(append([]migration(nil), migrations...), extra)
	for i := range 2 { // the second open must not re-run anything
		s = mustOpen(t, path, withExtra)
		if got := versions(t, s); !equalInts(got, allVersions(len(withExtra))) {
			t.Errorf("open %d: versions = %v, want %v", i, got, allVersions(len(withExtra)))
		}
		var n int
		if err := s.r.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM widgets`).Scan(&n); err != nil || n != 1 {
			t.Errorf("open %d: widgets = %d, %v; want 1", i, n, err)
		}
		if _, err := s.GetTenant(t.Context(), "t1"); err != nil {
			t.Errorf("open %d: data from before the migration: %v", i, err)
		}
		s.Close()
	}
}

func TestMigrationFromNewerVersionRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cagebox.db")
	withExtra := append(append([]migration(nil), migrations...), extra)
	mustOpen(t, path, withExtra).Close()

	_, err := openWith(t.Context(), path, migrations)
	if err == nil {
		t.Fatal("opening a database from a newer version succeeded")
	}
	for _, want := range []string{fmt.Sprintf("schema version %d", extra.Version), fmt.Sprintf("knows versions up to %d", len(migrations)), "newer cagebox"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestFailedMigrationRollsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cagebox.db")
	mustOpen(t, path, migrations).Close()

	broken := migration{Version: len(migrations) + 1, Name: "broken", SQL: `
CREATE TABLE half (id TEXT);
INSERT INTO no_such_table VALUES (1);
`}
	_, err := openWith(t.Context(), path, append(append([]migration(nil), migrations...), broken))
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("migration %d (broken)", broken.Version)) {
		t.Fatalf("open with a broken migration: %v, want an error naming it", err)
	}
	s := mustOpen(t, path, migrations)
	defer s.Close()
	if got := versions(t, s); !equalInts(got, allVersions(len(migrations))) {
		t.Errorf("versions = %v, want %v", got, allVersions(len(migrations)))
	}
	var n int
	err = s.r.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM sqlite_master WHERE name = 'half'`).Scan(&n)
	if err != nil || n != 0 {
		t.Errorf("table from the failed migration: count %d, %v; want rolled back", n, err)
	}
}

func allVersions(n int) []int {
	var v []int
	for i := 1; i <= n; i++ {
		v = append(v, i)
	}
	return v
}

// A database made by the first schema keeps its tenants through the
// later migrations (untrusted defaults to false).
func TestUpgradeFromFirstSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cagebox.db")
	old, err := openWith(t.Context(), path, migrations[:1])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.w.ExecContext(t.Context(), `INSERT INTO tenants (id, name, min_isolation, created_at) VALUES ('t1', 'one', 'app-kernel', 1)`); err != nil {
		t.Fatal(err)
	}
	old.Close()
	s := mustOpen(t, path, migrations)
	defer s.Close()
	tn, err := s.GetTenant(t.Context(), "t1")
	if err != nil || tn.MinIsolation != "app-kernel" || tn.Untrusted {
		t.Fatalf("tenant after upgrade: %+v %v", tn, err)
	}
}

func TestMigrationsOutOfOrderRefused(t *testing.T) {
	bad := []migration{migrations[0], {Version: 3, Name: "skips 2", SQL: `SELECT 1`}}
	_, err := openWith(t.Context(), filepath.Join(t.TempDir(), "db"), bad)
	if err == nil {
		t.Fatal("out-of-order migrations accepted")
	}
}

func TestMigrationsWellFormed(t *testing.T) {
	for i, m := range migrations {
		if m.Version != i+1 || m.Name == "" || strings.TrimSpace(m.SQL) == "" {
			t.Errorf("migration %d: %+v", i, m)
		}
	}
}

func TestConflictKeepsCause(t *testing.T) {
	s := mustOpen(t, filepath.Join(t.TempDir(), "db"), migrations)
	defer s.Close()
	err := s.CreateTenant(t.Context(), &store.Tenant{ID: store.AdminTenantID, Name: "x"})
	if !errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), `"admin"`) {
		t.Errorf("CreateTenant(admin) = %v, want a conflict naming the tenant", err)
	}
}

// TestDeleteEventsBeforeUsesIndex: retention finds old events by the
// events_time index, so a batch costs its own size, not a scan of the log.
func TestDeleteEventsBeforeUsesIndex(t *testing.T) {
	s := mustOpen(t, filepath.Join(t.TempDir(), "cagebox.db"), migrations)
	defer s.Close()
	rows, err := s.r.QueryContext(t.Context(), `EXPLAIN QUERY PLAN SELECT seq FROM events WHERE time < ? ORDER BY time, seq LIMIT ?`, 1, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(plan, "; "); !strings.Contains(got, "INDEX events_time") || strings.Contains(got, "SCAN events") {
		t.Fatalf("query plan %q: want a search of events_time", got)
	}
}
