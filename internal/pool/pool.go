// Package pool keeps warm sandboxes: per class (runtime, image, size) a
// number of started, idle sandboxes with no tenant, network binding,
// secrets or policy, which a create claims and then binds. It decides
// what to fill and when — at most Config.Fills at once (default 2), after
// creates in progress,
// within a memory budget, backing off after failures — and counts hits,
// misses and fills; making and destroying sandboxes is the Filler's (the
// sandbox manager's) job. A pooled sandbox is handed out once and never
// comes back.
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/isolation"
)

// Class is what makes pooled sandboxes interchangeable: the runtime, the
// image and the resources (with defaults applied).
type Class struct {
	Runtime   string
	Image     string
	Resources isolation.Resources
}

// ClassOf is the class of a sandbox of runtime and image with res.
func ClassOf(runtime, image string, res isolation.Resources) Class {
	return Class{Runtime: runtime, Image: image, Resources: res.WithDefaults()}
}

// String is RUNTIME:IMAGE, with :MEMORY when the memory is not the
// default; the other resources follow in brackets when they differ.
func (c Class) String() string {
	s := c.Runtime + ":" + c.Image
	r, d := c.Resources.WithDefaults(), isolation.Resources{}.WithDefaults()
	if r.MemoryBytes != d.MemoryBytes {
		s += ":" + FormatSize(r.MemoryBytes)
	}
	var extra []string
	if r.CPUs != d.CPUs {
		extra = append(extra, "cpus="+strconv.FormatFloat(r.CPUs, 'f', -1, 64))
	}
	if r.PIDs != d.PIDs {
		extra = append(extra, "pids="+strconv.FormatInt(r.PIDs, 10))
	}
	if r.DiskBytes != d.DiskBytes {
		extra = append(extra, "disk="+FormatSize(r.DiskBytes))
	}
	if len(extra) > 0 {
		s += "[" + strings.Join(extra, ",") + "]"
	}
	return s
}

// Target is how many sandboxes of a class to keep ready.
type Target struct {
	Class Class
	Size  int
}

// MaxSize bounds one class's target.
const MaxSize = 256

// ParseTargets reads pool targets: comma-separated RUNTIME:IMAGE[:MEMORY]=N
// entries ("container:busybox=4,qemu:default:1g=2"); MEMORY is a size
// such as 512m or 1g. The same class twice is an error.
func ParseTargets(specs ...string) ([]Target, error) {
	var out []Target
	seen := map[Class]bool{}
	for _, spec := range specs {
		for _, ent := range strings.Split(spec, ",") {
			ent = strings.TrimSpace(ent)
			if ent == "" {
				continue
			}
			key, n, ok := strings.Cut(ent, "=")
			size, err := strconv.Atoi(n)
			if !ok || err != nil || size < 0 || size > MaxSize {
				return nil, fmt.Errorf("pool %q: want RUNTIME:IMAGE[:MEMORY]=N with 0 <= N <= %d", ent, MaxSize)
			}
			parts := strings.Split(key, ":")
			if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
				return nil, fmt.Errorf("pool %q: want RUNTIME:IMAGE[:MEMORY]=N, e.g. container:busybox=4", ent)
			}
			var res isolation.Resources
			if len(parts) == 3 {
				mem, err := ParseSize(parts[2])
				if err != nil {
					return nil, fmt.Errorf("pool %q: memory: %v", ent, err)
				}
				res.MemoryBytes = mem
			}
			c := ClassOf(parts[0], parts[1], res)
			if seen[c] {
				return nil, fmt.Errorf("pool %q: class %s is given twice", ent, c)
			}
			seen[c] = true
			out = append(out, Target{Class: c, Size: size})
		}
	}
	return out, nil
}

// ParseSize reads 512m, 1g, 1024k or a number of bytes.
func ParseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "ib"), "b")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'k':
			mult = 1 << 10
		case 'm':
			mult = 1 << 20
		case 'g':
			mult = 1 << 30
		case 't':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("%q is not a size such as 512m or 1g", s)
	}
	return n * mult, nil
}

// FormatSize writes a size the way ParseSize reads it (g, m or k when
// exact).
func FormatSize(n int64) string {
	for _, u := range []struct {
		s string
		v int64
	}{{"t", 1 << 40}, {"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}} {
		if n >= u.v && n%u.v == 0 {
			return strconv.FormatInt(n/u.v, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}

// Item is a pooled sandbox, opaque to the pool.
type Item interface {
	ID() string
}

// Filler makes and destroys pooled sandboxes.
type Filler interface {
	// Fill makes a started, idle sandbox of c; ctx ends when the pool
	// closes.
	Fill(ctx context.Context, c Class) (Item, error)
	// Discard destroys a sandbox Fill made that is not handed out.
	Discard(it Item)
}

// Config configures a Pool.
type Config struct {
	Targets []Target
	// MemoryBudget bounds the memory (the classes' limits) of the
	// sandboxes ready in all pools together; a fill that would exceed it
	// waits.
	MemoryBudget int64
	Filler       Filler
	Logger       *slog.Logger
	// Emit records a pool event (claims with the claiming tenant's
	// sandbox, others as the daemon's).
	Emit func(tenant, sandbox string, ev api.EventPayload)
	// Busy, if set, reports creates in progress: a fill waits (up to
	// MaxDefer) until there are none, so refills do not compete with
	// the creates they serve.
	Busy func() bool
	// MaxDefer bounds how long a fill waits for Busy (default 2s).
	MaxDefer time.Duration
	// Backoff is the first wait after a failed fill of a class (doubling
	// up to a minute; default 1s).
	Backoff time.Duration
	// Fills is how many fills may run at once (default 2: a pool keeps up
	// with creates that come faster than one fill takes).
	Fills int
}

// Pool keeps warm sandboxes.
type Pool struct {
	cfg   Config
	log   *slog.Logger
	wake  chan struct{}
	stop  context.CancelFunc
	ctx   context.Context
	done  chan struct{}
	start sync.Once

	// mu guards classes, order and closed. A class SetTargets dropped
	// stays in classes (target 0, out of order) so a fill in progress
	// finds it; order is the classes kept.
	mu      sync.Mutex
	classes map[Class]*class
	order   []Class
	closed  bool
	// discards counts surplus sandboxes being destroyed (SetTargets);
	// Close waits for them.
	discards sync.WaitGroup
}

type class struct {
	target                          int
	ready                           []Item
	filling                         int
	claims, misses, fills, failures uint64
	lastErr                         string
	retryAt                         time.Time
	backoff                         time.Duration
	fillTime                        time.Duration // of the last fill
}

// New returns a pool; Start begins filling it.
func New(cfg Config) (*Pool, error) {
	if cfg.Filler == nil {
		return nil, errors.New("pool: no filler")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Emit == nil {
		cfg.Emit = func(string, string, api.EventPayload) {}
	}
	if cfg.MaxDefer <= 0 {
		cfg.MaxDefer = 2 * time.Second
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = time.Second
	}
	if cfg.Fills <= 0 {
		cfg.Fills = 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1), ctx: ctx, stop: cancel,
		done: make(chan struct{}), classes: map[Class]*class{}}
	if err := checkTargets(cfg.Targets); err != nil {
		cancel()
		return nil, err
	}
	for _, t := range cfg.Targets {
		p.classes[t.Class] = &class{target: t.Size}
		p.order = append(p.order, t.Class)
	}
	return p, nil
}

// Start begins filling in the background.
func (p *Pool) Start() {
	p.start.Do(func() { go p.run() })
}

// Pooled reports whether c has a pool.
func (p *Pool) Pooled(c Class) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cl, ok := p.classes[c]
	return ok && cl.target > 0
}

// Claim takes a ready sandbox of c, or reports a miss (false) when there
// is none. It never blocks on a fill.
func (p *Pool) Claim(c Class) (Item, bool) {
	p.mu.Lock()
	cl, ok := p.classes[c]
	if !ok || p.closed {
		p.mu.Unlock()
		return nil, false
	}
	if len(cl.ready) == 0 {
		cl.misses++
		p.mu.Unlock()
		p.kick()
		return nil, false
	}
	it := cl.ready[0]
	cl.ready = cl.ready[1:]
	cl.claims++
	p.mu.Unlock()
	p.kick()
	return it, true
}

// Missed records a miss the caller found after a claim (a claimed sandbox
// that could not be bound).
func (p *Pool) Missed(c Class) {
	p.mu.Lock()
	if cl, ok := p.classes[c]; ok {
		cl.claims--
		cl.misses++
	}
	p.mu.Unlock()
}

func (p *Pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Status is the state of every class's pool.
func (p *Pool) Status() []api.PoolStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]api.PoolStatus, 0, len(p.order))
	for _, c := range p.order {
		cl := p.classes[c]
		out = append(out, api.PoolStatus{
			Class: c.String(), Runtime: c.Runtime, Image: c.Image,
			MemoryBytes: c.Resources.MemoryBytes, Target: cl.target, Ready: len(cl.ready), Filling: cl.filling > 0,
			Claims: cl.claims, Misses: cl.misses, Fills: cl.fills, Failures: cl.failures,
			LastError: cl.lastErr, LastFillMs: cl.fillTime.Milliseconds(),
			Sandboxes: itemIDs(cl.ready),
		})
	}
	return out
}

// itemIDs are the IDs of items (nil for none).
func itemIDs(items []Item) []string {
	var ids []string
	for _, it := range items {
		ids = append(ids, it.ID())
	}
	return ids
}

// Memory is the budget and what the ready (and filling) sandboxes use of it.
func (p *Pool) Memory() (budget, used int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.MemoryBudget, p.usedLocked()
}

// used is the memory of the sandboxes ready or being filled. mu is held.
func (p *Pool) usedLocked() int64 {
	var n int64
	for c, cl := range p.classes {
		k := len(cl.ready) + cl.filling
		n += int64(k) * c.Resources.MemoryBytes
	}
	return n
}

// next picks the class to fill: the one furthest below its target (in
// proportion), not backing off, that fits the budget. It returns how long
// to wait when only backing-off classes need filling.
func (p *Pool) nextLocked(now time.Time) (Class, bool, time.Duration) {
	var (
		best     Class
		found    bool
		bestFrac = 2.0
		wait     time.Duration
	)
	used := p.usedLocked()
	for _, c := range p.order {
		cl := p.classes[c]
		if len(cl.ready)+cl.filling >= cl.target {
			continue
		}
		if now.Before(cl.retryAt) {
			if d := cl.retryAt.Sub(now); wait == 0 || d < wait {
				wait = d
			}
			continue
		}
		if p.cfg.MemoryBudget > 0 && used+c.Resources.MemoryBytes > p.cfg.MemoryBudget {
			continue
		}
		if frac := float64(len(cl.ready)) / float64(cl.target); frac < bestFrac {
			best, found, bestFrac = c, true, frac
		}
	}
	return best, found, wait
}

func (p *Pool) run() {
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		close(p.done)
	}()
	inflight := 0
	finished := make(chan struct{}, p.cfg.Fills)
	for {
		var (
			c    Class
			ok   bool
			wait time.Duration
		)
		if inflight < p.cfg.Fills {
			p.mu.Lock()
			if c, ok, wait = p.nextLocked(time.Now()); ok {
				p.classes[c].filling++
			}
			p.mu.Unlock()
		}
		if ok {
			inflight++
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.deferToCreates()
				p.fill(c)
				finished <- struct{}{}
			}()
			continue
		}
		var (
			timer <-chan time.Time
			t     *time.Timer
		)
		if wait > 0 {
			t = time.NewTimer(wait)
			timer = t.C
		}
		select {
		case <-p.ctx.Done():
		case <-p.wake:
		case <-finished:
			inflight--
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
		if p.ctx.Err() != nil {
			return
		}
	}
}

// deferToCreates waits (bounded) until no create is in progress.
func (p *Pool) deferToCreates() {
	if p.cfg.Busy == nil {
		return
	}
	deadline := time.Now().Add(p.cfg.MaxDefer)
	for p.cfg.Busy() && time.Now().Before(deadline) && p.ctx.Err() == nil {
		time.Sleep(2 * time.Millisecond)
	}
}

func (p *Pool) fill(c Class) {
	t0 := time.Now()
	it, err := p.cfg.Filler.Fill(p.ctx, c)
	d := time.Since(t0)
	p.mu.Lock()
	cl := p.classes[c]
	cl.filling--
	// A dropped class goes once its last fill ends (cl stays usable
	// here: the sandbox made is discarded below, target 0).
	p.forgetLocked(c)
	if err != nil {
		cl.failures++
		cl.lastErr = err.Error()
		if cl.backoff == 0 {
			cl.backoff = p.cfg.Backoff
		} else if cl.backoff *= 2; cl.backoff > time.Minute {
			cl.backoff = time.Minute
		}
		cl.retryAt = time.Now().Add(cl.backoff)
		closed, backoff := p.closed, cl.backoff
		p.mu.Unlock()
		if !closed {
			p.log.Warn("pool fill failed", "class", c.String(), "err", err, "retry_in", backoff)
			p.cfg.Emit("", "", api.PoolFillFailed{Class: c.String(), Error: err.Error()})
		}
		return
	}
	if p.closed {
		p.mu.Unlock()
		p.cfg.Filler.Discard(it)
		return
	}
	if len(cl.ready) >= cl.target {
		// SetTargets shrank or dropped the class while this fill ran.
		p.mu.Unlock()
		p.log.Debug("pool fill no longer wanted", "class", c.String(), "sandbox", it.ID())
		p.cfg.Filler.Discard(it)
		return
	}
	cl.ready = append(cl.ready, it)
	cl.fills++
	cl.backoff, cl.lastErr, cl.fillTime = 0, "", d
	ready := len(cl.ready)
	p.mu.Unlock()
	p.log.Debug("pool filled", "class", c.String(), "sandbox", it.ID(), "took", d, "ready", ready)
	p.cfg.Emit("", it.ID(), api.PoolFilled{Class: c.String(), Ready: ready, DurationMs: d.Milliseconds()})
}

// Close stops filling, waits for a fill in progress and destroys every
// ready sandbox. Claims after Close miss.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	var items []Item
	for _, c := range p.order {
		cl := p.classes[c]
		items = append(items, cl.ready...)
		cl.ready = nil
	}
	p.mu.Unlock()
	p.stop()
	p.start.Do(func() { close(p.done) }) // never started: nothing to wait for
	<-p.done
	p.discards.Wait()
	var wg sync.WaitGroup
	for _, it := range items {
		wg.Add(1)
		go func(it Item) {
			defer wg.Done()
			p.cfg.Filler.Discard(it)
		}(it)
	}
	wg.Wait()
}

// Classes lists the pooled classes, sorted by name.
func (p *Pool) Classes() []Class {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := append([]Class(nil), p.order...)
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// checkTargets refuses a class given twice or a size out of range.
func checkTargets(targets []Target) error {
	seen := map[Class]bool{}
	for _, t := range targets {
		if seen[t.Class] {
			return fmt.Errorf("pool: class %s given twice", t.Class)
		}
		seen[t.Class] = true
		if t.Size < 0 || t.Size > MaxSize {
			return fmt.Errorf("pool: class %s: size %d is out of range (0 to %d)", t.Class, t.Size, MaxSize)
		}
	}
	return nil
}

// SetTargets replaces the pool's targets at runtime: a new class starts
// filling; a class left out keeps none and a shrunk one keeps its new
// size — their surplus ready sandboxes are destroyed in the background
// (Close waits for that), and a fill in progress that is no longer wanted
// is destroyed when it ends. Counters of a class that stays (or comes
// back) are kept. Invalid targets change nothing.
func (p *Pool) SetTargets(targets []Target) error {
	if err := checkTargets(targets); err != nil {
		return err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.New("pool: closed")
	}
	want := make(map[Class]int, len(targets))
	order := make([]Class, 0, len(targets))
	for _, t := range targets {
		want[t.Class] = t.Size
		order = append(order, t.Class)
		if _, ok := p.classes[t.Class]; !ok {
			p.classes[t.Class] = &class{}
		}
	}
	var surplus []Item
	for c, cl := range p.classes {
		cl.target = want[c] // 0 when left out
		if n := len(cl.ready) - cl.target; n > 0 {
			// The newest go; claims keep taking the oldest first.
			surplus = append(surplus, cl.ready[cl.target:]...)
			cl.ready = append([]Item(nil), cl.ready[:cl.target]...)
		}
	}
	p.order = order
	for c := range p.classes {
		p.forgetLocked(c)
	}
	p.discards.Add(len(surplus))
	p.mu.Unlock()
	for _, it := range surplus {
		go func(it Item) {
			defer p.discards.Done()
			p.cfg.Filler.Discard(it)
		}(it)
	}
	if len(surplus) > 0 {
		p.log.Info("pool targets changed; destroying surplus sandboxes", "count", len(surplus))
	}
	p.kick()
	return nil
}

// forgetLocked drops class c, counters and all, once it is out of the
// targets with nothing ready or filling. mu is held.
func (p *Pool) forgetLocked(c Class) {
	cl, ok := p.classes[c]
	if !ok || cl.target > 0 || cl.filling > 0 || len(cl.ready) > 0 || slices.Contains(p.order, c) {
		return
	}
	delete(p.classes, c)
}
