package vault_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/hostname/hostnametest"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/internal/vault/sqlitebackend"
	"github.com/cagebox/cagebox/internal/vault/vaulttest"
)

// canary is a distinctive value: no error, log or formatted output may
// ever contain it.
const canary = "CANARYghp_9f8e7d6c5b4a3210zyxwvuTSRQ"

func newKey(t *testing.T) *vault.MasterKey {
	t.Helper()
	k, err := vault.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func openSQLite(t *testing.T, path string) *sqlitebackend.Backend {
	t.Helper()
	b, err := sqlitebackend.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// backends runs f against each Backend implementation.
func backends(t *testing.T, f func(t *testing.T, b vault.Backend)) {
	t.Run("mem", func(t *testing.T) { f(t, vault.NewMemBackend()) })
	t.Run("sqlite", func(t *testing.T) { f(t, openSQLite(t, filepath.Join(t.TempDir(), "vault.db"))) })
}

func mustValue(t *testing.T, v *vault.Vault, tenant, name string) string {
	t.Helper()
	s, _, err := v.Value(t.Context(), tenant, name)
	if err != nil {
		t.Fatalf("Value %s/%s: %v", tenant, name, err)
	}
	return string(s.Bytes())
}

func TestRoundTrip(t *testing.T) {
	backends(t, func(t *testing.T, b vault.Backend) {
		ctx := t.Context()
		v := vault.New(b, newKey(t))
		in, err := v.Put(ctx, "t1", "GITHUB_TOKEN", []byte(canary), []string{"API.GitHub.com.", "*.GitHub.com", "api.github.com"}, "authorization: Bearer {value}")
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"api.github.com", "*.github.com"}; !slices.Equal(in.Hosts, want) {
			t.Errorf("hosts %q, want %q", in.Hosts, want)
		}
		if in.Preview != "TSRQ" || in.Version != 1 || in.Revoked || in.KeyID != v.KeyID() {
			t.Errorf("info %+v", in)
		}
		s, got, err := v.Value(ctx, "t1", "GITHUB_TOKEN")
		if err != nil {
			t.Fatal(err)
		}
		if string(s.Bytes()) != canary {
			t.Error("Value returned a different value")
		}
		if got.Preview != "TSRQ" || got.Inject != "authorization: Bearer {value}" {
			t.Errorf("info from Value %+v", got)
		}
		s.Wipe()

		if _, err := v.Put(ctx, "t1", "OTHER", []byte("short"), []string{"x.example"}, ""); err != nil {
			t.Fatal(err)
		}
		list, err := v.List(ctx, "t1")
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 2 || list[0].Name != "GITHUB_TOKEN" || list[1].Name != "OTHER" || list[1].Preview != "****" {
			t.Errorf("List = %+v", list)
		}
		if strings.Contains(fmt.Sprintf("%+v %+v", *list[0], *list[1]), canary) {
			t.Error("List shows a value")
		}

		// Put replaces: Version+1, CreatedAt kept.
		in2, err := v.Put(ctx, "t1", "GITHUB_TOKEN", []byte("replacement-value"), []string{"api.github.com"}, "")
		if err != nil {
			t.Fatal(err)
		}
		if in2.Version != 2 || !in2.CreatedAt.Equal(in.CreatedAt) || in2.Inject != "" {
			t.Errorf("replaced info %+v (first %+v)", in2, in)
		}
		if mustValue(t, v, "t1", "GITHUB_TOKEN") != "replacement-value" {
			t.Error("replace did not change the value")
		}

		if err := v.Delete(ctx, "t1", "GITHUB_TOKEN"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := v.Value(ctx, "t1", "GITHUB_TOKEN"); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("Value after Delete: %v", err)
		}
		if _, err := v.Info(ctx, "t1", "GITHUB_TOKEN"); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("Info after Delete: %v", err)
		}
		if err := v.Delete(ctx, "t1", "GITHUB_TOKEN"); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("second Delete: %v", err)
		}
		if _, _, err := v.Value(ctx, "t2", "OTHER"); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("other tenant's Value: %v", err)
		}
	})
}

