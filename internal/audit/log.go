package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/store"
)

// Defaults of Config.
const (
	// DefaultRate and DefaultBurst bound each sandbox's events per class
	// (Bulk and Priority each have a bucket): 200 a second sustained, 1000
	// at once. A busy agent (a package install) stays under it; a loop
	// flooding DNS or HTTP does not.
	DefaultRate  = 200
	DefaultBurst = 1000
	// DefaultQueue and DefaultQueueBytes bound what waits for the store:
	// events queued or being written. Bulk events may use three quarters.
	DefaultQueue      = 8192
	DefaultQueueBytes = 16 << 20
	// DefaultBatch is the most events stored in one transaction.
	DefaultBatch = 512
	// DefaultLinger is how long the writer waits, after the first event
	// of a batch that is not full, for more to join it (group commit):
	// one transaction, so one fsync, for every event of that window. An
	// event is on its way to the store either way; the window adds at
	// most this much to its latency, and to its subscribers'.
	DefaultLinger = 5 * time.Millisecond
	// DefaultReportEvery is how often, at most, a sandbox's drops are
	// reported in an events.dropped event.
	DefaultReportEvery = time.Second
)

// Config configures a Log.
type Config struct {
	// Store receives the events (AppendEvents, one call per batch).
	Store store.Store
	// Broker receives each stored event; nil = a new one (Log.Broker).
	Broker *Broker
	Logger *slog.Logger
	// Now is the clock (tests); nil = time.Now.
	Now func() time.Time
	// Rate is the sustained number of events a second that one sandbox may
	// emit in each of the Bulk and Priority classes; beyond it events are
	// dropped and counted. 0 = DefaultRate; negative = no limit. Events
	// tied to no sandbox (tenant-wide API actions) are not rate-limited.
	Rate float64
	// Burst is each bucket's size; 0 = DefaultBurst.
	Burst int
	// Queue and QueueBytes bound the events waiting for the store (0 =
	// the defaults).
	Queue, QueueBytes int
	// Batch is the most events per AppendEvents call; 0 = DefaultBatch.
	Batch int
	// Linger is the group commit window: 0 = DefaultLinger; negative:
	// none (each wake writes what is queued at once).
	Linger time.Duration
	// ReportEvery: 0 = DefaultReportEvery.
	ReportEvery time.Duration
	// Tap, if set, sees every event emitted, before rate limits (the
	// daemon's metrics count them). It must not block.
	Tap func(tenant, sandbox string, ev api.EventPayload)
}

// Stats are a Log's totals since New.
type Stats struct {
	Emitted int64 // Emit calls
	Stored  int64 // events stored, reports included
	Dropped int64 // events dropped: rate limit, full queue, store failure, after Close
	Reports int64 // events.dropped events queued
}

// drop reasons.
const (
	reasonRate = iota
	reasonQueue
	reasonStore
)

// Log is the event path. Emit never blocks on the store: it takes one
// short mutex (no I/O under it) and either queues the event or drops and
// counts it. A writer goroutine stores the queue in batches and publishes
// what it stored; a reporter turns drop counts into events.dropped events.
type Log struct {
	cfg     Config
	log     *slog.Logger
	broker  *Broker
	limited bool
	refill  time.Duration // time for an empty bucket to fill again

	wake    chan struct{} // a token when the queue has something (cap 1)
	stop    chan struct{} // closed by Close: the writer drains and returns
	done    chan struct{} // closed when the writer has returned
	repStop chan struct{}
	repDone chan struct{}
	// wctx bounds the writer's store calls; Close cancels it at its deadline.
	wctx    context.Context
	wcancel context.CancelFunc

	closeOnce sync.Once
	closeErr  error

	// watchMu serialises Watch; watchers is read by every Emit without a
	// lock (copied on write: watchers are registered while the daemon
	// wires).
	watchMu  sync.Mutex
	watchers atomic.Pointer[[]watcher]

	// mu guards q, pending, pendingBytes, sources, closed, warned and stats.
	mu           sync.Mutex
	q            []*store.Event // waiting for the writer
	pending      int            // events queued or being written
	pendingBytes int
	sources      map[source]*sourceState
	closed       bool
	warned       bool // an emit after Close was logged
	stats        Stats
	// queued and handled count the events ever queued and ever written
	// (or dropped by a failed write), in queue order; progress is closed
	// and replaced after every write, waking Sync.
	queued, handled int64
	progress        chan struct{}
}

// source is who an event is about: a sandbox, or a tenant (sandbox "").
type source struct{ tenant, sandbox string }

