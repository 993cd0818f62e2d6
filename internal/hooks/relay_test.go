package hooks

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

// A relay's events go through Enqueue: delivered in order, a key queued
// twice once; its row is hidden from List and refused by Remove.
func TestRelayEnqueue(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	r := &store.Relay{Hook: store.Webhook{ID: "wh-relay", TenantID: "t1", SandboxID: "sb-1", Name: RelayPrefix + "bot", Port: 8080, Path: "/discord",
		Verify: RelayPrefix + "discord", Secret: "BOT", TokenHash: []byte("unusable")}, Kind: "discord", Config: "{}"}
	if err := h.st.CreateRelay(ctx, r); err != nil {
		t.Fatal(err)
	}
	hdr := http.Header{"Content-Type": {"application/json"}}
	for _, k := range []string{"s:1", "s:2", "s:2", "s:3"} {
		if err := h.svc.Enqueue(ctx, &r.Hook, k, hdr, []byte(k)); err != nil {
			t.Fatalf("enqueue %s: %v", k, err)
		}
	}
	h.waitDelivered(3)
	h.mu.Lock()
	got := append([]string(nil), h.bodies...)
	path := h.got[0].URL.Path
	h.mu.Unlock()
	if len(got) != 3 || got[0] != "s:1" || got[1] != "s:2" || got[2] != "s:3" || path != "/discord" {
		t.Fatalf("delivered %v to %s, want s:1,s:2,s:3 once each to /discord", got, path)
	}
	if l, err := h.svc.List(ctx, "t1", "sb-1"); err != nil || len(l) != 0 {
		t.Fatalf("webhook list shows the relay's row: %+v %v", l, err)
	}
	if err := h.svc.Remove(ctx, "t1", "sb-1", RelayPrefix+"bot"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("webhook rm of a relay's row: %v, want not found", err)
	}
}
