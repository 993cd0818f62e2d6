package sqlitebackend_test

import (
	"os"
	"path/filepath"
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
