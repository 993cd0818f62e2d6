package resign

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

var (
	hmacPlaceholder = []byte("whsec_placeholder_do_not_leak_0000")
	hmacReal        = []byte("whsec_real_do_not_leak_111111111111")
)

// hmacUpstream verifies signatures with the real secret, computing the
// canonical string on its own.
type hmacUpstream struct {
	*httptest.Server
	cfg HMAC

	// mu guards ok.
	mu sync.Mutex
	ok int
}

func newHMACUpstream(t *testing.T, cfg HMAC) *hmacUpstream {
	u := &hmacUpstream{cfg: cfg}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		want := testHMAC(u.cfg, hmacReal, r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header, body)
		if r.Header.Get(u.cfg.Header) != want {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		u.mu.Lock()
		u.ok++
		u.mu.Unlock()
		io.WriteString(w, "ok")
	}))
	t.Cleanup(u.Close)
	return u
}

func testHMAC(cfg HMAC, key []byte, method, path, query string, h http.Header, body []byte) string {
	var parts []string
	for _, p := range cfg.Canonical {
		switch {
		case p == "method":
			parts = append(parts, method)
		case p == "path":
			parts = append(parts, path)
		case p == "query":
			parts = append(parts, query)
		case p == "body":
			parts = append(parts, string(body))
		case strings.HasPrefix(p, "header:"):
			parts = append(parts, h.Get(strings.TrimPrefix(p, "header:")))
		}
	}
	nh := map[string]func() hash.Hash{"sha256": sha256.New, "sha1": sha1.New, "sha512": sha512.New}[cfg.Algorithm]
	m := hmac.New(nh, key)
	m.Write([]byte(strings.Join(parts, "\n")))
	sum := m.Sum(nil)
	if cfg.Encoding == "base64" {
		return cfg.Prefix + base64.StdEncoding.EncodeToString(sum)
	}
	return cfg.Prefix + hex.EncodeToString(sum)
}

func TestHMACThroughProxy(t *testing.T) {
	configs := []HMAC{
		{Algorithm: "sha256", Header: "X-Hub-Signature-256", Prefix: "sha256=", Encoding: "hex", Canonical: []string{"body"}},
		{Algorithm: "sha256", Header: "X-Signature", Encoding: "base64",
			Canonical: []string{"method", "path", "query", "header:X-Timestamp", "body"}},
		{Algorithm: "sha1", Header: "X-Sig", Prefix: "v1=", Encoding: "hex", Canonical: []string{"header:X-Timestamp", "body"}},
		{Algorithm: "sha512", Header: "X-Sig", Encoding: "base64", Canonical: []string{"method", "path", "query"}},
	}
	const path, query = "/v1/charges/ch%20%C3%BC", "amount=10&currency=eur"
	body := []byte(`{"amount":10}`)
	for _, cfg := range configs {
		t.Run(cfg.Algorithm+" "+strings.Join(cfg.Canonical, ","), func(t *testing.T) {
			up := newHMACUpstream(t, cfg)
			rs := cfg
			rs.Placeholder, rs.Real = hmacPlaceholder, hmacReal
			px := newProxy(t, &rs, up.URL)

			newReq := func() *http.Request {
				req, _ := http.NewRequest("POST", px.URL+path+"?"+query, bytes.NewReader(body))
				req.Header.Set("X-Timestamp", "1741944413")
				req.Header.Set(cfg.Header, testHMAC(cfg, hmacPlaceholder, "POST", path, query, req.Header, body))
				return req
			}
			if code, msg := do(t, newReq()); code != 200 {
				t.Fatalf("status %d: %s (proxy error %v)", code, msg, px.lastErr())
			}

			tampers := map[string]func(*http.Request){
				"timestamp": func(r *http.Request) { r.Header.Set("X-Timestamp", "1741944999") },
				"body":      func(r *http.Request) { r.Body = io.NopCloser(strings.NewReader(`{"amount":99}`)) },
				"method":    func(r *http.Request) { r.Method = "PUT" },
				"path":      func(r *http.Request) { r.URL.Path, r.URL.RawPath = "/v1/refunds", "" },
				"query":     func(r *http.Request) { r.URL.RawQuery = "amount=99&currency=eur" },
				"signature": func(r *http.Request) {
					r.Header.Set(cfg.Header, testHMAC(cfg, []byte("guess"), "POST", path, query, r.Header, body))
				},
			}
			for name, f := range tampers {
				if name != "signature" && !covers(cfg, name) {
					continue
				}
				req := newReq()
				f(req)
				code, msg := do(t, req)
				if code != 403 || !errors.Is(px.lastErr(), ErrBadSignature) {
					t.Errorf("tampered %s: status %d (%s), error %v; want 403 and ErrBadSignature", name, code, msg, px.lastErr())
				}
			}
			if up.ok != 1 {
				t.Errorf("upstream accepted %d requests, want 1", up.ok)
			}
		})
	}
}

