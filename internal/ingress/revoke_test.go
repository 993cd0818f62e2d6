package ingress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/cagebox/cagebox/api"
)

const otherID = "sb-fedcba9876543210"

// cutWithin bounds how long after Revoke a cut stream may stay open.
const cutWithin = 2 * time.Second

// portsBackend publishes the given ports of two sandboxes, all served by
// one test server.
type portsBackend struct {
	addr  netip.AddrPort
	ports map[string][]uint16
}

// count reports how many deliveries are tracked.
func (d *deliveries) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, ports := range d.m {
		for _, set := range ports {
			n += len(set)
		}
	}
	return n
}

func (b *portsBackend) Resolve(_ context.Context, id string, port uint16) (*Target, error) {
	for _, p := range b.ports[id] {
		if p == port {
			return &Target{Tenant: "t", Addr: b.addr, Public: true}, nil
		}
	}
	return nil, ErrNotFound
}

func (b *portsBackend) Guest(_ context.Context, id string) (string, netip.Addr, error) {
	if b.ports[id] == nil {
		return "", netip.Addr{}, ErrNotFound
	}
	return "t", b.addr.Addr(), nil
}

func (b *portsBackend) Begin(context.Context, string, string) (func(), error) { return func() {}, nil }

// streamGuest serves /sse (an event every 50 ms until the client goes),
// /ws (a WebSocket echo), /slow (answers only when the client goes) and
// /hook (answers 204 after 500 ms); each handler but /hook reports its
// ?name when it ends.
type streamGuest struct {
	*httptest.Server
	ended   chan string
	arrived chan string
}

func newStreamGuest(t *testing.T) *streamGuest {
	g := &streamGuest{ended: make(chan string, 64), arrived: make(chan string, 64)}
	ws := websocket.Server{Handler: func(c *websocket.Conn) {
		defer func() { g.ended <- c.Request().URL.Query().Get("name") }()
		_, _ = io.Copy(c, c)
	}}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("name")
		switch r.URL.Path {
		case "/ws":
			ws.ServeHTTP(w, r)
			return
		case "/slow":
			g.arrived <- name
			<-r.Context().Done()
		case "/hook":
			g.arrived <- name
			time.Sleep(500 * time.Millisecond) // Revoke comes meanwhile
			w.WriteHeader(http.StatusNoContent)
			return
		case "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			rc := http.NewResponseController(w)
			for {
				if _, err := fmt.Fprintf(w, "data: %s\n\n", name); err != nil {
					break
				}
				if rc.Flush() != nil {
					break
				}
				select {
				case <-r.Context().Done():
				case <-time.After(50 * time.Millisecond):
					continue
				}
				break
			}
		}
		g.ended <- name
	}))
	t.Cleanup(func() {
		g.CloseClientConnections()
		g.Close()
	})
	return g
}

// waitEnded waits for the guest handlers of names to end.
func (g *streamGuest) waitEnded(t *testing.T, names ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	deadline := time.After(cutWithin)
	for len(want) > 0 {
		select {
		case n := <-g.ended:
			if !want[n] {
				t.Errorf("the guest's %s stream ended, and it was not revoked", n)
			}
			delete(want, n)
		case <-deadline:
			t.Fatalf("the guest's streams %v still open %s after Revoke", want, cutWithin)
		}
	}
}

// sseStream is an open event stream through the listener.
type sseStream struct {
	name   string
	events chan string // closed when the stream ends
	err    error       // why it ended, once events is closed
}

func openSSE(t *testing.T, hc *http.Client, base string, id string, port uint16, name string) *sseStream {
	t.Helper()
	req, err := http.NewRequest("GET", base+"/sse?name="+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = HostFor(id, port, "sb.test")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("%s: status %d", name, resp.StatusCode)
	}
	s := &sseStream{name: name, events: make(chan string, 1024)}
	go func() {
		defer close(s.events)
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				s.err = err
				return
			}
			if ev, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok {
				s.events <- ev
			}
		}
	}()
	s.alive(t)
	return s
}

// alive checks that events still arrive.
func (s *sseStream) alive(t *testing.T) {
	t.Helper()
	for {
		select {
		case _, ok := <-s.events:
			if !ok {
				t.Fatalf("%s: the stream ended (%v), and it was not revoked", s.name, s.err)
			}
			// Drained what was buffered; the next one must be new.
			if len(s.events) == 0 {
				select {
				case _, ok := <-s.events:
					if !ok {
						t.Fatalf("%s: the stream ended (%v), and it was not revoked", s.name, s.err)
					}
					return
				case <-time.After(cutWithin):
					t.Fatalf("%s: no event for %s", s.name, cutWithin)
				}
			}
		case <-time.After(cutWithin):
			t.Fatalf("%s: no event for %s", s.name, cutWithin)
		}
	}
}

