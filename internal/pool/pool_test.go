package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/isolation"
)

type item string

func (i item) ID() string { return string(i) }

// filler makes numbered items; fail makes fills fail.
type filler struct {
	mu        sync.Mutex
	n         int
	live      map[string]bool
	discarded []string
	fail      atomic.Bool
	delay     atomic.Int64 // nanoseconds
}

func newFiller() *filler { return &filler{live: map[string]bool{}} }

func (f *filler) Fill(ctx context.Context, c Class) (Item, error) {
	time.Sleep(time.Duration(f.delay.Load()))
	if f.fail.Load() {
		return nil, errors.New("runtime is broken")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	id := fmt.Sprintf("%s#%d", c.Runtime, f.n)
	f.live[id] = true
	return item(id), nil
}

func (f *filler) Discard(it Item) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, it.ID())
	f.discarded = append(f.discarded, it.ID())
}

func (f *filler) liveCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

type events struct {
	mu  sync.Mutex
	evs []api.EventPayload
}

func (e *events) emit(_, _ string, ev api.EventPayload) {
	e.mu.Lock()
	e.evs = append(e.evs, ev)
	e.mu.Unlock()
}

func (e *events) count(k api.EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.evs {
		if ev.EventKind() == k {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func status(p *Pool, c Class) api.PoolStatus {
	for _, s := range p.Status() {
		if s.Class == c.String() {
			return s
		}
	}
	return api.PoolStatus{}
}

func TestParseTargets(t *testing.T) {
	ts, err := ParseTargets("container:busybox=4, qemu:default:1g=2", "gvisor:default=0")
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 3 {
		t.Fatalf("got %d targets", len(ts))
	}
	if ts[0].Class.String() != "container:busybox" || ts[0].Size != 4 {
		t.Errorf("first: %s=%d", ts[0].Class, ts[0].Size)
	}
	if ts[1].Class.String() != "qemu:default:1g" || ts[1].Class.Resources.MemoryBytes != 1<<30 || ts[1].Size != 2 {
		t.Errorf("second: %s=%d", ts[1].Class, ts[1].Size)
	}
	// A class equals the class of a request with the same resources.
	if ClassOf("container", "busybox", isolation.Resources{}) != ts[0].Class {
		t.Error("a default request's class differs from the pool's")
	}
	if ClassOf("container", "busybox", isolation.Resources{MemoryBytes: 1 << 30}) == ts[0].Class {
		t.Error("a request with more memory has the default class")
	}
	for _, bad := range []string{
		"container=4", "container:busybox", "container:busybox=x", "container:busybox=-1",
		"container:busybox=9999", ":busybox=1", "container:=1", "container:busybox:lots=1",
		"container:busybox=1,container:busybox=2", "a:b:1g:x=1",
	} {
		if _, err := ParseTargets(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestSizes(t *testing.T) {
	for in, want := range map[string]int64{"512m": 512 << 20, "1g": 1 << 30, "1GiB": 1 << 30, "64k": 64 << 10, "4096": 4096} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1m", "1x", "m", "99999999999999g"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
	if FormatSize(1<<30) != "1g" || FormatSize(1536<<20) != "1536m" || FormatSize(1000) != "1000" {
		t.Error("FormatSize")
	}
}

func TestFillClaimRefill(t *testing.T) {
	f, ev := newFiller(), &events{}
	c := ClassOf("container", "busybox", isolation.Resources{})
	p, err := New(Config{Targets: []Target{{c, 3}}, Filler: f, Emit: ev.emit})
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	defer p.Close()
	waitFor(t, "three ready", func() bool { return status(p, c).Ready == 3 })

	// Claims hand out distinct sandboxes, never the same twice.
	seen := map[string]bool{}
	for i := 0; i < 10; i++ {
		waitFor(t, "a ready sandbox", func() bool { return status(p, c).Ready > 0 })
		it, ok := p.Claim(c)
		if !ok {
			t.Fatal("miss with a ready sandbox")
		}
		if seen[it.ID()] {
			t.Fatalf("%s handed out twice", it.ID())
		}
		seen[it.ID()] = true
	}
	waitFor(t, "refilled", func() bool { return status(p, c).Ready == 3 })
	st := status(p, c)
	if st.Claims != 10 || st.Misses != 0 || st.Fills != 13 {
		t.Errorf("status %+v: want 10 claims, 0 misses, 13 fills", st)
	}
	if n := ev.count(api.EventPoolFilled); n != 13 {
		t.Errorf("%d pool.filled events, want 13", n)
	}
	// Another class is not served, and is not a miss of this one.
	if _, ok := p.Claim(ClassOf("gvisor", "busybox", isolation.Resources{})); ok {
		t.Error("claim of an unpooled class succeeded")
	}
	if p.Pooled(ClassOf("gvisor", "busybox", isolation.Resources{})) || !p.Pooled(c) {
		t.Error("Pooled")
	}
}

func TestMissWhenEmpty(t *testing.T) {
	f := newFiller()
	f.delay.Store(int64(50 * time.Millisecond))
	c := ClassOf("container", "busybox", isolation.Resources{})
	p, _ := New(Config{Targets: []Target{{c, 1}}, Filler: f})
	p.Start()
	defer p.Close()
	if _, ok := p.Claim(c); ok {
		t.Fatal("claim of an empty pool hit")
	}
	if st := status(p, c); st.Misses != 1 {
		t.Fatalf("misses %d", st.Misses)
	}
	waitFor(t, "filled", func() bool { return status(p, c).Ready == 1 })
	it, ok := p.Claim(c)
	if !ok {
		t.Fatal("miss after fill")
	}
	p.Missed(c) // the caller could not bind it
	if st := status(p, c); st.Misses != 2 || st.Claims != 0 {
		t.Fatalf("after Missed: %+v", st)
	}
	_ = it
}

func TestMemoryBudget(t *testing.T) {
	f := newFiller()
	small := ClassOf("container", "busybox", isolation.Resources{MemoryBytes: 256 << 20})
	big := ClassOf("qemu", "default", isolation.Resources{MemoryBytes: 1 << 30})
	p, _ := New(Config{Targets: []Target{{small, 4}, {big, 4}}, Filler: f, MemoryBudget: 2 << 30})
	p.Start()
	defer p.Close()
	waitFor(t, "settled", func() bool {
		_, used := p.Memory()
		return status(p, small).Ready == 4 && used >= (2<<30)-(256<<20)
	})
	time.Sleep(50 * time.Millisecond)
	budget, used := p.Memory()
	if used > budget {
		t.Fatalf("pools use %d bytes, budget %d", used, budget)
	}
	if st := status(p, big); st.Ready != 1 {
		t.Fatalf("big class has %d ready within a 2g budget (4×256m + 1g)", st.Ready)
	}
}

func TestFailureBacksOff(t *testing.T) {
	f, ev := newFiller(), &events{}
	f.fail.Store(true)
	c := ClassOf("gvisor", "default", isolation.Resources{})
	p, _ := New(Config{Targets: []Target{{c, 2}}, Filler: f, Emit: ev.emit, Backoff: 20 * time.Millisecond})
	p.Start()
	defer p.Close()
	waitFor(t, "failures", func() bool { return status(p, c).Failures >= 3 })
	st := status(p, c)
	if st.LastError == "" || st.Ready != 0 {
		t.Fatalf("status %+v", st)
	}
	// Backing off: 20+40+80 ms before the fourth attempt, not a tight loop.
	time.Sleep(30 * time.Millisecond)
	if n := status(p, c).Failures; n > 5 {
		t.Fatalf("%d failures in ~200ms: no backoff", n)
	}
	if ev.count(api.EventPoolFillFailed) == 0 {
		t.Error("no pool.fill_failed event")
	}
	f.fail.Store(false)
	waitFor(t, "recovered", func() bool { return status(p, c).Ready == 2 })
	if status(p, c).LastError != "" {
		t.Error("last error kept after a success")
	}
}

func TestCloseDiscardsEverything(t *testing.T) {
	f := newFiller()
	c := ClassOf("container", "busybox", isolation.Resources{})
	p, _ := New(Config{Targets: []Target{{c, 4}}, Filler: f})
	p.Start()
	waitFor(t, "filled", func() bool { return status(p, c).Ready == 4 })
	claimed, _ := p.Claim(c)
	f.delay.Store(int64(30 * time.Millisecond)) // a fill is in progress at Close
	time.Sleep(5 * time.Millisecond)
	p.Close()
	if n := f.liveCount(); n != 1 {
		t.Fatalf("%d sandboxes live after Close, want only the claimed one", n)
	}
	f.mu.Lock()
	live := f.live[claimed.ID()]
	f.mu.Unlock()
	if !live {
		t.Fatal("Close destroyed a claimed sandbox")
	}
	if _, ok := p.Claim(c); ok {
		t.Fatal("claim after Close hit")
	}
	p.Close() // idempotent
}

func TestCloseUnstarted(t *testing.T) {
	p, _ := New(Config{Filler: newFiller()})
	p.Close()
}

func TestRefillsYieldToCreates(t *testing.T) {
	f := newFiller()
	var busy atomic.Bool
	busy.Store(true)
	c := ClassOf("container", "busybox", isolation.Resources{})
	p, _ := New(Config{Targets: []Target{{c, 1}}, Filler: f, Busy: busy.Load, MaxDefer: time.Minute})
	p.Start()
	defer p.Close()
	time.Sleep(50 * time.Millisecond)
	if status(p, c).Ready != 0 {
		t.Fatal("filled while a create was in progress")
	}
	busy.Store(false)
	waitFor(t, "filled after the create", func() bool { return status(p, c).Ready == 1 })
}
