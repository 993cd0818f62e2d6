package ingress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
)

// guestEnv is an ingress Server in front of a guest server on loopback,
// reached by a plain HTTP/1.1 front (the --ingress-plain listener) and a
// TLS front that speaks HTTP/2.
type guestEnv struct {
	srv          *Server
	guest        *httptest.Server
	plain, tls   *httptest.Server
	fb           *fakeBackend
	guestConns   atomic.Int64
	mu           sync.Mutex
	events       []api.IngressRequest
	plainC, tlsC *http.Client
}

func newGuestEnv(t *testing.T, h http.HandlerFunc) *guestEnv {
	t.Helper()
	e := &guestEnv{}
	e.guest = httptest.NewUnstartedServer(h)
	e.guest.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			e.guestConns.Add(1)
		}
	}
	e.guest.Start()
	t.Cleanup(e.guest.Close)
	e.fb = &fakeBackend{target: &Target{Tenant: "t", Addr: netip.MustParseAddrPort(e.guest.Listener.Addr().String()), Public: true}}
	e.srv = New(Config{Domain: "sb.test", Backend: e.fb, Rate: -1, Emit: func(_, _ string, ev api.EventPayload) {
		e.mu.Lock()
		e.events = append(e.events, ev.(api.IngressRequest))
		e.mu.Unlock()
	}})
	e.plain = httptest.NewServer(e.srv)
	t.Cleanup(e.plain.Close)
	e.tls = httptest.NewUnstartedServer(e.srv)
	e.tls.EnableHTTP2 = true
	e.tls.StartTLS()
	t.Cleanup(e.tls.Close)
	e.plainC = &http.Client{Transport: &http.Transport{}}
	e.tlsC = e.tls.Client()
	t.Cleanup(func() {
		e.plainC.CloseIdleConnections()
		e.tlsC.CloseIdleConnections()
		e.srv.CloseIdle()
	})
	return e
}

func (e *guestEnv) req(t *testing.T, ctx context.Context, front *httptest.Server, method, path string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, front.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "8080-" + testID + ".sb.test"
	return req
}

func (e *guestEnv) client(front *httptest.Server) *http.Client {
	if front == e.tls {
		return e.tlsC
	}
	return e.plainC
}

// get does a GET through front and returns the status and body.
func (e *guestEnv) get(t *testing.T, front *httptest.Server, path string) (*http.Response, []byte) {
	t.Helper()
	resp, err := e.client(front).Do(e.req(t, context.Background(), front, "GET", path))
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: body: %v", path, err)
	}
	return resp, b
}

func (e *guestEnv) waitIdle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.fb.mu.Lock()
		busy := e.fb.busy
		e.fb.mu.Unlock()
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests still counted busy", busy)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestGuestClientBodies: Content-Length bodies reach the client byte for
// byte, and so do chunked and empty ones and HEAD; the guest's connection
// serves them all one after another; the events count every byte.
func TestGuestClientBodies(t *testing.T) {
	big := make([]byte, 4<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	e := newGuestEnv(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			w.Write(big)
		case "/chunked":
			for i := 0; i < 3; i++ {
				fmt.Fprintf(w, "part %d;", i)
				w.(http.Flusher).Flush()
			}
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Write([]byte("ok " + r.Method))
		}
	})
	for _, front := range []*httptest.Server{e.plain, e.tls} {
		name := "plain"
		if front == e.tls {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			conns := e.guestConns.Load()
			for i := 0; i < 3; i++ {
				resp, b := e.get(t, front, "/big")
				if resp.StatusCode != 200 || sha256.Sum256(b) != sha256.Sum256(big) {
					t.Fatalf("GET /big %d: %d, %d bytes, not the guest's", i, resp.StatusCode, len(b))
				}
			}
			if resp, b := e.get(t, front, "/chunked"); resp.StatusCode != 200 || string(b) != "part 0;part 1;part 2;" {
				t.Errorf("chunked: %d %q", resp.StatusCode, b)
			}
			if resp, b := e.get(t, front, "/empty"); resp.StatusCode != 204 || len(b) != 0 {
				t.Errorf("204: %d %q", resp.StatusCode, b)
			}
			resp, err := e.client(front).Do(e.req(t, context.Background(), front, "HEAD", "/big"))
			if err != nil || resp.StatusCode != 200 || resp.ContentLength != int64(len(big)) {
				t.Fatalf("HEAD: %v %+v", err, resp)
			}
			resp.Body.Close()
			if resp, b := e.get(t, front, "/"); string(b) != "ok GET" {
				t.Errorf("small GET: %d %q", resp.StatusCode, b)
			}
			if n := e.guestConns.Load() - conns; n > 1 {
				t.Errorf("%d guest connections for requests one after another, want one kept", n)
			}
		})
	}
	e.waitIdle(t)
	e.mu.Lock()
	defer e.mu.Unlock()
	var bigs int
	for _, ev := range e.events {
		if ev.Path == "/big" && ev.Method == "GET" {
			bigs++
			if ev.BytesOut != int64(len(big)) || ev.Status != 200 {
				t.Errorf("event %+v: want %d bytes out", ev, len(big))
			}
		}
	}
	if bigs != 6 {
		t.Errorf("%d events of GET /big, want 6", bigs)
	}
}

