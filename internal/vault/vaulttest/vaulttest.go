// Package vaulttest is the conformance suite every vault.Backend must
// pass: vaulttest.TestBackend(t, newBackend).
package vaulttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/vault"
)

// TestBackend runs the conformance suite. newBackend returns a new, empty
// backend for each subtest (closing it with t.Cleanup if need be).
func TestBackend(t *testing.T, newBackend func(t *testing.T) vault.Backend) {
	t.Run("RoundTrip", func(t *testing.T) { testRoundTrip(t, newBackend(t)) })
	t.Run("ReplaceOnPut", func(t *testing.T) { testReplaceOnPut(t, newBackend(t)) })
	t.Run("NotFound", func(t *testing.T) { testNotFound(t, newBackend(t)) })
	t.Run("TenantIsolation", func(t *testing.T) { testTenantIsolation(t, newBackend(t)) })
	t.Run("Invalid", func(t *testing.T) { testInvalid(t, newBackend(t)) })
	t.Run("ReplaceAll", func(t *testing.T) { testReplaceAll(t, newBackend(t)) })
	t.Run("ReplaceAllAtomic", func(t *testing.T) { testReplaceAllAtomic(t, newBackend(t)) })
	t.Run("ConcurrentPuts", func(t *testing.T) { testConcurrentPuts(t, newBackend(t)) })
	t.Run("CopiesNotShared", func(t *testing.T) { testCopies(t, newBackend(t)) })
	t.Run("AllowEnv", func(t *testing.T) { testAllowEnv(t, newBackend(t)) })
}

var t0 = time.Date(2025, 3, 4, 5, 6, 7, 891011000, time.UTC)

// Rec returns a well-formed record for tests; its ciphertext is not
// a real seal.
func Rec(tenant, name string, version int64) *vault.Record {
	return &vault.Record{
		Tenant:     tenant,
		Name:       name,
		Hosts:      []string{"api.example.com", "*.example.org"},
		Inject:     "Authorization: Bearer {value}",
		Preview:    "wxyz",
		KeyID:      "0123456789abcdef",
		Nonce:      bytes.Repeat([]byte{byte(version)}, vault.NonceSize),
		Ciphertext: []byte(fmt.Sprintf("ct-%s-%s-%d", tenant, name, version)),
		Version:    version,
		CreatedAt:  t0,
		UpdatedAt:  t0.Add(time.Duration(version) * time.Second),
	}
}

// Equal reports how got differs from want ("" if it does not), treating
// nil and empty Hosts alike and comparing times with Equal.
func Equal(got, want *vault.Record) string {
	switch {
	case got == nil || want == nil:
		if got != want {
			return fmt.Sprintf("got %v, want %v", got, want)
		}
		return ""
	case got.Tenant != want.Tenant || got.Name != want.Name:
		return fmt.Sprintf("identity %s/%s, want %s/%s", got.Tenant, got.Name, want.Tenant, want.Name)
	case !slices.Equal(got.Hosts, want.Hosts):
		return fmt.Sprintf("hosts %q, want %q", got.Hosts, want.Hosts)
	case got.Inject != want.Inject, got.Preview != want.Preview, got.KeyID != want.KeyID:
		return fmt.Sprintf("inject/preview/key %q %q %q, want %q %q %q", got.Inject, got.Preview, got.KeyID, want.Inject, want.Preview, want.KeyID)
	case !bytes.Equal(got.Nonce, want.Nonce), !bytes.Equal(got.Ciphertext, want.Ciphertext):
		return "nonce or ciphertext differ"
	case got.Version != want.Version:
		return fmt.Sprintf("version %d, want %d", got.Version, want.Version)
	case !got.CreatedAt.Equal(want.CreatedAt), !got.UpdatedAt.Equal(want.UpdatedAt):
		return fmt.Sprintf("times %v %v, want %v %v", got.CreatedAt, got.UpdatedAt, want.CreatedAt, want.UpdatedAt)
	case (got.RevokedAt == nil) != (want.RevokedAt == nil),
		got.RevokedAt != nil && !got.RevokedAt.Equal(*want.RevokedAt):
		return fmt.Sprintf("revoked %v, want %v", got.RevokedAt, want.RevokedAt)
	case got.AllowEnv != want.AllowEnv:
		return fmt.Sprintf("allow env %v, want %v", got.AllowEnv, want.AllowEnv)
	}
	return ""
}

func mustPut(t *testing.T, b vault.Backend, r *vault.Record) {
	t.Helper()
	if err := b.Put(context.Background(), r); err != nil {
		t.Fatalf("Put %s/%s: %v", r.Tenant, r.Name, err)
	}
}

func mustGet(t *testing.T, b vault.Backend, tenant, name string) *vault.Record {
	t.Helper()
	r, err := b.Get(context.Background(), tenant, name)
	if err != nil {
		t.Fatalf("Get %s/%s: %v", tenant, name, err)
	}
	return r
}