// cut checks that the stream ends (the client sees its connection end)
// within cutWithin.
func (s *sseStream) cut(t *testing.T) {
	t.Helper()
	deadline := time.After(cutWithin)
	for {
		select {
		case _, ok := <-s.events:
			if !ok {
				if s.err == nil {
					t.Errorf("%s: no error at the end", s.name)
				}
				return
			}
		case <-deadline:
			t.Fatalf("%s: the stream is still open %s after Revoke", s.name, cutWithin)
		}
	}
}

// wsConn is an open WebSocket through the listener.
type wsConn struct {
	name string
	c    *websocket.Conn
}

func openWS(t *testing.T, listener, id string, port uint16, name string, useTLS bool) *wsConn {
	t.Helper()
	host := HostFor(id, port, "sb.test")
	conf, err := websocket.NewConfig("ws://"+host+"/ws?name="+name, "http://"+host)
	if err != nil {
		t.Fatal(err)
	}
	var raw net.Conn
	if useTLS {
		raw, err = tls.Dial("tcp", listener, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
	} else {
		raw, err = net.Dial("tcp", listener)
	}
	if err != nil {
		t.Fatal(err)
	}
	c, err := websocket.NewClient(conf, raw)
	if err != nil {
		raw.Close()
		t.Fatalf("%s: handshake: %v", name, err)
	}
	t.Cleanup(func() { c.Close() })
	w := &wsConn{name: name, c: c}
	w.alive(t)
	return w
}

// alive checks that the WebSocket still echoes.
func (w *wsConn) alive(t *testing.T) {
	t.Helper()
	msg := "ping " + w.name
	if _, err := w.c.Write([]byte(msg)); err != nil {
		t.Fatalf("%s: send: %v", w.name, err)
	}
	_ = w.c.SetReadDeadline(time.Now().Add(cutWithin))
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(w.c, buf); err != nil || string(buf) != msg {
		t.Fatalf("%s: echo %q, %v", w.name, buf, err)
	}
}

// cut checks that the client's connection ends within cutWithin (EOF or
// a reset, not a timeout).
func (w *wsConn) cut(t *testing.T) {
	t.Helper()
	_ = w.c.SetReadDeadline(time.Now().Add(cutWithin))
	_, err := io.Copy(io.Discard, w.c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the WebSocket is still open %s after Revoke", w.name, cutWithin)
	}
}

// TestRevoke: Revoke(id, port) closes the open event streams and
// WebSockets to that port, to the client and to the guest, within
// cutWithin, and fails a request still waiting for the guest; streams to
// other ports and sandboxes go on, and Revoke(id, 0) cuts every port of
// id. Host-side deliveries (Send) are not cut.
func TestRevoke(t *testing.T) {
	guest := newStreamGuest(t)
	// Port p of testID is the guest server's own, so that Send (which
	// goes to the port of the guest's address) reaches it too.
	ap := netip.MustParseAddrPort(guest.Listener.Addr().String())
	p := ap.Port()
	fb := &portsBackend{addr: ap, ports: map[string][]uint16{testID: {p, 8081}, otherID: {p}}}
	events := make(chan api.IngressRequest, 64)
	srv := New(Config{Domain: "sb.test", Backend: fb, Emit: func(_, _ string, ev api.EventPayload) {
		events <- ev.(api.IngressRequest)
	}})
	ts := httptest.NewUnstartedServer(srv)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	defer func() {
		ts.CloseClientConnections()
		ts.Close()
	}()
	h2 := ts.Client()
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer h1.CloseIdleConnections()
	listener := ts.Listener.Addr().String()

	apsse1 := openSSE(t, h1, ts.URL, testID, p, "ap-sse-h1")
	apsse2 := openSSE(t, h2, ts.URL, testID, p, "ap-sse-h2")
	apws := openWS(t, listener, testID, p, "ap-ws", true)
	a81sse := openSSE(t, h2, ts.URL, testID, 8081, "a81-sse")
	a81ws := openWS(t, listener, testID, 8081, "a81-ws", true)
	bsse := openSSE(t, h1, ts.URL, otherID, p, "b-sse")
	bws := openWS(t, listener, otherID, p, "b-ws", true)

	// A request the guest has not answered yet, and a delivery from the
	// host side (a webhook) to the same port.
	type reply struct {
		resp *http.Response
		err  error
	}
	slow := make(chan reply, 1)
	go func() {
		req, _ := http.NewRequest("GET", ts.URL+"/slow?name=ap-slow", nil)
		req.Host = HostFor(testID, p, "sb.test")
		resp, err := h1.Do(req)
		slow <- reply{resp, err}
	}()
	sent := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://guest/hook?name=ap-hook", nil)
		code, err := srv.Send(context.Background(), testID, int(p), req)
		if err == nil && code != http.StatusNoContent {
			err = fmt.Errorf("status %d", code)
		}
		sent <- err
	}()
	for range 2 {
		select {
		case <-guest.arrived:
		case <-time.After(5 * time.Second):
			t.Fatal("the slow request or the webhook did not reach the guest")
		}
	}

	t0 := time.Now()
	srv.Revoke(testID, p)
	apsse1.cut(t)
	apsse2.cut(t)
	apws.cut(t)
	var resp *http.Response
	select {
	case rep := <-slow:
		if rep.err != nil {
			t.Fatalf("a request cut before the guest answered: %v, want a 404", rep.err)
		}
		resp = rep.resp
	case <-time.After(cutWithin):
		t.Fatalf("a request waiting for the guest still waits %s after Revoke", cutWithin)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "revoked") {
		t.Errorf("a request cut before the guest answered: %d %s", resp.StatusCode, body)
	}
	guest.waitEnded(t, "ap-sse-h1", "ap-sse-h2", "ap-ws", "ap-slow")
	t.Logf("port %d of %s cut in %s", p, testID, time.Since(t0))
	// Each cut request is recorded, with what went through it.
	want := map[string]int{"/sse 200": 2, "/ws 101": 1, "/slow 404": 1}
	for len(want) > 0 {
		select {
		case ev := <-events:
			k := fmt.Sprintf("%s %d", ev.Path, ev.Status)
			if want[k] == 0 || ev.Port != int(p) || (ev.Path != "/slow" && ev.BytesOut == 0) {
				t.Errorf("event %+v; want %v", ev, want)
				continue
			}
			if want[k]--; want[k] == 0 {
				delete(want, k)
			}
		case <-time.After(cutWithin):
			t.Fatalf("no ingress.request events of the cut requests %v", want)
		}
	}
	if err := <-sent; err != nil {
		t.Errorf("a host-side delivery to the revoked port: %v", err)
	}
	a81sse.alive(t)
	a81ws.alive(t)
	bsse.alive(t)
	bws.alive(t)

	// The port works again for new requests (the Backend still publishes
	// it here: Revoke cuts only what was under way).
	openWS(t, listener, testID, p, "ap-ws-again", true).alive(t)

	srv.Revoke(testID, 0)
	a81sse.cut(t)
	a81ws.cut(t)
	guest.waitEnded(t, "a81-sse", "a81-ws", "ap-ws-again")
	bsse.alive(t)
	bws.alive(t)

	// Done requests are forgotten.
	bws.c.Close()
	guest.waitEnded(t, "b-ws")
	deadline := time.Now().Add(cutWithin)
	for srv.live.count() != 1 { // b-sse
		if time.Now().After(deadline) {
			t.Fatalf("%d requests tracked, want 1 (b-sse)", srv.live.count())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRevokeBeforeResolve: a request tracked before Revoke is cut even
// when it resolved the port before Revoke (ServeHTTP tracks it first; a
// request tracked after Revoke resolves the port afresh).
func TestRevokeBeforeResolve(t *testing.T) {
	guest := newStreamGuest(t)
	rb := &resolveHeld{portsBackend: portsBackend{addr: netip.MustParseAddrPort(guest.Listener.Addr().String()),
		ports: map[string][]uint16{testID: {8080}}}, held: make(chan struct{}), release: make(chan struct{})}
	srv := New(Config{Domain: "sb.test", Backend: rb})
	done := serveAsync(srv, "/slow?name=raced")
	<-rb.held // resolved with the old state, not yet proxied
	srv.Revoke(testID, 8080)
	close(rb.release)
	select {
	case w := <-done:
		if w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), "revoked") {
			t.Errorf("a request that resolved before Revoke: %d %s", w.Code, w.Body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a request that resolved before Revoke went on")
	}
	if n := srv.live.count(); n != 0 {
		t.Errorf("%d requests still tracked", n)
	}
}

// resolveHeld holds the first Resolve after it has answered.
type resolveHeld struct {
	portsBackend
	once          sync.Once
	held, release chan struct{}
}

func (r *resolveHeld) Resolve(ctx context.Context, id string, port uint16) (*Target, error) {
	t, err := r.portsBackend.Resolve(ctx, id, port)
	r.once.Do(func() {
		close(r.held)
		<-r.release
	})
	return t, err
}

// TestWebSocketBytes: the ingress.request event of a WebSocket counts
// the bytes exchanged after the upgrade, both ways.
func TestWebSocketBytes(t *testing.T) {
	guest := newStreamGuest(t)
	fb := &portsBackend{addr: netip.MustParseAddrPort(guest.Listener.Addr().String()),
		ports: map[string][]uint16{testID: {8080}}}
	events := make(chan api.IngressRequest, 16)
	srv := New(Config{Domain: "sb.test", Backend: fb, Emit: func(_, _ string, ev api.EventPayload) {
		events <- ev.(api.IngressRequest)
	}})
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			ts := httptest.NewUnstartedServer(srv)
			if useTLS {
				ts.StartTLS()
			} else {
				ts.Start()
			}
			defer ts.Close()
			ws := openWS(t, ts.Listener.Addr().String(), testID, 8080, "bytes", useTLS)
			const n = 1 << 20
			payload := []byte(strings.Repeat("0123456789abcdef", n/16))
			go func() {
				for off := 0; off < n; off += 64 << 10 {
					if _, err := ws.c.Write(payload[off : off+64<<10]); err != nil {
						t.Errorf("send: %v", err)
						return
					}
				}
			}()
			_ = ws.c.SetReadDeadline(time.Now().Add(10 * time.Second))
			got := make([]byte, n)
			if _, err := io.ReadFull(ws.c, got); err != nil || string(got) != string(payload) {
				t.Fatalf("echo of %d bytes: %v", n, err)
			}
			ws.c.Close()
			select {
			case ev := <-events:
				if ev.Status != http.StatusSwitchingProtocols || ev.BytesIn < n || ev.BytesOut < n {
					t.Errorf("event: status %d, bytes in %d, out %d; want 101 and ≥ %d each way", ev.Status, ev.BytesIn, ev.BytesOut, n)
				}
				t.Logf("event: bytes in %d, out %d", ev.BytesIn, ev.BytesOut)
			case <-time.After(5 * time.Second):
				t.Fatal("no ingress.request event after the WebSocket closed")
			}
		})
	}
}

