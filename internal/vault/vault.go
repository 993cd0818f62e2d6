package vault

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrNotFound means the tenant has no secret of that name.
	ErrNotFound = errors.New("secret not found")
	// ErrRevoked means the secret has been revoked: its value is kept
	// sealed but is never handed out again.
	ErrRevoked = errors.New("secret revoked")
	// ErrInvalid means an argument or record is malformed; the message
	// says what is wrong.
	ErrInvalid = errors.New("invalid secret")
	// ErrWrongKey means a record is sealed under a master key other than
	// the vault's. The message names both key IDs.
	ErrWrongKey = errors.New("wrong master key")
	// ErrTampered means a record sealed under the vault's key does not
	// authenticate: it was altered, or its ciphertext was copied from
	// another tenant, name or version.
	ErrTampered = errors.New("secret does not authenticate")
)

// Info describes a secret without its value.
type Info struct {
	Tenant, Name string
	Hosts        []string
	Inject       string
	Preview      string // the last 4 characters of the value, or "****"
	Version      int64
	CreatedAt    time.Time
	UpdatedAt    time.Time
	Revoked      bool
	RevokedAt    *time.Time // nil unless revoked
	KeyID        string     // the master key the value is sealed under
	AllowEnv     bool       // sandboxes may bind it in env mode (the real value in the guest)
}

func infoOf(r *Record) *Info {
	in := &Info{
		Tenant:    r.Tenant,
		Name:      r.Name,
		Hosts:     slices.Clone(r.Hosts),
		Inject:    r.Inject,
		Preview:   r.Preview,
		Version:   r.Version,
		CreatedAt: r.CreatedAt,
		UpdatedAt: r.UpdatedAt,
		Revoked:   r.RevokedAt != nil,
		KeyID:     r.KeyID,
		AllowEnv:  r.AllowEnv,
	}
	if r.RevokedAt != nil {
		t := *r.RevokedAt
		in.RevokedAt = &t
	}
	return in
}

// Vault seals and opens secrets kept in a Backend.
type Vault struct {
	b     Backend
	locks keyLocks

	// mu guards key. Every operation holds it for reading; a master-key
	// rotation holds it for writing, so no write interleaves with it.
	mu  sync.RWMutex
	key *MasterKey
}

// New returns a Vault over b that seals with key.
func New(b Backend, key *MasterKey) *Vault {
	if b == nil || key.gcm() == nil {
		panic("vault: New needs a backend and a master key made by NewKey, GenerateKey, LoadOrCreateKeyFile or KeyFromEnv")
	}
	return &Vault{b: b, key: key, locks: keyLocks{m: map[[2]string]*keyLock{}}}
}

// KeyID returns the ID of the master key the vault seals with.
func (v *Vault) KeyID() string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.key.ID
}

func now() time.Time { return normTime(time.Now()) }

// Put stores a secret that may not be delivered into a guest (PutWith
// with only hosts and inject).
func (v *Vault) Put(ctx context.Context, tenant, name string, value []byte, hosts []string, inject string) (*Info, error) {
	return v.PutWith(ctx, tenant, name, value, PutOptions{Hosts: hosts, Inject: inject})
}

// PutOptions are a secret's settings besides its value.
type PutOptions struct {
	// Hosts are DNS names or "*." wildcards (see NormalizeHosts).
	Hosts []string
	// Inject is "" or a template such as "Authorization: Bearer {value}"
	// (see ParseInject), in which case the value must be free of control
	// characters.
	Inject string
	// AllowEnv lets sandboxes bind the secret in env mode: the real value
	// is then delivered into the guest. It can be set only together with
	// a value (Put, Rotate), never on its own, so whoever allows a value
	// into guests is whoever supplied it.
	AllowEnv bool
}

// PutWith stores a secret, replacing any of the same name (settings and
// all): a replaced secret keeps its CreatedAt, gets Version+1 and is no
// longer revoked. name is [A-Za-z_][A-Za-z0-9_]{0,127}; value is 1 byte to
// 64 KiB. value is copied; the caller may wipe it afterwards.
func (v *Vault) PutWith(ctx context.Context, tenant, name string, value []byte, o PutOptions) (*Info, error) {
	hosts, inject := o.Hosts, o.Inject
	if err := checkTenant(tenant); err != nil {
		return nil, fmt.Errorf("put secret: %w", err)
	}
	if err := CheckName(name); err != nil {
		return nil, fmt.Errorf("put secret: %w", err)
	}
	hosts, err := NormalizeHosts(hosts)
	if err != nil {
		return nil, fmt.Errorf("put secret %q: %w", name, err)
	}
	if _, _, err := ParseInject(inject); err != nil {
		return nil, fmt.Errorf("put secret %q: %w", name, err)
	}
	if err := checkValue(value, inject); err != nil {
		return nil, fmt.Errorf("put secret %q: %w", name, err)
	}

	v.mu.RLock()
	defer v.mu.RUnlock()
	defer v.locks.lock(tenant, name)()

	t := now()
	r := &Record{Tenant: tenant, Name: name, Hosts: hosts, Inject: inject, Preview: preview(value), Version: 1, CreatedAt: t, UpdatedAt: t, AllowEnv: o.AllowEnv}
	old, err := v.b.Get(ctx, tenant, name)
	switch {
	case err == nil:
		r.Version = old.Version + 1
		r.CreatedAt = old.CreatedAt
	case !errors.Is(err, ErrNotFound):
		return nil, fmt.Errorf("put secret %q: %w", name, err)
	}
	if err := seal(v.key, r, value); err != nil {
		return nil, err
	}
	if err := v.b.Put(ctx, r); err != nil {
		return nil, fmt.Errorf("put secret %q: %w", name, err)
	}
	return infoOf(r), nil
}

