package pool

import (
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/isolation"
)

// TestSetTargets: a pool started with no targets fills a class set at
// runtime; shrinking destroys the surplus, dropping a class destroys all
// of its ready sandboxes and takes it out of the status; invalid targets
// change nothing; Close leaves nothing alive.
func TestSetTargets(t *testing.T) {
	f, ev := newFiller(), &events{}
	a := ClassOf("container", "busybox", isolation.Resources{})
	b := ClassOf("gvisor", "default", isolation.Resources{MemoryBytes: 512 << 20})
	p, err := New(Config{Filler: f, Emit: ev.emit})
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	if st := p.Status(); len(st) != 0 {
		t.Fatalf("status without targets: %+v", st)
	}
	if err := p.SetTargets([]Target{{a, 3}, {b, 1}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both classes filled", func() bool { return status(p, a).Ready == 3 && status(p, b).Ready == 1 })
	if n := ev.count(api.EventPoolFilled); n != 4 {
		t.Errorf("pool.filled events: %d, want 4", n)
	}
	it, ok := p.Claim(a)
	if !ok {
		t.Fatal("claim after SetTargets missed")
	}
	f.Discard(it) // the claimer's now
	waitFor(t, "a refill", func() bool { return status(p, a).Ready == 3 })

	// Invalid: nothing changes.
	for _, bad := range [][]Target{{{a, 1}, {a, 2}}, {{a, MaxSize + 1}}, {{a, -1}}} {
		if err := p.SetTargets(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if st := status(p, a); st.Target != 3 || st.Ready != 3 {
		t.Fatalf("after refused targets: %+v", st)
	}

	// Shrink a, drop b.
	if err := p.SetTargets([]Target{{a, 1}}); err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); len(st) != 1 || st[0].Class != a.String() || st[0].Target != 1 || st[0].Ready != 1 {
		t.Fatalf("status after shrinking: %+v", st)
	}
	if st := status(p, a); st.Claims != 1 {
		t.Errorf("the kept class lost its counters: %+v", st)
	}
	waitFor(t, "surplus destroyed", func() bool { return f.liveCount() == 1 })
	if _, ok := p.Claim(b); ok {
		t.Fatal("claimed a dropped class")
	}
	// Nothing refills the dropped class or past the new size.
	time.Sleep(50 * time.Millisecond)
	if f.liveCount() != 1 {
		t.Fatalf("live after shrinking: %d, want 1", f.liveCount())
	}
	_, used := p.Memory()
	if used != a.Resources.MemoryBytes {
		t.Errorf("memory used %d, want one default sandbox's %d", used, a.Resources.MemoryBytes)
	}

	// A fill in progress when its class is dropped is destroyed when it ends.
	f.delay.Store(int64(100 * time.Millisecond))
	if err := p.SetTargets([]Target{{a, 1}, {b, 1}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b filling", func() bool { return status(p, b).Filling })
	if err := p.SetTargets(nil); err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); len(st) != 0 {
		t.Fatalf("status with no targets: %+v", st)
	}
	waitFor(t, "everything destroyed", func() bool { return f.liveCount() == 0 })
	p.Close()
	if f.liveCount() != 0 {
		t.Fatalf("live after Close: %d", f.liveCount())
	}
	if err := p.SetTargets([]Target{{a, 1}}); err == nil {
		t.Fatal("SetTargets after Close accepted")
	}
}

// TestSetTargetsForgetsDroppedClasses: a dropped class leaves the pool's
// books once nothing of it is ready or filling; brought back, it starts
// from zero.
func TestSetTargetsForgetsDroppedClasses(t *testing.T) {
	f := newFiller()
	a := ClassOf("container", "busybox", isolation.Resources{})
	p, err := New(Config{Filler: f, Targets: []Target{{a, 1}}})
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	defer p.Close()
	waitFor(t, "a ready", func() bool { return status(p, a).Ready == 1 })
	f.delay.Store(int64(100 * time.Millisecond))
	p.Claim(a)
	waitFor(t, "a refilling", func() bool { return status(p, a).Filling })
	if err := p.SetTargets(nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the class forgotten", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.classes) == 0
	})
	if err := p.SetTargets([]Target{{a, 1}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a ready again", func() bool { return status(p, a).Ready == 1 })
	if st := status(p, a); st.Claims != 0 || st.Fills != 1 {
		t.Errorf("a class brought back kept its old counters: %+v", st)
	}
}
