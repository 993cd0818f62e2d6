package sandbox

import (
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/audit"
)

// Events is the event path: its Broker for live subscribers, Sync for a
// reader that must see what was emitted before it asked.
func (m *Manager) Events() *audit.Log { return m.events }

// Emit records an audit event, of ev's kind; it never blocks (see
// audit.Log.Emit: the event is bounded, rate-limited per sandbox, and
// queued or dropped and counted). The gateway's proxy and resolver report
// through the same Log.
func (m *Manager) Emit(tenant, sandbox string, ev api.EventPayload) {
	m.events.Emit(tenant, sandbox, ev)
}
