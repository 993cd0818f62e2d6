package egress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Synthetic destinations the test sandbox's "DNS" handed out.
var (
	dstAPI   = netip.MustParseAddrPort("198.18.0.5:443")
	dstBad   = netip.MustParseAddrPort("198.18.0.6:443")
	dstTCP   = netip.MustParseAddrPort("198.18.0.7:5432")
	dstPlain = netip.MustParseAddrPort("198.18.0.8:80")
	dstOther = netip.MustParseAddrPort("198.18.0.9:443")
	dstSpeak = netip.MustParseAddrPort("198.18.0.10:2525")
	dstIP    = netip.MustParseAddrPort("10.0.0.1:443")
)

var names = map[netip.Addr]string{
	dstAPI.Addr():   "api.example.test",
	dstBad.Addr():   "bad.example.test",
	dstTCP.Addr():   "tcp.example.test",
	dstPlain.Addr(): "plain.example.test",
	dstOther.Addr(): "other.example.test",
	dstSpeak.Addr(): "smtp.example.test",
}

// testCA is an upstream certificate authority made by the test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "upstream test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

func (ca *testCA) issue(t testing.TB, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// seen is what an upstream observed of one request.
type seen struct {
	Method, Host, Path, Proto string
	XFF                       []string
	Header                    http.Header
	URI                       string // the request target as received
}

type upstream struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []seen
}

func (u *upstream) record(r *http.Request) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.reqs = append(u.reqs, seen{r.Method, r.Host, r.URL.Path, r.Proto, r.Header.Values("X-Forwarded-For"), r.Header.Clone(), r.RequestURI})
}

func (u *upstream) seen() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.reqs...)
}

// newUpstream starts an HTTPS upstream (HTTP/1.1 and HTTP/2) with cert.
func newUpstream(t testing.TB, cert tls.Certificate, h http.Handler) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.record(r)
		h.ServeHTTP(w, r)
	}))
	u.EnableHTTP2 = true
	u.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	u.StartTLS()
	t.Cleanup(u.Close)
	return u
}

func addrPort(t testing.TB, a net.Addr) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

type harness struct {
	t       testing.TB
	p       *Proxy
	addr    string
	sb      *Sandbox
	caPool  *x509.CertPool
	dst     atomic.Pointer[netip.AddrPort]
	policy  atomic.Pointer[PolicyFunc]
	api     *upstream
	plain   *upstream
	release chan struct{} // unblocks the SSE handler

	mu     sync.Mutex
	events []Event
}

type harnessOpt func(*Config)

func newHarness(t testing.TB, opts ...harnessOpt) *harness {
	t.Helper()
	h := &harness{t: t, release: make(chan struct{})}
	upCA := newTestCA(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "hello from upstream: "+r.Method+" "+r.URL.Path+" "+string(b))
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/target", http.StatusFound)
	})
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-h.release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: two\n\n")
	})
	mux.HandleFunc("/ws", wsEcho)
	h.api = newUpstream(t, upCA.issue(t, "api.example.test"), mux)

	// bad.example.test presents a certificate from a CA nobody trusts.
	bad := newUpstream(t, newTestCA(t).issue(t, "bad.example.test"), mux)

	h.plain = &upstream{}
	h.plain.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.plain.record(r)
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(h.plain.Close)

	echo := newTCPServer(t, func(c net.Conn) { io.Copy(c, c) })
	speaker := newTCPServer(t, func(c net.Conn) {
		io.WriteString(c, "220 smtp.example.test ready\r\n")
		io.Copy(c, c)
	})

	ca, err := NewCA("sb-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h.caPool = x509.NewCertPool()
	if !h.caPool.AppendCertsFromPEM(ca.CertPEM()) {
		t.Fatal("bad CA PEM")
	}
	h.setPolicy(defaultTestPolicy)
	h.sb = &Sandbox{
		ID: "sb-test", Tenant: "tenant-a", CA: ca,
		Policy: PolicyFunc(func(ctx context.Context, r *Request) (Decision, error) {
			return (*h.policy.Load())(ctx, r)
		}),
		NameOf: func(a netip.Addr) (string, bool) {
			n, ok := names[a]
			return n, ok
		},
	}
	h.setDst(dstAPI)

	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	cfg := Config{
		Lookup: func(c net.Conn) (*Sandbox, netip.AddrPort, bool) {
			return h.sb, *h.dst.Load(), true
		},
		OnEvent: func(ev Event) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.events = append(h.events, ev)
		},
		Resolve: map[string]netip.AddrPort{
			"api.example.test:443":   addrPort(t, h.api.Listener.Addr()),
			"bad.example.test:443":   addrPort(t, bad.Listener.Addr()),
			"plain.example.test:80":  addrPort(t, h.plain.Listener.Addr()),
			"tcp.example.test:5432":  addrPort(t, echo.Addr()),
			"smtp.example.test:2525": addrPort(t, speaker.Addr()),
		},
		UpstreamCAs: upCA.pool,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
	for _, o := range opts {
		o(&cfg)
	}
	h.p, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = l.Addr().String()
	served := make(chan error, 1)
	go func() { served <- h.p.Serve(l) }()
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
		if err := h.p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return h
}

