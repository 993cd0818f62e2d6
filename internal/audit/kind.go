// Package audit is the daemon's event path. Every audit event — sandbox
// lifecycle, egress decisions, DNS queries, credential use — enters through
// Log.Emit, which bounds its fields, rate-limits it per sandbox and queues
// it without ever blocking the caller (the proxy, the resolver, an API
// handler). One writer stores queued events in batches (one transaction
// each) and then publishes them to live subscribers (Broker). Retain prunes
// events older than the retention period in the background.
//
// The kinds of event and the shape of each one's data are the catalog in
// package api (api.EventKind, api.EventPayload; docs/events.md).
package audit

import "github.com/cagebox/cagebox/api"

// Kind names an event ("egress.allow"); the constants are api's.
type Kind = api.EventKind

// Class is how an event is treated under load; Kind.Class gives it.
type Class = api.EventClass

const (
	// Bulk events (egress.*, dns.query and any area not named below) are
	// one per request or query: a sandbox makes as many as it likes, so
	// they are the first to go — rate-limited per sandbox, and refused
	// once the queue is three quarters full.
	Bulk = api.ClassBulk
	// Priority events (sandbox.*, secret.*) are lifecycle and security
	// records. They have a per-sandbox bucket of their own, so a flood of
	// bulk events never uses it up, and may fill the whole queue.
	Priority = api.ClassPriority
	// Report is events.dropped: made by this package at most once a second
	// per sandbox, never rate-limited, kept pending until it is queued.
	Report = api.ClassReport
)
