package webhook

import (
	"container/list"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrReplay: a delivery already accepted within the replay window.
var ErrReplay = errors.New("webhook delivery replayed")

// Replays remembers the IDs of accepted deliveries for a window and
// refuses one seen again (a replay of a captured request). It holds at
// most max IDs, the oldest evicted first: size it above the deliveries a
// window brings (timestamped schemes are also bounded by their tolerance,
// GitHub's only by this). Safe for concurrent use.
type Replays struct {
	window time.Duration
	max    int

	// mu guards seen and order.
	mu    sync.Mutex
	seen  map[string]*list.Element
	order *list.List // of entry, oldest first
}

type entry struct {
	id string
	at time.Time
}

// NewReplays returns a cache of IDs seen within window, at most max.
func NewReplays(window time.Duration, max int) *Replays {
	if max <= 0 {
		max = 100_000
	}
	return &Replays{window: window, max: max, seen: map[string]*list.Element{}, order: list.New()}
}

// Accept records id as delivered at now, or fails with ErrReplay if it
// was accepted within the window.
func (r *Replays) Accept(id string, now time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Forget what the window has passed, oldest first.
	for f := r.order.Front(); f != nil; f = r.order.Front() {
		e := f.Value.(entry)
		if now.Sub(e.at) <= r.window {
			break
		}
		r.order.Remove(f)
		delete(r.seen, e.id)
	}
	if el, ok := r.seen[id]; ok {
		return fmt.Errorf("%w: first accepted %s ago", ErrReplay, now.Sub(el.Value.(entry).at).Round(time.Second))
	}
	for r.order.Len() >= r.max {
		f := r.order.Front()
		r.order.Remove(f)
		delete(r.seen, f.Value.(entry).id)
	}
	r.seen[id] = r.order.PushBack(entry{id: id, at: now})
	return nil
}

// Len is how many IDs are remembered.
func (r *Replays) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.order.Len()
}