// beginHeld is a sandbox asleep: Begin waits for the wake until released
// or the request's context ends.
type beginHeld struct {
	portsBackend
	waking, release chan struct{}
}

func (b *beginHeld) Begin(ctx context.Context, _, _ string) (func(), error) {
	close(b.waking)
	select {
	case <-b.release:
		return func() {}, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("wake: %w", ctx.Err())
	}
}

// TestRevokeDuringWake: a request waiting for its sleeping sandbox to
// wake when the port is revoked gets the revoked 404 at once, not a 503
// that asks it to try again.
func TestRevokeDuringWake(t *testing.T) {
	guest := newStreamGuest(t)
	b := &beginHeld{portsBackend: portsBackend{addr: netip.MustParseAddrPort(guest.Listener.Addr().String()),
		ports: map[string][]uint16{testID: {8080}}}, waking: make(chan struct{}), release: make(chan struct{})}
	defer close(b.release)
	srv := New(Config{Domain: "sb.test", Backend: b})
	done := serveAsync(srv, "/?name=asleep")
	<-b.waking
	srv.Revoke(testID, 8080)
	select {
	case w := <-done:
		if w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), "revoked") {
			t.Errorf("revoked during the wake: %d %s, want the revoked 404", w.Code, w.Body)
		}
	case <-time.After(cutWithin):
		t.Fatal("a request waiting for the wake went on after Revoke")
	}
}

// serveAsync serves a GET of target on port 8080 of testID in the
// background; the recorder comes when ServeHTTP returns.
func serveAsync(srv *Server, target string) <-chan *httptest.ResponseRecorder {
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		r := httptest.NewRequest("GET", target, nil)
		r.Host = HostFor(testID, 8080, "sb.test")
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		done <- w
	}()
	return done
}