// defaultTestPolicy allows HTTP to api/plain/bad except /admin and DoH, and
// nothing else.
func defaultTestPolicy(_ context.Context, r *Request) (Decision, error) {
	switch {
	case r.Protocol == "tcp":
		return Decision{Rule: "default-deny", Reason: "no rule allows raw TCP"}, nil
	case r.ContentType == "application/dns-message" || r.Accept == "application/dns-message":
		return Decision{Rule: "deny-doh", Reason: "DNS over HTTPS is not allowed"}, nil
	case r.WebSocket:
		return Decision{Rule: "default-deny", Reason: "no rule allows WebSocket"}, nil
	case strings.HasPrefix(r.Path, "/admin"):
		return Decision{Rule: "deny-admin", Reason: "admin API is off limits"}, nil
	case r.Host == "api.example.test" || r.Host == "plain.example.test" || r.Host == "bad.example.test":
		return Decision{Allow: true, Rule: "allow-" + strings.Split(r.Host, ".")[0]}, nil
	}
	return Decision{Rule: "default-deny", Reason: "no rule matches"}, nil
}

func (h *harness) setPolicy(f PolicyFunc)  { h.policy.Store(&f) }
func (h *harness) setDst(d netip.AddrPort) { h.dst.Store(&d) }

func (h *harness) takeEvents() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	ev := h.events
	h.events = nil
	return ev
}

// waitEvents waits until at least n events were recorded.
func (h *harness) waitEvents(n int) []Event {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.mu.Lock()
		got := len(h.events)
		h.mu.Unlock()
		if got >= n || time.Now().After(deadline) {
			return h.takeEvents()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) dialProxy(ctx context.Context, _, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", h.addr)
}

// client is the sandbox's HTTP client: every connection goes to the proxy
// (as the REDIRECT would make it), trusting only the sandbox CA.
func (h *harness) client(h2 bool) *http.Client {
	tr := &http.Transport{
		DialContext:         h.dialProxy,
		TLSClientConfig:     &tls.Config{RootCAs: h.caPool},
		ForceAttemptHTTP2:   h2,
		MaxIdleConnsPerHost: 100,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	h.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{
		Transport:     tr,
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// tlsDial opens a raw TLS connection to the proxy as the sandbox would.
func (h *harness) tlsDial(serverName string, protos ...string) (*tls.Conn, error) {
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, &tls.Config{ServerName: serverName, RootCAs: h.caPool, NextProtos: protos,
		InsecureSkipVerify: serverName == ""})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

type tcpServer struct{ l net.Listener }

func (s *tcpServer) Addr() net.Addr { return s.l.Addr() }

func newTCPServer(t testing.TB, handle func(net.Conn)) *tcpServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return &tcpServer{l}
}

// wsEcho is a tiny hand-written WebSocket upstream: it answers the upgrade
// with 101 and echoes raw bytes (framing does not matter to the proxy).
func wsEcho(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "want websocket", http.StatusBadRequest)
		return
	}
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: test\r\n\r\n")
	brw.Flush()
	io.Copy(c, brw)
}
