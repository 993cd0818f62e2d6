package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
)

const testID = "sb-0123456789abcdef"

// TestParseHost checks the Route the ingress makes of a host; the
// PORT-ID.DOMAIN grammar itself is tested in internal/hostname.
func TestParseHost(t *testing.T) {
	r, ok := ParseHost("8080-"+testID+".SB.test:8443", "sb.test")
	if !ok || r.Port != 8080 || r.ID != testID || r.Prefix != "" {
		t.Errorf("ParseHost = %+v %v", r, ok)
	}
	if _, ok := ParseHost("8080-"+testID+".evil.sb.test", "sb.test"); ok {
		t.Error("a host below another name was routed")
	}
	if got := HostFor(testID, 8080, "sb.test."); got != "8080-"+testID+".sb.test" {
		t.Errorf("HostFor = %q", got)
	}
}

func TestParsePath(t *testing.T) {
	for _, tc := range []struct {
		path, rest string
		ok         bool
	}{
		{"/s/" + testID + "/8080/a/b", "/a/b", true},
		{"/s/" + testID + "/8080/", "/", true},
		{"/s/" + testID + "/8080", "/", true},
		{"/s/" + testID + "/0/", "", false},
		{"/s/" + testID + "/99999/", "", false},
		{"/s/" + testID + "/80x/", "", false},
		{"/s/sb-bad/8080/", "", false},
		{"/s/../8080/", "", false},
		{"/x/" + testID + "/8080/", "", false},
		{"/", "", false},
	} {
		r, rest, ok := ParsePath(tc.path)
		if ok != tc.ok || (ok && (rest != tc.rest || r.ID != testID || r.Port != 8080 || r.Prefix != "/s/"+testID+"/8080")) {
			t.Errorf("ParsePath(%q) = %+v %q %v", tc.path, r, rest, ok)
		}
	}
}

func TestTokenAndSignature(t *testing.T) {
	tok := NewToken()
	if !strings.HasPrefix(tok, "cbp_") || len(tok) < 40 || tok == NewToken() {
		t.Fatalf("token %q", tok)
	}
	h := HashToken(tok)
	if !CheckToken(tok, h) || CheckToken(tok+"x", h) || CheckToken("", h) || CheckToken(tok, nil) {
		t.Fatal("CheckToken")
	}
	now := time.Unix(1_800_000_000, 0)
	s := &Signer{Key: []byte("k1"), Now: func() time.Time { return now }}
	sig := s.Sign(testID, 8080, now.Add(time.Minute), h)
	if _, err := s.Verify(sig, testID, 8080, h); err != nil {
		t.Fatalf("valid: %v", err)
	}
	for name, tc := range map[string]struct {
		sig  string
		id   string
		port uint16
		hash []byte
		s    *Signer
	}{
		"other port":    {sig, testID, 8081, h, s},
		"other sandbox": {sig, "sb-0123456789abcdee", 8080, h, s},
		"rotated token": {sig, testID, 8080, HashToken(NewToken()), s},
		"other key":     {sig, testID, 8080, h, &Signer{Key: []byte("k2"), Now: s.Now}},
		"moved expiry":  {strings.Replace(sig, "18000000", "18000001", 1), testID, 8080, h, s},
		"garbage":       {"x", testID, 8080, h, s},
		"empty mac":     {"1800000060.", testID, 8080, h, s},
	} {
		if _, err := tc.s.Verify(tc.sig, tc.id, tc.port, tc.hash); !errors.Is(err, ErrNoAccess) {
			t.Errorf("%s: %v, want ErrNoAccess", name, err)
		}
	}
	now = now.Add(2 * time.Minute)
	if _, err := s.Verify(sig, testID, 8080, h); !errors.Is(err, ErrExpired) {
		t.Errorf("expired: %v", err)
	}
}

// fakeBackend serves one published port at a test server's address.
type fakeBackend struct {
	target *Target
	mu     sync.Mutex
	begun  []string
	busy   int
}

func (f *fakeBackend) Resolve(_ context.Context, id string, port uint16) (*Target, error) {
	if id != testID || port != 8080 {
		return nil, ErrNotFound
	}
	return f.target, nil
}

