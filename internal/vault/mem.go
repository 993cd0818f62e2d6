package vault

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
)

var _ Backend = (*MemBackend)(nil)

// MemBackend is a Backend in memory, for tests and for daemons that keep
// no state. The zero value is ready to use.
type MemBackend struct {
	// mu guards recs.
	mu   sync.Mutex
	recs map[[2]string]*Record
}

// NewMemBackend returns an empty MemBackend.
func NewMemBackend() *MemBackend { return &MemBackend{} }

// Put implements Backend.
func (m *MemBackend) Put(ctx context.Context, r *Record) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("put record: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("put record %q: %w", r.Name, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.recs == nil {
		m.recs = map[[2]string]*Record{}
	}
	m.recs[[2]string{r.Tenant, r.Name}] = r.Clone()
	return nil
}

// Get implements Backend.
func (m *MemBackend) Get(ctx context.Context, tenant, name string) (*Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[[2]string{tenant, name}]
	if !ok {
		return nil, fmt.Errorf("record %q of tenant %q: %w", name, tenant, ErrNotFound)
	}
	return r.Clone(), nil
}

// List implements Backend.
func (m *MemBackend) List(ctx context.Context, tenant string) ([]*Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []*Record{}
	for k, r := range m.recs {
		if k[0] == tenant {
			out = append(out, r.Clone())
		}
	}
	sortRecords(out)
	return out, nil
}

// Delete implements Backend.
func (m *MemBackend) Delete(ctx context.Context, tenant, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := [2]string{tenant, name}
	if _, ok := m.recs[k]; !ok {
		return fmt.Errorf("record %q of tenant %q: %w", name, tenant, ErrNotFound)
	}
	delete(m.recs, k)
	return nil
}

// ReplaceAll implements Backend.
func (m *MemBackend) ReplaceAll(ctx context.Context, recs []*Record) error {
	for _, r := range recs {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("replace records: %w", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("replace records: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.recs == nil {
		m.recs = map[[2]string]*Record{}
	}
	for _, r := range recs {
		m.recs[[2]string{r.Tenant, r.Name}] = r.Clone()
	}
	return nil
}

// All implements Backend.
func (m *MemBackend) All(ctx context.Context) ([]*Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Record, 0, len(m.recs))
	for _, r := range m.recs {
		out = append(out, r.Clone())
	}
	sortRecords(out)
	return out, nil
}

func sortRecords(rs []*Record) {
	slices.SortFunc(rs, func(a, b *Record) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Name, b.Name))
	})
}