type sourceState struct {
	bulk, prio *rate.Limiter // nil when not rate-limited
	sys        *rate.Limiter // syscall.*: a budget of its own
	drops      *drops        // nil when nothing is waiting to be reported
	lastReport time.Time
	lastSeen   time.Time
}

type drops struct {
	count                             int64
	kinds                             map[Kind]int64
	rateLimited, queueFull, storeFail int64
	from, to                          time.Time
}

// New starts a Log's writer and reporter; Close stops them.
func New(cfg Config) *Log {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Broker == nil {
		cfg.Broker = NewBroker()
	}
	if cfg.Rate == 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = DefaultQueueBytes
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.ReportEvery <= 0 {
		cfg.ReportEvery = DefaultReportEvery
	}
	l := &Log{
		cfg: cfg, log: cfg.Logger, broker: cfg.Broker, limited: cfg.Rate > 0,
		refill: cfg.ReportEvery,
		wake:   make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		repStop: make(chan struct{}), repDone: make(chan struct{}),
		sources: map[source]*sourceState{},
	}
	if l.limited {
		l.refill = max(l.refill, time.Duration(float64(cfg.Burst)/cfg.Rate*float64(time.Second)))
	}
	l.wctx, l.wcancel = context.WithCancel(context.Background())
	go l.writer()
	go l.reporter()
	return l
}

// Broker is where live subscribers attach; it sees each event once stored.
func (l *Log) Broker() *Broker { return l.broker }

// Stats returns the totals so far.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

type watcher struct {
	kinds []Kind
	fn    func(tenant, sandbox string, ev api.EventPayload)
}

// Watch has fn see every event of one of kinds as it is emitted, before
// rate limits and whether or not it is stored, so that the services that
// act on a sandbox's lifecycle (relays ending with their sandbox, …) learn
// of it from the one place lifecycle events go out, never by polling the
// store. fn runs on the emitter's goroutine and must not block.
func (l *Log) Watch(fn func(tenant, sandbox string, ev api.EventPayload), kinds ...Kind) {
	l.watchMu.Lock()
	defer l.watchMu.Unlock()
	var ws []watcher
	if cur := l.watchers.Load(); cur != nil {
		ws = append(ws, *cur...)
	}
	ws = append(ws, watcher{kinds: kinds, fn: fn})
	l.watchers.Store(&ws)
}