func testRoundTrip(t *testing.T, b vault.Backend) {
	ctx := context.Background()
	a := Rec("t1", "A", 1)
	c := Rec("t1", "C", 3)
	rev := t0.Add(time.Hour)
	c.RevokedAt = &rev
	c.Inject = ""
	c.Hosts = []string{"one.example"}
	mustPut(t, b, c)
	mustPut(t, b, a)
	for _, want := range []*vault.Record{a, c} {
		if d := Equal(mustGet(t, b, want.Tenant, want.Name), want); d != "" {
			t.Errorf("Get %s: %s", want.Name, d)
		}
	}
	list, err := b.List(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || Equal(list[0], a) != "" || Equal(list[1], c) != "" {
		t.Errorf("List = %d records, want A then C", len(list))
	}
	all, err := b.All(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 {
		t.Errorf("All = %d records, want 2", len(all))
	}
	if err := b.Delete(ctx, "t1", "A"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, "t1", "A"); !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("Get after Delete: %v, want ErrNotFound", err)
	}
	if list, _ := b.List(ctx, "t1"); len(list) != 1 {
		t.Errorf("List after Delete = %d records, want 1", len(list))
	}
}

// testAllowEnv: the flag is kept, read back, listed and replaced like
// every other field.
func testAllowEnv(t *testing.T, b vault.Backend) {
	ctx := context.Background()
	on, off := Rec("t", "ON", 1), Rec("t", "OFF", 1)
	on.AllowEnv = true
	mustPut(t, b, on)
	mustPut(t, b, off)
	for _, want := range []*vault.Record{on, off} {
		if d := Equal(mustGet(t, b, "t", want.Name), want); d != "" {
			t.Errorf("Get %s: %s", want.Name, d)
		}
	}
	list, err := b.List(ctx, "t")
	if err != nil || len(list) != 2 || !list[1].AllowEnv || list[0].AllowEnv {
		t.Errorf("List: %v %v (want OFF without, ON with allow env)", list, err)
	}
	on2 := Rec("t", "ON", 2)
	mustPut(t, b, on2)
	if mustGet(t, b, "t", "ON").AllowEnv {
		t.Error("a replacing Put without AllowEnv kept it")
	}
	off.AllowEnv = true
	if err := b.ReplaceAll(ctx, []*vault.Record{off}); err != nil {
		t.Fatal(err)
	}
	if !mustGet(t, b, "t", "OFF").AllowEnv {
		t.Error("ReplaceAll lost AllowEnv")
	}
}

func testReplaceOnPut(t *testing.T, b vault.Backend) {
	mustPut(t, b, Rec("t", "N", 1))
	r2 := Rec("t", "N", 2)
	r2.Hosts = []string{"other.example"}
	mustPut(t, b, r2)
	if d := Equal(mustGet(t, b, "t", "N"), r2); d != "" {
		t.Errorf("after replace: %s", d)
	}
	if all, _ := b.All(context.Background()); len(all) != 1 {
		t.Errorf("All = %d records after a replace, want 1", len(all))
	}
}

func testNotFound(t *testing.T, b vault.Backend) {
	ctx := context.Background()
	if _, err := b.Get(ctx, "t", "X"); !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("Get: %v, want ErrNotFound", err)
	}
	if err := b.Delete(ctx, "t", "X"); !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("Delete: %v, want ErrNotFound", err)
	}
	list, err := b.List(ctx, "t")
	if err != nil || len(list) != 0 {
		t.Errorf("List of an empty tenant = %d, %v; want 0, nil", len(list), err)
	}
	all, err := b.All(ctx)
	if err != nil || len(all) != 0 {
		t.Errorf("All of an empty backend = %d, %v; want 0, nil", len(all), err)
	}
}

func testTenantIsolation(t *testing.T, b vault.Backend) {
	ctx := context.Background()
	mustPut(t, b, Rec("t1", "S", 1))
	mustPut(t, b, Rec("t2", "S", 5))
	if r := mustGet(t, b, "t2", "S"); r.Version != 5 {
		t.Errorf("t2/S version %d, want 5", r.Version)
	}
	if _, err := b.Get(ctx, "t3", "S"); !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("other tenant's Get: %v, want ErrNotFound", err)
	}
	if err := b.Delete(ctx, "t3", "S"); !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("other tenant's Delete: %v, want ErrNotFound", err)
	}
	if err := b.Delete(ctx, "t1", "S"); err != nil {
		t.Fatal(err)
	}
	if r := mustGet(t, b, "t2", "S"); r.Version != 5 {
		t.Errorf("t2/S gone or changed after deleting t1/S")
	}
	all, _ := b.All(ctx)
	if len(all) != 1 || all[0].Tenant != "t2" {
		t.Errorf("All = %d records, want only t2's", len(all))
	}
}

