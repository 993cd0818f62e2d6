package storetest

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/store"
)

func testWebhooks(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustTenant(t, s, "t2")
	w := &store.Webhook{ID: "wh-1", TenantID: "t1", SandboxID: "sb-1", Name: "gh", Port: 8080, Path: "/hook", Verify: "github", Secret: "GH_HOOK", TokenHash: []byte("h1")}
	if err := s.CreateWebhook(ctx(t), w); err != nil {
		t.Fatal(err)
	}
	if w.CreatedAt.IsZero() {
		t.Error("CreatedAt not set")
	}
	wantErr(t, "same name, same sandbox", s.CreateWebhook(ctx(t), &store.Webhook{ID: "wh-2", TenantID: "t1", SandboxID: "sb-1", Name: "gh", TokenHash: []byte("h2")}), store.ErrConflict)
	wantErr(t, "same token hash", s.CreateWebhook(ctx(t), &store.Webhook{ID: "wh-3", TenantID: "t1", SandboxID: "sb-1", Name: "other", TokenHash: []byte("h1")}), store.ErrConflict)
	if err := s.CreateWebhook(ctx(t), &store.Webhook{ID: "wh-4", TenantID: "t2", SandboxID: "sb-2", Name: "gh", Port: 1, Path: "/", Verify: "slack", Secret: "S", TokenHash: []byte("h4")}); err != nil {
		t.Fatal(err)
	}
	got, err := s.WebhookByToken(ctx(t), []byte("h1"))
	if err != nil || got.ID != "wh-1" || got.Port != 8080 || got.Path != "/hook" || got.Verify != "github" || got.Secret != "GH_HOOK" {
		t.Fatalf("by token: %+v %v", got, err)
	}
	_, err = s.WebhookByToken(ctx(t), []byte("nope"))
	wantErr(t, "unknown token", err, store.ErrNotFound)
	if l, _ := s.ListWebhooks(ctx(t), "t1", ""); len(l) != 1 || l[0].ID != "wh-1" {
		t.Errorf("t1's webhooks: %+v", l)
	}
	if l, _ := s.ListWebhooks(ctx(t), "", ""); len(l) != 2 {
		t.Errorf("all webhooks: %d", len(l))
	}
	if l, _ := s.ListWebhooks(ctx(t), "t2", "sb-1"); len(l) != 0 {
		t.Errorf("another tenant's sandbox: %+v", l)
	}

	// The queue: bounded, replays refused, due order, retry, finish.
	t0 := time.Unix(1_700_000_000, 0).UTC()
	d1 := &store.Delivery{WebhookID: "wh-1", SandboxID: "sb-1", Key: "k1", Method: "POST", Header: http.Header{"X-Github-Event": {"push"}}, Body: []byte(`{"a":1}`), ReceivedAt: t0}
	if err := s.EnqueueDelivery(ctx(t), d1, 2); err != nil {
		t.Fatal(err)
	}
	if d1.ID == 0 || d1.State != store.DeliveryPending {
		t.Fatalf("enqueued: %+v", d1)
	}
	wantErr(t, "replayed key", s.EnqueueDelivery(ctx(t), &store.Delivery{WebhookID: "wh-1", SandboxID: "sb-1", Key: "k1", Method: "POST", ReceivedAt: t0}, 2), store.ErrConflict)
	if err := s.EnqueueDelivery(ctx(t), &store.Delivery{WebhookID: "wh-1", SandboxID: "sb-1", Key: "k2", Method: "POST", ReceivedAt: t0.Add(time.Second)}, 2); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "queue at its bound", s.EnqueueDelivery(ctx(t), &store.Delivery{WebhookID: "wh-1", SandboxID: "sb-1", Key: "k3", Method: "POST", ReceivedAt: t0}, 2), store.ErrFull)
	wantErr(t, "unknown webhook", s.EnqueueDelivery(ctx(t), &store.Delivery{WebhookID: "wh-none", SandboxID: "sb-1", Key: "k", Method: "POST"}, 2), store.ErrNotFound)
	// Only a sandbox's oldest pending delivery is due: order is kept.
	due, err := s.DueDeliveries(ctx(t), "sb-1", t0.Add(time.Hour), 10)
	if err != nil || len(due) != 1 || due[0].Key != "k1" || !bytes.Equal(due[0].Body, []byte(`{"a":1}`)) || due[0].Header.Get("X-Github-Event") != "push" {
		t.Fatalf("due: %+v %v", due, err)
	}
	if err := s.RetryDelivery(ctx(t), d1.ID, "connection refused", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if due, _ := s.DueDeliveries(ctx(t), "", t0.Add(30*time.Second), 10); len(due) != 0 {
		t.Fatalf("due while the head waits for its retry: %+v", due)
	}
	if due, _ := s.DueDeliveries(ctx(t), "", t0.Add(2*time.Minute), 10); len(due) != 1 || due[0].Key != "k1" || due[0].Attempts != 1 {
		t.Fatalf("due at the retry time: %+v", due)
	}
	if err := s.FinishDelivery(ctx(t), d1.ID, true, "200", t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if due, _ := s.DueDeliveries(ctx(t), "", t0.Add(2*time.Minute), 10); len(due) != 1 || due[0].Key != "k2" {
		t.Fatalf("due after the head is done: %+v", due)
	}
	wantErr(t, "finish twice", s.FinishDelivery(ctx(t), d1.ID, true, "200", t0), store.ErrNotFound)
	if n, _ := s.PendingDeliveries(ctx(t), "wh-1"); n != 1 {
		t.Errorf("pending = %d, want 1", n)
	}
	// A delivered one still blocks its replay (within the window).
	wantErr(t, "replay of a delivered one", s.EnqueueDelivery(ctx(t), &store.Delivery{WebhookID: "wh-1", SandboxID: "sb-1", Key: "k1", Method: "POST"}, 2), store.ErrConflict)
	// Past the window, finished deliveries go; pending ones stay.
	if n, err := s.PruneDeliveries(ctx(t), t0.Add(time.Hour), 0); err != nil || n != 1 {
		t.Errorf("prune = %d %v, want 1", n, err)
	}
	if n, _ := s.PendingDeliveries(ctx(t), "wh-1"); n != 1 {
		t.Errorf("pending after prune = %d", n)
	}
	// Deleting a webhook deletes its queue; other tenants cannot.
	wantErr(t, "delete another tenant's", s.DeleteWebhook(ctx(t), "t2", "sb-1", "gh"), store.ErrNotFound)
	if err := s.DeleteWebhook(ctx(t), "t1", "sb-1", "gh"); err != nil {
		t.Fatal(err)
	}
	if due, _ := s.DueDeliveries(ctx(t), "sb-1", t0.Add(time.Hour), 10); len(due) != 0 {
		t.Errorf("deliveries outlived their webhook: %+v", due)
	}
}