// Emit records an event about sandbox (or, when sandbox is "", about the
// tenant): its kind is ev's, its data ev bounded by Bound (none when ev's
// type has no fields). It returns at once whatever the store is doing:
// over the sandbox's rate, or with the queue full, the event is dropped and
// counted for the next events.dropped report.
func (l *Log) Emit(tenant, sandbox string, ev api.EventPayload) {
	if l.cfg.Tap != nil {
		l.cfg.Tap(tenant, sandbox, ev)
	}
	now := l.cfg.Now()
	kind := ev.EventKind()
	if ws := l.watchers.Load(); ws != nil {
		for _, w := range *ws {
			if slices.Contains(w.kinds, kind) {
				w.fn(tenant, sandbox, ev)
			}
		}
	}
	cls := kind.Class()
	if cls == Report {
		cls = Priority // only the reporter makes reports
	}
	l.mu.Lock()
	if l.afterClose(kind, sandbox) {
		l.mu.Unlock()
		return
	}
	l.stats.Emitted++
	src := source{tenant, sandbox}
	if st := l.state(src, now); !st.allow(cls, now) {
		l.dropLocked(src, kind, now, reasonRate)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()

	// Encoding is the costly part: outside the lock, and only for events
	// that passed the rate limit.
	var raw json.RawMessage
	if !empty(ev) {
		var err error
		if raw, err = Bound(ev); err != nil {
			l.log.Warn("event data not encodable", "kind", kind, "sandbox", sandbox, "err", err)
			raw = json.RawMessage(`{"truncated":true,"unencodable":true}`)
		}
		if string(raw) == "{}" {
			// Every field is optional and unset (a pause through the
			// API): no data, as for a payload without fields.
			raw = nil
		}
	}
	sev := &store.Event{Time: now.UTC(), TenantID: tenant, SandboxID: sandbox, Kind: string(kind), Data: raw}

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.afterClose(kind, sandbox) {
		return
	}
	if !l.admit(cls, size(sev)) {
		l.dropLocked(src, kind, now, reasonQueue)
		return
	}
	l.enqueueLocked(sev)
}

// empty reports whether ev's type is a struct with no fields (such events
// carry no data).
func empty(ev api.EventPayload) bool {
	t := reflect.TypeOf(ev)
	return t.Kind() == reflect.Struct && t.NumField() == 0
}

// afterClose counts and drops an event emitted after Close (a request
// finishing during shutdown); l.mu is held.
func (l *Log) afterClose(kind Kind, sandbox string) bool {
	if !l.closed {
		return false
	}
	l.stats.Dropped++
	if !l.warned {
		l.warned = true
		l.log.Warn("event after shutdown dropped (later ones are dropped silently)", "kind", kind, "sandbox", sandbox)
	}
	return true
}

// state returns src's state, made on first use; l.mu is held.
func (l *Log) state(src source, now time.Time) *sourceState {
	st := l.sources[src]
	if st == nil {
		st = &sourceState{}
		if l.limited && src.sandbox != "" {
			st.bulk = rate.NewLimiter(rate.Limit(l.cfg.Rate), l.cfg.Burst)
			st.prio = rate.NewLimiter(rate.Limit(l.cfg.Rate), l.cfg.Burst)
			st.sys = rate.NewLimiter(rate.Limit(l.cfg.Rate), l.cfg.Burst)
		}
		l.sources[src] = st
	}
	st.lastSeen = now
	return st
}

func (st *sourceState) allow(cls Class, now time.Time) bool {
	lim := st.prio
	switch cls {
	case Bulk:
		lim = st.bulk
	case api.ClassSyscall:
		lim = st.sys
	}
	return lim == nil || lim.AllowN(now, 1)
}

// dropLocked counts a dropped event for src's next report; l.mu is held.
func (l *Log) dropLocked(src source, kind Kind, at time.Time, reason int) {
	l.stats.Dropped++
	st := l.state(src, at)
	d := st.drops
	if d == nil {
		d = &drops{kinds: map[Kind]int64{}, from: at}
		st.drops = d
	}
	d.count++
	d.kinds[kind]++
	if at.Before(d.from) {
		d.from = at
	}
	if at.After(d.to) {
		d.to = at
	}
	switch reason {
	case reasonRate:
		d.rateLimited++
	case reasonQueue:
		d.queueFull++
	case reasonStore:
		d.storeFail++
	}
}

// admit reports whether an event of class cls and size n fits the queue;
// bulk events may fill three quarters of it. l.mu is held.
func (l *Log) admit(cls Class, n int) bool {
	maxN, maxB := l.cfg.Queue, l.cfg.QueueBytes
	if cls == Bulk || cls == api.ClassSyscall {
		maxN, maxB = maxN*3/4, maxB*3/4
	}
	return l.pending < maxN && l.pendingBytes+n <= maxB
}

func (l *Log) enqueueLocked(ev *store.Event) {
	l.q = append(l.q, ev)
	l.queued++
	l.pending++
	l.pendingBytes += size(ev)
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Sync waits until every event queued before it was called has been
// written to the store (or dropped by a failed write), so that a reader
// sees what was emitted before its request: `cagebox secret rm` then
// `cagebox events` shows the removal. It waits at most for one group
// commit and the write; ctx bounds it.
func (l *Log) Sync(ctx context.Context) error {
	l.mu.Lock()
	target := l.queued
	for l.handled < target {
		if l.progress == nil {
			l.progress = make(chan struct{})
		}
		ch := l.progress
		l.mu.Unlock()
		select {
		case <-ch:
		case <-l.done:
			return nil // the writer has drained and gone
		case <-ctx.Done():
			return ctx.Err()
		}
		l.mu.Lock()
	}
	l.mu.Unlock()
	return nil
}

// size is what an event costs in the queue, roughly.
func size(ev *store.Event) int {
	return 128 + len(ev.TenantID) + len(ev.SandboxID) + len(ev.Kind) + len(ev.Data)
}

// take returns the queue and leaves it empty.
func (l *Log) take() []*store.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.q
	l.q = nil
	return q
}

// writer stores the queue in batches until Close has stopped it and the
// queue is empty.
func (l *Log) writer() {
	defer close(l.done)
	for {
		batch := l.take()
		if len(batch) == 0 {
			select {
			case <-l.wake:
				continue
			case <-l.stop:
				if batch = l.take(); len(batch) == 0 {
					return
				}
			}
		}
		if len(batch) < l.cfg.Batch && l.cfg.Linger > 0 {
			// Group commit: let the window's other events join this
			// transaction (Close cuts the window short).
			t := time.NewTimer(l.cfg.Linger)
			select {
			case <-t.C:
			case <-l.stop:
				t.Stop()
			}
			batch = append(batch, l.take()...)
		}
		for len(batch) > 0 {
			n := min(len(batch), l.cfg.Batch)
			l.write(batch[:n])
			batch = batch[n:]
		}
	}
}

// write stores one batch in one transaction and publishes it.
func (l *Log) write(batch []*store.Event) {
	err := l.cfg.Store.AppendEvents(l.wctx, batch)
	bytes := 0
	for _, ev := range batch {
		bytes += size(ev)
	}
	l.mu.Lock()
	l.pending -= len(batch)
	l.pendingBytes -= bytes
	l.handled += int64(len(batch))
	if l.progress != nil {
		close(l.progress)
		l.progress = nil
	}
	lostReports := 0
	if err != nil {
		for _, ev := range batch {
			if Kind(ev.Kind) == api.EventDropped {
				lostReports++
				l.stats.Dropped++
				continue
			}
			l.dropLocked(source{ev.TenantID, ev.SandboxID}, Kind(ev.Kind), ev.Time, reasonStore)
		}
	} else {
		l.stats.Stored += int64(len(batch))
	}
	l.mu.Unlock()
	if err != nil {
		// The counts go into the next reports, except those of reports
		// themselves, which only this line records.
		l.log.Error("store events", "count", len(batch), "lost_reports", lostReports, "err", err)
		return
	}
	for _, ev := range batch {
		l.broker.Publish(ev)
	}
}

func (l *Log) reporter() {
	defer close(l.repDone)
	t := time.NewTicker(l.cfg.ReportEvery)
	defer t.Stop()
	for {
		select {
		case <-l.repStop:
			return
		case <-t.C:
			l.report(l.cfg.Now(), false)
		}
	}
}

// report queues an events.dropped event for every source with drops not
// yet reported and no report in the last ReportEvery, and forgets sources
// that are idle. A report that does not fit the queue stays pending, its
// counts growing, until one does. final (Close) reports everything, over
// the queue's bound if need be: one event per source.
func (l *Log) report(now time.Time, final bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for src, st := range l.sources {
		if st.drops == nil {
			if now.Sub(st.lastSeen) >= l.refill && now.Sub(st.lastReport) >= l.cfg.ReportEvery {
				delete(l.sources, src) // its buckets are full again: as good as new
			}
			continue
		}
		if !final && now.Sub(st.lastReport) < l.cfg.ReportEvery {
			continue
		}
		ev := l.reportEvent(src, st.drops, now)
		if !final && !l.admit(Report, size(ev)) {
			continue
		}
		l.enqueueLocked(ev)
		l.stats.Reports++
		if st.drops.queueFull > 0 || st.drops.storeFail > 0 {
			l.log.Warn("events dropped: the store is not keeping up", "sandbox", src.sandbox, "tenant", src.tenant,
				"queue_full", st.drops.queueFull, "store_failed", st.drops.storeFail)
		} else {
			l.log.Debug("events dropped over the rate limit", "sandbox", src.sandbox, "count", st.drops.count)
		}
		st.drops = nil
		st.lastReport = now
	}
}

// reportEvent is the events.dropped event for d: how many, of which kinds,
// why, and the window they were dropped in.
func (l *Log) reportEvent(src source, d *drops, now time.Time) *store.Event {
	data := api.EventsDropped{
		Count: d.count, Kinds: d.kinds,
		RateLimited: d.rateLimited, QueueFull: d.queueFull, StoreFailed: d.storeFail,
		Window: api.DroppedWindow{From: d.from.UTC(), To: d.to.UTC()},
	}
	if l.limited {
		data.Limit = &api.DroppedLimit{Rate: l.cfg.Rate, Burst: l.cfg.Burst}
	}
	raw, err := Bound(data)
	if err != nil { // cannot happen: the data is ours
		raw = json.RawMessage(fmt.Sprintf(`{"count":%d}`, d.count))
	}
	return &store.Event{Time: now.UTC(), TenantID: src.tenant, SandboxID: src.sandbox, Kind: string(data.EventKind()), Data: raw}
}

// Close reports pending drops, stores everything queued and stops the
// writer. It waits until ctx ends at most: then it cancels the store call
// under way and returns an error saying how many events were not stored.
// Emit after Close drops the event. Close is safe to call more than once.
func (l *Log) Close(ctx context.Context) error {
	l.closeOnce.Do(func() {
		close(l.repStop)
		<-l.repDone
		l.report(l.cfg.Now(), true)
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		close(l.stop)
		select {
		case <-l.done:
		case <-ctx.Done():
			l.mu.Lock()
			lost := l.pending
			l.mu.Unlock()
			l.wcancel()
			select {
			case <-l.done:
			case <-time.After(time.Second): // a store that ignores its context
			}
			l.closeErr = fmt.Errorf("close event log: %d events not stored: %w", lost, ctx.Err())
		}
		l.wcancel()
	})
	return l.closeErr
}
