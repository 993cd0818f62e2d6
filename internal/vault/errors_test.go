package vault_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/vault"
)

// brokenBackend fails the methods named in fail.
type brokenBackend struct {
	vault.Backend
	fail map[string]bool
}

var errDisk = errors.New("disk on fire")

func (b *brokenBackend) Put(ctx context.Context, r *vault.Record) error {
	if b.fail["Put"] {
		return errDisk
	}
	return b.Backend.Put(ctx, r)
}

func (b *brokenBackend) Get(ctx context.Context, tenant, name string) (*vault.Record, error) {
	if b.fail["Get"] {
		return nil, errDisk
	}
	return b.Backend.Get(ctx, tenant, name)
}

func (b *brokenBackend) ReplaceAll(ctx context.Context, recs []*vault.Record) error {
	if b.fail["ReplaceAll"] {
		return errDisk
	}
	return b.Backend.ReplaceAll(ctx, recs)
}

// TestNoValueInErrors forces every error path with a distinctive value and
// checks that no error message contains it, or any recognisable part.
func TestNoValueInErrors(t *testing.T) {
	ctx := t.Context()
	hosts := []string{"h.example"}
	big := strings.Repeat(canary, vault.MaxValueLen/len(canary)+1)
	key, other := newKey(t), newKey(t)

	setup := func(t *testing.T) (*brokenBackend, *vault.Vault) {
		b := &brokenBackend{Backend: vault.NewMemBackend(), fail: map[string]bool{}}
		v := vault.New(b, key)
		for _, n := range []string{"S", "REVOKED", "TAMPERED", "INJ"} {
			inject := ""
			if n == "INJ" {
				inject = "Authorization: Bearer {value}"
			}
			if _, err := v.Put(ctx, "t", n, []byte(canary), hosts, inject); err != nil {
				t.Fatal(err)
			}
		}
		if err := v.Revoke(ctx, "t", "REVOKED"); err != nil {
			t.Fatal(err)
		}
		r, _ := b.Get(ctx, "t", "TAMPERED")
		r.Ciphertext[0] ^= 1
		_ = b.Backend.Put(ctx, r)
		if _, err := vault.New(b, other).Put(ctx, "t", "OTHERKEY", []byte(canary), hosts, ""); err != nil {
			t.Fatal(err)
		}
		return b, v
	}
	value := func(v *vault.Vault, name string) error { _, _, err := v.Value(ctx, "t", name); return err }

	cases := []struct {
		name string
		want error
		run  func(b *brokenBackend, v *vault.Vault) error
	}{
		{"put bad tenant", vault.ErrInvalid, func(b *brokenBackend, v *vault.Vault) error {
			_, err := v.Put(ctx, "", "S", []byte(canary), hosts, "")
			return err
		}},
		{"put bad name", vault.ErrInvalid, func(b *brokenBackend, v *vault.Vault) error {
			_, err := v.Put(ctx, "t", "bad name", []byte(canary), hosts, "")
			return err
		}},
		{"put bad host", vault.ErrInvalid, func(b *brokenBackend, v *vault.Vault) error {
			_, err := v.Put(ctx, "t", "S", []byte(canary), []string{"http://x/"}, "")
			return err
		}},
		{"put bad inject", vault.ErrInvalid, func(b *brokenBackend, v *vault.Vault) error {
			_, err := v.Put(ctx, "t", "S", []byte(canary), hosts, "Authorization Bearer")
			return err
		}},
		{"put too long", vault.ErrInvalid, func(b *brokenBackend, v *vault.Vault) error {
			_, err := v.Put(ctx, "t", "S", []byte(big), hosts, "")
			return err
		}},
		{"put control char", vault.ErrInvalid, func(b *brokenBackend, v *vault.Vault) error {
			_, err := v.Put(ctx, "t", "S", []byte(canary+"\r\n"+canary), hosts, "X-Key: {value}")
			return err
		}},
		{"put backend write", errDisk, func(b *brokenBackend, v *vault.Vault) error {
			b.fail["Put"] = true
			_, err := v.Put(ctx, "t", "S", []byte(canary), hosts, "")
			return err
		}},
		{"put backend read", errDisk, func(b *brokenBackend, v *vault.Vault) error {
			b.fail["Get"] = true
			_, err := v.Put(ctx, "t", "S", []byte(canary), hosts, "")
			return err
		}},
		{"value not found", vault.ErrNotFound, func(b *brokenBackend, v *vault.Vault) error { return value(v, "NOPE") }},
		{"value revoked", vault.ErrRevoked, func(b *brokenBackend, v *vault.Vault) error { return value(v, "REVOKED") }},
		{"value tampered", vault.ErrTampered, func(b *brokenBackend, v *vault.Vault) error { return value(v, "TAMPERED") }},
		{"value wrong key", vault.ErrWrongKey, func(b *brokenBackend, v *vault.Vault) error { return value(v, "OTHERKEY") }},
		{"value backend", errDisk, func(b *brokenBackend, v *vault.Vault) error { b.fail["Get"] = true; return value(v, "S") }},
		{"rotate too long", vault.ErrInvalid, func(b *brokenBackend, v *vault.Vault) error {
			_, err := v.Rotate(ctx, "t", "S", []byte(big))
			return err
		}},
		{"rotate empty", vault.ErrInvalid, func(b *brokenBackend, v *vault.Vault) error {
			_, err := v.Rotate(ctx, "t", "S", nil)
			return err
		}},
		{"rotate control char", vault.ErrInvalid, func(b *brokenBackend, v *vault.Vault) error {
			_, err := v.Rotate(ctx, "t", "INJ", []byte(canary+"\n"))
			return err
		}},
		{"rotate revoked", vault.ErrRevoked, func(b *brokenBackend, v *vault.Vault) error {
			_, err := v.Rotate(ctx, "t", "REVOKED", []byte(canary))
			return err
		}},
		{"rotate not found", vault.ErrNotFound, func(b *brokenBackend, v *vault.Vault) error {
			_, err := v.Rotate(ctx, "t", "NOPE", []byte(canary))
			return err
		}},
		{"rotate backend", errDisk, func(b *brokenBackend, v *vault.Vault) error {
			b.fail["Put"] = true
			_, err := v.Rotate(ctx, "t", "S", []byte(canary))
			return err
		}},
		{"master rotation with stray and tampered records", vault.ErrWrongKey, func(b *brokenBackend, v *vault.Vault) error {
			_, err := vault.RotateMasterKey(ctx, b, key, newKey(t))
			if !errors.Is(err, vault.ErrTampered) {
				return fmt.Errorf("want ErrTampered too: %w", err)
			}
			return err
		}},
		{"master rotation backend", errDisk, func(b *brokenBackend, v *vault.Vault) error {
			_ = b.Backend.Delete(ctx, "t", "OTHERKEY")
			_ = b.Backend.Delete(ctx, "t", "TAMPERED")
			b.fail["ReplaceAll"] = true
			_, err := v.RotateMasterKey(ctx, newKey(t))
			return err
		}},
	}
	forbidden := []string{canary, canary[:8], canary[len(canary)-8:]}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, v := setup(t)
			err := c.run(b, v)
			if !errors.Is(err, c.want) {
				t.Fatalf("error %v, want %v", err, c.want)
			}
			for _, f := range forbidden {
				if strings.Contains(err.Error(), f) || strings.Contains(fmt.Sprintf("%+v %#v", err, err), f) {
					t.Fatalf("error contains the value: %v", err)
				}
			}
		})
	}

	t.Run("panic", func(t *testing.T) {
		defer func() {
			r := recover()
			if r == nil || strings.Contains(fmt.Sprint(r), canary) {
				t.Errorf("New(nil, nil) recovered %v", r)
			}
		}()
		vault.New(nil, nil)
	})
}
