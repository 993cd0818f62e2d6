package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/api"
)

// TestSecretVault: values go in, only previews come out; at rest the value
// is ciphertext; rotate, revoke and rm work; nothing logs the value.
func TestSecretVault(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	const real = "ghp_R3alV4lu3ThatMustNeverLeakX9cdef"
	os.Setenv("CBX_E2E_TOKEN", real)
	defer os.Unsetenv("CBX_E2E_TOKEN")
	r := e.cli("", "secret", "add", "GITHUB_TOKEN", "--host", "api.github.com,*.githubassets.com", "--from-env", "CBX_E2E_TOKEN")
	if r.code != 0 || !strings.Contains(r.stdout, "…cdef") {
		t.Fatalf("secret add: %+v", r)
	}
	if r := e.cli("", "secret", "add", "NOHOST", "--from-env", "CBX_E2E_TOKEN"); r.code == 0 || !strings.Contains(r.stderr, "--host") {
		t.Fatalf("secret add without --host: %+v", r)
	}
	if r := e.cli("", "secret", "add", "BAD", "--host", "10.0.0.1", "--from-env", "CBX_E2E_TOKEN"); r.code == 0 {
		t.Fatalf("secret bound to an IP accepted: %+v", r)
	}
	// A wildcard over a public suffix would send the value to names of
	// unrelated owners.
	for host, why := range map[string]string{"*.com": "top-level domain", "*.githubusercontent.com": "public suffix", "*.co.uk": "public suffix"} {
		if r := e.cli("", "secret", "add", "BAD", "--host", host, "--from-env", "CBX_E2E_TOKEN"); r.code == 0 || !strings.Contains(r.stderr, why) {
			t.Fatalf("secret bound to %s: %+v", host, r)
		}
	}
	for _, args := range [][]string{{"secret", "ls"}, {"secret", "ls", "--json"}} {
		r := e.cli("", args...)
		if r.code != 0 || !strings.Contains(r.stdout, "GITHUB_TOKEN") || !strings.Contains(r.stdout, "cdef") || strings.Contains(r.stdout, real) {
			t.Fatalf("%v: %+v", args, r)
		}
	}
	r = e.cli("ghp_Rotated000000000000000000000wxyz\n", "secret", "rotate", "GITHUB_TOKEN")
	if r.code != 0 || !strings.Contains(r.stdout, "version 2") || !strings.Contains(r.stdout, "wxyz") {
		t.Fatalf("rotate: %+v", r)
	}
	if r := e.cli("", "secret", "revoke", "GITHUB_TOKEN"); r.code != 0 {
		t.Fatalf("revoke: %+v", r)
	}
	if r := e.cli("", "secret", "ls"); !strings.Contains(r.stdout, "revoked") {
		t.Fatalf("ls after revoke: %+v", r)
	}
	if r := e.cli("", "secret", "rotate", "GITHUB_TOKEN", "--from-env", "CBX_E2E_TOKEN"); r.code == 0 {
		t.Fatalf("rotating a revoked secret succeeded: %+v", r)
	}
	// At rest: ciphertext only; the key file is 0600 and not in the database.
	for _, f := range []string{"vault.db", "vault.db-wal", "cagebox.db", "cagebox.db-wal"} {
		b, err := os.ReadFile(filepath.Join(e.home, f))
		if err != nil {
			continue
		}
		for _, v := range []string{real, "ghp_Rotated000000000000000000000wxyz"} {
			if bytes.Contains(b, []byte(v)) {
				t.Errorf("%s holds a secret value in clear", f)
			}
		}
	}
	if fi, err := os.Stat(filepath.Join(e.home, "master.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("master key file: %v %v", fi, err)
	}
	if r := e.cli("", "secret", "rm", "GITHUB_TOKEN"); r.code != 0 {
		t.Fatalf("rm: %+v", r)
	}
	if r := e.cli("", "secret", "rm", "GITHUB_TOKEN"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("rm of a missing secret: %+v", r)
	}
	// Events and the daemon's log never carry the value.
	evs, err := e.client().Events(context.Background(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[api.EventKind]bool{}
	for _, ev := range evs {
		kinds[ev.Kind] = true
	}
	for _, k := range []api.EventKind{api.EventSecretPut, api.EventSecretRotated, api.EventSecretRevoked, api.EventSecretDeleted} {
		if !kinds[k] {
			t.Errorf("no %s event", k)
		}
	}
	r = e.cli("", "events", "--json")
	if strings.Contains(r.stdout, real) || strings.Contains(e.logBuf.String(), real) {
		t.Error("a secret value reached the events or the daemon log")
	}
}

// TestMasterKeyRotation: every secret survives a master-key rotation, and
// the old key no longer opens them.
func TestMasterKeyRotation(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	os.Setenv("CBX_ROT", "value-that-must-survive-rotation-42")
	defer os.Unsetenv("CBX_ROT")
	for _, n := range []string{"ONE", "TWO", "THREE"} {
		if r := e.cli("", "secret", "add", n, "--host", "api.example.test", "--from-env", "CBX_ROT", "--allow-env"); r.code != 0 {
			t.Fatal(r)
		}
	}
	if r := e.cli("", "secret", "rotate-master-key"); r.code == 0 || !strings.Contains(r.stderr, "stop it first") {
		t.Fatalf("rotation with the daemon running: %+v", r)
	}
	oldKey, _ := os.ReadFile(filepath.Join(e.home, "master.key"))
	e.stopDaemon(15)
	if r := e.cli("", "secret", "rotate-master-key"); r.code != 0 || !strings.Contains(r.stdout, "re-sealed 3 secrets") {
		t.Fatalf("rotate-master-key: %+v", r)
	}
	newKey, _ := os.ReadFile(filepath.Join(e.home, "master.key"))
	if bytes.Equal(oldKey, newKey) || len(newKey) == 0 {
		t.Fatal("master key unchanged")
	}
	e.startDaemon()
	// env mode prints the value: each secret opens under the new key.
	for _, n := range []string{"ONE", "TWO", "THREE"} {
		r := e.cli("", "run", "--secret", n+"=vault:"+n, "--secret-env", n, "--", "sh", "-c", "printf %s \"$"+n+"\"")
		if r.stdout != "value-that-must-survive-rotation-42" {
			t.Fatalf("%s after rotation: %+v", n, r)
		}
	}
	// The old key opens nothing: put it back and the vault fails closed.
	e.stopDaemon(15)
	if err := os.WriteFile(filepath.Join(e.home, "master.key"), oldKey, 0o600); err != nil {
		t.Fatal(err)
	}
	e.startDaemon()
	if r := e.cli("", "run", "--secret", "ONE=vault:ONE", "--secret-env", "ONE", "--", "true"); r.code == 0 || strings.Contains(r.stdout+r.stderr, "value-that-must-survive") {
		t.Fatalf("the old key still opens a secret: %+v", r)
	}
}