func TestCiphertextAtRest(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vault.db")
	b, err := sqlitebackend.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	v := vault.New(b, newKey(t))
	for i := range 20 {
		if _, err := v.Put(t.Context(), "t", fmt.Sprintf("S%d", i), []byte(canary), []string{"api.example.com"}, ""); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		var all []byte
		files, _ := filepath.Glob(path + "*") // the database, -wal, -shm
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, data...)
		}
		if bytes.Contains(all, []byte(canary)) || bytes.Contains(all, []byte(canary[:12])) {
			t.Errorf("%s: the value is in the database files in plaintext", when)
		}
		if !bytes.Contains(all, []byte("TSRQ")) {
			t.Errorf("%s: the preview is not in the database files", when)
		}
	}
	check("open")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	check("closed")
}

func TestMovedCiphertextFails(t *testing.T) {
	ctx := t.Context()
	b := vault.NewMemBackend()
	v := vault.New(b, newKey(t))
	for _, tn := range [][2]string{{"t1", "A"}, {"t1", "B"}, {"t2", "A"}} {
		if _, err := v.Put(ctx, tn[0], tn[1], []byte(canary+tn[0]+tn[1]), []string{"h.example"}, ""); err != nil {
			t.Fatal(err)
		}
	}
	src, err := b.Get(ctx, "t1", "A")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Rotate(ctx, "t1", "A", []byte(canary+"-v2")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name         string
		tenant, dest string
		mod          func(r *vault.Record)
	}{
		{"other tenant", "t2", "A", nil},
		{"other name", "t1", "B", nil},
		{"new name", "t1", "C", nil},
		{"new tenant", "t9", "A", nil},
		{"rolled back to version 1", "t1", "A", func(r *vault.Record) { r.Version = 2 }},
		{"version changed", "t1", "A", func(r *vault.Record) { r.Version = 7 }},
		{"bit flipped", "t1", "A", func(r *vault.Record) { r.Version = 2; r.Ciphertext[3] ^= 1 }},
		{"nonce changed", "t1", "A", func(r *vault.Record) { r.Version = 2; r.Nonce[0] ^= 1 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := src.Clone()
			r.Tenant, r.Name = c.tenant, c.dest
			if c.mod != nil {
				c.mod(r)
			}
			if err := b.Put(ctx, r); err != nil {
				t.Fatal(err)
			}
			_, _, err := v.Value(ctx, c.tenant, c.dest)
			if !errors.Is(err, vault.ErrTampered) {
				t.Fatalf("Value of a moved ciphertext: %v, want ErrTampered", err)
			}
			if strings.Contains(err.Error(), canary) {
				t.Error("error contains the value")
			}
		})
	}
}

func TestWrongKeyFailsClosed(t *testing.T) {
	backends(t, func(t *testing.T, b vault.Backend) {
		ctx := t.Context()
		k1, k2 := newKey(t), newKey(t)
		if _, err := vault.New(b, k1).Put(ctx, "t", "S", []byte(canary), []string{"h.example"}, ""); err != nil {
			t.Fatal(err)
		}
		s, in, err := vault.New(b, k2).Value(ctx, "t", "S")
		if !errors.Is(err, vault.ErrWrongKey) || s.Bytes() != nil || in != nil {
			t.Fatalf("Value with the wrong key: %v, %v", err, in)
		}
		msg := err.Error()
		if !strings.Contains(msg, k1.ID) || !strings.Contains(msg, k2.ID) {
			t.Errorf("error %q does not name both key IDs", msg)
		}
		if strings.Contains(msg, canary) {
			t.Error("error contains the value")
		}

		// A forged key id does not help: the AAD binds it.
		r, err := b.Get(ctx, "t", "S")
		if err != nil {
			t.Fatal(err)
		}
		r.KeyID = k2.ID
		if err := b.Put(ctx, r); err != nil {
			t.Fatal(err)
		}
		if _, _, err := vault.New(b, k2).Value(ctx, "t", "S"); !errors.Is(err, vault.ErrTampered) {
			t.Errorf("Value with a forged key id: %v, want ErrTampered", err)
		}
	})
}

