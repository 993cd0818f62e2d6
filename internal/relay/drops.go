package relay

import (
	"sync"
	"time"
)

// Drops coalesces a relay's dropped events (the guest's queue was full)
// into at most one report a window: a flood while the guest sleeps must
// not become a flood of events. The first drop after a quiet window is
// reported at once; the drops that follow within the window are summed
// into one report at its end. Every drop is in exactly one report, made
// at most a window after it.
type Drops struct {
	// Window is the least time between reports (0: a second).
	Window time.Duration
	// Report receives the drops since the last report and the last
	// drop's reason. It is called with no lock held and must not block.
	Report func(n int64, reason string)

	mu      sync.Mutex
	pending int64
	reason  string
	timer   *time.Timer
	last    time.Time
}

func (d *Drops) window() time.Duration {
	if d.Window <= 0 {
		return time.Second
	}
	return d.Window
}

// Add counts one dropped event.
func (d *Drops) Add(reason string) {
	d.mu.Lock()
	d.pending++
	d.reason = reason
	if d.timer != nil {
		d.mu.Unlock()
		return // a report is due at the window's end
	}
	wait := d.window() - time.Since(d.last)
	if wait > 0 {
		d.timer = time.AfterFunc(wait, d.flush)
		d.mu.Unlock()
		return
	}
	n, r := d.takeLocked()
	d.mu.Unlock()
	d.Report(n, r)
}

// Flush reports what is pending now (a relay that stops).
func (d *Drops) Flush() {
	d.mu.Lock()
	if d.timer != nil {
		d.timer.Stop()
	}
	d.mu.Unlock()
	d.flush()
}

func (d *Drops) flush() {
	d.mu.Lock()
	d.timer = nil
	if d.pending == 0 {
		d.mu.Unlock()
		return
	}
	n, r := d.takeLocked()
	d.mu.Unlock()
	d.Report(n, r)
}

func (d *Drops) takeLocked() (int64, string) {
	n, r := d.pending, d.reason
	d.pending, d.reason = 0, ""
	d.last = time.Now()
	return n, r
}