// Copy stores the tenant's secret from under the name to as well, with
// the same hosts, inject template and AllowEnv (allowEnv false narrows it),
// replacing any secret named to. The value is opened and sealed again
// inside the vault and is never returned: a snapshot keeps a copy of a
// sandbox's inline secret this way (internal/sandbox), without the host
// code holding its value. A revoked secret is not copied (ErrRevoked).
func (v *Vault) Copy(ctx context.Context, tenant, from, to string, allowEnv bool) (*Info, error) {
	v.mu.RLock()
	r, err := v.b.Get(ctx, tenant, from)
	if err != nil {
		v.mu.RUnlock()
		return nil, fmt.Errorf("copy secret %q: %w", from, err)
	}
	if r.RevokedAt != nil {
		v.mu.RUnlock()
		return nil, fmt.Errorf("copy secret %q: it was revoked: %w", from, ErrRevoked)
	}
	pt, err := open(v.key, r)
	v.mu.RUnlock()
	if err != nil {
		return nil, fmt.Errorf("copy secret %q: %w", from, err)
	}
	s := newSecret(pt)
	defer s.Wipe()
	return v.PutWith(ctx, tenant, to, s.Bytes(), PutOptions{Hosts: r.Hosts, Inject: r.Inject, AllowEnv: r.AllowEnv && allowEnv})
}

// Value opens the secret. It fails with ErrNotFound, ErrRevoked (without
// decrypting), ErrWrongKey or ErrTampered. The caller should Wipe the
// Secret when done with it.
func (v *Vault) Value(ctx context.Context, tenant, name string) (Secret, *Info, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	r, err := v.b.Get(ctx, tenant, name)
	if err != nil {
		return Secret{}, nil, fmt.Errorf("secret %q: %w", name, err)
	}
	if r.RevokedAt != nil {
		return Secret{}, nil, fmt.Errorf("secret %q was revoked at %s; add it again to use it: %w",
			name, r.RevokedAt.Format(time.RFC3339), ErrRevoked)
	}
	pt, err := open(v.key, r)
	if err != nil {
		return Secret{}, nil, err
	}
	return newSecret(pt), infoOf(r), nil
}

// Info describes the secret without opening it (a revoked one too).
func (v *Vault) Info(ctx context.Context, tenant, name string) (*Info, error) {
	r, err := v.b.Get(ctx, tenant, name)
	if err != nil {
		return nil, fmt.Errorf("secret %q: %w", name, err)
	}
	return infoOf(r), nil
}

// List describes the tenant's secrets, ordered by name, never their values.
func (v *Vault) List(ctx context.Context, tenant string) ([]*Info, error) {
	recs, err := v.b.List(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	out := make([]*Info, len(recs))
	for i, r := range recs {
		out[i] = infoOf(r)
	}
	return out, nil
}

// Delete removes the secret, sealed value and all; ErrNotFound if there is
// none.
func (v *Vault) Delete(ctx context.Context, tenant, name string) error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	defer v.locks.lock(tenant, name)()
	if err := v.b.Delete(ctx, tenant, name); err != nil {
		return fmt.Errorf("delete secret %q: %w", name, err)
	}
	return nil
}

// Revoke marks the secret revoked: its value stays sealed but Value
// refuses it with ErrRevoked. Revoking a revoked secret keeps the first
// revocation time. ErrNotFound if there is none.
func (v *Vault) Revoke(ctx context.Context, tenant, name string) error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	defer v.locks.lock(tenant, name)()
	r, err := v.b.Get(ctx, tenant, name)
	if err != nil {
		return fmt.Errorf("revoke secret %q: %w", name, err)
	}
	if r.RevokedAt != nil {
		return nil
	}
	t := now()
	r.RevokedAt, r.UpdatedAt = &t, t
	if err := v.b.Put(ctx, r); err != nil {
		return fmt.Errorf("revoke secret %q: %w", name, err)
	}
	return nil
}