func TestMasterKeyNeverPrinted(t *testing.T) {
	raw := bytes.Repeat([]byte{0xab}, 32)
	k, err := vault.NewKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(k.ID) != 16 {
		t.Errorf("ID %q, want 16 hex digits", k.ID)
	}
	type inner struct{ k vault.MasterKey }
	holders := []any{
		k, *k,
		struct{ K *vault.MasterKey }{k},
		struct{ k *vault.MasterKey }{k},
		struct{ k vault.MasterKey }{*k},
		struct{ i inner }{inner{*k}},
		[]*vault.MasterKey{k},
		map[string]vault.MasterKey{"a": *k},
	}
	for _, h := range holders {
		for _, f := range printVerbs {
			out := fmt.Sprintf(f, h)
			if strings.Contains(out, "abab") || strings.Contains(out, "ABAB") || strings.Contains(out, "171 171") ||
				strings.Contains(out, "\xab\xab") || strings.Contains(out, "\xab\xab") || strings.Contains(out, "2880154539") {
				t.Errorf("%s of %T prints the key: %s", f, h, out)
			}
		}
	}
}

var printVerbs = []string{"%v", "%+v", "%#v", "%s", "%x", "%X", "%q", "%d", "%T", "%p"}

func TestRevoke(t *testing.T) {
	backends(t, func(t *testing.T, b vault.Backend) {
		ctx := t.Context()
		v := vault.New(b, newKey(t))
		if _, err := v.Put(ctx, "t", "S", []byte(canary), []string{"h.example"}, ""); err != nil {
			t.Fatal(err)
		}
		if err := v.Revoke(ctx, "t", "S"); err != nil {
			t.Fatal(err)
		}
		_, _, err := v.Value(ctx, "t", "S")
		if !errors.Is(err, vault.ErrRevoked) {
			t.Fatalf("Value after Revoke: %v", err)
		}
		in, err := v.Info(ctx, "t", "S")
		if err != nil || !in.Revoked || in.RevokedAt == nil {
			t.Fatalf("Info after Revoke: %+v, %v", in, err)
		}
		first := *in.RevokedAt
		if err := v.Revoke(ctx, "t", "S"); err != nil {
			t.Fatal(err)
		}
		if in, _ := v.Info(ctx, "t", "S"); !in.RevokedAt.Equal(first) {
			t.Error("a second Revoke changed the revocation time")
		}
		if _, err := v.Rotate(ctx, "t", "S", []byte("new-value-123")); !errors.Is(err, vault.ErrRevoked) {
			t.Errorf("Rotate of a revoked secret: %v", err)
		}
		if err := v.Revoke(ctx, "t", "NOPE"); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("Revoke of a missing secret: %v", err)
		}
		// Adding it again replaces it, unrevoked.
		in, err = v.Put(ctx, "t", "S", []byte("fresh-value-456"), []string{"h.example"}, "")
		if err != nil || in.Revoked || in.Version != 2 {
			t.Fatalf("Put over a revoked secret: %+v, %v", in, err)
		}
		if mustValue(t, v, "t", "S") != "fresh-value-456" {
			t.Error("wrong value after re-adding")
		}
	})
}

func TestRotate(t *testing.T) {
	backends(t, func(t *testing.T, b vault.Backend) {
		ctx := t.Context()
		v := vault.New(b, newKey(t))
		in1, err := v.Put(ctx, "t", "S", []byte("first-value-AAAA"), []string{"h.example"}, "X-Api-Key: {value}")
		if err != nil {
			t.Fatal(err)
		}
		r1, _ := b.Get(ctx, "t", "S")
		in2, err := v.Rotate(ctx, "t", "S", []byte("second-value-BBBB"))
		if err != nil {
			t.Fatal(err)
		}
		if in2.Version != in1.Version+1 || in2.Preview != "BBBB" || !slices.Equal(in2.Hosts, in1.Hosts) ||
			in2.Inject != in1.Inject || !in2.CreatedAt.Equal(in1.CreatedAt) || in2.UpdatedAt.Before(in1.UpdatedAt) {
			t.Errorf("after Rotate %+v (before %+v)", in2, in1)
		}
		r2, _ := b.Get(ctx, "t", "S")
		if bytes.Equal(r1.Nonce, r2.Nonce) || bytes.Equal(r1.Ciphertext, r2.Ciphertext) {
			t.Error("Rotate kept the nonce or ciphertext")
		}
		if mustValue(t, v, "t", "S") != "second-value-BBBB" {
			t.Error("Rotate did not change the value")
		}
		if _, err := v.Rotate(ctx, "t", "S", []byte("bad\r\nX-Evil: 1")); !errors.Is(err, vault.ErrInvalid) {
			t.Errorf("Rotate to a header-splitting value of an injected secret: %v", err)
		}
		if _, err := v.Rotate(ctx, "t", "NOPE", []byte("v")); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("Rotate of a missing secret: %v", err)
		}
	})
}

