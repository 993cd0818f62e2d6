package vault_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cagebox/cagebox/internal/vault"
)

func TestKeyFileCreate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	path := filepath.Join(dir, "master.key")
	k, err := vault.LoadOrCreateKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() != 65 {
		t.Errorf("key file mode %04o size %d, want 0600 and 65", fi.Mode().Perm(), fi.Size())
	}
	di, _ := os.Stat(dir)
	if di.Mode().Perm() != 0o700 {
		t.Errorf("key dir mode %04o, want 0700", di.Mode().Perm())
	}
	data, _ := os.ReadFile(path)
	raw, err := hex.DecodeString(strings.TrimSuffix(string(data), "\n"))
	if err != nil || len(raw) != 32 {
		t.Fatalf("key file is not 64 hex digits and a newline: %v", err)
	}
	if strings.Contains(string(data), k.ID) {
		t.Error("the key ID is a prefix of the key")
	}
	again, err := vault.LoadOrCreateKeyFile(path)
	if err != nil || again.ID != k.ID {
		t.Fatalf("reload: %v, %v (want the same key)", again, err)
	}
	fromRaw, _ := vault.NewKey(raw)
	if fromRaw.ID != k.ID {
		t.Error("the file's key has another ID")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

func TestKeyFileConcurrentCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "master.key")
	ids := make([]string, 16)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			k, err := vault.LoadOrCreateKeyFile(path)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = k.ID
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent starts made different keys: %v", ids)
		}
	}
}

func TestKeyFileRefused(t *testing.T) {
	rawKey := bytes.Repeat([]byte{0x5a}, 32)
	hexKey := hex.EncodeToString(rawKey)
	cases := []struct {
		name    string
		content string
		mode    os.FileMode
		ok      bool
		want    string // in the error
	}{
		{"hex with newline", hexKey + "\n", 0o600, true, ""},
		{"hex without newline", hexKey, 0o600, true, ""},
		{"raw", string(rawKey), 0o400, true, ""},
		{"0644", hexKey + "\n", 0o644, false, "chmod 600"},
		{"0640", hexKey + "\n", 0o640, false, "chmod 600"},
		{"0602", hexKey + "\n", 0o602, false, "chmod 600"},
		{"short", hexKey[:40], 0o600, false, "bytes"},
		{"long", hexKey + "\n\n", 0o600, false, "bytes"},
		{"empty", "", 0o600, false, "bytes"},
		{"not hex", strings.Repeat("zz", 32) + "\n", 0o600, false, "hex"},
		{"65 without newline", hexKey + "x", 0o600, false, "newline"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "master.key")
			if err := os.WriteFile(path, []byte(c.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, c.mode); err != nil {
				t.Fatal(err)
			}
			k, err := vault.LoadOrCreateKeyFile(path)
			if c.ok {
				want, _ := vault.NewKey(rawKey)
				if err != nil || k.ID != want.ID {
					t.Fatalf("load: %v, %v", k, err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
			if strings.Contains(err.Error(), hexKey[:16]) {
				t.Errorf("error shows key material: %v", err)
			}
			if data, _ := os.ReadFile(path); string(data) != c.content {
				t.Error("a refused key file was rewritten")
			}
		})
	}

	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(dir, "real.key")
		if err := os.WriteFile(target, []byte(hexKey), 0o600); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, "master.key")
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		if _, err := vault.LoadOrCreateKeyFile(link); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("symlink: %v", err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := vault.LoadOrCreateKeyFile(dir); err == nil {
			t.Error("a directory was accepted")
		}
	})
	t.Run("other owner", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to chown")
		}
		path := filepath.Join(t.TempDir(), "master.key")
		if err := os.WriteFile(path, []byte(hexKey), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := vault.LoadOrCreateKeyFile(path); err == nil || !strings.Contains(err.Error(), "owned by") {
			t.Errorf("file of another owner: %v", err)
		}
	})
}

func TestKeyFromEnv(t *testing.T) {
	raw := bytes.Repeat([]byte{0xc3}, 32)
	want, _ := vault.NewKey(raw)
	for name, val := range map[string]string{
		"hex":     hex.EncodeToString(raw),
		"HEX":     strings.ToUpper(hex.EncodeToString(raw)),
		"base64":  base64.StdEncoding.EncodeToString(raw),
		"raw b64": base64.RawStdEncoding.EncodeToString(raw),
		"url b64": base64.URLEncoding.EncodeToString(raw),
		"newline": hex.EncodeToString(raw) + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("CBX_TEST_KEY", val)
			k, err := vault.KeyFromEnv("CBX_TEST_KEY")
			if err != nil || k.ID != want.ID {
				t.Fatalf("%v, %v", k, err)
			}
		})
	}
	for name, val := range map[string]string{
		"short hex": hex.EncodeToString(raw[:16]),
		"b64 of 31": base64.StdEncoding.EncodeToString(raw[:31]),
		"garbage":   canary,
		"empty":     "",
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("CBX_TEST_KEY", val)
			_, err := vault.KeyFromEnv("CBX_TEST_KEY")
			if !errors.Is(err, vault.ErrInvalid) {
				t.Fatalf("%v, want ErrInvalid", err)
			}
			if val != "" && strings.Contains(err.Error(), val[:10]) {
				t.Errorf("error shows the variable's contents: %v", err)
			}
			if !strings.Contains(err.Error(), "CBX_TEST_KEY") {
				t.Errorf("error does not name the variable: %v", err)
			}
		})
	}
	if _, err := vault.KeyFromEnv("CBX_TEST_KEY_UNSET_xyz"); !errors.Is(err, vault.ErrInvalid) {
		t.Errorf("unset variable: %v", err)
	}
}
