package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/hooks"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

// A tenant's websocket relay URL cannot reach the host's loopback, private
// or metadata addresses.
func TestRelayPublicClientRefusesPrivate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hits := 0
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits++ }))
	for _, u := range []string{"http://" + ln.Addr().String() + "/", "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1:1/", "http://[::1]:1/"} {
		resp, err := publicClient.Get(u)
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: reached (status %d), want refused", u, resp.StatusCode)
			continue
		}
		if !strings.Contains(err.Error(), "relay dial") {
			t.Errorf("%s: %v, want the relay dialer's refusal", u, err)
		}
	}
	if hits != 0 {
		t.Errorf("the loopback server was reached %d times", hits)
	}
}

// TestRelayDropsReported: a relay whose guest queue is full drops what
// it receives and says so in relay.dropped events, which count every drop
// once and come at most one a second, not one per message.
func TestRelayDropsReported(t *testing.T) {
	const sent = 40
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for i := 0; i < sent; i++ {
			if err := c.Write(r.Context(), websocket.MessageText, []byte(fmt.Sprint("m", i))); err != nil {
				return
			}
		}
		<-r.Context().Done()
	})}
	go srv.Serve(ln)
	defer srv.Close()

	db, err := sqlite.Open(filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := db.CreateTenant(ctx, &store.Tenant{ID: "t1", Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	// No dispatcher runs: the guest is asleep and its queue holds two.
	hs := hooks.New(hooks.Config{Store: db, MaxPending: 2})
	var mu sync.Mutex
	var drops []api.RelayDropped
	emit := func(_, _ string, ev api.EventPayload) {
		if d, ok := ev.(api.RelayDropped); ok {
			mu.Lock()
			drops = append(drops, d)
			mu.Unlock()
		}
	}
	cfg, _ := json.Marshal(relayConfig{URL: "ws://" + ln.Addr().String() + "/"})
	if err := db.CreateRelay(ctx, &store.Relay{Hook: store.Webhook{ID: "wh-1", TenantID: "t1", SandboxID: "sb-1", Name: hooks.RelayPrefix + "feed",
		Port: 8080, Path: "/feed", Verify: hooks.RelayPrefix + "websocket", TokenHash: []byte("x")}, Kind: "websocket", Config: string(cfg)}); err != nil {
		t.Fatal(err)
	}
	rs := newRelays(db, hs, nil, emit, slog.New(slog.NewTextHandler(io.Discard, nil)), "", true)
	done := make(chan struct{})
	go func() { rs.run(ctx); close(done) }()
	total := func() (n int64, events int) {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range drops {
			n += d.Dropped
		}
		return n, len(drops)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if n, _ := total(); n >= sent-2 {
			break
		}
		if time.Now().After(deadline) {
			n, _ := total()
			t.Fatalf("relay.dropped counted %d drops, want %d", n, sent-2)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // nothing more comes
	n, events := total()
	if n != sent-2 || events < 1 || events > 3 {
		t.Errorf("%d relay.dropped events counting %d drops, want %d drops in 1-3 events", events, n, sent-2)
	}
	mu.Lock()
	if d := drops[0]; d.Relay != "feed" || !strings.Contains(d.Reason, "queue full") {
		t.Errorf("relay.dropped: %+v", d)
	}
	mu.Unlock()
	if st := rs.state("wh-1"); st.Dropped != sent-2 || st.Received != 2 {
		t.Errorf("relay state: %+v, want %d dropped and 2 received", st, sent-2)
	}
	cancel()
	<-done
}
