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
)

func TestWebSocketRelay(t *testing.T) {
	const secret = "ws-secret-value-123"
	var mu sync.Mutex
	var auths []string
	conns := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		conns++
		n := conns
		mu.Unlock()
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		if n == 1 {
			for _, m := range []string{"a", "b", "c"} {
				_ = c.Write(ctx, websocket.MessageText, []byte(m))
			}
			_ = c.Close(websocket.StatusGoingAway, "bye") // a drop: the relay reconnects
			return
		}
		_ = c.Write(ctx, websocket.MessageBinary, []byte{0, 1, 2})
		<-ctx.Done()
	}))
	defer srv.Close()
	var dmu sync.Mutex
	var got []string
	w := NewWebSocket(WebSocketConfig{
		URL:     "ws" + strings.TrimPrefix(srv.URL, "http") + "/events",
		Headers: []string{"Authorization: Bearer {secret}", "X-Client: cagebox"},
		Secret: func(context.Context, string) ([]byte, func(), error) {
			b := []byte(secret)
			return b, func() { clear(b) }, nil
		},
		Deliver: func(_ context.Context, key, typ string, msg []byte) error {
			dmu.Lock()
			got = append(got, typ+":"+string(msg))
			dmu.Unlock()
			return nil
		},
		MinBackoff: 20 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	waitFor(t, "4 messages over 2 connections", func() bool {
		dmu.Lock()
		defer dmu.Unlock()
		return len(got) == 4
	})
	cancel()
	<-done
	if strings.Join(got, ",") != "text:a,text:b,text:c,binary:\x00\x01\x02" {
		t.Fatalf("delivered %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range auths {
		if a != "Bearer "+secret {
			t.Fatalf("handshake Authorization %q", a)
		}
	}
	st := w.Snapshot()
	if st.Reconnects < 1 || st.Received != 4 || strings.Contains(st.LastError, secret) {
		t.Fatalf("state %+v", st)
	}
}

func TestWebSocketRelayRefusedStops(t *testing.T) {
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		http.Error(w, "no", http.StatusUnauthorized)
	}))
	defer srv.Close()
	w := NewWebSocket(WebSocketConfig{URL: "ws" + strings.TrimPrefix(srv.URL, "http"), MinBackoff: 10 * time.Millisecond,
		Deliver: func(context.Context, string, string, []byte) error { return nil }})
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrAuth) || n != 1 {
			t.Fatalf("Run = %v after %d handshakes, want ErrAuth after 1", err, n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a refused relay kept retrying")
	}
}

func TestParseHeaders(t *testing.T) {
	for _, bad := range []string{"NoColon", "Host: x", "Sec-WebSocket-Key: x", "Bad Name: x", "X: a\r\nY: b"} {
		if ParseHeaders([]string{bad}) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := ParseHeaders([]string{"Authorization: Bearer {secret}"}); err != nil {
		t.Error(err)
	}
}