func testInvalid(t *testing.T, b vault.Backend) {
	ctx := context.Background()
	for name, mod := range map[string]func(r *vault.Record){
		"empty tenant":  func(r *vault.Record) { r.Tenant = "" },
		"empty name":    func(r *vault.Record) { r.Name = "" },
		"short nonce":   func(r *vault.Record) { r.Nonce = r.Nonce[:8] },
		"no ciphertext": func(r *vault.Record) { r.Ciphertext = nil },
		"no key id":     func(r *vault.Record) { r.KeyID = "" },
		"version 0":     func(r *vault.Record) { r.Version = 0 },
	} {
		r := Rec("t", "N", 1)
		mod(r)
		if err := b.Put(ctx, r); !errors.Is(err, vault.ErrInvalid) {
			t.Errorf("Put with %s: %v, want ErrInvalid", name, err)
		}
	}
	if all, _ := b.All(ctx); len(all) != 0 {
		t.Errorf("invalid records were stored: %d", len(all))
	}
}

func testReplaceAll(t *testing.T, b vault.Backend) {
	ctx := context.Background()
	mustPut(t, b, Rec("t1", "A", 1))
	mustPut(t, b, Rec("t2", "B", 1))
	keep := Rec("t2", "KEEP", 1)
	mustPut(t, b, keep)
	a2, b2, n := Rec("t1", "A", 2), Rec("t2", "B", 2), Rec("t3", "NEW", 1)
	if err := b.ReplaceAll(ctx, []*vault.Record{a2, b2, n}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []*vault.Record{a2, b2, n, keep} {
		if d := Equal(mustGet(t, b, want.Tenant, want.Name), want); d != "" {
			t.Errorf("%s/%s after ReplaceAll: %s", want.Tenant, want.Name, d)
		}
	}
	if err := b.ReplaceAll(ctx, nil); err != nil {
		t.Errorf("ReplaceAll(nil): %v", err)
	}
}

func testReplaceAllAtomic(t *testing.T, b vault.Backend) {
	ctx := context.Background()
	var before []*vault.Record
	for i := range 5 {
		r := Rec("t", fmt.Sprintf("S%d", i), 1)
		mustPut(t, b, r)
		before = append(before, r)
	}
	var next []*vault.Record
	for i := range 5 {
		next = append(next, Rec("t", fmt.Sprintf("S%d", i), 2))
	}
	next = append(next, Rec("t", "FRESH", 1))
	bad := Rec("t", "S4", 3)
	bad.Nonce = []byte("short") // fails, after the others were written
	next = append(next, bad)
	if err := b.ReplaceAll(ctx, next); err == nil {
		t.Fatal("ReplaceAll with an invalid record succeeded")
	}
	all, err := b.All(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(before) {
		t.Fatalf("after a failed ReplaceAll: %d records, want %d", len(all), len(before))
	}
	for i, want := range before {
		if d := Equal(all[i], want); d != "" {
			t.Errorf("after a failed ReplaceAll, %s: %s", want.Name, d)
		}
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.ReplaceAll(cctx, next[:5]); err == nil {
		t.Error("ReplaceAll with a cancelled context succeeded")
	}
	if r := mustGet(t, b, "t", "S0"); r.Version != 1 {
		t.Errorf("cancelled ReplaceAll changed S0 to version %d", r.Version)
	}
}

func testConcurrentPuts(t *testing.T, b vault.Backend) {
	ctx := context.Background()
	const goroutines, each = 50, 10
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*each)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				if err := b.Put(ctx, Rec(fmt.Sprintf("t%d", g%3), fmt.Sprintf("S_%d_%d", g, i), int64(i+1))); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	all, err := b.All(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != goroutines*each {
		t.Fatalf("All = %d records after %d concurrent puts", len(all), goroutines*each)
	}
	for g := range goroutines {
		for i := range each {
			want := Rec(fmt.Sprintf("t%d", g%3), fmt.Sprintf("S_%d_%d", g, i), int64(i+1))
			if d := Equal(mustGet(t, b, want.Tenant, want.Name), want); d != "" {
				t.Fatalf("%s: %s", want.Name, d)
			}
		}
	}
}

func testCopies(t *testing.T, b vault.Backend) {
	r := Rec("t", "N", 1)
	mustPut(t, b, r)
	r.Ciphertext[0] ^= 0xff
	r.Hosts[0] = "changed.example"
	got := mustGet(t, b, "t", "N")
	if d := Equal(got, Rec("t", "N", 1)); d != "" {
		t.Errorf("changing the record after Put changed the stored one: %s", d)
	}
	got.Nonce[0] ^= 0xff
	if d := Equal(mustGet(t, b, "t", "N"), Rec("t", "N", 1)); d != "" {
		t.Errorf("changing a record from Get changed the stored one: %s", d)
	}
}
