package sqlitebackend_test

import (
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/internal/vault/sqlitebackend"
	"github.com/cagebox/cagebox/internal/vault/vaulttest"
)

func open(t *testing.T, path string) *sqlitebackend.Backend {
	t.Helper()
	b, err := sqlitebackend.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

func TestBackend(t *testing.T) {
	vaulttest.TestBackend(t, func(t *testing.T) vault.Backend {
		return open(t, filepath.Join(t.TempDir(), "vault.db"))
	})
}

func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vault.db")
	b, err := sqlitebackend.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	want := vaulttest.Rec("t", "N", 1)
	if err := b.Put(t.Context(), want); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("database mode %04o, want 0600", perm)
	}
	b = open(t, path)
	got, err := b.Get(t.Context(), "t", "N")
	if err != nil {
		t.Fatal(err)
	}
	if d := vaulttest.Equal(got, want); d != "" {
		t.Error(d)
	}
}

func TestOpenRefusesURIs(t *testing.T) {
	for _, p := range []string{"", ":memory:", "file:x.db", "x.db?mode=ro"} {
		if b, err := sqlitebackend.Open(p); err == nil {
			b.Close()
			t.Errorf("Open(%q) succeeded", p)
		}
	}
}

// v1Schema is the table as cagebox created it before allow_env existed
// (and before schema steps were counted: user_version 0).
const v1Schema = `CREATE TABLE vault_secrets (
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
) WITHOUT ROWID`

// TestMigratesOldDatabase: a vault written before secrets could be
// allowed into guests opens, keeps its secrets, and allows none of them.
func TestMigratesOldDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vault.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	old := vaulttest.Rec("t", "OLD", 1)
	if _, err := db.Exec(v1Schema); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO vault_secrets VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)`,
		old.Tenant, old.Name, `["api.example.com","*.example.org"]`, old.Inject, old.Preview, old.KeyID, old.Nonce, old.Ciphertext,
		old.Version, old.CreatedAt.UnixNano(), old.UpdatedAt.UnixNano()); err != nil {
		t.Fatal(err)
	}
	db.Close()

	b := open(t, path)
	got, err := b.Get(t.Context(), "t", "OLD")
	if err != nil {
		t.Fatal(err)
	}
	if d := vaulttest.Equal(got, old); d != "" || got.AllowEnv {
		t.Errorf("migrated record: %s (AllowEnv %v)", d, got.AllowEnv)
	}
	allowed := vaulttest.Rec("t", "NEW", 1)
	allowed.AllowEnv = true
	if err := b.Put(t.Context(), allowed); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.Get(t.Context(), "t", "NEW"); got == nil || !got.AllowEnv {
		t.Errorf("AllowEnv after migration: %+v", got)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Opening again changes nothing; a value outside 0/1 is refused.
	b = open(t, path)
	if got, _ := b.Get(t.Context(), "t", "NEW"); got == nil || !got.AllowEnv {
		t.Errorf("AllowEnv after reopening: %+v", got)
	}
	db, err = sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil || v != 2 {
		t.Errorf("user_version %d %v, want 2", v, err)
	}
	if _, err := db.Exec(`UPDATE vault_secrets SET allow_env = 7 WHERE name = 'OLD'`); err == nil {
		t.Error("allow_env = 7 accepted")
	}
}

// TestRefusesNewerDatabase: a vault at a schema version this code does
// not know is not touched.
func TestRefusesNewerDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vault.db")
	open(t, path).Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`PRAGMA user_version = 99`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if b, err := sqlitebackend.Open(path); err == nil || !strings.Contains(err.Error(), "newer cagebox") {
		if b != nil {
			b.Close()
		}
		t.Fatalf("Open of a version-99 vault: %v", err)
	}
}
