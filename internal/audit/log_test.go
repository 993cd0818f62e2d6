package audit

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

// clock is a manual clock.
type clock struct {
	// mu guards t.
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

func openStore(t testing.TB) store.Store {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "cagebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// gatedStore is a real store whose AppendEvents waits for the gate to open
// (or its context to end): a store that is slow, locked or stuck.
type gatedStore struct {
	store.Store
	entered chan struct{} // a token each time AppendEvents starts waiting
	gate    chan struct{} // closed to let every call through

	// mu guards batches.
	mu      sync.Mutex
	batches []int // sizes of the batches stored
}

func newGatedStore(t testing.TB) *gatedStore {
	return &gatedStore{Store: openStore(t), entered: make(chan struct{}, 1<<16), gate: make(chan struct{})}
}

func (g *gatedStore) AppendEvents(ctx context.Context, es []*store.Event) error {
	g.entered <- struct{}{}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	g.mu.Lock()
	g.batches = append(g.batches, len(es))
	g.mu.Unlock()
	return g.Store.AppendEvents(ctx, es)
}

func (g *gatedStore) open() { close(g.gate) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func closeLog(t testing.TB, l *Log) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := l.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func listEvents(t testing.TB, st store.Store, sandbox string) []*store.Event {
	t.Helper()
	evs, err := st.ListEvents(context.Background(), "", sandbox, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// testEvent is an event of any kind with any data (nil: none).
type testEvent struct {
	kind Kind
	data any
}

func (e testEvent) EventKind() Kind              { return e.kind }
func (e testEvent) MarshalJSON() ([]byte, error) { return json.Marshal(e.data) }

func countKinds(evs []*store.Event) map[string]int {
	n := map[string]int{}
	for _, e := range evs {
		n[e.Kind]++
	}
	return n
}

// dropReport is the data of an events.dropped event.
type dropReport struct {
	Count       int64            `json:"count"`
	Kinds       map[string]int64 `json:"kinds"`
	RateLimited int64            `json:"rate_limited"`
	QueueFull   int64            `json:"queue_full"`
	StoreFailed int64            `json:"store_failed"`
	Window      struct {
		From time.Time `json:"from"`
		To   time.Time `json:"to"`
	} `json:"window"`
	Limit *struct {
		Rate  float64 `json:"rate"`
		Burst int     `json:"burst"`
	} `json:"limit"`
}

func reports(t testing.TB, evs []*store.Event) []dropReport {
	t.Helper()
	var out []dropReport
	for _, e := range evs {
		if e.Kind != string(api.EventDropped) {
			continue
		}
		var r dropReport
		if err := json.Unmarshal(e.Data, &r); err != nil {
			t.Fatalf("events.dropped data %s: %v", e.Data, err)
		}
		out = append(out, r)
	}
	return out
}

// TestRateLimitPerSandbox: a sandbox over its rate loses its bulk events,
// counted in one events.dropped report; its security events have a bucket
// of their own; another sandbox and tenant-wide events are untouched.
func TestRateLimitPerSandbox(t *testing.T) {
	st := openStore(t)
	clk := newClock()
	l := New(Config{Store: st, Logger: quiet, Now: clk.Now, Rate: 10, Burst: 20, ReportEvery: time.Hour})
	t0 := clk.Now()
	for range 100 {
		l.Emit("t1", "flood", testEvent{api.EventDNSQuery, map[string]any{"name": "x.example.test"}})
	}
	for range 3 {
		l.Emit("t1", "flood", testEvent{api.EventSecretAlert, map[string]any{"host": "evil.test"}})
	}
	for range 5 {
		l.Emit("t1", "calm", testEvent{api.EventEgressAllow, map[string]any{"host": "api.example.test"}})
	}
	for range 50 {
		l.Emit("t1", "", testEvent{api.EventSecretPut, map[string]any{"name": "GH"}})
	}
	clk.Add(time.Hour)
	l.report(clk.Now(), false)
	closeLog(t, l)

	flood := listEvents(t, st, "flood")
	if got := countKinds(flood); got["dns.query"] != 20 || got["secret.alert"] != 3 || got["events.dropped"] != 1 {
		t.Fatalf("flood stored %v: want the burst of 20 dns.query, all 3 secret.alert, 1 events.dropped", got)
	}
	r := reports(t, flood)[0]
	if r.Count != 80 || r.Kinds["dns.query"] != 80 || len(r.Kinds) != 1 || r.RateLimited != 80 || r.QueueFull != 0 {
		t.Errorf("report %+v: want 80 dns.query over the rate", r)
	}
	if !r.Window.From.Equal(t0) || !r.Window.To.Equal(t0) {
		t.Errorf("window %v–%v, want the drops' time %v", r.Window.From, r.Window.To, t0)
	}
	if r.Limit == nil || r.Limit.Rate != 10 || r.Limit.Burst != 20 {
		t.Errorf("report limit %+v, want rate 10 burst 20", r.Limit)
	}
	if last := flood[len(flood)-1]; last.Kind != string(api.EventDropped) || last.TenantID != "t1" {
		t.Errorf("last event %+v: want the report, of tenant t1", last)
	}
	if got := countKinds(listEvents(t, st, "calm")); got["egress.allow"] != 5 || got["events.dropped"] != 0 {
		t.Errorf("calm sandbox stored %v: want its 5 events and no drops", got)
	}
	all := countKinds(listEvents(t, st, ""))
	if all["secret.put"] != 50 {
		t.Errorf("%d of 50 tenant-wide events stored: those are not rate-limited", all["secret.put"])
	}
	s := l.Stats()
	if s.Emitted != 158 || s.Dropped != 80 || s.Stored != 20+3+5+50+1 || s.Reports != 1 {
		t.Errorf("stats %+v", s)
	}
}

// TestReportAtMostOncePerInterval: drops are reported at most once per
// ReportEvery per sandbox; the next report carries what came meanwhile.
func TestReportAtMostOncePerInterval(t *testing.T) {
	st := openStore(t)
	clk := newClock()
	// One event per 1000 s: the bucket stays empty through the test.
	l := New(Config{Store: st, Logger: quiet, Now: clk.Now, Rate: 0.001, Burst: 1, ReportEvery: time.Minute})
	emit := func(n int) {
		for range n {
			l.Emit("t1", "sb", testEvent{api.EventEgressDeny, nil})
		}
	}
	emit(5) // 1 stored, 4 dropped
	l.report(clk.Add(time.Minute), false)
	clk.Add(time.Millisecond)
	emit(3)
	l.report(clk.Add(30*time.Second), false) // within the minute: no report
	t1 := clk.Now()
	emit(2)
	l.report(clk.Add(31*time.Second), false)
	closeLog(t, l)

	rs := reports(t, listEvents(t, st, "sb"))
	if len(rs) != 2 {
		t.Fatalf("%d reports, want 2: %+v", len(rs), rs)
	}
	if rs[0].Count != 4 {
		t.Errorf("first report %d, want 4", rs[0].Count)
	}
	if rs[1].Count != 5 || rs[1].Kinds["egress.deny"] != 5 || !rs[1].Window.To.Equal(t1) {
		t.Errorf("second report %+v, want 5 egress.deny up to %v", rs[1], t1)
	}
}

// TestQueuePrefersPriority: with the store stuck, bulk events stop at three
// quarters of the queue, priority events use the rest, and the report of
// what was dropped waits — never lost — until Close stores it.
func TestQueuePrefersPriority(t *testing.T) {
	st := newGatedStore(t)
	clk := newClock()
	l := New(Config{Store: st, Logger: quiet, Now: clk.Now, Rate: -1, Queue: 8, Batch: 100, ReportEvery: time.Hour})
	l.Emit("t1", "sb", testEvent{api.EventSandboxCreated, nil})
	<-st.entered // the writer holds the first event in a stuck AppendEvents
	for range 10 {
		l.Emit("t1", "sb", testEvent{api.EventDNSQuery, nil}) // 5 fit below 6 (3/4 of 8)
	}
	for range 3 {
		l.Emit("t1", "sb", testEvent{api.EventSecretAlert, nil}) // 2 fit below 8
	}
	l.report(clk.Add(2*time.Hour), false) // the queue is full: the report waits
	if s := l.Stats(); s.Reports != 0 || s.Dropped != 6 {
		t.Fatalf("stats %+v: want 6 dropped, no report queued", s)
	}
	st.open()
	closeLog(t, l)

	evs := listEvents(t, st, "sb")
	if got := countKinds(evs); got["sandbox.created"] != 1 || got["dns.query"] != 5 || got["secret.alert"] != 2 || got["events.dropped"] != 1 {
		t.Fatalf("stored %v", got)
	}
	r := reports(t, evs)[0]
	if r.Count != 6 || r.Kinds["dns.query"] != 5 || r.Kinds["secret.alert"] != 1 || r.QueueFull != 6 || r.RateLimited != 0 || r.Limit != nil {
		t.Errorf("report %+v", r)
	}
}

// TestEmitNeverBlocks: with the store stuck for good, any number of
// emitters from any number of goroutines return; Close gives up at its
// deadline and says how many events it could not store.
func TestEmitNeverBlocks(t *testing.T) {
	st := newGatedStore(t) // never opened
	l := New(Config{Store: st, Logger: quiet, Rate: -1, Queue: 1024})
	const goroutines, each = 8, 5000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				kind := api.EventEgressAllow
				if i%100 == 0 {
					kind = api.EventSecretUsed
				}
				l.Emit("t1", "sb"+string(rune('a'+g)), testEvent{kind, map[string]any{"host": "api.example.test", "i": i}})
			}
		})
	}
	wg.Wait() // returns: that is the test (it hung here with a blocking emit)
	s := l.Stats()
	if s.Emitted != goroutines*each || s.Dropped < goroutines*each-1024 {
		t.Fatalf("stats %+v: want all emitted and all but the queue's 1024 dropped", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := l.Close(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "not stored") {
		t.Fatalf("Close with a stuck store = %v; want a deadline error counting the events not stored", err)
	}
	l.Emit("t1", "sba", testEvent{api.EventEgressAllow, nil}) // after Close: dropped, no panic
}

// TestCloseStoresEverythingQueued: a clean stop loses nothing queued, and
// the writer stores the backlog in batches (one transaction each).
func TestCloseStoresEverythingQueued(t *testing.T) {
	st := newGatedStore(t)
	l := New(Config{Store: st, Logger: quiet, Rate: -1, Batch: 512})
	l.Emit("t1", "sb", testEvent{api.EventEgressAllow, map[string]any{"i": 0}})
	<-st.entered
	const n = 1500
	for i := 1; i < n; i++ {
		l.Emit("t1", "sb", testEvent{api.EventEgressAllow, map[string]any{"i": i}})
	}
	go st.open()
	closeLog(t, l)
	evs := listEvents(t, st, "sb")
	if len(evs) != n {
		t.Fatalf("%d of %d events stored", len(evs), n)
	}
	for i, e := range evs {
		var d struct{ I int }
		if err := json.Unmarshal(e.Data, &d); err != nil || d.I != i {
			t.Fatalf("event %d is %s: want the order of Emit", i, e.Data)
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if want := []int{1, 512, 512, 475}; !slices.Equal(st.batches, want) {
		t.Fatalf("batches %v, want %v", st.batches, want)
	}
	if s := l.Stats(); s.Stored != n || s.Dropped != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestEmitBoundsData: the emit path bounds every event's data — callers do
// nothing.
func TestEmitBoundsData(t *testing.T) {
	st := openStore(t)
	l := New(Config{Store: st, Logger: quiet})
	l.Emit("t1", "sb", testEvent{api.EventEgressDeny, map[string]any{"host": strings.Repeat("h", 5000), "path": "/" + strings.Repeat("p", 1<<20)}})
	closeLog(t, l)
	evs := listEvents(t, st, "sb")
	if len(evs) != 1 || len(evs[0].Data) > MaxData {
		t.Fatalf("stored %d events, data %d bytes", len(evs), len(evs[0].Data))
	}
	m := decode(t, evs[0].Data)
	if len(m["host"].(string)) != MaxHost || len(m["path"].(string)) != MaxPath || m["truncated"] != true {
		t.Errorf("stored %.300s", evs[0].Data)
	}
}

// TestSubscribersSeeStoredEvents: live subscribers get each event once it
// is stored (with its sequence number), filtered by tenant.
func TestSubscribersSeeStoredEvents(t *testing.T) {
	st := openStore(t)
	l := New(Config{Store: st, Logger: quiet})
	mine, stop := l.Broker().Subscribe("t1")
	defer stop()
	l.Emit("t2", "other", testEvent{api.EventEgressAllow, nil})
	l.Emit("t1", "sb", testEvent{api.EventSandboxCreated, nil})
	e := <-mine
	if e.Kind != string(api.EventSandboxCreated) || e.Seq == 0 || e.TenantID != "t1" {
		t.Errorf("subscriber got %+v", e)
	}
	closeLog(t, l)
}

// TestStoreFailureCounted: a batch the store refuses is counted in the
// next report, which is stored once the store works again.
func TestStoreFailureCounted(t *testing.T) {
	fs := &failingStore{Store: openStore(t), fail: true}
	clk := newClock()
	l := New(Config{Store: fs, Logger: quiet, Now: clk.Now, ReportEvery: time.Hour})
	sub, stop := l.Broker().Subscribe("")
	defer stop()
	l.Emit("t1", "sb", testEvent{api.EventEgressAllow, nil})
	l.Emit("t1", "sb", testEvent{api.EventSandboxCreated, nil})
	for l.Stats().Dropped < 2 { // both refused (no timing: it waits as long as it takes)
		time.Sleep(time.Millisecond)
	}
	fs.setFail(false)
	l.report(clk.Add(time.Hour), false)
	if e := <-sub; e.Kind != string(api.EventDropped) {
		t.Fatalf("first stored event %s, want events.dropped", e.Kind)
	}
	closeLog(t, l)
	r := reports(t, listEvents(t, fs, "sb"))
	if len(r) != 1 || r[0].Count != 2 || r[0].StoreFailed != 2 {
		t.Errorf("reports %+v", r)
	}
}

type failingStore struct {
	store.Store
	// mu guards fail.
	mu   sync.Mutex
	fail bool
}

func (f *failingStore) setFail(v bool) {
	f.mu.Lock()
	f.fail = v
	f.mu.Unlock()
}

func (f *failingStore) AppendEvents(ctx context.Context, es []*store.Event) error {
	f.mu.Lock()
	fail := f.fail
	f.mu.Unlock()
	if fail {
		return errors.New("disk full")
	}
	return f.Store.AppendEvents(ctx, es)
}

// BenchmarkEmit is what an egress event costs the proxy (bounding,
// limiting, queueing; the store's work is the writer's).
func BenchmarkEmit(b *testing.B) {
	st := openStore(b)
	l := New(Config{Store: st, Logger: quiet, Rate: -1})
	defer closeLog(b, l)
	ev := api.EgressAllow{Host: "api.example.test", Port: 443, Protocol: "https", Method: "GET",
		Path: "/repos/cagebox/cagebox/pulls", Rule: "github", Verdict: "allow", Status: 200}
	b.ReportAllocs()
	for b.Loop() {
		l.Emit("t1", "sb", ev)
	}
}

// BenchmarkEmitOverLimit is what a dropped event costs (a flood).
func BenchmarkEmitOverLimit(b *testing.B) {
	st := openStore(b)
	l := New(Config{Store: st, Logger: quiet, Rate: 1, Burst: 1, ReportEvery: time.Hour})
	defer closeLog(b, l)
	ev := api.DNSQuery{Name: "x.example.test", Type: "A", Rcode: "NOERROR"}
	b.ReportAllocs()
	for b.Loop() {
		l.Emit("t1", "sb", ev)
	}
}

// TestEmitNoData: a payload with no fields set (sandbox.paused through the
// API) is stored with no data at all, as before the catalog.
func TestEmitNoData(t *testing.T) {
	st := openStore(t)
	l := New(Config{Store: st, Logger: quiet})
	l.Emit("t1", "sb", api.SandboxPaused{})
	l.Emit("t1", "sb", api.SandboxDestroyed{Reason: "removed"})
	closeLog(t, l)
	evs := listEvents(t, st, "sb")
	if len(evs) != 2 || evs[0].Kind != string(api.EventSandboxPaused) || evs[0].Data != nil || string(evs[1].Data) != `{"reason":"removed"}` {
		t.Fatalf("events %+v", evs)
	}
}

// TestWatchSeesLifecycleOverTheRate: a watcher sees every event of its
// kinds, also those the sandbox's rate limit drops from the store, and
// none of other kinds (the relays act on sandbox.stopped through it).
func TestWatchSeesLifecycleOverTheRate(t *testing.T) {
	st := openStore(t)
	clk := newClock()
	l := New(Config{Store: st, Logger: quiet, Now: clk.Now, Rate: 0.001, Burst: 1, ReportEvery: time.Hour})
	var seen []string
	l.Watch(func(tenant, sandbox string, ev api.EventPayload) {
		seen = append(seen, tenant+"/"+sandbox+" "+string(ev.EventKind()))
	}, api.EventSandboxStopped, api.EventSandboxDestroyed)
	l.Emit("t1", "sb", testEvent{api.EventSandboxStopped, nil}) // takes the one token
	l.Emit("t1", "sb", testEvent{api.EventDNSQuery, map[string]any{"name": "x.example.test"}})
	l.Emit("t1", "sb", testEvent{api.EventSandboxDestroyed, nil}) // over the rate: not stored
	closeLog(t, l)
	if want := []string{"t1/sb sandbox.stopped", "t1/sb sandbox.destroyed"}; !slices.Equal(seen, want) {
		t.Errorf("the watcher saw %q, want %q", seen, want)
	}
	if got := countKinds(listEvents(t, st, "sb")); got["sandbox.destroyed"] != 0 {
		t.Errorf("stored %v: the destroyed event should have been over the rate (the watcher must not depend on storage)", got)
	}
}

// TestGroupCommit: events that come one by one within the writer's linger
// window go to the store in one transaction (one fsync), and Close cuts
// the window short: nothing waits for it at shutdown.
func TestGroupCommit(t *testing.T) {
	st := newGatedStore(t)
	st.open()
	l := New(Config{Store: st, Logger: quiet, Rate: -1, Linger: time.Hour})
	const n = 10
	for i := range n {
		l.Emit("t1", "sb", testEvent{api.EventEgressAllow, map[string]any{"i": i}})
	}
	closeLog(t, l)
	if evs := listEvents(t, st, "sb"); len(evs) != n {
		t.Fatalf("%d of %d events stored", len(evs), n)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if want := []int{n}; !slices.Equal(st.batches, want) {
		t.Fatalf("batches %v, want %v: one transaction for the window", st.batches, want)
	}
}

// TestSyncSeesEarlierEmits: Sync returns only once every event emitted
// before it is in the store (the events API calls it, so a reader sees
// what happened before its request), waits while the store is stuck, and
// gives up with its context.
func TestSyncSeesEarlierEmits(t *testing.T) {
	st := newGatedStore(t)
	l := New(Config{Store: st, Logger: quiet, Rate: -1})
	defer closeLog(t, l)
	if err := l.Sync(context.Background()); err != nil {
		t.Fatalf("Sync of an empty log: %v", err)
	}
	l.Emit("t1", "sb", testEvent{api.EventSecretDeleted, map[string]any{"name": "A"}})
	<-st.entered // the writer holds it; the store is stuck
	l.Emit("t1", "sb", testEvent{api.EventSecretDeleted, map[string]any{"name": "B"}})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.Sync(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Sync with a stuck store = %v; want its context's error", err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Sync(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Sync returned (%v) before the store took the events", err)
	default:
	}
	st.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if evs := listEvents(t, st, "sb"); len(evs) != 2 {
		t.Fatalf("after Sync %d events stored; want both emitted before it", len(evs))
	}
}
