package credentials

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/egress"
	"github.com/cagebox/cagebox/internal/resign"
	"github.com/cagebox/cagebox/internal/substitute"
	"github.com/cagebox/cagebox/internal/testpki"
)

// A sandbox's request path, for real: the egress proxy with a pipeline as
// its hook, adapted as internal/gateway adapts it (no link, no DNS: the test
// is the sandbox, as the REDIRECT would make it), and an HTTPS upstream on
// loopback.

var (
	dstBound   = netip.MustParseAddrPort("198.18.0.5:443") // api.example.test
	dstUnbound = netip.MustParseAddrPort("198.18.0.6:443") // other.example.test
	testNames  = map[netip.Addr]string{dstBound.Addr(): "api.example.test", dstUnbound.Addr(): "other.example.test"}
)

// harnessConfig is the pipeline's configuration and the proxy's body
// limit.
type harnessConfig struct {
	Exfil     string
	ExfilScan ScanBudget
	Limits    harnessLimits
}

type harnessLimits struct{ BodyIdleTimeout time.Duration }

type gwHarness struct {
	t    *testing.T
	p    *Pipeline
	addr string
	dst  atomic.Pointer[netip.AddrPort]
	pool *x509.CertPool // the sandbox CA

	// upstreamHeaders receives each request's path as soon as the upstream
	// has its headers (before reading the body).
	upstreamHeaders chan string

	// mu guards events and upstream.
	mu       sync.Mutex
	events   []gwEvent
	upstream []string // "METHOD URI body-length"
}

type gwEvent struct {
	Kind string
	Data map[string]any // as the event's JSON decodes
}

func gwEventOf(t testing.TB, ev api.EventPayload) gwEvent {
	raw, err := json.Marshal(ev)
	if err != nil {
		t.Error(err)
	}
	var data map[string]any
	if err := json.Unmarshal(raw, &data); err != nil {
		t.Error(err)
	}
	return gwEvent{string(ev.EventKind()), data}
}

func newGWHarness(t *testing.T, hc harnessConfig) *gwHarness {
	t.Helper()
	h := &gwHarness{t: t, upstreamHeaders: make(chan string, 16)}
	pki, err := testpki.New(time.Hour, "api.example.test", "other.example.test")
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case h.upstreamHeaders <- r.URL.Path:
		default:
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "upstream: "+err.Error(), http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		h.upstream = append(h.upstream, fmt.Sprintf("%s %s %d", r.Method, r.RequestURI, len(b)))
		h.mu.Unlock()
		io.WriteString(w, "ok")
	}))
	up.EnableHTTP2 = true
	up.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	up.StartTLS()
	t.Cleanup(up.Close)
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())

	cfg := Config{Exfil: hc.Exfil, ExfilScan: hc.ExfilScan}
	if err := cfg.Check(); err != nil {
		t.Fatal(err)
	}
	h.p = New(cfg, func(ev api.EventPayload) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.events = append(h.events, gwEventOf(t, ev))
	})
	ca, err := egress.NewCA("sb-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h.pool = x509.NewCertPool()
	h.pool.AppendCertsFromPEM(ca.CertPEM())
	allowed := map[string]bool{"api.example.test": true, "other.example.test": true}
	sb := &egress.Sandbox{ID: "sb-1", Tenant: "tenant-a", CA: ca,
		Policy: egress.PolicyFunc(func(_ context.Context, r *egress.Request) (egress.Decision, error) {
			return egress.Decision{Allow: allowed[r.Host], Rule: "allow-hosts"}, nil
		}),
		NameOf: func(ad netip.Addr) (string, bool) { n, ok := testNames[ad]; return n, ok }}
	h.dst.Store(&dstBound)
	proxy, err := egress.New(egress.Config{
		Lookup: func(net.Conn) (*egress.Sandbox, netip.AddrPort, bool) {
			return sb, *h.dst.Load(), true
		},
		Hook:     h.hook,
		OnDenied: func(_ *egress.Sandbox, r *http.Request, host string) { h.p.Denied(r, host) },
		Resolve: map[string]netip.AddrPort{
			"api.example.test:443": upAddr, "other.example.test:443": upAddr,
		},
		UpstreamCAs: pki.Pool,
		Logger:      slog.New(slog.DiscardHandler),

		BodyIdleTimeout: hc.Limits.BodyIdleTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = l.Addr().String()
	go proxy.Serve(l)
	t.Cleanup(func() { proxy.Close() })
	return h
}

// hook is the pipeline as the proxy's request hook, converted to egress'
// types as internal/gateway converts it.
func (h *gwHarness) hook(_ *egress.Sandbox, r *http.Request) (*egress.Refusal, egress.ResponseFilter) {
	ref, f := h.p.Request(r)
	if ref != nil {
		return &egress.Refusal{Rule: ref.Rule, Reason: ref.Reason, Status: ref.Status}, nil
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = egressBody{r.Body}
	}
	return nil, f
}

type egressBody struct{ io.ReadCloser }

func (b egressBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var ref *Refusal
	if err != nil && errors.As(err, &ref) {
		return n, &egress.Refusal{Rule: ref.Rule, Reason: ref.Reason, Status: ref.Status}
	}
	return n, err
}

// conn opens a TLS connection to the proxy as the sandbox, for name.
func (h *gwHarness) conn(name string) *tls.Conn {
	h.t.Helper()
	d := dstBound
	if name == "other.example.test" {
		d = dstUnbound
	}
	h.dst.Store(&d)
	c, err := tls.Dial("tcp", h.addr, &tls.Config{ServerName: name, RootCAs: h.pool, NextProtos: []string{"http/1.1"}})
	if err != nil {
		h.t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(15 * time.Second))
	h.t.Cleanup(func() { c.Close() })
	return c
}

// do sends r (its URL's host names the destination) over a new
// connection and returns the response.
func (h *gwHarness) do(r *http.Request) (*http.Response, string) {
	h.t.Helper()
	c := h.conn(r.URL.Hostname())
	if err := r.Write(c); err != nil {
		h.t.Fatal(err)
	}
	return readResponse(h.t, c)
}

// writeHead sends r's request line and headers with Content-Length n, and
// no body.
func writeHead(t *testing.T, c net.Conn, r *http.Request, n int) {
	t.Helper()
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", r.Method, r.URL.RequestURI(), r.URL.Host)
	r.Header.Write(&b)
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n", n)
	if _, err := c.Write(b.Bytes()); err != nil {
		t.Fatal(err)
	}
}

func readResponse(t *testing.T, c net.Conn) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func (h *gwHarness) eventsOf(kind string) []gwEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []gwEvent
	for _, e := range h.events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

func (h *gwHarness) upstreamSaw() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.upstream...)
}

type refusalBody struct{ Error, Rule, Host, Reason string }

func wantRefused(t *testing.T, resp *http.Response, body string, status int, rule string) refusalBody {
	t.Helper()
	var rb refusalBody
	json.Unmarshal([]byte(body), &rb)
	if resp.StatusCode != status || rb.Rule != rule {
		t.Fatalf("got %d %q, want %d naming %q", resp.StatusCode, body, status, rule)
	}
	return rb
}

// TestExfilScanBudget: past its byte or time budget, or past its body
// window, the exfil scan stops and says so; "block" refuses what it could
// not scan (fail closed), "flag" lets it through with an event. Before,
// the scan had no budget (a 57 KiB header cost 6.7 s) and block passed
// unscanned bodies silently.
func TestExfilScanBudget(t *testing.T) {
	big := strings.Repeat("token=abcdefghij ", 1<<10) // 17 KiB, credential-free
	header := func() *http.Request {
		r, _ := http.NewRequest("GET", "https://api.example.test/x", nil)
		r.Header.Set("X-Data", big)
		return r
	}
	body := func() *http.Request {
		r, _ := http.NewRequest("POST", "https://api.example.test/up", strings.NewReader(strings.Repeat("y", 8<<10)))
		return r
	}
	for _, tc := range []struct {
		name   string
		mode   string
		budget substitute.Budget
		req    func() *http.Request
		limit  string // "" → passes with no unscanned event
	}{
		{"bytes, block", ExfilBlock, substitute.Budget{Bytes: 8 << 10, Time: time.Minute}, header, substitute.LimitBytes},
		{"bytes, flag", ExfilFlag, substitute.Budget{Bytes: 8 << 10, Time: time.Minute}, header, substitute.LimitBytes},
		{"time, block", ExfilBlock, substitute.Budget{Time: time.Nanosecond}, header, substitute.LimitTime},
		{"time, flag", ExfilFlag, substitute.Budget{Time: time.Nanosecond}, header, substitute.LimitTime},
		{"body window, block", ExfilBlock, substitute.Budget{Body: 4 << 10, Time: time.Minute}, body, substitute.LimitBody},
		{"body window, flag", ExfilFlag, substitute.Budget{Body: 4 << 10, Time: time.Minute}, body, ""},
		{"within budget, block", ExfilBlock, substitute.Budget{Time: time.Minute}, body, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newGWHarness(t, harnessConfig{Exfil: tc.mode, ExfilScan: tc.budget})
			resp, rb := h.do(tc.req())
			unscanned := h.eventsOf("secret.exfil_unscanned")
			if tc.limit == "" {
				if resp.StatusCode != http.StatusOK || len(unscanned) != 0 {
					t.Fatalf("%d %q, events %+v", resp.StatusCode, rb, unscanned)
				}
				return
			}
			if len(unscanned) != 1 || unscanned[0].Data["limit"] != tc.limit || unscanned[0].Data["mode"] != tc.mode {
				t.Fatalf("events %+v", unscanned)
			}
			if tc.mode == ExfilFlag {
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("flag: %d %q", resp.StatusCode, rb)
				}
				return
			}
			r := wantRefused(t, resp, rb, http.StatusForbidden, "builtin:exfil-unscanned")
			if !strings.Contains(r.Reason, "--exfil-scan-") {
				t.Errorf("reason %q does not say which limit to raise", r.Reason)
			}
			if n := len(h.upstreamSaw()); n != 0 {
				t.Errorf("upstream saw %d requests", n)
			}
		})
	}
}