// Rotate replaces the secret's value, keeping its hosts, injection
// template and AllowEnv, and bumps its Version. A revoked secret is
// refused with ErrRevoked (add it again with Put instead).
func (v *Vault) Rotate(ctx context.Context, tenant, name string, newValue []byte) (*Info, error) {
	return v.RotateWith(ctx, tenant, name, newValue, nil)
}

// RotateWith is Rotate that also sets AllowEnv when allowEnv is not nil
// (with the new value: see PutOptions.AllowEnv).
func (v *Vault) RotateWith(ctx context.Context, tenant, name string, newValue []byte, allowEnv *bool) (*Info, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	defer v.locks.lock(tenant, name)()
	r, err := v.b.Get(ctx, tenant, name)
	if err != nil {
		return nil, fmt.Errorf("rotate secret %q: %w", name, err)
	}
	if r.RevokedAt != nil {
		return nil, fmt.Errorf("rotate secret %q: it was revoked; add it again instead: %w", name, ErrRevoked)
	}
	if err := checkValue(newValue, r.Inject); err != nil {
		return nil, fmt.Errorf("rotate secret %q: %w", name, err)
	}
	r.Version++
	r.UpdatedAt = now()
	r.Preview = preview(newValue)
	if allowEnv != nil {
		r.AllowEnv = *allowEnv
	}
	if err := seal(v.key, r, newValue); err != nil {
		return nil, err
	}
	if err := v.b.Put(ctx, r); err != nil {
		return nil, fmt.Errorf("rotate secret %q: %w", name, err)
	}
	return infoOf(r), nil
}

// RotateMasterKey re-seals every secret of the backend under newKey (see
// the package function) and from then on seals with it. No other
// operation of this Vault runs meanwhile.
func (v *Vault) RotateMasterKey(ctx context.Context, newKey *MasterKey) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	n, err := RotateMasterKey(ctx, v.b, v.key, newKey)
	if err != nil {
		return 0, err
	}
	v.key = newKey
	return n, nil
}

// RotateMasterKey re-seals every record of b, of every tenant, revoked
// ones included, from oldKey to newKey, in one ReplaceAll, and returns how
// many it re-sealed. Records already sealed under newKey (a rotation run
// before) are checked to open with it and left alone. If any record fails
// to open — sealed under a third key, or tampered — it changes nothing and
// says which. Versions and times are kept: the values do not change.
//
// Nothing else may write to b meanwhile (use Vault.RotateMasterKey in a
// running daemon): a record written between the read and the ReplaceAll
// would be overwritten.
func RotateMasterKey(ctx context.Context, b Backend, oldKey, newKey *MasterKey) (int, error) {
	if oldKey.gcm() == nil || newKey.gcm() == nil {
		return 0, fmt.Errorf("rotate master key: missing key: %w", ErrInvalid)
	}
	if oldKey.ID == newKey.ID {
		return 0, fmt.Errorf("rotate master key: the new key is the old key (%s): %w", oldKey.ID, ErrInvalid)
	}
	all, err := b.All(ctx)
	if err != nil {
		return 0, fmt.Errorf("rotate master key: %w", err)
	}
	var out []*Record
	var errs []error
	for _, r := range all {
		if r.KeyID == newKey.ID {
			pt, err := open(newKey, r)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			clear(pt)
			continue
		}
		pt, err := open(oldKey, r)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		n := r.Clone()
		err = seal(newKey, n, pt)
		clear(pt)
		if err != nil {
			return 0, fmt.Errorf("rotate master key: %w", err)
		}
		out = append(out, n)
	}
	if len(errs) > 0 {
		return 0, fmt.Errorf("rotate master key from %s to %s: %d of %d secrets do not open, nothing changed: %w",
			oldKey.ID, newKey.ID, len(errs), len(all), errors.Join(errs...))
	}
	if len(out) == 0 {
		return 0, nil
	}
	if err := b.ReplaceAll(ctx, out); err != nil {
		return 0, fmt.Errorf("rotate master key from %s to %s: %w", oldKey.ID, newKey.ID, err)
	}
	return len(out), nil
}

// keyLocks is a mutex per (tenant, name), created on demand and dropped
// when nobody holds or waits for it.
type keyLocks struct {
	// mu guards m and the refs of its entries.
	mu sync.Mutex
	m  map[[2]string]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int
}

func (l *keyLocks) lock(tenant, name string) (unlock func()) {
	k := [2]string{tenant, name}
	l.mu.Lock()
	e := l.m[k]
	if e == nil {
		e = &keyLock{}
		l.m[k] = e
	}
	e.refs++
	l.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, k)
		}
		l.mu.Unlock()
	}
}
