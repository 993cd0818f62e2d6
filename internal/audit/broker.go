package audit

import (
	"sync"

	"github.com/cagebox/cagebox/internal/store"
)

// Broker fans stored events out to live subscribers. A subscriber that
// falls more than its buffer behind is dropped (its channel closed) rather
// than slowing the daemon down; it can resume from the store by sequence.
type Broker struct {
	// mu guards subs.
	mu   sync.Mutex
	subs map[chan *store.Event]string // channel → tenant filter ("" = all)
}

// NewBroker returns an empty broker.
func NewBroker() *Broker { return &Broker{subs: map[chan *store.Event]string{}} }

// Subscribe returns a channel of the tenant's events ("" = all tenants)
// and a function that ends the subscription.
func (b *Broker) Subscribe(tenant string) (<-chan *store.Event, func()) {
	ch := make(chan *store.Event, 256)
	b.mu.Lock()
	b.subs[ch] = tenant
	b.mu.Unlock()
	return ch, func() {
		b.mu.Lock()
		if _, ok := b.subs[ch]; ok {
			delete(b.subs, ch)
			close(ch)
		}
		b.mu.Unlock()
	}
}

// Publish delivers ev to every matching subscriber without blocking.
func (b *Broker) Publish(ev *store.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch, tenant := range b.subs {
		if tenant != "" && tenant != ev.TenantID {
			continue
		}
		select {
		case ch <- ev:
		default:
			delete(b.subs, ch)
			close(ch)
		}
	}
}
