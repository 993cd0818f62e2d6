package router

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/cagebox/cagebox/internal/testpki"
)

const (
	domain = "example.test"
	idA    = "sb-00000000000000a1"
	idB    = "sb-00000000000000b2"
	idGone = "sb-00000000000000ff"
)

// node is a stand-in for one node's ingress listener: TLS terminated
// there (h2 and http/1.1), plus a raw TLS echo on "echo" hosts.
type node struct {
	name string
	addr string
	srv  *http.Server
}

func startNode(t testing.TB, name string, pki *testpki.PKI) *node {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{name: name, addr: ln.Addr().String()}
	n.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "node=%s host=%s proto=%s", name, r.Host, r.Proto)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pki.Leaf}, NextProtos: []string{"echo", "sink"}},
	}
	if err := http2.ConfigureServer(n.srv, nil); err != nil {
		t.Fatal(err)
	}
	// "echo" is a long-lived stream (a WebSocket stand-in): every line
	// comes back; at the client's EOF the node says how many lines it
	// saw, after the client stopped sending.
	n.srv.TLSNextProto["echo"] = func(_ *http.Server, c *tls.Conn, _ http.Handler) {
		br := bufio.NewReader(c)
		lines := 0
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				break
			}
			lines++
			if _, err := c.Write([]byte(l)); err != nil {
				return
			}
		}
		fmt.Fprintf(c, "bye %d\n", lines)
	}
	// "sink" reads to EOF and answers how many bytes it got.
	n.srv.TLSNextProto["sink"] = func(_ *http.Server, c *tls.Conn, _ http.Handler) {
		k, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d\n", k)
	}
	go func() { _ = n.srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = n.srv.Close() })
	return n
}

type fixture struct {
	r     *Router
	addr  string
	pki   *testpki.PKI
	dials atomic.Int64
	a, b  *node
	done  chan error
}

func setup(t testing.TB, mod func(*Config)) *fixture {
	t.Helper()
	pki, err := testpki.New(time.Hour, "*."+domain)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{pki: pki}
	f.a = startNode(t, "a", pki)
	f.b = startNode(t, "b", pki)
	nodes := map[string]string{idA: f.a.addr, idB: f.b.addr}
	d := &net.Dialer{}
	cfg := Config{
		Domain: domain,
		Lookup: func(id string) (string, bool) { a, ok := nodes[id]; return a, ok },
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel(t)})),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			f.dials.Add(1)
			return d.DialContext(ctx, network, addr)
		},
		HelloTimeout: 500 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	f.r = New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	f.done = make(chan error, 1)
	go func() { f.done <- f.r.Serve(ln) }()
	t.Cleanup(func() {
		_ = f.r.Close()
		if err := <-f.done; !errors.Is(err, ErrClosed) {
			t.Errorf("Serve = %v, want ErrClosed", err)
		}
	})
	return f
}

// client is an HTTPS client that reaches every name through the router.
func (f *fixture) client(h2 bool) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", f.addr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: f.pki.Pool},
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestRoutesBySNI(t *testing.T) {
	f := setup(t, nil)
	for _, tc := range []struct {
		id, node string
		h2       bool
	}{{idA, "a", true}, {idB, "b", true}, {idA, "a", false}, {idB, "b", false}} {
		host := "8080-" + tc.id + "." + domain
		got := get(t, f.client(tc.h2), "https://"+host+"/")
		proto := "HTTP/1.1"
		if tc.h2 {
			proto = "HTTP/2.0"
		}
		if want := fmt.Sprintf("node=%s host=%s proto=%s", tc.node, host, proto); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	// Letter case and a trailing dot in the URL still route (the TLS
	// client drops the dot from the SNI).
	if got := get(t, f.client(true), "https://8080-"+strings.ToUpper(idB[:2])+idB[2:]+".EXAMPLE.test/"); !strings.HasPrefix(got, "node=b ") {
		t.Errorf("mixed case: %q", got)
	}
	if st := f.r.Stats(); st.Routed < 5 || st.NoSNI+st.BadHost+st.Unknown+st.NoTLS+st.Slow != 0 {
		t.Errorf("stats %+v", st)
	}
}

// A long two-way stream with pauses passes through, and a client that
// half-closes still gets the node's last words.
func TestLongStreamAndHalfClose(t *testing.T) {
	f := setup(t, func(c *Config) { c.IdleTimeout = 400 * time.Millisecond })
	raw, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := tls.Client(raw, &tls.Config{RootCAs: f.pki.Pool, ServerName: "9000-" + idB + "." + domain, NextProtos: []string{"echo"}})
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	const n = 40
	for i := range n {
		msg := fmt.Sprintf("message %d %s\n", i, strings.Repeat("x", i*200))
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		got, err := br.ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echo %d: %q, %v", i, trim(got), err)
		}
		if i%10 == 0 {
			time.Sleep(250 * time.Millisecond) // quiet, under the idle timeout
		}
	}
	if err := c.CloseWrite(); err != nil { // TLS close_notify
		t.Fatal(err)
	}
	if err := raw.(*net.TCPConn).CloseWrite(); err != nil { // TCP FIN
		t.Fatal(err)
	}
	got, err := br.ReadString('\n')
	if err != nil || got != fmt.Sprintf("bye %d\n", n) {
		t.Fatalf("after half-close: %q, %v", got, err)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the node closed: %v, want EOF", err)
	}
}