// TestGuestClientStreams: nothing is held back while the guest is slow —
// the first half of a Content-Length body and the first event of a stream
// reach the client before the guest sends the rest.
func TestGuestClientStreams(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	e := newGuestEnv(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			// Less than any buffer on the way: only a flush sends it.
			w.Header().Set("Content-Length", "2000")
			w.Write(bytes.Repeat([]byte("a"), 1000))
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			w.Write(bytes.Repeat([]byte("b"), 1000))
		case "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Content-Length", "30") // a stream that says its length
			io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			io.WriteString(w, "data: secondxxxx\n\n")
		}
	})
	for _, front := range []*httptest.Server{e.plain, e.tls} {
		for _, tc := range []struct {
			path string
			want int
		}{{"/slow", 1000}, {"/sse", len("data: first\n\n")}} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := e.client(front).Do(e.req(t, ctx, front, "GET", tc.path))
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, tc.want)
			done := make(chan error, 1)
			go func() { _, err := io.ReadFull(resp.Body, got); done <- err }()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s %s: %v", front.URL, tc.path, err)
				}
			case <-time.After(3 * time.Second):
				t.Errorf("%s %s: the first %d bytes were held back while the guest waited", front.URL, tc.path, tc.want)
			}
			cancel()
			resp.Body.Close()
		}
	}
	once.Do(func() { close(release) })
	e.waitIdle(t)
}

// TestGuestClientFailures: a guest that lies or misbehaves costs the
// client an error, never a hang or a kept broken connection.
func TestGuestClientFailures(t *testing.T) {
	var phase atomic.Int32
	e := newGuestEnv(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/short":
			// Says 1 MiB, sends 100 KiB, hangs up.
			w.Header().Set("Content-Length", strconv.Itoa(1<<20))
			w.Write(bytes.Repeat([]byte("s"), 100<<10))
			w.(http.Flusher).Flush()
			c, _, _ := http.NewResponseController(w).Hijack()
			c.Close()
		case "/hints":
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Write([]byte("after hints"))
		case "/stall":
			w.Header().Set("Content-Length", "1000")
			w.Write([]byte("x"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			w.Write([]byte(fmt.Sprint("phase ", phase.Load())))
		}
	})
	for _, front := range []*httptest.Server{e.plain, e.tls} {
		resp, err := e.client(front).Do(e.req(t, context.Background(), front, "GET", "/short"))
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err == nil {
			t.Errorf("%s: a body cut short by the guest read as whole", front.URL)
		}
		// 103 Early Hints reach the client, then the answer.
		var hints []int
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			if h.Get("Link") != "" {
				hints = append(hints, code)
			}
			return nil
		}})
		resp, err = e.client(front).Do(e.req(t, ctx, front, "GET", "/hints"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "after hints" || len(hints) != 1 || hints[0] != 103 {
			t.Errorf("%s: early hints %v, body %q", front.URL, hints, b)
		}
		// A client that gives up on a stalled guest frees its request.
		ctx, cancel := context.WithCancel(context.Background())
		resp, err = e.client(front).Do(e.req(t, ctx, front, "GET", "/stall"))
		if err != nil {
			t.Fatal(err)
		}
		one := make([]byte, 1)
		if _, err := io.ReadFull(resp.Body, one); err != nil {
			t.Fatal(err)
		}
		cancel()
		resp.Body.Close()
		e.waitIdle(t)
	}
	// The guest drops its idle connections (a restart): the next request
	// is sent again on a new one, and succeeds.
	e.get(t, e.plain, "/") // one kept connection
	phase.Store(1)
	e.guest.CloseClientConnections()
	time.Sleep(50 * time.Millisecond)
	for _, front := range []*httptest.Server{e.plain, e.tls} {
		if resp, b := e.get(t, front, "/"); resp.StatusCode != 200 || string(b) != "phase 1" {
			t.Errorf("%s after the guest closed its connections: %d %q", front.URL, resp.StatusCode, b)
		}
	}

}