func (f *fakeBackend) Guest(_ context.Context, id string) (string, netip.Addr, error) {
	if id != testID {
		return "", netip.Addr{}, ErrNotFound
	}
	return f.target.Tenant, f.target.Addr.Addr(), nil
}

func (f *fakeBackend) Begin(_ context.Context, id, reason string) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.begun = append(f.begun, reason)
	f.busy++
	return func() { f.mu.Lock(); f.busy--; f.mu.Unlock() }, nil
}

func TestProxy(t *testing.T) {
	guest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			n, _ := io.Copy(io.Discard, r.Body)
			_ = json.NewEncoder(w).Encode(map[string]any{"n": n})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"path": r.URL.RequestURI(), "headers": r.Header, "host": r.Host})
	}))
	defer guest.Close()
	tok := NewToken()
	fb := &fakeBackend{target: &Target{Tenant: "t", Addr: netip.MustParseAddrPort(guest.Listener.Addr().String()), TokenHash: HashToken(tok)}}
	var events []api.IngressRequest
	var emu sync.Mutex
	srv := New(Config{Domain: "sb.test", Backend: fb, Signer: &Signer{Key: []byte("k")}, MaxBody: 1000,
		Emit: func(_, _ string, ev api.EventPayload) {
			emu.Lock()
			events = append(events, ev.(api.IngressRequest))
			emu.Unlock()
		}})
	do := func(method, host, target string, hdr http.Header, body io.Reader) (*http.Response, map[string]any) {
		r := httptest.NewRequest(method, target, body)
		r.Host = host
		for k, v := range hdr {
			r.Header[k] = v
		}
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		var m map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &m)
		return w.Result(), m
	}
	host := "8080-" + testID + ".sb.test"
	ok := http.Header{"X-Cagebox-Access": {tok}, "X-Cagebox-Tenant": {"admin"}, "X-Forwarded-For": {"6.6.6.6"},
		"Cookie": {"cbx_access=x; a=1"}, "Connection": {"X-Hop"}, "X-Hop": {"1"}}
	resp, m := do("GET", host, "/p?q=1&cbx_sig=zz", ok, nil)
	if resp.StatusCode != 200 || m["path"] != "/p?q=1" {
		t.Fatalf("proxied: %d %v", resp.StatusCode, m)
	}
	hdrs := m["headers"].(map[string]any)
	for k := range hdrs {
		if strings.HasPrefix(k, "X-Cagebox") || k == "X-Hop" {
			t.Errorf("guest got header %s", k)
		}
	}
	if xff := hdrs["X-Forwarded-For"].([]any); len(xff) != 1 || xff[0] != "192.0.2.1" {
		t.Errorf("X-Forwarded-For = %v (the client's value must go)", xff)
	}
	if c := hdrs["Cookie"].([]any); len(c) != 1 || c[0] != "a=1" {
		t.Errorf("Cookie = %v", c)
	}
	if m["host"] != host {
		t.Errorf("Host = %v", m["host"])
	}
	// Path form.
	_, m = do("GET", "sb.test", "/s/"+testID+"/8080/x/y?z", http.Header{"X-Cagebox-Access": {tok}}, nil)
	if m["path"] != "/x/y?z" {
		t.Errorf("path form: %v", m)
	}
	// Refusals.
	for name, tc := range map[string]struct {
		host, target string
		hdr          http.Header
		code         int
	}{
		"no token":         {host, "/", nil, 401},
		"wrong token":      {host, "/", http.Header{"X-Cagebox-Access": {tok + "x"}}, 401},
		"unpublished port": {"8081-" + testID + ".sb.test", "/", http.Header{"X-Cagebox-Access": {tok}}, 404},
		"unknown host":     {"example.com", "/", nil, 404},
		"expired":          {host, "/?cbx_sig=" + srv.cfg.Signer.Sign(testID, 8080, time.Now().Add(-time.Second), HashToken(tok)), nil, 403},
	} {
		if resp, _ := do("GET", tc.host, tc.target, tc.hdr, nil); resp.StatusCode != tc.code {
			t.Errorf("%s: %d, want %d", name, resp.StatusCode, tc.code)
		}
	}
	// A valid signature sets the cookie, which then works alone.
	sig := srv.cfg.Signer.Sign(testID, 8080, time.Now().Add(time.Minute), HashToken(tok))
	resp, _ = do("GET", host, "/?cbx_sig="+sig, nil, nil)
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == CookieName {
			cookie = c
		}
	}
	if resp.StatusCode != 200 || cookie == nil || !cookie.HttpOnly || !cookie.Secure {
		t.Fatalf("signed URL: %d %v", resp.StatusCode, resp.Header)
	}
	if resp, _ := do("GET", host, "/", http.Header{"Cookie": {cookie.String()}}, nil); resp.StatusCode != 200 {
		t.Errorf("cookie: %d", resp.StatusCode)
	}
	// Body limit: declared and streamed.
	if resp, _ := do("POST", host, "/big", http.Header{"X-Cagebox-Access": {tok}}, strings.NewReader(strings.Repeat("x", 1001))); resp.StatusCode != 413 {
		t.Errorf("declared over the limit: %d", resp.StatusCode)
	}
	r := httptest.NewRequest("POST", "/big", io.NopCloser(strings.NewReader(strings.Repeat("x", 5000))))
	r.Host, r.ContentLength = host, -1
	r.Header.Set("X-Cagebox-Access", tok)
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	if w.Code != 413 && w.Code != 502 {
		t.Errorf("streamed over the limit: %d %s", w.Code, w.Body)
	}
	fb.mu.Lock()
	if fb.busy != 0 || len(fb.begun) == 0 || fb.begun[0] != "ingress 8080" {
		t.Errorf("Begin/end: busy %d, reasons %v", fb.busy, fb.begun)
	}
	fb.mu.Unlock()
	emu.Lock()
	defer emu.Unlock()
	if len(events) == 0 || events[0].Status != 200 || events[0].Path != "/p" || events[0].Port != 8080 {
		t.Errorf("events: %+v", events)
	}
}

func TestRateLimit(t *testing.T) {
	guest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer guest.Close()
	fb := &fakeBackend{target: &Target{Addr: netip.MustParseAddrPort(guest.Listener.Addr().String()), Public: true}}
	srv := New(Config{Domain: "sb.test", Backend: fb, Rate: 1, Burst: 3})
	codes := map[int]int{}
	for i := 0; i < 6; i++ {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = "8080-" + testID + ".sb.test"
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		codes[w.Code]++
		if w.Code == 429 && w.Header().Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
	}
	if codes[200] != 3 || codes[429] != 3 {
		t.Errorf("codes %v, want 3×200 and 3×429", codes)
	}
}

func TestSend(t *testing.T) {
	var got *http.Request
	var body string
	guest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		b, _ := io.ReadAll(r.Body)
		body = string(b)
		w.WriteHeader(204)
	}))
	defer guest.Close()
	ap := netip.MustParseAddrPort(guest.Listener.Addr().String())
	fb := &fakeBackend{target: &Target{Tenant: "t", Addr: ap}}
	srv := New(Config{Domain: "sb.test", Backend: fb})
	req, _ := http.NewRequest("POST", "http://guest/hook?x=1", strings.NewReader("payload"))
	req.Header.Set("X-Cagebox-Delivery", "7")
	code, err := srv.Send(context.Background(), testID, int(ap.Port()), req)
	if err != nil || code != 204 {
		t.Fatalf("Send: %d %v", code, err)
	}
	if got.URL.RequestURI() != "/hook?x=1" || got.Header.Get("X-Cagebox-Delivery") != "7" || body != "payload" {
		t.Errorf("guest got %s %v %q", got.URL, got.Header, body)
	}
	if fb.busy != 0 || fb.begun[len(fb.begun)-1] != "delivery "+strconv.Itoa(int(ap.Port())) {
		t.Errorf("Begin/end: %d %v", fb.busy, fb.begun)
	}
	if _, err := srv.Send(context.Background(), "sb-ffffffffffffffff", 80, req); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
}
