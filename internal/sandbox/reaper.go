package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/cagebox/cagebox/internal/store"
)

// touch records API activity in memory; flushActivity stores it.
func (e *entry) touch(now time.Time) {
	e.mu.Lock()
	if now.After(e.active) {
		e.active = now
	}
	e.mu.Unlock()
}

// flushActivity writes changed activity times to the store.
func (m *Manager) flushActivity(ctx context.Context) {
	m.mu.Lock()
	entries := make([]*entry, 0, len(m.live))
	for _, e := range m.live {
		entries = append(entries, e)
	}
	m.mu.Unlock()
	for _, e := range entries {
		e.mu.Lock()
		t, changed := e.active, e.active.After(e.persisted)
		e.mu.Unlock()
		if !changed {
			continue
		}
		if err := m.cfg.Store.TouchSandbox(ctx, e.id, t); err == nil {
			e.mu.Lock()
			e.persisted = t
			e.mu.Unlock()
		}
	}
}

// lastActive is the later of the stored and the in-memory activity time.
func (m *Manager) lastActive(r *store.Sandbox) time.Time {
	t := r.LastActive
	m.mu.Lock()
	e := m.live[r.ID]
	m.mu.Unlock()
	if e != nil {
		e.mu.Lock()
		if e.active.After(t) {
			t = e.active
		}
		e.mu.Unlock()
	}
	return t
}

// Reap destroys sandboxes past their maximum lifetime or idle timeout.
// The daemon calls it periodically.
func (m *Manager) Reap(ctx context.Context) {
	rs, err := m.cfg.Store.ListSandboxes(ctx, "")
	if err != nil {
		m.log.Error("reap: list", "err", err)
		return
	}
	now := m.cfg.Now()
	for _, r := range rs {
		switch r.Status {
		case StatusRunning, StatusPaused, StatusStopped, StatusHibernated:
		default:
			continue
		}
		reason := ""
		if r.ExpiresAt != nil && now.After(*r.ExpiresAt) {
			reason = "maximum lifetime reached"
		} else if r.IdleTimeout > 0 && now.Sub(m.lastActive(r)) > r.IdleTimeout && !m.busy(r.ID) {
			reason = fmt.Sprintf("idle for more than %s", r.IdleTimeout)
			var sr specRecord
			_ = json.Unmarshal(r.Spec, &sr)
			if sr.IdleAction == IdlePause || sr.IdleAction == IdleHibernate {
				// Paused or hibernated sandboxes (idle or not) wait for
				// the next call.
				if r.Status == StatusRunning {
					var err error
					if sr.IdleAction == IdleHibernate {
						_, err = m.hibernate(context.Background(), "", r.ID, reason)
					} else {
						err = m.idlePause(r, reason)
					}
					if err != nil {
						m.log.Error("idle "+sr.IdleAction, "sandbox", r.ID, "err", err)
					}
				}
				continue
			}
		}
		if reason != "" {
			if err := m.destroy(r, reason); err != nil {
				m.log.Error("reap", "sandbox", r.ID, "err", err)
			}
		}
	}
}

// busy reports whether an exec is running in the sandbox.
func (m *Manager) busy(id string) bool {
	m.mu.Lock()
	e := m.live[id]
	m.mu.Unlock()
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.execs > 0 || e.inbound > 0
}

// RunReaper calls Reap every interval until ctx ends.
func (m *Manager) RunReaper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.flushActivity(ctx)
			m.Reap(ctx)
			m.ports.reapPorts(ctx)
		}
	}
}
