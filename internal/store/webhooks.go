package store

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// ErrFull means a bounded queue is at its limit.
var ErrFull = errors.New("queue full")

// WebhookStore keeps webhooks (a stable URL per sandbox endpoint, verified
// at the edge) and their deliveries: a persisted queue, at least once,
// whose rows stay after delivery for the replay window (their Key is
// unique per webhook, so a replayed delivery is refused even after a
// daemon restart).
type WebhookStore interface {
	// CreateWebhook inserts w (ErrConflict if its sandbox has a webhook of
	// that name, or its token hash is taken), setting CreatedAt.
	CreateWebhook(ctx context.Context, w *Webhook) error
	// ListWebhooks lists a sandbox's webhooks (sandboxID "": the tenant's;
	// tenantID "": every tenant's).
	ListWebhooks(ctx context.Context, tenantID, sandboxID string) ([]*Webhook, error)
	// WebhookByToken returns the webhook whose URL token hashes to hash.
	WebhookByToken(ctx context.Context, hash []byte) (*Webhook, error)
	// DeleteWebhook removes a webhook and its deliveries (ErrNotFound if
	// the tenant's sandbox has none of that name).
	DeleteWebhook(ctx context.Context, tenantID, sandboxID, name string) error

	// EnqueueDelivery stores d (ID, ReceivedAt and NextAt set): ErrConflict
	// if the webhook already has a delivery with d.Key (a replay), ErrFull
	// if it has maxPending undelivered ones.
	EnqueueDelivery(ctx context.Context, d *Delivery, maxPending int) error
	// DueDeliveries returns, of each sandbox, its oldest undelivered
	// delivery if its NextAt <= now (deliveries reach a sandbox in the
	// order they came: one being retried holds back the next), at most
	// limit; sandboxID "" for every sandbox.
	DueDeliveries(ctx context.Context, sandboxID string, now time.Time, limit int) ([]*Delivery, error)
	// FinishDelivery marks a delivery delivered (ok) or dead (given up),
	// recording the attempt's outcome; RetryDelivery records a failed
	// attempt and when to try again.
	FinishDelivery(ctx context.Context, id int64, ok bool, result string, at time.Time) error
	RetryDelivery(ctx context.Context, id int64, result string, next time.Time) error
	// PendingDeliveries counts a webhook's undelivered deliveries.
	PendingDeliveries(ctx context.Context, webhookID string) (int, error)
	// PruneDeliveries deletes finished deliveries received before before
	// (past the replay window), at most limit; it returns how many.
	PruneDeliveries(ctx context.Context, before time.Time, limit int) (int64, error)
}

// Webhook is one sandbox endpoint reachable at a stable URL.
type Webhook struct {
	ID        string
	TenantID  string
	SandboxID string
	Name      string
	Port      int
	Path      string
	// Verify is the verification scheme (webhook.New); Secret names the
	// tenant's vault secret holding the shared secret.
	Verify string
	Secret string
	// TokenHash is sha256 of the URL's token; the token itself is shown
	// once, at creation.
	TokenHash []byte
	CreatedAt time.Time
}

// Delivery states.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryDead      = "dead"
)

// Delivery is one verified request waiting for (or done with) its sandbox.
type Delivery struct {
	ID        int64
	WebhookID string
	SandboxID string
	// Key names the delivery for replay detection (webhook.Verifier).
	Key        string
	Method     string
	Header     http.Header
	Body       []byte
	ReceivedAt time.Time
	NextAt     time.Time
	Attempts   int
	State      string
	// Result is the last attempt's outcome ("200", an error).
	Result     string
	FinishedAt time.Time
}