// A spliced connection that moves nothing either way is closed after
// IdleTimeout; one that moves bytes one way only is not.
func TestIdleTimeout(t *testing.T) {
	f := setup(t, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	dial := func() (*tls.Conn, *bufio.Reader) {
		c, err := tls.Dial("tcp", f.addr, &tls.Config{RootCAs: f.pki.Pool, ServerName: "9000-" + idA + "." + domain, NextProtos: []string{"echo"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return c, bufio.NewReader(c)
	}
	// Busy one way (client → node every 100 ms, echoes back) for 1.2 s.
	c, br := dial()
	for i := range 12 {
		fmt.Fprintf(c, "%d\n", i)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatalf("busy connection cut after %d lines: %v", i, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.Close()
	// Quiet: cut.
	c, br = dial()
	start := time.Now()
	_, err := br.ReadByte()
	if err == nil {
		t.Fatal("idle connection got a byte")
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Errorf("idle connection closed after %v (err %v), want ~300ms", d, err)
	}
	waitFor(t, func() bool { return f.r.Stats().Idle == 1 })
}

// Connections the router cannot route are closed without a dial to any
// node.
func TestRefusedWithoutDialing(t *testing.T) {
	f := setup(t, nil)
	tlsTry := func(sni string) error {
		raw, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		c := tls.Client(raw, &tls.Config{RootCAs: f.pki.Pool, ServerName: sni, InsecureSkipVerify: sni == ""})
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		return c.Handshake()
	}
	for _, tc := range []struct {
		name, sni string
		stat      func(Stats) int64
	}{
		{"unknown sandbox", "8080-" + idGone + "." + domain, func(s Stats) int64 { return s.Unknown }},
		{"wrong domain", "8080-" + idA + ".example.other", func(s Stats) int64 { return s.BadHost }},
		{"below the domain", "8080-" + idA + ".x." + domain, func(s Stats) int64 { return s.BadHost }},
		{"not PORT-ID", "hooks." + domain, func(s Stats) int64 { return s.BadHost }},
		{"port 0", "0-" + idA + "." + domain, func(s Stats) int64 { return s.BadHost }},
		{"no SNI", "", func(s Stats) int64 { return s.NoSNI }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.stat(f.r.Stats())
			if err := tlsTry(tc.sni); err == nil {
				t.Fatal("handshake succeeded")
			}
			waitFor(t, func() bool { return tc.stat(f.r.Stats()) == before+1 })
		})
	}
	t.Run("plain HTTP", func(t *testing.T) {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: 8080-%s.%s\r\n\r\n", idA, domain)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Fatalf("read %d, %v; want closed", n, err)
		}
		waitFor(t, func() bool { return f.r.Stats().NoTLS == 1 })
	})
	t.Run("oversized ClientHello", func(t *testing.T) {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// A handshake message claiming 1 MB, in full records.
		msg := []byte{1, 0x10, 0, 0}
		rec := append([]byte{0x16, 3, 1, 0x40, 0}, msg...)
		rec = append(rec, make([]byte, 1<<14-len(msg))...)
		go func() {
			for range 4 {
				if _, err := c.Write(rec); err != nil {
					return
				}
				rec = append([]byte{0x16, 3, 1, 0x40, 0}, make([]byte, 1<<14)...)
			}
		}()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Fatalf("read %d, %v; want closed", n, err)
		}
		waitFor(t, func() bool { return f.r.Stats().NoTLS == 2 })
	})
	if n := f.dials.Load(); n != 0 {
		t.Errorf("%d dials to nodes for refused connections", n)
	}
}

// A ClientHello that never ends, or one trickled a byte at a time
// (slowloris), is cut at HelloTimeout from accept, not extended by each
// byte.
func TestSlowHello(t *testing.T) {
	f := setup(t, func(c *Config) { c.HelloTimeout = 400 * time.Millisecond })
	hello := clientHello(t, "8080-"+idA+"."+domain)
	for _, tc := range []struct {
		name  string
		write func(c net.Conn)
	}{
		{"never ends", func(c net.Conn) { _, _ = c.Write(hello[:len(hello)/2]) }},
		{"slowloris", func(c net.Conn) {
			for _, b := range hello {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}},
		{"silent", func(net.Conn) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			go tc.write(c)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
				t.Fatalf("read %d, %v; want closed by the router", n, err)
			}
			if d := time.Since(start); d < 350*time.Millisecond || d > 2*time.Second {
				t.Errorf("closed after %v, want ~400ms", d)
			}
		})
	}
	waitFor(t, func() bool { return f.r.Stats().Slow == 3 })
	if st := f.r.Stats(); st.Slow != 3 || f.dials.Load() != 0 {
		t.Errorf("stats %+v, dials %d; want 3 slow, no dial", st, f.dials.Load())
	}
}

// A node whose ingress does not answer: the client's connection is
// closed, and counted.
func TestNodeUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	f := setup(t, func(c *Config) {
		c.Lookup = func(string) (string, bool) { return dead, true }
	})
	c, err := tls.Dial("tcp", f.addr, &tls.Config{RootCAs: f.pki.Pool, ServerName: "8080-" + idA + "." + domain})
	if err == nil {
		c.Close()
		t.Fatal("handshake through to a dead node")
	}
	waitFor(t, func() bool { return f.r.Stats().DialFail == 1 })
}

func TestConnectionCap(t *testing.T) {
	f := setup(t, func(c *Config) { c.MaxConns = 2; c.HelloTimeout = 5 * time.Second })
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		defer c.Close()
	}
	waitFor(t, func() bool { return f.r.Stats().Accepted == 2 })
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
		t.Fatalf("third connection: read %d, %v; want closed at once", n, err)
	}
	waitFor(t, func() bool { return f.r.Stats().Busy == 1 })
	// Freeing one admits a new one, which routes.
	held[0].Close()
	waitFor(t, func() bool { return f.r.open.Load() < 2 })
	if got := get(t, f.client(true), "https://8080-"+idA+"."+domain+"/"); !strings.HasPrefix(got, "node=a ") {
		t.Errorf("after freeing: %q", got)
	}
}

