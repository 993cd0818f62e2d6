package syscallaudit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Default rate limit of one sandbox's syscall records.
const (
	DefaultRate  = 200  // records a second, sustained
	DefaultBurst = 1000 // records at once
	// ReportEvery is how often at most a sandbox's drops are reported.
	ReportEvery = time.Second
)

// Stats are a sandbox's audit counters (shown by `cagebox inspect`).
type Stats struct {
	// Recorded counts records that passed the rate limit.
	Recorded uint64 `json:"recorded"`
	// Dropped counts records dropped over the rate limit.
	Dropped uint64 `json:"dropped"`
}

// Limiter is one sandbox's token bucket, with its counters. It is safe
// for concurrent use and never blocks.
type Limiter struct {
	rate  float64
	burst int

	// mu guards everything below.
	mu         sync.Mutex
	lim        *rate.Limiter
	stats      Stats
	unreported uint64 // drops since the last report
	lastReport time.Time
}

// NewLimiter returns a limiter of r records a second with bursts of burst
// (0 = the defaults).
func NewLimiter(r float64, burst int) *Limiter {
	if r <= 0 {
		r = DefaultRate
	}
	if burst <= 0 {
		burst = DefaultBurst
	}
	return &Limiter{rate: r, burst: burst, lim: rate.NewLimiter(rate.Limit(r), burst)}
}

// Rate and Burst are the limits in force.
func (l *Limiter) Rate() float64 { return l.rate }

// Burst is the bucket's size.
func (l *Limiter) Burst() int { return l.burst }

// Allow takes a token at now; false means the record is dropped (and
// counted).
func (l *Limiter) Allow(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lim.AllowN(now, 1) {
		l.stats.Recorded++
		return true
	}
	l.stats.Dropped++
	l.unreported++
	return false
}

// Drop counts n records lost before they reached the limiter (a VM
// guest agent's full ring), as drops to report.
func (l *Limiter) Drop(n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stats.Dropped += n
	l.unreported += n
}

// Stats returns the counters.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// Report returns the drops not yet reported and the total, when there are
// some and the last report is at least ReportEvery old (or force); ok is
// false otherwise. A true ok resets the unreported count.
func (l *Limiter) Report(now time.Time, force bool) (n, total uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unreported == 0 || (!force && now.Sub(l.lastReport) < ReportEvery) {
		return 0, l.stats.Dropped, false
	}
	n, l.unreported, l.lastReport = l.unreported, 0, now
	return n, l.stats.Dropped, true
}