// TestGuestClientHostile: a guest that sends endless headers or 1xx
// answers gets a 502, not the daemon's memory.
func TestGuestClientHostile(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				switch req.URL.Path {
				case "/headers":
					io.WriteString(c, "HTTP/1.1 200 OK\r\n")
					line := "X-Pad: " + strings.Repeat("p", 1000) + "\r\n"
					for i := 0; i < 4000; i++ { // 4 MB of header
						if _, err := io.WriteString(c, line); err != nil {
							return
						}
					}
					io.WriteString(c, "Content-Length: 2\r\n\r\nok")
				case "/1xx":
					for i := 0; i < 100; i++ {
						if _, err := io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"); err != nil {
							return
						}
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}()
		}
	}()
	fb := &fakeBackend{target: &Target{Tenant: "t", Addr: netip.MustParseAddrPort(ln.Addr().String()), Public: true}}
	srv := New(Config{Domain: "sb.test", Backend: fb, Rate: -1})
	front := httptest.NewServer(srv)
	defer front.Close()
	for _, path := range []string{"/headers", "/1xx"} {
		req, _ := http.NewRequest("GET", front.URL+path, nil)
		req.Host = "8080-" + testID + ".sb.test"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("%s: %d, want 502", path, resp.StatusCode)
		}
	}
}

// TestGuestClientRetry: a kept connection the guest closes on receiving
// the next request, without an answer, costs nothing: the request is sent
// again on a new connection. One that fails after an answer began is not.
func TestGuestClientRetry(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := accepted.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for i := 0; ; i++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					switch {
					case n == 1 && i == 1:
						return // the second request on the first connection: hang up
					case req.URL.Path == "/half":
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Le")
						return
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}()
		}
	}()
	g := newGuestClient((&net.Dialer{}).DialContext)
	defer g.CloseIdleConnections()
	get := func(path string) (string, error) {
		req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+path, nil)
		resp, err := g.RoundTrip(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	for i := 0; i < 2; i++ {
		if b, err := get("/"); err != nil || b != "ok" {
			t.Fatalf("GET %d: %q %v", i, b, err)
		}
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2 (the first kept, then hung up on; the request sent again)", n)
	}
	if _, err := get("/half"); err == nil || errors.Is(err, errNoAnswer) {
		t.Errorf("an answer cut in its header: %v, want an error that is not errNoAnswer", err)
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("%d connections: a request whose answer began was sent again", n)
	}
}

// TestGuestClientCloseEndless: closing the body of an endless answer part
// read (the client went) returns at once and drops the connection; it
// does not read the stream to an end that never comes.
func TestGuestClientCloseEndless(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer close(closed)
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
		chunk := "400\r\n" + strings.Repeat("x", 0x400) + "\r\n"
		for {
			if _, err := io.WriteString(c, chunk); err != nil {
				return // the client closed
			}
		}
	}()
	g := newGuestClient((&net.Dialer{}).DialContext)
	req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/", nil)
	resp, err := g.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { resp.Body.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Close of an endless body did not return: it drains")
	}
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Fatal("the guest's connection stayed open")
	}
}