// TestAllowEnv: a secret may be delivered into a guest only if it was
// stored (or rotated) with AllowEnv; replacing it without the flag, or a
// master-key rotation, never sets it, and a value rotation keeps it.
func TestAllowEnv(t *testing.T) {
	backends(t, func(t *testing.T, b vault.Backend) {
		ctx := t.Context()
		v := vault.New(b, newKey(t))
		in, err := v.Put(ctx, "t", "S", []byte("value-one-AAAA"), []string{"h.example"}, "")
		if err != nil || in.AllowEnv {
			t.Fatalf("Put: %+v %v (want AllowEnv off)", in, err)
		}
		in, err = v.PutWith(ctx, "t", "S", []byte("value-two-BBBB"), vault.PutOptions{Hosts: []string{"h.example"}, AllowEnv: true})
		if err != nil || !in.AllowEnv {
			t.Fatalf("PutWith AllowEnv: %+v %v", in, err)
		}
		if in, _ := v.Info(ctx, "t", "S"); !in.AllowEnv {
			t.Error("Info lost AllowEnv")
		}
		if in, err = v.Rotate(ctx, "t", "S", []byte("value-three-CCCC")); err != nil || !in.AllowEnv {
			t.Errorf("Rotate dropped AllowEnv: %+v %v", in, err)
		}
		no, yes := false, true
		if in, err = v.RotateWith(ctx, "t", "S", []byte("value-four-DDDD"), &no); err != nil || in.AllowEnv {
			t.Errorf("RotateWith off: %+v %v", in, err)
		}
		if in, err = v.RotateWith(ctx, "t", "S", []byte("value-five-EEEE"), &yes); err != nil || !in.AllowEnv {
			t.Errorf("RotateWith on: %+v %v", in, err)
		}
		if _, err := v.RotateMasterKey(ctx, newKey(t)); err != nil {
			t.Fatal(err)
		}
		if in, _ := v.Info(ctx, "t", "S"); !in.AllowEnv || mustValue(t, v, "t", "S") != "value-five-EEEE" {
			t.Errorf("after a master-key rotation: %+v", in)
		}
		if in, err = v.Put(ctx, "t", "S", []byte("value-six-FFFF"), []string{"h.example"}, ""); err != nil || in.AllowEnv {
			t.Errorf("a replacing Put without the flag kept it: %+v %v", in, err)
		}
		if l, _ := v.List(ctx, "t"); len(l) != 1 || l[0].AllowEnv {
			t.Errorf("List: %+v", l)
		}
	})
}

func TestConcurrentPutsSQLite(t *testing.T) {
	b := openSQLite(t, filepath.Join(t.TempDir(), "vault.db"))
	v := vault.New(b, newKey(t))
	ctx := t.Context()
	const goroutines, each = 50, 10
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*each)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				val := fmt.Sprintf("value-%d-%d-%s", g, i, canary)
				if _, err := v.Put(ctx, fmt.Sprintf("t%d", g%4), fmt.Sprintf("S_%d_%d", g, i), []byte(val), []string{"h.example"}, ""); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := 0
	for tn := range 4 {
		list, err := v.List(ctx, fmt.Sprintf("t%d", tn))
		if err != nil {
			t.Fatal(err)
		}
		n += len(list)
	}
	if n != goroutines*each {
		t.Fatalf("%d secrets after %d concurrent puts", n, goroutines*each)
	}
	for g := range goroutines {
		for i := range each {
			if got, want := mustValue(t, v, fmt.Sprintf("t%d", g%4), fmt.Sprintf("S_%d_%d", g, i)), fmt.Sprintf("value-%d-%d-%s", g, i, canary); got != want {
				t.Fatalf("S_%d_%d has another value", g, i)
			}
		}
	}
}

