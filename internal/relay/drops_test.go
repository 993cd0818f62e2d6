package relay

import (
	"sync"
	"testing"
	"time"
)

// TestDrops: a burst of drops makes one report at once and one at the
// window's end with the rest; none is lost or counted twice.
func TestDrops(t *testing.T) {
	var mu sync.Mutex
	var reports []int64
	var reasons []string
	d := &Drops{Window: 100 * time.Millisecond, Report: func(n int64, reason string) {
		mu.Lock()
		reports = append(reports, n)
		reasons = append(reasons, reason)
		mu.Unlock()
	}}
	got := func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		return append([]int64(nil), reports...)
	}
	d.Add("queue full")
	if r := got(); len(r) != 1 || r[0] != 1 {
		t.Fatalf("after the first drop: %v, want one report of 1 at once", r)
	}
	for i := 0; i < 500; i++ {
		d.Add("queue full")
	}
	if r := got(); len(r) != 1 {
		t.Fatalf("within the window: %v, want no new report yet", r)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(got()) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if r := got(); len(r) != 2 || r[1] != 500 {
		t.Fatalf("after the window: %v, want [1 500]", r)
	}
	// A drop in the next window waits for its end; Flush reports it now.
	d.Add("queue full again")
	d.Flush()
	d.Flush()
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 3 || reports[2] != 1 || reasons[2] != "queue full again" {
		t.Fatalf("reports %v %q, want a third report of 1 with the last reason", reports, reasons)
	}
}
