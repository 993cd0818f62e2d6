// Package audit is the daemon's event path. Every audit event — sandbox
// lifecycle, egress decisions, DNS queries, credential use — enters through
// Log.Emit, which bounds its fields, rate-limits it per sandbox and queues
// it without ever blocking the caller (the proxy, the resolver, an API
// handler). One writer stores queued events in batches (one transaction
// each) and then publishes them to live subscribers (Broker). Retain prunes
// events older than the retention period in the background.
package audit

import "strings"

// Kind names an event ("egress.allow"). The prefix before the first dot is
// its area, and the area decides its Class.
type Kind string

// The event kinds the daemon emits.
const (
	// Sandbox lifecycle (the sandbox manager).
	SandboxCreated    Kind = "sandbox.created"
	SandboxFailed     Kind = "sandbox.failed"
	SandboxExec       Kind = "sandbox.exec"
	SandboxPaused     Kind = "sandbox.paused"
	SandboxResumed    Kind = "sandbox.resumed"
	SandboxStopped    Kind = "sandbox.stopped"
	SandboxDestroyed  Kind = "sandbox.destroyed"
	SandboxLost       Kind = "sandbox.lost"
	SandboxReattached Kind = "sandbox.reattached"

	// Credentials (the vault API and the gateway).
	SecretPut          Kind = "secret.put"
	SecretRotated      Kind = "secret.rotated"
	SecretDeleted      Kind = "secret.deleted"
	SecretRevoked      Kind = "secret.revoked"
	SecretUnbound      Kind = "secret.unbound"
	SecretUsed         Kind = "secret.used"
	SecretRefused      Kind = "secret.refused"
	SecretAlert        Kind = "secret.alert"
	SecretError        Kind = "secret.error"
	SecretExfilSuspect Kind = "secret.exfil_suspect"
	SecretReflected    Kind = "secret.reflected"
	SecretEnvDelivered Kind = "secret.env_delivered"

	// Traffic (the gateway's proxy and resolver).
	EgressAllow Kind = "egress.allow"
	EgressDeny  Kind = "egress.deny"
	EgressError Kind = "egress.error"
	DNSQuery    Kind = "dns.query"

	// Dropped reports events this package dropped (see Log).
	Dropped Kind = "events.dropped"
)

// Class is how an event is treated under load.
type Class int

const (
	// Bulk events (egress.*, dns.query and any area not named below) are
	// one per request or query: a sandbox makes as many as it likes, so
	// they are the first to go — rate-limited per sandbox, and refused
	// once the queue is three quarters full.
	Bulk Class = iota
	// Priority events (sandbox.*, secret.*) are lifecycle and security
	// records. They have a per-sandbox bucket of their own, so a flood of
	// bulk events never uses it up, and may fill the whole queue.
	Priority
	// Report is events.dropped: made by this package at most once a second
	// per sandbox, never rate-limited, kept pending until it is queued.
	Report
)

// Class returns the class of k, from its area.
func (k Kind) Class() Class {
	area, _, _ := strings.Cut(string(k), ".")
	switch area {
	case "sandbox", "secret":
		return Priority
	case "events":
		return Report
	}
	return Bulk
}

func (c Class) String() string {
	switch c {
	case Priority:
		return "priority"
	case Report:
		return "report"
	}
	return "bulk"
}
