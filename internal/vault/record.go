package vault

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Backend persists sealed records; the daemon adapts its store to it.
// Implementations are safe for concurrent use and must pass
// vaulttest.TestBackend. They never see a value, only ciphertext.
//
// Every method that writes validates its records with Record.Validate and
// returns an error wrapping ErrInvalid for a malformed one. Times are
// stored as given; Vault normalises them to UTC microseconds first.
type Backend interface {
	// Put inserts r, or replaces the record with the same (Tenant, Name),
	// atomically.
	Put(ctx context.Context, r *Record) error
	// Get returns the record, or an error wrapping ErrNotFound.
	Get(ctx context.Context, tenant, name string) (*Record, error)
	// List returns the tenant's records ordered by Name (empty, not an
	// error, for a tenant without secrets).
	List(ctx context.Context, tenant string) ([]*Record, error)
	// Delete removes the record, or returns an error wrapping ErrNotFound.
	Delete(ctx context.Context, tenant, name string) error
	// ReplaceAll writes every record of recs (each inserting or replacing
	// the record with its (Tenant, Name)) in one transaction: all or
	// nothing. Records not in recs are left as they are. It is how a
	// master-key rotation rewraps every secret at once.
	ReplaceAll(ctx context.Context, recs []*Record) error
	// All returns every record of every tenant ordered by Tenant, then
	// Name.
	All(ctx context.Context) ([]*Record, error)
}

// Record is one sealed secret as the backend stores it.
type Record struct {
	Tenant, Name string
	Hosts        []string // hosts the secret may be sent to
	Inject       string   // optional injection template, e.g. "Authorization: Bearer {value}"
	Preview      string   // the last 4 characters of the value only
	KeyID        string   // the ID of the master key that sealed it
	Nonce        []byte   // NonceSize bytes, random per seal
	Ciphertext   []byte   // AES-256-GCM ciphertext with its tag
	Version      int64    // 1 at creation; bumps on every change of the VALUE
	CreatedAt    time.Time
	UpdatedAt    time.Time
	RevokedAt    *time.Time // nil unless revoked
	// AllowEnv lets sandboxes bind the secret in env mode, which puts the
	// real value into the guest. Off unless the secret was stored with it.
	AllowEnv bool
}

// NonceSize is the length of Record.Nonce.
const NonceSize = 12

// Validate reports (wrapping ErrInvalid) whether r is well-formed enough
// to be stored. It does not check that the ciphertext opens.
func (r *Record) Validate() error {
	switch {
	case r == nil:
		return fmt.Errorf("nil record: %w", ErrInvalid)
	case r.Tenant == "":
		return fmt.Errorf("record %q: empty tenant: %w", r.Name, ErrInvalid)
	case r.Name == "":
		return fmt.Errorf("record of tenant %q: empty name: %w", r.Tenant, ErrInvalid)
	case r.KeyID == "":
		return fmt.Errorf("record %q: empty key id: %w", r.Name, ErrInvalid)
	case len(r.Nonce) != NonceSize:
		return fmt.Errorf("record %q: nonce is %d bytes, want %d: %w", r.Name, len(r.Nonce), NonceSize, ErrInvalid)
	case len(r.Ciphertext) == 0:
		return fmt.Errorf("record %q: empty ciphertext: %w", r.Name, ErrInvalid)
	case r.Version < 1:
		return fmt.Errorf("record %q: version %d, want >= 1: %w", r.Name, r.Version, ErrInvalid)
	}
	return nil
}

// Clone returns a deep copy of r.
func (r *Record) Clone() *Record {
	if r == nil {
		return nil
	}
	c := *r
	c.Hosts = slices.Clone(r.Hosts)
	c.Nonce = slices.Clone(r.Nonce)
	c.Ciphertext = slices.Clone(r.Ciphertext)
	if r.RevokedAt != nil {
		t := *r.RevokedAt
		c.RevokedAt = &t
	}
	return &c
}

// normTime is the store's time convention: UTC, microseconds.
func normTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }
