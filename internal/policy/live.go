package policy

import (
	"context"
	"errors"
	"sync/atomic"
)

// Live holds the current policy of a running sandbox. Set swaps it
// atomically: the very next Decide or AllowsName sees the new policy, while
// calls already running finish with the one they started with. The zero
// value holds no policy, and a Live without a policy refuses everything
// (Decide returns an error, AllowsName false).
type Live struct {
	p atomic.Pointer[Policy]
}

// Set replaces the current policy.
func (l *Live) Set(p *Policy) { l.p.Store(p) }

// Current returns the current policy (nil if none).
func (l *Live) Current() *Policy { return l.p.Load() }

// Decide decides r with the current policy.
func (l *Live) Decide(ctx context.Context, r *Request) (Decision, error) {
	p := l.p.Load()
	if p == nil {
		return Decision{}, errors.New("decide: sandbox has no policy")
	}
	return p.Decide(ctx, r)
}

// AllowsName asks the current policy; false if there is none.
func (l *Live) AllowsName(name string) bool {
	return l.p.Load().AllowsName(name)
}

// NamesHost asks the current policy; false if there is none.
func (l *Live) NamesHost(name string) bool {
	return l.p.Load().NamesHost(name)
}