// A Revoke racing a Rotate of the same secret is never undone by it.
func TestRevokeNotUndoneByConcurrentRotate(t *testing.T) {
	backends(t, func(t *testing.T, b vault.Backend) {
		ctx := t.Context()
		v := vault.New(b, newKey(t))
		for i := range 30 {
			name := fmt.Sprintf("S%d", i)
			if _, err := v.Put(ctx, "t", name, []byte("value-one-1111"), []string{"h.example"}, ""); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			wg.Go(func() {
				if err := v.Revoke(ctx, "t", name); err != nil {
					t.Error(err)
				}
			})
			for range 3 {
				wg.Go(func() {
					if _, err := v.Rotate(ctx, "t", name, []byte("value-two-2222")); err != nil && !errors.Is(err, vault.ErrRevoked) {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			if _, _, err := v.Value(ctx, "t", name); !errors.Is(err, vault.ErrRevoked) {
				t.Fatalf("after a Revoke raced Rotates: %v, want ErrRevoked", err)
			}
		}
	})
}

func fillVault(t *testing.T, v *vault.Vault, n int) map[[2]string]string {
	t.Helper()
	want := map[[2]string]string{}
	for i := range n {
		tenant, name := fmt.Sprintf("tenant%d", i%7), fmt.Sprintf("SECRET_%d", i)
		val := fmt.Sprintf("%s-%03d", canary, i)
		if _, err := v.Put(t.Context(), tenant, name, []byte(val), []string{"h.example"}, ""); err != nil {
			t.Fatal(err)
		}
		want[[2]string{tenant, name}] = val
	}
	return want
}

func TestRotateMasterKey(t *testing.T) {
	backends(t, func(t *testing.T, b vault.Backend) {
		ctx := t.Context()
		oldKey, newK := newKey(t), newKey(t)
		vOld := vault.New(b, oldKey)
		want := fillVault(t, vOld, 100)
		if _, err := vOld.Rotate(ctx, "tenant3", "SECRET_3", []byte("rotated-value-3")); err != nil {
			t.Fatal(err)
		}
		want[[2]string{"tenant3", "SECRET_3"}] = "rotated-value-3"
		if err := vOld.Revoke(ctx, "tenant5", "SECRET_5"); err != nil {
			t.Fatal(err)
		}
		before, _ := b.All(ctx)

		n, err := vault.RotateMasterKey(ctx, b, oldKey, newK)
		if err != nil {
			t.Fatal(err)
		}
		if n != 100 {
			t.Errorf("re-sealed %d, want 100", n)
		}
		vNew := vault.New(b, newK)
		for k, val := range want {
			if k == [2]string{"tenant5", "SECRET_5"} {
				if _, _, err := vNew.Value(ctx, k[0], k[1]); !errors.Is(err, vault.ErrRevoked) {
					t.Errorf("revoked secret after rotation: %v", err)
				}
				continue
			}
			if got := mustValue(t, vNew, k[0], k[1]); got != val {
				t.Errorf("%v changed in the rotation", k)
			}
			if _, _, err := vOld.Value(ctx, k[0], k[1]); !errors.Is(err, vault.ErrWrongKey) {
				t.Errorf("old key after rotation: %v, want ErrWrongKey", err)
			}
		}
		after, _ := b.All(ctx)
		for i := range after {
			a, p := after[i], before[i]
			if a.KeyID != newK.ID || a.Version != p.Version || !a.UpdatedAt.Equal(p.UpdatedAt) || (a.RevokedAt == nil) != (p.RevokedAt == nil) {
				t.Errorf("%s/%s: rotation changed metadata", a.Tenant, a.Name)
			}
		}
		// Running it again is harmless.
		if n, err := vault.RotateMasterKey(ctx, b, oldKey, newK); err != nil || n != 0 {
			t.Errorf("second rotation: %d, %v; want 0, nil", n, err)
		}
		if _, err := vault.RotateMasterKey(ctx, b, newK, newK); !errors.Is(err, vault.ErrInvalid) {
			t.Errorf("rotation to the same key: %v", err)
		}
	})
}

func TestRotateMasterKeyRefusesUnopenable(t *testing.T) {
	backends(t, func(t *testing.T, b vault.Backend) {
		ctx := t.Context()
		oldKey, newK, other := newKey(t), newKey(t), newKey(t)
		fillVault(t, vault.New(b, oldKey), 10)
		if _, err := vault.New(b, other).Put(ctx, "x", "STRAY", []byte(canary), []string{"h.example"}, ""); err != nil {
			t.Fatal(err)
		}
		before, _ := b.All(ctx)
		_, err := vault.RotateMasterKey(ctx, b, oldKey, newK)
		if !errors.Is(err, vault.ErrWrongKey) || !strings.Contains(err.Error(), "STRAY") || !strings.Contains(err.Error(), other.ID) {
			t.Fatalf("rotation with a stray record: %v", err)
		}
		if strings.Contains(err.Error(), canary) {
			t.Error("error contains a value")
		}
		after, _ := b.All(ctx)
		assertSame(t, before, after)
	})
}

// failingBackend makes ReplaceAll fail part way: it appends an invalid
// record, so the real backend has written the others in its transaction
// before it fails.
type failingBackend struct{ vault.Backend }

func (f failingBackend) ReplaceAll(ctx context.Context, recs []*vault.Record) error {
	bad := vaulttest.Rec("zz", "BAD", 1)
	bad.Nonce = nil
	return f.Backend.ReplaceAll(ctx, append(slices.Clone(recs), bad))
}

func TestRotateMasterKeyReplaceAllFailure(t *testing.T) {
	backends(t, func(t *testing.T, b vault.Backend) {
		ctx := t.Context()
		oldKey, newK := newKey(t), newKey(t)
		v := vault.New(failingBackend{b}, oldKey)
		want := fillVault(t, v, 20)
		before, _ := b.All(ctx)
		if _, err := v.RotateMasterKey(ctx, newK); err == nil {
			t.Fatal("rotation succeeded although ReplaceAll failed")
		}
		if v.KeyID() != oldKey.ID {
			t.Error("the vault switched keys although the rotation failed")
		}
		after, _ := b.All(ctx)
		assertSame(t, before, after)
		for k, val := range want {
			if mustValue(t, v, k[0], k[1]) != val {
				t.Fatalf("%v changed", k)
			}
		}
	})
}

func assertSame(t *testing.T, before, after []*vault.Record) {
	t.Helper()
	if len(before) != len(after) {
		t.Fatalf("%d records, had %d", len(after), len(before))
	}
	for i := range before {
		if d := vaulttest.Equal(after[i], before[i]); d != "" {
			t.Errorf("%s/%s changed: %s", before[i].Tenant, before[i].Name, d)
		}
	}
}

// Vault.RotateMasterKey runs safely alongside the vault's other writes.
func TestVaultRotateMasterKeyConcurrent(t *testing.T) {
	b := openSQLite(t, filepath.Join(t.TempDir(), "vault.db"))
	ctx := t.Context()
	k1, k2 := newKey(t), newKey(t)
	v := vault.New(b, k1)
	fillVault(t, v, 50)
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Go(func() {
			for i := range 10 {
				if _, err := v.Put(ctx, "c", fmt.Sprintf("C_%d_%d", g, i), []byte("concurrent-value"), []string{"h.example"}, ""); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Go(func() {
		if _, err := v.RotateMasterKey(ctx, k2); err != nil {
			t.Error(err)
		}
	})
	wg.Wait()
	if v.KeyID() != k2.ID {
		t.Fatal("vault did not switch keys")
	}
	all, _ := b.All(ctx)
	if len(all) != 150 {
		t.Fatalf("%d records, want 150", len(all))
	}
	vNew := vault.New(b, k2)
	for _, r := range all {
		if _, _, err := vNew.Value(ctx, r.Tenant, r.Name); err != nil {
			t.Fatalf("after a concurrent rotation: %v", err)
		}
	}
}

func TestValidation(t *testing.T) {
	ctx := t.Context()
	v := vault.New(vault.NewMemBackend(), newKey(t))
	hosts := []string{"api.example.com"}
	long := strings.Repeat("x", 64<<10)
	cases := []struct {
		name, secret string
		value        string
		hosts        []string
		inject       string
		ok           bool
	}{
		{"ok", "A", "v", hosts, "", true},
		{"underscore name", "_a_1", "v", hosts, "", true},
		{"128-char name", "A" + strings.Repeat("b", 127), "v", hosts, "", true},
		{"129-char name", "A" + strings.Repeat("b", 128), "v", hosts, "", false},
		{"digit first", "1A", "v", hosts, "", false},
		{"dash", "A-B", "v", hosts, "", false},
		{"empty name", "", "v", hosts, "", false},
		{"64 KiB value", "A", long, hosts, "", true},
		{"value too long", "A", long + "x", hosts, "", false},
		{"empty value", "A", "", hosts, "", false},
		{"binary value without inject", "A", "a\x00\r\nb", hosts, "", true},
		{"control char with inject", "A", "a\r\nb", hosts, "Authorization: Bearer {value}", false},
		{"wildcard", "A", "v", []string{"*.example.com"}, "", true},
		{"wildcard TLD", "A", "v", []string{"*.com"}, "", false},
		{"single label", "A", "v", []string{"localhost"}, "", true},
		{"no hosts", "A", "v", nil, "", false},
		{"ip", "A", "v", []string{"10.0.0.1"}, "", false},
		{"ipv6", "A", "v", []string{"[::1]"}, "", false},
		{"numeric", "A", "v", []string{"127.1"}, "", false},
		{"port", "A", "v", []string{"example.com:443"}, "", false},
		{"url", "A", "v", []string{"https://example.com/"}, "", false},
		{"mid wildcard", "A", "v", []string{"a.*.example.com"}, "", false},
		{"bad label", "A", "v", []string{"-a.example.com"}, "", false},
		{"empty label", "A", "v", []string{"a..example.com"}, "", false},
		{"unicode", "A", "v", []string{"exämple.com"}, "", false},
		{"inject ok", "A", "v", hosts, "X-Api-Key: {value}", true},
		{"inject no colon", "A", "v", hosts, "Bearer {value}", false},
		{"inject no token", "A", "v", hosts, "Authorization: Bearer", false},
		{"inject twice", "A", "v", hosts, "Authorization: {value}{value}", false},
		{"inject bad header", "A", "v", hosts, "Auth orization: {value}", false},
		{"inject empty header", "A", "v", hosts, ": {value}", false},
		{"inject newline", "A", "v", hosts, "Authorization: {value}\r\nX-Evil: 1", false},
		{"inject host", "A", "v", hosts, "Host: {value}", false},
		{"inject content-length", "A", "v", hosts, "content-length: {value}", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := v.Put(ctx, "t", c.secret, []byte(c.value), c.hosts, c.inject)
			if c.ok && err != nil {
				t.Errorf("Put: %v", err)
			}
			if !c.ok && !errors.Is(err, vault.ErrInvalid) {
				t.Errorf("Put: %v, want ErrInvalid", err)
			}
		})
	}
	if _, err := v.Put(ctx, "", "A", []byte("v"), hosts, ""); !errors.Is(err, vault.ErrInvalid) {
		t.Errorf("empty tenant: %v", err)
	}
}

func TestPreview(t *testing.T) {
	v := vault.New(vault.NewMemBackend(), newKey(t))
	for value, want := range map[string]string{
		"abcdefgh":                             "efgh",
		"abcdefg":                              "****",
		"x":                                    "****",
		"sk_live_0123456789":                   "6789",
		"日本語のパスワードです":                          "ードです",
		"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8\xf7": "****",
		"abcdefgh\x00\x01\x02\x03":             "****",
	} {
		in, err := v.Put(t.Context(), "t", "S", []byte(value), []string{"h.example"}, "")
		if err != nil {
			t.Fatal(err)
		}
		if in.Preview != want {
			t.Errorf("preview of %q = %q, want %q", value, in.Preview, want)
		}
	}
}

func TestMatchHost(t *testing.T) {
	hosts, err := vault.NormalizeHosts([]string{"API.example.com", "*.Example.org"})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"api.example.com":      true,
		"API.EXAMPLE.COM.":     true,
		"example.com":          false,
		"x.api.example.com":    false,
		"a.example.org":        true,
		"a.b.example.org":      true,
		"example.org":          false,
		"badexample.org":       false,
		"":                     false,
		"api.example.com.evil": false,
	} {
		if got := hostname.MatchAny(hosts, host); got != want {
			t.Errorf("MatchAny(%q) = %v, want %v", host, got, want)
		}
	}
}

// TestHostsAgree runs the shared host tables (package hostnametest)
// through NormalizeHosts: the vault accepts, canonicalises and refuses a
// secret's hosts exactly as the policy and the substitution do.
func TestHostsAgree(t *testing.T) {
	for _, tc := range hostnametest.Patterns {
		got, err := vault.NormalizeHosts([]string{tc.In})
		if tc.Canonical == "" {
			if !errors.Is(err, vault.ErrInvalid) || !strings.Contains(err.Error(), tc.Why) {
				t.Errorf("%q: %v, want ErrInvalid saying %q", tc.In, err, tc.Why)
			}
			continue
		}
		if err != nil || len(got) != 1 || got[0] != tc.Canonical {
			t.Errorf("%q: %q, %v; want %q", tc.In, got, err, tc.Canonical)
		}
	}
	for _, tc := range hostnametest.Matches {
		hosts, err := vault.NormalizeHosts([]string{tc.Pattern})
		if err != nil {
			t.Fatalf("%q: %v", tc.Pattern, err)
		}
		if got := hostname.MatchAny(hosts, tc.Host); got != tc.Want {
			t.Errorf("%q ~ %q = %v, want %v", tc.Pattern, tc.Host, got, tc.Want)
		}
	}
}

// TestHostsRefusePrivateSuffixWildcards: a secret bound to every name of a
// hosting platform could be sent to anyone's app.
func TestHostsRefusePrivateSuffixWildcards(t *testing.T) {
	for _, tc := range hostnametest.PrivateSuffixWildcards {
		if _, err := vault.NormalizeHosts([]string{tc.In}); !errors.Is(err, vault.ErrInvalid) || !strings.Contains(err.Error(), tc.Why) {
			t.Errorf("%q: %v, want ErrInvalid saying %q", tc.In, err, tc.Why)
		}
	}
}

// TestCopy: a copy holds the same value, hosts and inject template under
// its own name, never widens AllowEnv, leaves the original as it was, and
// a revoked or missing secret is not copied.
func TestCopy(t *testing.T) {
	backends(t, func(t *testing.T, b vault.Backend) {
		ctx := t.Context()
		v := vault.New(b, newKey(t))
		if _, err := v.PutWith(ctx, "t", "S", []byte(canary), vault.PutOptions{Hosts: []string{"h.example"}, Inject: "X-Api-Key: {value}", AllowEnv: true}); err != nil {
			t.Fatal(err)
		}
		in, err := v.Copy(ctx, "t", "S", "C", true)
		if err != nil {
			t.Fatal(err)
		}
		if in.Name != "C" || !slices.Equal(in.Hosts, []string{"h.example"}) || in.Inject != "X-Api-Key: {value}" || !in.AllowEnv {
			t.Errorf("copy: %+v", in)
		}
		if mustValue(t, v, "t", "C") != canary || mustValue(t, v, "t", "S") != canary {
			t.Error("the copy or the original does not hold the value")
		}
		if in, err := v.Copy(ctx, "t", "S", "N", false); err != nil || in.AllowEnv {
			t.Errorf("copy with allowEnv false: %+v %v; want AllowEnv off", in, err)
		}
		if _, err := v.Put(ctx, "t", "E", []byte("value-no-env-1"), []string{"h.example"}, ""); err != nil {
			t.Fatal(err)
		}
		if in, err := v.Copy(ctx, "t", "E", "E2", true); err != nil || in.AllowEnv {
			t.Errorf("a copy widened AllowEnv: %+v %v", in, err)
		}
		if err := v.Revoke(ctx, "t", "S"); err != nil {
			t.Fatal(err)
		}
		if _, err := v.Copy(ctx, "t", "S", "R", true); !errors.Is(err, vault.ErrRevoked) {
			t.Errorf("copy of a revoked secret: %v; want ErrRevoked", err)
		}
		if _, err := v.Info(ctx, "t", "R"); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("a refused copy left %q behind: %v", "R", err)
		}
		if _, err := v.Copy(ctx, "other", "C", "X", true); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("copy across tenants: %v; want ErrNotFound", err)
		}
	})
}
