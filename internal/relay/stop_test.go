package relay

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cagebox/cagebox/internal/relay/discordtest"
)

// A stopped relay (its Run's ctx ends: relay rm, its sandbox stopped, the
// daemon's shutdown) says goodbye with a close frame, 1000, within a
// bound, and Run returns only once the connection is closed: Discord ends
// the session and shows the bot offline at once, where a connection that
// is merely dropped leaves the bot online until its heartbeats time out.
func TestDiscordStopClosesCleanly(t *testing.T) {
	for name, phase := range map[string]func(t *testing.T, g *discordtest.Gateway){
		// Connected, reading dispatches.
		"connected": func(t *testing.T, g *discordtest.Gateway) {
			waitFor(t, "identify", g.Connected)
		},
		// The gateway's HELLO came, the relay waits out the identify
		// interval: it has not read from the connection since.
		"identifying": func(t *testing.T, g *discordtest.Gateway) {
			waitFor(t, "the connection", func() bool { return g.Conns() == 1 })
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := gateway(t)
			s := &sink{}
			d := NewDiscord(DiscordConfig{
				URL: g.URL,
				Token: func(context.Context, string) ([]byte, func(), error) {
					b := []byte(testToken)
					return b, func() { clear(b) }, nil
				},
				Deliver:          s.deliver,
				IdentifyInterval: time.Hour,
				MinBackoff:       20 * time.Millisecond,
			})
			if name == "identifying" {
				d.lastIdentify = time.Now() // the next identify waits an hour
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- d.Run(ctx) }()
			phase(t, g)
			cancel()
			start := time.Now()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run = %v, want nil after its ctx ended", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10 s of its ctx's end")
			}
			took := time.Since(start)
			ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel2()
			if err := g.Wait(ctx2, "the connection's end", func(g *discordtest.Gateway) bool { return g.NEnds() == 1 }); err != nil {
				t.Fatal(err)
			}
			if e := g.Ends()[0]; e.Code != int(websocket.StatusNormalClosure) {
				t.Errorf("the gateway saw the connection end with %+v, want a close frame 1000", e)
			}
			if took > 6*time.Second {
				t.Errorf("Run took %v to return after its ctx ended", took)
			}
			time.Sleep(200 * time.Millisecond)
			if g.Conns() != 1 || g.Connected() {
				t.Errorf("%d connections (connected %v) after the stop, want the one, closed", g.Conns(), g.Connected())
			}
			if st := d.Snapshot(); st.Connected {
				t.Errorf("state after the stop: %+v", st)
			}
		})
	}
}

// The generic relay closes the same way.
func TestWebSocketStopClosesCleanly(t *testing.T) {
	var mu sync.Mutex
	var ends []websocket.StatusCode
	conns := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		mu.Lock()
		conns++
		mu.Unlock()
		_ = c.Write(r.Context(), websocket.MessageText, []byte("hello"))
		_, _, err = c.Read(context.Background())
		mu.Lock()
		ends = append(ends, websocket.CloseStatus(err))
		mu.Unlock()
	}))
	defer srv.Close()
	got := make(chan struct{}, 8)
	w := NewWebSocket(WebSocketConfig{
		URL: "ws" + strings.TrimPrefix(srv.URL, "http"),
		Deliver: func(context.Context, string, string, []byte) error {
			got <- struct{}{}
			return nil
		},
		MinBackoff: 20 * time.Millisecond,
	})
	if _, err := stopAfterFirst(t, w, got); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
	waitFor(t, "the server to see the end", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ends) == 1
	})
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if ends[0] != websocket.StatusNormalClosure || conns != 1 {
		t.Errorf("the server saw %d connections, the first ending with %d, want one ending with a close frame 1000", conns, ends[0])
	}
}

// A peer that does not read (and so never answers the close frame) holds
// a stopping relay up for closeWait at most; the frame was sent all the
// same.
func TestStopDoesNotWaitForDeafPeer(t *testing.T) {
	end := make(chan websocket.StatusCode, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		_ = c.Write(r.Context(), websocket.MessageText, []byte("hello"))
		time.Sleep(closeWait + time.Second) // deaf
		_, _, err = c.Read(context.Background())
		end <- websocket.CloseStatus(err)
	}))
	defer srv.Close()
	got := make(chan struct{}, 8)
	w := NewWebSocket(WebSocketConfig{
		URL: "ws" + strings.TrimPrefix(srv.URL, "http"),
		Deliver: func(context.Context, string, string, []byte) error {
			got <- struct{}{}
			return nil
		},
	})
	if took, _ := stopAfterFirst(t, w, got); took > closeWait+time.Second {
		t.Errorf("Run took %v to return, want at most about %v", took, closeWait)
	}
	select {
	case code := <-end:
		if code != websocket.StatusNormalClosure {
			t.Errorf("the deaf server read %d at last, want the close frame 1000", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server never read the end")
	}
}

// stopAfterFirst runs w until got says it relayed a message, then ends its
// context and returns how long Run took to return after that, and what
// it returned.
func stopAfterFirst(t *testing.T, w *WebSocket, got <-chan struct{}) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no message relayed")
	}
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of its ctx's end")
		return 0, nil
	}
}
