package storetest

import (
	"testing"

	"github.com/cagebox/cagebox/internal/store"
)

func testRelays(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustTenant(t, s, "t2")
	r := &store.Relay{Hook: store.Webhook{ID: "wh-r1", TenantID: "t1", SandboxID: "sb-1", Name: "relay:bot", Port: 8080, Path: "/discord", Verify: "relay:discord", Secret: "BOT", TokenHash: []byte("r1")},
		Kind: "discord", Config: `{"intents":513}`}
	if err := s.CreateRelay(ctx(t), r); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "same name", s.CreateRelay(ctx(t), &store.Relay{Hook: store.Webhook{ID: "wh-r2", TenantID: "t1", SandboxID: "sb-1", Name: "relay:bot", TokenHash: []byte("r2")}, Kind: "discord", Config: "{}"}), store.ErrConflict)
	if err := s.CreateRelay(ctx(t), &store.Relay{Hook: store.Webhook{ID: "wh-r3", TenantID: "t2", SandboxID: "sb-2", Name: "relay:x", TokenHash: []byte("r3")}, Kind: "websocket", Config: "{}"}); err != nil {
		t.Fatal(err)
	}
	l, err := s.ListRelays(ctx(t), "t1", "")
	if err != nil || len(l) != 1 || l[0].Hook.ID != "wh-r1" || l[0].Kind != "discord" || l[0].Config != `{"intents":513}` || l[0].Hook.Port != 8080 || l[0].Hook.Secret != "BOT" {
		t.Fatalf("t1's relays: %+v %v", l, err)
	}
	if l, _ := s.ListRelays(ctx(t), "", ""); len(l) != 2 {
		t.Fatalf("all relays: %d", len(l))
	}
	if l, _ := s.ListRelays(ctx(t), "t2", "sb-1"); len(l) != 0 {
		t.Fatalf("another tenant's sandbox: %+v", l)
	}
	// The relay's webhook carries its queue; deleting it deletes the relay.
	if ws, _ := s.ListWebhooks(ctx(t), "t1", "sb-1"); len(ws) != 1 {
		t.Fatalf("the relay's webhook row: %+v", ws)
	}
	if err := s.DeleteWebhook(ctx(t), "t1", "sb-1", "relay:bot"); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.ListRelays(ctx(t), "t1", ""); len(l) != 0 {
		t.Fatalf("relay outlived its webhook: %+v", l)
	}
}
