package store

import "context"

// RelayStore keeps relays: connections the host holds for a sandbox
// (package relay), whose events become deliveries of a webhook row the
// relay owns (so they share the webhooks' persisted, bounded queue).
type RelayStore interface {
	// CreateRelay inserts r.Hook and r in one transaction (ErrConflict if
	// the sandbox has a webhook of that name).
	CreateRelay(ctx context.Context, r *Relay) error
	// ListRelays lists a sandbox's relays (sandboxID "": the tenant's;
	// tenantID "": every tenant's). DeleteWebhook of a relay's hook
	// deletes the relay.
	ListRelays(ctx context.Context, tenantID, sandboxID string) ([]*Relay, error)
}

// Relay is one held connection.
type Relay struct {
	// Hook is the webhook row the relay's deliveries belong to.
	Hook Webhook
	// Kind is "discord" or "websocket"; Config its settings (JSON, no
	// secret values: those are named vault keys).
	Kind   string
	Config string
}