func covers(cfg HMAC, part string) bool {
	for _, p := range cfg.Canonical {
		if p == part || (part == "timestamp" && p == "header:X-Timestamp") {
			return true
		}
	}
	return false
}

func TestHMACErrors(t *testing.T) {
	base := HMAC{Algorithm: "sha256", Header: "X-Sig", Encoding: "hex", Canonical: []string{"body"}, Placeholder: hmacPlaceholder, Real: hmacReal}
	tests := []struct {
		name string
		mod  func(*HMAC, *http.Request)
		want error
	}{
		{"no header", func(h *HMAC, r *http.Request) { r.Header.Del("X-Sig") }, ErrNotSigned},
		{"not hex", func(h *HMAC, r *http.Request) { r.Header.Set("X-Sig", "zz") }, ErrBadSignature},
		{"missing prefix", func(h *HMAC, r *http.Request) { h.Prefix = "sha256=" }, ErrBadSignature},
		{"unknown algorithm", func(h *HMAC, r *http.Request) { h.Algorithm = "md5" }, ErrUnsupported},
		{"unknown part", func(h *HMAC, r *http.Request) { h.Canonical = []string{"cookie"} }, ErrUnsupported},
		{"body over limit", func(h *HMAC, r *http.Request) { h.MaxBody = 4 }, ErrUnsupported},
		{"empty placeholder", func(h *HMAC, r *http.Request) { h.Placeholder = nil }, ErrBadSignature},
		{"no real secret", func(h *HMAC, r *http.Request) { h.Real = nil }, ErrUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := base
			r := httptest.NewRequest("POST", "/hook", strings.NewReader("payload"))
			r.Header.Set("X-Sig", testHMAC(base, hmacPlaceholder, "", "", "", nil, []byte("payload")))
			tt.mod(&h, r)
			if err := h.Resign(r); !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

// TestErrorsCarryNoSecrets drives every failure path and checks that no
// secret, token or real key id appears in an error string, in %v of the
// configuration, or in a log line.
func TestErrorsCarryNoSecrets(t *testing.T) {
	var errs []error
	sig := &SigV4{Placeholder: withToken(phCreds, phToken), Real: withToken(realCreds, realToken), MaxBody: 8}
	mk := func(method, target string, body []byte, o guestOpt) *http.Request {
		if o.creds == (AWSCreds{}) {
			o.creds = withToken(phCreds, phToken)
		}
		return guestRequest(t, method, "http://bucket.example", target, body, o)
	}
	cases := []*http.Request{
		mk("GET", "/b/k", nil, guestOpt{payloadHash: unsignedPayload, sendHash: true, creds: withToken(realCreds, realToken)}),
		mk("GET", "/b/k", nil, guestOpt{payloadHash: unsignedPayload, sendHash: true, creds: AWSCreds{AccessKeyID: phCreds.AccessKeyID, SecretAccessKey: realCreds.SecretAccessKey, SessionToken: realToken}}),
		// over MaxBody: a payload hash signed but not declared needs the body in memory
		mk("PUT", "/b/k", []byte("0123456789"), guestOpt{}),
		mk("GET", "/b/k", nil, guestOpt{payloadHash: "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD", sendHash: true}),
	}
	tampered := mk("GET", "/b/k", nil, guestOpt{payloadHash: unsignedPayload, sendHash: true})
	tampered.Header.Set("X-Amz-Date", "20250314T000000Z")
	cases = append(cases, tampered)
	for _, r := range cases {
		errs = append(errs, sig.Resign(r))
	}
	// aws-chunked: a bad chunk fails the body reader.
	up := chunkedUpload(t, "http://bucket.example", withToken(phCreds, phToken), [][]byte{[]byte("abc")}, true)
	body, _ := io.ReadAll(up.Body)
	body[len("3;chunk-signature=")+64+2] ^= 1
	up.Body = io.NopCloser(bytes.NewReader(body))
	if err := (&SigV4{Placeholder: withToken(phCreds, phToken), Real: withToken(realCreds, realToken)}).Resign(up); err != nil {
		t.Fatal(err)
	}
	_, err := io.ReadAll(up.Body)
	errs = append(errs, err)
	// A declared payload hash: a body that does not match fails its reader.
	hashed := mk("PUT", "/b/k", []byte("0123456789"), guestOpt{sendHash: true})
	hashed.Body = io.NopCloser(strings.NewReader("9876543210"))
	if err := sig.Resign(hashed); err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(hashed.Body)
	errs = append(errs, err)

	h := &HMAC{Algorithm: "sha256", Header: "X-Sig", Canonical: []string{"body"}, Placeholder: hmacPlaceholder, Real: hmacReal}
	r := httptest.NewRequest("POST", "/", strings.NewReader("x"))
	r.Header.Set("X-Sig", hex.EncodeToString(hmacReal))
	errs = append(errs, h.Resign(r))

	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("config", "sigv4", sig, "hmac", h, "creds", realCreds)
	texts := []string{logs.String(), fmt.Sprintf("%v %+v %#v %v %+v %s", sig, sig, realCreds, h, sig.Real, realCreds)}
	for i, err := range errs {
		if err == nil {
			t.Fatalf("case %d did not fail", i)
		}
		texts = append(texts, err.Error())
	}
	for _, text := range texts {
		for _, s := range allSecrets {
			if strings.Contains(text, s) {
				t.Errorf("%q leaks a secret", text)
			}
		}
		for _, s := range []string{phCreds.AccessKeyID} {
			if strings.Contains(text, s) {
				t.Errorf("%q names the placeholder key id", text)
			}
		}
	}
}

func TestHMACVerifyAndValidate(t *testing.T) {
	cfg := HMAC{Algorithm: "sha256", Header: "X-Signature", Prefix: "sha256=", Canonical: []string{"method", "path", "header:X-Timestamp", "body"}, Placeholder: hmacPlaceholder}
	mk := func(key []byte, body string) *http.Request {
		r := httptest.NewRequest("POST", "https://hooks.example/a", strings.NewReader(body))
		r.Header.Set("X-Timestamp", "1700000000")
		r.Header.Set("X-Signature", testHMAC(cfg, key, "POST", "/a", "", r.Header, []byte(body)))
		return r
	}
	if err := cfg.Verify(mk(hmacPlaceholder, "x")); err != nil {
		t.Fatalf("placeholder-signed: %v", err)
	}
	r := mk(hmacPlaceholder, "x")
	if err := cfg.Verify(r); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(r.Body); string(b) != "x" {
		t.Fatalf("Verify consumed the body: %q", b)
	}
	if err := cfg.Verify(mk(hmacReal, "x")); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("signed with another key: %v", err)
	}
	if err := cfg.Verify(httptest.NewRequest("GET", "https://hooks.example/", nil)); !errors.Is(err, ErrNotSigned) {
		t.Fatalf("unsigned: %v", err)
	}
	for _, bad := range []HMAC{
		{Header: "", Canonical: []string{"body"}},
		{Header: "X-Sig", Canonical: nil},
		{Header: "X-Sig", Canonical: []string{"bogus"}},
		{Header: "X-Sig", Canonical: []string{"header:"}},
		{Header: "X-Sig", Canonical: []string{"body"}, Algorithm: "md5"},
		{Header: "X-Sig", Canonical: []string{"body"}, Encoding: "base32"},
		{Header: "X Sig", Canonical: []string{"body"}},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}