var (
	phAWS   = resign.AWSCreds{AccessKeyID: "AKIAPLACEHOLDER00001", SecretAccessKey: "placeholder/secret/key/0000000000000000"}
	realAWS = resign.AWSCreds{AccessKeyID: "AKIAREALREALREAL0001", SecretAccessKey: "real/secret/key/00000000000000000000000"}
)

// signAWS signs r with creds as an SDK in the guest would.
func signAWS(t *testing.T, r *http.Request, creds resign.AWSCreds, payloadHash string) {
	t.Helper()
	r.Header.Set("X-Amz-Content-Sha256", payloadHash)
	if err := v4.NewSigner().SignHTTP(context.Background(), creds.Credentials(), r, payloadHash, "s3", "eu-west-1", time.Now()); err != nil {
		t.Fatal(err)
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestSigV4RefusedFromHeaders: a request signed with the placeholder AWS
// key for a host the binding does not cover is refused from its headers,
// before any of its body is read (with a short body timeout, a read would
// end in a 408 instead). Before, the exfil scan read the body first.
func TestSigV4RefusedFromHeaders(t *testing.T) {
	h := newGWHarness(t, harnessConfig{Limits: harnessLimits{BodyIdleTimeout: 300 * time.Millisecond}})
	h.p.Install(&Bindings{SigV4: []*SigV4Binding{{Name: "AWS", Hosts: []string{"api.example.test"}, Placeholder: phAWS,
		Real: func(string) (resign.AWSCreds, error) { return realAWS, nil }}}})
	body := bytes.Repeat([]byte("z"), 1<<20)
	r, _ := http.NewRequest("PUT", "https://other.example.test/bucket/key", bytes.NewReader(body))
	signAWS(t, r, phAWS, sha256Hex(body))
	c := h.conn("other.example.test")
	writeHead(t, c, r, len(body)) // the body never comes
	resp, rb := readResponse(t, c)
	wantRefused(t, resp, rb, http.StatusForbidden, "secret:AWS")
	if len(h.eventsOf("secret.alert")) != 1 {
		t.Errorf("no secret.alert")
	}
}

// TestSigV4DeclaredHashStreamsThroughGateway: a signed upload with
// X-Amz-Content-Sha256 to the bound host reaches the upstream before the
// guest has sent its body: nothing is buffered to verify it. Before, the
// gateway read the whole body (up to 64 MiB) first.
func TestSigV4DeclaredHashStreamsThroughGateway(t *testing.T) {
	h := newGWHarness(t, harnessConfig{Exfil: ExfilOff})
	h.p.Install(&Bindings{SigV4: []*SigV4Binding{{Name: "AWS", Hosts: []string{"api.example.test"}, Placeholder: phAWS,
		Real: func(string) (resign.AWSCreds, error) { return realAWS, nil }}}})
	body := bytes.Repeat([]byte("z"), 1<<20)
	pr, pw := io.Pipe()
	r, _ := http.NewRequest("PUT", "https://api.example.test/bucket/key", pr)
	r.ContentLength = int64(len(body))
	signAWS(t, r, phAWS, sha256Hex(body))
	c := h.conn("api.example.test")
	go r.Write(c)
	select {
	case p := <-h.upstreamHeaders:
		if p != "/bucket/key" {
			t.Fatalf("upstream got %q", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream saw nothing before the body was sent: the gateway buffers it")
	}
	pw.Write(body)
	pw.Close()
	resp, rb := readResponse(t, c)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %q", resp.StatusCode, rb)
	}
	if up := h.upstreamSaw(); len(up) != 1 || up[0] != fmt.Sprintf("PUT /bucket/key %d", len(body)) {
		t.Fatalf("upstream %v", up)
	}

	// A body that is not what was signed: refused by name as it ends, and
	// the upstream never gets it whole.
	bad := bytes.Repeat([]byte("q"), len(body))
	r, _ = http.NewRequest("PUT", "https://api.example.test/bucket/key2", bytes.NewReader(bad))
	signAWS(t, r, phAWS, sha256Hex(body))
	resp, rb = h.do(r)
	wantRefused(t, resp, rb, http.StatusForbidden, "secret:AWS")
	for _, u := range h.upstreamSaw() {
		if strings.HasPrefix(u, "PUT /bucket/key2 ") {
			t.Fatalf("upstream accepted the tampered body: %s", u)
		}
	}
}

// hmacSign signs method, path and body with key as the binding's guest
// would (sign=method+path+body, hex, prefix sha256=).
func hmacSign(key []byte, method, path string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(method + "\n" + path + "\n"))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

func hmacBinding(maxBody int64) []*HMACBinding {
	return []*HMACBinding{{Name: "HOOK", Hosts: []string{"api.example.test"},
		Signer: &resign.HMAC{Algorithm: "sha256", Header: "X-Signature", Prefix: "sha256=", Encoding: "hex",
			Canonical: []string{"method", "path", "body"}, Placeholder: []byte("placeholder-hmac-key"), MaxBody: maxBody},
		Real: func(string) ([]byte, error) { return []byte("the-real-hmac-key"), nil }}}
}

// TestHMACUnboundHostNotBuffered: a request to a host the HMAC binding does
// not cover, carrying a header of the binding's name over a large body,
// goes upstream without the gateway reading the body to check whose
// signature it is. Before, the gateway read up to 64 MiB of it first.
func TestHMACUnboundHostNotBuffered(t *testing.T) {
	h := newGWHarness(t, harnessConfig{Exfil: ExfilOff})
	h.p.Install(&Bindings{HMAC: hmacBinding(0)})
	body := bytes.Repeat([]byte("b"), 1<<20)
	pr, pw := io.Pipe()
	r, _ := http.NewRequest("POST", "https://other.example.test/hook", pr)
	r.ContentLength = int64(len(body))
	r.Header.Set("X-Signature", hmacSign([]byte("someone-elses-key"), "POST", "/hook", body))
	c := h.conn("other.example.test")
	go r.Write(c)
	select {
	case <-h.upstreamHeaders:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream saw nothing before the body was sent: the gateway buffers it")
	}
	pw.Write(body)
	pw.Close()
	if resp, rb := readResponse(t, c); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %q", resp.StatusCode, rb)
	}
	// A small body signed with the placeholder key is still caught.
	small := []byte("hello")
	r, _ = http.NewRequest("POST", "https://other.example.test/hook", bytes.NewReader(small))
	r.Header.Set("X-Signature", hmacSign([]byte("placeholder-hmac-key"), "POST", "/hook", small))
	resp, rb := h.do(r)
	wantRefused(t, resp, rb, http.StatusForbidden, "secret:HOOK")
}

// TestHMACBodyOverLimit: a bound request whose signature covers a body
// over the binding's limit is refused with 413 from its Content-Length,
// unread. Before: a 403 after reading up to the limit.
func TestHMACBodyOverLimit(t *testing.T) {
	h := newGWHarness(t, harnessConfig{Exfil: ExfilOff, Limits: harnessLimits{BodyIdleTimeout: 300 * time.Millisecond}})
	h.p.Install(&Bindings{HMAC: hmacBinding(1 << 10)})
	body := bytes.Repeat([]byte("b"), 4<<10)
	r, _ := http.NewRequest("POST", "https://api.example.test/hook", nil)
	r.Header.Set("X-Signature", hmacSign([]byte("placeholder-hmac-key"), "POST", "/hook", body))
	c := h.conn("api.example.test")
	writeHead(t, c, r, len(body)) // the body never comes
	resp, rb := readResponse(t, c)
	rr := wantRefused(t, resp, rb, http.StatusRequestEntityTooLarge, "secret:HOOK")
	if !strings.Contains(rr.Reason, "1024-byte limit") {
		t.Errorf("reason %q does not name the limit", rr.Reason)
	}
	// Within the limit: re-signed and sent.
	small := []byte("hello")
	r, _ = http.NewRequest("POST", "https://api.example.test/hook", bytes.NewReader(small))
	r.Header.Set("X-Signature", hmacSign([]byte("placeholder-hmac-key"), "POST", "/hook", small))
	if resp, rb := h.do(r); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %q", resp.StatusCode, rb)
	}
}
