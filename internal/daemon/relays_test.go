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
	"github.com/cagebox/cagebox/internal/safedial"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

// A tenant's URL (relays, approval webhooks: one client) cannot reach
// the host's loopback, private or metadata addresses.
func TestTenantClientRefusesPrivate(t *testing.T) {
	publicClient, err := tenantClient(Config{})
	if err != nil {
		t.Fatal(err)
	}
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
		if safedial.Rule(err) == "" && !strings.Contains(err.Error(), "literal IP") {
			t.Errorf("%s: %v, want the guarded dialer's refusal", u, err)
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

	db, ctx := relayStore(t)
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
	rs := runRelays(t, ctx, db, hs, emit)
	total := func() (n int64, events int) {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range drops {
			n += d.Dropped
		}
		return n, len(drops)
	}
	waitUntil(t, "relay.dropped to count every drop", 20*time.Second, func() bool { n, _ := total(); return n >= sent-2 })
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
}

// TestRelayStopsWithItsSandbox: a relay whose sandbox stops closes its
// connection (a close frame, 1000) within a bound of the next sync, says
// so in a relay.disconnected event, and is not started again; a failed
// sandbox's relay is not started at all; `relay ls` says why neither
// runs.
func TestRelayStopsWithItsSandbox(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var smu sync.Mutex
	conns := map[string]int{}                   // path → connections
	ends := map[string][]websocket.StatusCode{} // path → how each ended
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		smu.Lock()
		conns[r.URL.Path]++
		smu.Unlock()
		if err := c.Write(r.Context(), websocket.MessageText, []byte("hello")); err != nil {
			return
		}
		_, _, err = c.Read(context.Background())
		smu.Lock()
		ends[r.URL.Path] = append(ends[r.URL.Path], websocket.CloseStatus(err))
		smu.Unlock()
	})}
	go srv.Serve(ln)
	defer srv.Close()
	seen := func(path string) (int, []websocket.StatusCode) {
		smu.Lock()
		defer smu.Unlock()
		return conns[path], append([]websocket.StatusCode(nil), ends[path]...)
	}

	db, ctx := relayStore(t)
	sbs := map[string]*store.Sandbox{}
	for id, status := range map[string]string{"sb-1": "running", "sb-2": "failed"} {
		sbs[id] = &store.Sandbox{ID: id, TenantID: "t1", Runtime: "container", Image: "debian", Status: status}
		if err := db.CreateSandbox(ctx, sbs[id]); err != nil {
			t.Fatal(err)
		}
	}
	hs := hooks.New(hooks.Config{Store: db})
	var emu sync.Mutex
	var disc []api.RelayDisconnected
	emit := func(_, sb string, ev api.EventPayload) {
		if d, ok := ev.(api.RelayDisconnected); ok {
			emu.Lock()
			disc = append(disc, d)
			emu.Unlock()
		}
	}
	disconnected := func() []api.RelayDisconnected {
		emu.Lock()
		defer emu.Unlock()
		return append([]api.RelayDisconnected(nil), disc...)
	}
	rels := map[string]*store.Relay{}
	for i, sb := range []string{"sb-1", "sb-2"} {
		cfg, _ := json.Marshal(relayConfig{URL: "ws://" + ln.Addr().String() + "/" + sb})
		rels[sb] = &store.Relay{Hook: store.Webhook{ID: fmt.Sprint("wh-", i+1), TenantID: "t1", SandboxID: sb, Name: hooks.RelayPrefix + "feed",
			Port: 8080, Path: "/feed", Verify: hooks.RelayPrefix + "websocket", TokenHash: []byte{byte(i)}}, Kind: "websocket", Config: string(cfg)}
		if err := db.CreateRelay(ctx, rels[sb]); err != nil {
			t.Fatal(err)
		}
	}
	rs := runRelays(t, ctx, db, hs, emit)
	waitUntil(t, "the running sandbox's relay to connect and relay a message", 10*time.Second, func() bool {
		return rs.state("wh-1").Connected && rs.state("wh-1").Received == 1
	})

	// The sandbox stops (cagebox stop): the manager records it and emits
	// sandbox.stopped, which the audit log hands the relays' watcher; the
	// relay closes at once (its close takes 2 s at most). No event, no
	// sync: relays do not poll.
	sbs["sb-1"].Status = "stopped"
	if err := db.UpdateSandbox(ctx, sbs["sb-1"]); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	rs.lifecycle("t1", "sb-1", api.SandboxStopped{})
	waitUntil(t, "the stopped sandbox's relay to close its connection", 8*time.Second, func() bool {
		_, e := seen("/sb-1")
		return len(e) == 1
	})
	if _, e := seen("/sb-1"); e[0] != websocket.StatusNormalClosure {
		t.Errorf("the server saw the connection end with %d, want a close frame 1000", e[0])
	}
	waitUntil(t, "relay.disconnected", 5*time.Second, func() bool { return len(disconnected()) == 1 })
	t.Logf("closed %v after the stop", time.Since(stopped).Round(time.Millisecond))
	if d := disconnected()[0]; d.Relay != "feed" || d.Code != int(websocket.StatusNormalClosure) || !strings.Contains(d.Reason, "sandbox stopped") {
		t.Errorf("relay.disconnected: %+v, want code 1000 and a reason saying the sandbox stopped", d)
	}
	// Not started again, sync after sync.
	for range 3 {
		rs.sync(ctx)
	}
	time.Sleep(300 * time.Millisecond)
	if n, _ := seen("/sb-1"); n != 1 {
		t.Errorf("the stopped sandbox's relay connected %d times, want once", n)
	}
	// The failed sandbox's relay never ran.
	if n, _ := seen("/sb-2"); n != 0 {
		t.Errorf("the failed sandbox's relay connected %d times", n)
	}
	if got := disconnected(); len(got) != 1 {
		t.Errorf("relay.disconnected events: %+v, want the one", got)
	}
	for sb, want := range map[string]string{"sb-1": "the sandbox stopped", "sb-2": "the sandbox failed"} {
		if v := rs.view(ctx, rels[sb]); v.State.Connected || !v.State.Failed || !strings.Contains(v.State.LastError, want) {
			t.Errorf("relay ls of %s: %+v, want failed: %s", sb, v.State, want)
		}
	}
}

// relayStore is a store on SQLite with tenant t1, and a context that ends
// with the test.
func relayStore(t *testing.T) (*sqlite.Store, context.Context) {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := t.Context()
	if err := db.CreateTenant(ctx, &store.Tenant{ID: "t1", Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	return db, ctx
}

// runRelays runs the store's relays until the test ends.
func runRelays(t *testing.T, ctx context.Context, db store.Store, hs *hooks.Service, emit func(string, string, api.EventPayload)) *relays {
	rs := newRelays(db, hs, nil, emit, slog.New(slog.NewTextHandler(io.Discard, nil)), "", nil, nil)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { rs.run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return rs
}

// waitUntil fails the test unless ok holds within the time given.
func waitUntil(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