// Close ends spliced connections and Serve.
func TestClose(t *testing.T) {
	f := setup(t, nil)
	c, err := tls.Dial("tcp", f.addr, &tls.Config{RootCAs: f.pki.Pool, ServerName: "9000-" + idA + "." + domain, NextProtos: []string{"echo"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		if err == nil || isTimeout(err) {
			t.Errorf("read after Close: %v, want closed", err)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	if err := f.r.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func clientHello(t *testing.T, sni string) []byte {
	t.Helper()
	c, s := net.Pipe()
	go func() { _ = tls.Client(c, &tls.Config{ServerName: sni}).Handshake(); c.Close() }()
	defer s.Close()
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(s, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(s, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met in 5s")
}

func logLevel(t testing.TB) slog.Level {
	if _, ok := t.(*testing.B); ok {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// BenchmarkRouter compares a client reaching a node's ingress directly
// with the same through the router: a new TLS connection and one HTTP
// request each, and a bulk upload.
func BenchmarkRouter(b *testing.B) {
	f := setup(b, nil)
	host := "8080-" + idA + "." + domain
	for _, via := range []struct{ name, addr string }{{"direct", f.a.addr}, {"router", f.addr}} {
		b.Run("connect+GET/"+via.name, func(b *testing.B) {
			conf := &tls.Config{RootCAs: f.pki.Pool, ServerName: host, NextProtos: []string{"http/1.1"}, ClientSessionCache: nil}
			for b.Loop() {
				c, err := tls.Dial("tcp", via.addr, conf)
				if err != nil {
					b.Fatal(err)
				}
				fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
				if _, err := io.Copy(io.Discard, c); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
		b.Run("upload-64MiB/"+via.name, func(b *testing.B) {
			const size = 64 << 20
			buf := make([]byte, 256<<10)
			b.SetBytes(size)
			for b.Loop() {
				raw, err := net.Dial("tcp", via.addr)
				if err != nil {
					b.Fatal(err)
				}
				c := tls.Client(raw, &tls.Config{RootCAs: f.pki.Pool, ServerName: host, NextProtos: []string{"sink"}})
				for sent := 0; sent < size; sent += len(buf) {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				_ = c.CloseWrite()
				_ = raw.(*net.TCPConn).CloseWrite()
				got, err := bufio.NewReader(c).ReadString('\n')
				if err != nil || got != fmt.Sprintf("%d\n", size) {
					b.Fatalf("sink got %q, %v", got, err)
				}
				c.Close()
			}
		})
	}
}
