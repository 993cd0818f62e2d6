package audit

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/store"
)

// countingStore records the limit of each DeleteEventsBefore call and what
// it deleted.
type countingStore struct {
	store.Store
	// mu guards calls.
	mu    sync.Mutex
	calls [][2]int64 // limit, deleted
}

func (c *countingStore) DeleteEventsBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := c.Store.DeleteEventsBefore(ctx, before, limit)
	c.mu.Lock()
	c.calls = append(c.calls, [2]int64{int64(limit), n})
	c.mu.Unlock()
	return n, err
}

func seed(t *testing.T, st store.Store, at time.Time, n int, kind string) {
	t.Helper()
	batch := make([]*store.Event, n)
	for i := range batch {
		batch[i] = &store.Event{Time: at.Add(time.Duration(i) * time.Millisecond), TenantID: "t1", SandboxID: "sb", Kind: kind}
	}
	if err := st.AppendEvents(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
}

// TestPrune: old events go in bounded transactions, oldest first; newer
// ones stay.
func TestPrune(t *testing.T) {
	st := &countingStore{Store: openStore(t)}
	now := time.Date(2030, 6, 1, 0, 0, 0, 0, time.UTC)
	seed(t, st, now.Add(-30*24*time.Hour), 2500, "old")
	seed(t, st, now.Add(-time.Hour), 10, "new")
	n, err := Prune(context.Background(), st, now.Add(-7*24*time.Hour), 1000)
	if err != nil || n != 2500 {
		t.Fatalf("Prune = %d, %v; want 2500", n, err)
	}
	if want := [][2]int64{{1000, 1000}, {1000, 1000}, {1000, 500}}; !slices.Equal(st.calls, want) {
		t.Errorf("delete calls (limit, deleted) %v, want %v", st.calls, want)
	}
	if got := countKinds(listEvents(t, st, "")); got["old"] != 0 || got["new"] != 10 {
		t.Errorf("left %v", got)
	}
}

// TestRetain: the background loop prunes by the clock and stops with its
// context; Keep 0 keeps everything.
func TestRetain(t *testing.T) {
	st := &countingStore{Store: openStore(t)}
	now := time.Date(2030, 6, 1, 0, 0, 0, 0, time.UTC)
	seed(t, st, now.Add(-8*24*time.Hour), 30, "old")
	seed(t, st, now.Add(-6*24*time.Hour), 5, "new")

	Retain(context.Background(), RetainConfig{Store: st, Keep: 0}) // returns at once
	if len(st.calls) != 0 {
		t.Fatalf("Keep 0 pruned: %v", st.calls)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Retain(ctx, RetainConfig{Store: st, Keep: DefaultRetention, Batch: 7, Logger: quiet, Now: func() time.Time { return now }})
	}()
	for countKinds(listEvents(t, st, ""))["old"] > 0 { // no timing: as long as it takes
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if got := countKinds(listEvents(t, st, "")); got["new"] != 5 {
		t.Errorf("left %v, want the 5 events newer than 7 days", got)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, c := range st.calls {
		if c[0] != 7 || c[1] > 7 {
			t.Errorf("delete call %v: want batches of at most 7", c)
		}
	}
}
