package console

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/errdefs"
)

const (
	goodKey   = "cbk_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	otherKey  = "cbk_fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	tenantID  = "acme"
	adminID   = "admin"
	testHost  = "console.test:7070"
	origin    = "http://console.test:7070"
	apiTarget = "http://console.test:7070/v1/sandboxes"
)

// keys is a revocable key table, as the daemon's store is.
type keys struct {
	mu sync.Mutex
	m  map[[32]byte]string
}

func newKeys() *keys {
	return &keys{m: map[[32]byte]string{sha256.Sum256([]byte(goodKey)): tenantID, sha256.Sum256([]byte(otherKey)): "other"}}
}

func (k *keys) lookup(_ context.Context, h []byte) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var a [32]byte
	copy(a[:], h)
	t, ok := k.m[a]
	if !ok {
		return "", fmt.Errorf("%w: unknown or revoked API key", errdefs.ErrUnauthorized)
	}
	return t, nil
}

func (k *keys) revoke(key string) {
	k.mu.Lock()
	delete(k.m, sha256.Sum256([]byte(key)))
	k.mu.Unlock()
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	c     *Console
	keys  *keys
	clock *clock
	h     http.Handler
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	k := newKeys()
	cl := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	c := New(Config{Lookup: k.lookup, AdminTenant: adminID, Now: cl.now, Idle: 10 * time.Minute, MaxAge: time.Hour, TokenTTL: time.Minute})
	return &fixture{c: c, keys: k, clock: cl, h: c.Handler()}
}

func (f *fixture) do(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

func req(method, target string, body io.Reader) *http.Request {
	r := httptest.NewRequest(method, target, body)
	r.Host = testHost
	r.RemoteAddr = "192.0.2.10:4444"
	return r
}

// login logs in with key and returns the session cookie.
func (f *fixture) login(t *testing.T, key string) *http.Cookie {
	t.Helper()
	r := req("POST", origin+"/ui/login", strings.NewReader(url.Values{"key": {key}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", origin)
	w := f.do(r)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/ui/" {
		t.Fatalf("login: %d %s %q", w.Code, w.Header().Get("Location"), w.Body.String())
	}
	for _, c := range w.Result().Cookies() {
		if c.Name == CookieName {
			return c
		}
	}
	t.Fatalf("login set no %s cookie: %v", CookieName, w.Header()["Set-Cookie"])
	return nil
}

func (f *fixture) csrf(t *testing.T, ck *http.Cookie) string {
	t.Helper()
	r := req("GET", origin+"/ui/session", nil)
	r.AddCookie(ck)
	w := f.do(r)
	var si SessionInfo
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &si) != nil || si.CSRF == "" {
		t.Fatalf("session: %d %s", w.Code, w.Body.String())
	}
	return si.CSRF
}

func TestSecurityHeadersOnEveryResponse(t *testing.T) {
	f := newFixture(t)
	ck := f.login(t, goodKey)
	var paths []string
	_ = fs.WalkDir(staticFS, "static", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.HasSuffix(p, "login.html") {
			paths = append(paths, "/ui/"+p)
		}
		return nil
	})
	paths = append(paths, "/ui/", "/ui", "/ui/login", "/ui/session", "/ui/nosuch", "/ui/static/", "/ui/static/login.html", "/ui/login?token=bogus")
	for _, p := range paths {
		for _, withCookie := range []bool{false, true} {
			r := req("GET", origin+p, nil)
			if withCookie {
				r.AddCookie(ck)
			}
			w := f.do(r)
			h := w.Header()
			if got := h.Get("Content-Security-Policy"); got != CSP {
				t.Errorf("%s: CSP %q", p, got)
			}
			for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY"} {
				if h.Get(k) != v {
					t.Errorf("%s: %s = %q, want %q", p, k, h.Get(k), v)
				}
			}
			cc := h.Get("Cache-Control")
			if strings.HasPrefix(p, "/ui/static/") && w.Code == 200 && !strings.HasSuffix(p, ".html") && !strings.HasSuffix(p, ".md") && !strings.HasSuffix(p, "LICENSE") {
				if cc != "no-cache" {
					t.Errorf("%s: Cache-Control %q", p, cc)
				}
			} else if cc != "no-store" {
				t.Errorf("%s: Cache-Control %q, want no-store", p, cc)
			}
		}
	}
	// The CSP is strict: no inline script or style anywhere, nothing from
	// elsewhere.
	for _, bad := range []string{"unsafe-inline", "unsafe-eval", "http:", "https:", "*"} {
		if strings.Contains(CSP, bad) {
			t.Errorf("CSP contains %q", bad)
		}
	}
}

// TestNoInlineOrExternal: the pages carry no inline script, style or event
// handler and load nothing from another origin (the CSP would refuse it;
// this catches it before a browser does).
func TestNoInlineOrExternal(t *testing.T) {
	_ = fs.WalkDir(staticFS, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.Contains(p, "/vendor/") {
			return nil
		}
		b, _ := staticFS.ReadFile(p)
		s := string(b)
		if strings.HasSuffix(p, ".html") {
			for _, bad := range []string{"<style", "style=", " onclick", " onload", " onerror", "javascript:"} {
				if strings.Contains(s, bad) {
					t.Errorf("%s contains %q", p, bad)
				}
			}
			if i := strings.Index(s, "<script"); i >= 0 && !strings.Contains(s[i:i+80], "src=") {
				t.Errorf("%s has an inline script", p)
			}
		}
		for _, bad := range []string{"http://", "https://", "//cdn", "innerHTML", "eval("} {
			if strings.Contains(s, bad) && !(bad == "https://" && strings.Contains(p, ".js")) {
				t.Errorf("%s contains %q", p, bad)
			}
		}
		return nil
	})
}

func TestCookieAttributes(t *testing.T) {
	f := newFixture(t)
	ck := f.login(t, goodKey)
	if !ck.HttpOnly || !ck.Secure || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" {
		t.Errorf("cookie %+v", ck)
	}
	if len(ck.Value) < 43 {
		t.Errorf("session id %d characters: want 32 random bytes", len(ck.Value))
	}
	if strings.Contains(ck.Value, goodKey) {
		t.Error("the cookie holds the API key")
	}
	// Two logins, two sessions.
	if ck2 := f.login(t, goodKey); ck2.Value == ck.Value {
		t.Error("a session id was reused")
	}
}

func TestLoginRefusedAndThrottled(t *testing.T) {
	f := newFixture(t)
	post := func(body, addr, org string) *httptest.ResponseRecorder {
		r := req("POST", origin+"/ui/login", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if org != "" {
			r.Header.Set("Origin", org)
		}
		r.RemoteAddr = addr + ":1000"
		return f.do(r)
	}
	if w := post("key=", "192.0.2.1", origin); w.Code != 400 {
		t.Errorf("empty key: %d", w.Code)
	}
	if w := post("key="+goodKey, "192.0.2.1", "https://evil.test"); w.Code != 403 || len(w.Result().Cookies()) != 0 {
		t.Errorf("cross-origin login: %d", w.Code)
	}
	// A key in the URL is refused even when right.
	r := req("POST", origin+"/ui/login?key="+goodKey, strings.NewReader(""))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if w := f.do(r); w.Code != 400 || len(w.Result().Cookies()) != 0 {
		t.Errorf("key in the URL: %d", w.Code)
	}
	for i := 0; i < loginBurst; i++ {
		w := post("key=cbk_wrong"+fmt.Sprint(i), "192.0.2.1", "")
		if w.Code != 401 || len(w.Result().Cookies()) != 0 || !strings.Contains(w.Body.String(), "Unknown or revoked") {
			t.Fatalf("bad key %d: %d %s", i, w.Code, w.Body.String())
		}
		if strings.Contains(w.Body.String(), "cbk_wrong") {
			t.Error("the login page echoes the key")
		}
	}
	// Throttled now, even with the right key; another address is not.
	w := post("key="+goodKey, "192.0.2.1", "")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || len(w.Result().Cookies()) != 0 {
		t.Fatalf("after %d failures: %d", loginBurst, w.Code)
	}
	if w := post("key="+goodKey, "192.0.2.2", ""); w.Code != http.StatusSeeOther {
		t.Errorf("another address: %d", w.Code)
	}
	f.clock.add(loginEvery + time.Second)
	if w := post("key="+goodKey, "192.0.2.1", ""); w.Code != http.StatusSeeOther {
		t.Errorf("after the wait: %d", w.Code)
	}
	// A success clears the count.
	if w := post("key=cbk_wrong", "192.0.2.1", ""); w.Code != 401 {
		t.Errorf("a failure after success: %d", w.Code)
	}
}

func apiReq(method string, ck *http.Cookie, csrf, org string) *http.Request {
	r := req(method, apiTarget, strings.NewReader("{}"))
	if ck != nil {
		r.AddCookie(ck)
	}
	if csrf != "" {
		r.Header.Set("X-CSRF-Token", csrf)
	}
	if org != "" {
		r.Header.Set("Origin", org)
	}
	return r
}

func TestAuthenticateCSRFAndOrigin(t *testing.T) {
	f := newFixture(t)
	ck := f.login(t, goodKey)
	tok := f.csrf(t, ck)
	other := f.login(t, otherKey)
	otherTok := f.csrf(t, other)
	for _, tc := range []struct {
		name    string
		r       *http.Request
		tenant  string
		ok      bool
		errKind error
	}{
		{"no cookie", apiReq("POST", nil, tok, origin), "", false, nil},
		{"GET needs no token", apiReq("GET", ck, "", ""), tenantID, true, nil},
		{"HEAD needs no token", apiReq("HEAD", ck, "", ""), tenantID, true, nil},
		{"POST with token and origin", apiReq("POST", ck, tok, origin), tenantID, true, nil},
		{"DELETE with token and origin", apiReq("DELETE", ck, tok, origin), tenantID, true, nil},
		{"POST without token", apiReq("POST", ck, "", origin), "", true, errdefs.ErrDenied},
		{"POST with a wrong token", apiReq("POST", ck, tok[:len(tok)-2]+"xx", origin), "", true, errdefs.ErrDenied},
		{"POST with another session's token", apiReq("POST", ck, otherTok, origin), "", true, errdefs.ErrDenied},
		{"PUT without origin", apiReq("PUT", ck, tok, ""), "", true, errdefs.ErrDenied},
		{"PATCH from another origin", apiReq("PATCH", ck, tok, "https://evil.test"), "", true, errdefs.ErrDenied},
		{"POST from another port", apiReq("POST", ck, tok, "http://console.test:7071"), "", true, errdefs.ErrDenied},
		{"POST with origin null", apiReq("POST", ck, tok, "null"), "", true, errdefs.ErrDenied},
		{"unknown session", apiReq("GET", &http.Cookie{Name: CookieName, Value: "nope"}, "", ""), "", true, errdefs.ErrUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tenant, ok, err := f.c.Authenticate(tc.r)
			if ok != tc.ok || tenant != tc.tenant {
				t.Errorf("got %q %v %v", tenant, ok, err)
			}
			if tc.errKind == nil && err != nil || tc.errKind != nil && !errorsIs(err, tc.errKind) {
				t.Errorf("err %v, want %v", err, tc.errKind)
			}
		})
	}
	// A WebSocket upgrade carries the token in the query (and still needs
	// the origin); the query token is not accepted on other requests.
	ws := func(q, org string) *http.Request {
		r := req("GET", origin+"/v1/sandboxes/sb-1/pty?"+q, nil)
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Connection", "Upgrade")
		if org != "" {
			r.Header.Set("Origin", org)
		}
		r.AddCookie(ck)
		return r
	}
	if _, _, err := f.c.Authenticate(ws("csrf="+url.QueryEscape(tok), origin)); err != nil {
		t.Errorf("upgrade with token: %v", err)
	}
	for name, r := range map[string]*http.Request{
		"upgrade without token":     ws("rows=24", origin),
		"upgrade with wrong token":  ws("csrf=x", origin),
		"upgrade from elsewhere":    ws("csrf="+url.QueryEscape(tok), "https://evil.test"),
		"upgrade without origin":    ws("csrf="+url.QueryEscape(tok), ""),
		"POST with the query token": apiReqQuery(ck, tok),
	} {
		if _, _, err := f.c.Authenticate(r); !errorsIs(err, errdefs.ErrDenied) {
			t.Errorf("%s: %v, want denied", name, err)
		}
	}
	// Sessions are bound to the origin they were made on (a 127.0.0.1
	// cookie goes to every port).
	r := apiReq("GET", ck, "", "")
	r.Host = "console.test:9999"
	if _, _, err := f.c.Authenticate(r); !errorsIs(err, errdefs.ErrUnauthorized) {
		t.Errorf("session on another port: %v", err)
	}
}

func apiReqQuery(ck *http.Cookie, tok string) *http.Request {
	r := req("POST", apiTarget+"?csrf="+url.QueryEscape(tok), strings.NewReader("{}"))
	r.Header.Set("Origin", origin)
	r.AddCookie(ck)
	return r
}

func errorsIs(err, target error) bool {
	for e := err; e != nil; {
		if e == target {
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}

func TestSessionExpiry(t *testing.T) {
	f := newFixture(t)
	ck := f.login(t, goodKey)
	get := func() error { _, _, err := f.c.Authenticate(apiReq("GET", ck, "", "")); return err }
	// Activity keeps it alive past the idle limit...
	for i := 0; i < 5; i++ {
		f.clock.add(9 * time.Minute)
		if err := get(); err != nil {
			t.Fatalf("active session after %d×9m: %v", i+1, err)
		}
	}
	// ...but idle ends it.
	f.clock.add(11 * time.Minute)
	if err := get(); !errorsIs(err, errdefs.ErrUnauthorized) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("idle session: %v", err)
	}
	if err := get(); !errorsIs(err, errdefs.ErrUnauthorized) {
		t.Fatalf("an expired session came back: %v", err)
	}
	// The absolute age ends an active one.
	ck = f.login(t, goodKey)
	for i := 0; i < 6; i++ {
		f.clock.add(9 * time.Minute)
		_ = get()
	}
	f.clock.add(8 * time.Minute)
	if err := get(); !errorsIs(err, errdefs.ErrUnauthorized) {
		t.Fatalf("a session over its maximum age: %v", err)
	}
	// The index page sends an expired session to the login page.
	r := req("GET", origin+"/ui/", nil)
	r.AddCookie(ck)
	if w := f.do(r); w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/ui/login" {
		t.Errorf("index with an expired session: %d %s", w.Code, w.Header().Get("Location"))
	}
}

func TestRevokedKeyEndsSession(t *testing.T) {
	f := newFixture(t)
	ck := f.login(t, goodKey)
	if tn, _, err := f.c.Authenticate(apiReq("GET", ck, "", "")); err != nil || tn != tenantID {
		t.Fatalf("before revocation: %q %v", tn, err)
	}
	f.keys.revoke(goodKey)
	if _, ok, err := f.c.Authenticate(apiReq("GET", ck, "", "")); !ok || !errorsIs(err, errdefs.ErrUnauthorized) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("after revocation: %v %v", ok, err)
	}
	r := req("GET", origin+"/ui/session", nil)
	r.AddCookie(ck)
	if w := f.do(r); w.Code != 401 {
		t.Errorf("session info after revocation: %d", w.Code)
	}
	// Nor can it log in again.
	r = req("POST", origin+"/ui/login", strings.NewReader("key="+goodKey))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if w := f.do(r); w.Code != 401 {
		t.Errorf("login with a revoked key: %d", w.Code)
	}
}

func TestLogout(t *testing.T) {
	f := newFixture(t)
	ck := f.login(t, goodKey)
	tok := f.csrf(t, ck)
	// Without the token, logout is refused (a cross-site form cannot end
	// a session either).
	r := req("POST", origin+"/ui/logout", strings.NewReader(""))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", origin)
	r.AddCookie(ck)
	if w := f.do(r); w.Code != 403 {
		t.Errorf("logout without token: %d", w.Code)
	}
	r = req("POST", origin+"/ui/logout", strings.NewReader("csrf="+url.QueryEscape(tok)))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", origin)
	r.AddCookie(ck)
	w := f.do(r)
	if w.Code != http.StatusSeeOther {
		t.Fatalf("logout: %d %s", w.Code, w.Body.String())
	}
	cleared := false
	for _, c := range w.Result().Cookies() {
		cleared = cleared || c.Name == CookieName && c.MaxAge < 0
	}
	if !cleared {
		t.Error("logout did not clear the cookie")
	}
	if _, _, err := f.c.Authenticate(apiReq("GET", ck, "", "")); !errorsIs(err, errdefs.ErrUnauthorized) {
		t.Errorf("after logout: %v", err)
	}
}

func TestOneTimeToken(t *testing.T) {
	f := newFixture(t)
	tok, exp := f.c.NewToken(origin)
	if !exp.Equal(f.clock.now().Add(time.Minute)) {
		t.Errorf("expiry %v", exp)
	}
	u := LoginURL(origin, tok)
	if !strings.HasPrefix(u, origin+"/ui/login?token=") {
		t.Fatalf("URL %s", u)
	}
	open := func(u, host string) *httptest.ResponseRecorder {
		r := req("GET", u, nil)
		r.Host = host
		return f.do(r)
	}
	w := open(u, testHost)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/ui/" {
		t.Fatalf("first use: %d %s", w.Code, w.Body.String())
	}
	var ck *http.Cookie
	for _, c := range w.Result().Cookies() {
		if c.Name == CookieName {
			ck = c
		}
	}
	if ck == nil || !ck.HttpOnly || !ck.Secure || ck.SameSite != http.SameSiteStrictMode {
		t.Fatalf("cookie %+v", ck)
	}
	if tn, _, err := f.c.Authenticate(apiReq("GET", ck, "", "")); err != nil || tn != adminID {
		t.Errorf("token session: %q %v", tn, err)
	}
	if w := open(u, testHost); w.Code != 401 || !strings.Contains(w.Body.String(), "already used") || len(w.Result().Cookies()) != 0 {
		t.Errorf("second use: %d %s", w.Code, w.Body.String())
	}
	// Expired.
	tok2, _ := f.c.NewToken(origin)
	f.clock.add(61 * time.Second)
	if w := open(LoginURL(origin, tok2), testHost); w.Code != 401 || !strings.Contains(w.Body.String(), "expired") {
		t.Errorf("expired token: %d %s", w.Code, w.Body.String())
	}
	// Good only on the origin it was made for.
	tok3, _ := f.c.NewToken(origin)
	if w := open("http://elsewhere.test/ui/login?token="+url.QueryEscape(tok3), "elsewhere.test"); w.Code != 401 {
		t.Errorf("token on another origin: %d", w.Code)
	}
	// ...and used up by that attempt.
	if w := open(LoginURL(origin, tok3), testHost); w.Code != 401 {
		t.Errorf("token after a wrong-origin try: %d", w.Code)
	}
}

// TestNoKeyInResponses: neither the API key nor anything derived from it
// appears in any console response after login.
func TestNoKeyInResponses(t *testing.T) {
	f := newFixture(t)
	ck := f.login(t, goodKey)
	keyHash := fmt.Sprintf("%x", sha256.Sum256([]byte(goodKey)))
	for _, p := range []string{"/ui/", "/ui/session", "/ui/login", "/ui/static/app.js"} {
		r := req("GET", origin+p, nil)
		r.AddCookie(ck)
		w := f.do(r)
		body := w.Body.String() + fmt.Sprint(w.Header())
		if strings.Contains(body, goodKey) || strings.Contains(body, goodKey[4:20]) || strings.Contains(body, keyHash) {
			t.Errorf("%s: the API key is in the response", p)
		}
	}
	// The failed-login page does not echo what was typed.
	r := req("POST", origin+"/ui/login", strings.NewReader("key=cbk_"+strings.Repeat("9", 64)))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if w := f.do(r); bytes.Contains(w.Body.Bytes(), []byte(strings.Repeat("9", 64))) {
		t.Error("the login page echoes a typed key")
	}
}

// TestSessionsBounded: all sessions together stay under maxSessions; at
// the bound the tenant holding the most loses its oldest, and a tenant
// holding few keeps its session.
func TestSessionsBounded(t *testing.T) {
	f := newFixture(t)
	few := f.login(t, goodKey)
	// Later than the first (the fixture's clock stands still otherwise:
	// a tie would leave which one goes to map order).
	f.clock.add(time.Millisecond)
	big, _ := f.c.newSession("big", nil, origin, "192.0.2.10")
	f.clock.add(time.Millisecond)
	for i := 1; i < maxTenantSessions; i++ {
		f.c.newSession("big", nil, origin, "192.0.2.10")
		f.clock.add(time.Millisecond)
	}
	// 300 tenants, round robin: the bound is reached while each holds
	// fewer than big's maxTenantSessions.
	for i := 0; i < maxSessions; i++ {
		f.c.newSession(fmt.Sprintf("t%d", i%300), nil, origin, "192.0.2.10")
		f.clock.add(time.Millisecond)
	}
	f.c.mu.Lock()
	n := len(f.c.sessions)
	f.c.mu.Unlock()
	if n > maxSessions {
		t.Errorf("%d sessions kept, limit %d", n, maxSessions)
	}
	if _, _, err := f.c.Authenticate(apiReq("GET", few, "", "")); err != nil {
		t.Errorf("a tenant with one session lost it: %v", err)
	}
	if _, _, err := f.c.Authenticate(apiReq("GET", &http.Cookie{Name: CookieName, Value: big}, "", "")); err == nil {
		t.Error("the oldest session of the tenant holding the most survived the limit")
	}
}

// adminSession logs in with a one-time token and returns the cookie.
func (f *fixture) adminSession(t *testing.T) *http.Cookie {
	t.Helper()
	tok, _ := f.c.NewToken(origin)
	w := f.do(req("GET", LoginURL(origin, tok), nil))
	for _, c := range w.Result().Cookies() {
		if c.Name == CookieName && c.Value != "" {
			return c
		}
	}
	t.Fatalf("one-time login: %d %s", w.Code, w.Body.String())
	return nil
}

// TestTenantLoginsEvictOnlyTheirOwn: however many times a tenant logs in
// (paced as the throttle lets it), the admin's session and another
// tenant's stay; the tenant's own oldest sessions go.
func TestTenantLoginsEvictOnlyTheirOwn(t *testing.T) {
	f := newFixture(t)
	f.c.cfg.MaxAge = 24 * time.Hour
	admin := f.adminSession(t)
	other := f.login(t, otherKey)
	f.clock.add(time.Millisecond)
	firstOwn := f.login(t, goodKey)
	for i := 0; i < 4200; i++ {
		f.clock.add(6 * time.Second)
		f.login(t, goodKey)
		// Stay within the idle timeout of the sessions kept.
		if i%50 == 0 {
			for _, ck := range []*http.Cookie{admin, other} {
				if _, _, err := f.c.Authenticate(apiReq("GET", ck, "", "")); err != nil {
					t.Fatalf("after %d tenant logins: %v", i+1, err)
				}
			}
		}
	}
	for name, ck := range map[string]*http.Cookie{"admin": admin, "other tenant": other} {
		if _, _, err := f.c.Authenticate(apiReq("GET", ck, "", "")); err != nil {
			t.Errorf("the %s's session was evicted by another tenant's logins: %v", name, err)
		}
	}
	if _, _, err := f.c.Authenticate(apiReq("GET", firstOwn, "", "")); err == nil {
		t.Error("the tenant's own oldest session survived its cap")
	}
}

// TestSuccessfulLoginsThrottled: right keys too are throttled, per key
// (from any address) and per client address (with any key).
func TestSuccessfulLoginsThrottled(t *testing.T) {
	f := newFixture(t)
	post := func(key, addr string) *httptest.ResponseRecorder {
		r := req("POST", origin+"/ui/login", strings.NewReader(url.Values{"key": {key}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.RemoteAddr = addr + ":1000"
		return f.do(r)
	}
	n := 0
	for ; n < 100; n++ {
		if w := post(goodKey, "192.0.2.1"); w.Code != http.StatusSeeOther {
			if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || len(w.Result().Cookies()) != 0 {
				t.Fatalf("login %d: %d %s", n+1, w.Code, w.Body.String())
			}
			break
		}
	}
	if n == 100 {
		t.Fatal("100 successful logins in a row with one key were not throttled")
	}
	if w := post(goodKey, "192.0.2.2"); w.Code != http.StatusTooManyRequests {
		t.Errorf("the same key from another address: %d, want 429", w.Code)
	}
	if w := post(otherKey, "192.0.2.1"); w.Code != http.StatusTooManyRequests {
		t.Errorf("another key from the same address: %d, want 429", w.Code)
	}
	if w := post(otherKey, "192.0.2.3"); w.Code != http.StatusSeeOther {
		t.Errorf("another key from another address: %d", w.Code)
	}
	f.clock.add(time.Minute)
	if w := post(goodKey, "192.0.2.1"); w.Code != http.StatusSeeOther {
		t.Errorf("after a wait: %d", w.Code)
	}
}

// TestSessionBoundToClient: a session cookie is good only from the client
// address it was made from, and only on the host it was made on.
func TestSessionBoundToClient(t *testing.T) {
	f := newFixture(t)
	ck := f.login(t, goodKey)
	r := apiReq("GET", ck, "", "")
	r.RemoteAddr = "198.51.100.7:5555"
	if _, _, err := f.c.Authenticate(r); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("the cookie replayed from another address: %v, want unauthorized", err)
	}
	r = apiReq("GET", ck, "", "")
	r.Host = "8080-sb123.sandboxes.test:7070"
	if _, _, err := f.c.Authenticate(r); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("the cookie replayed on another host name: %v, want unauthorized", err)
	}
	if tn, _, err := f.c.Authenticate(apiReq("GET", ck, "", "")); err != nil || tn != tenantID {
		t.Errorf("the session where it was made: %q %v", tn, err)
	}
}

// TestNotOnIngressNames: the console neither serves pages nor accepts
// sessions on the ingress domain's names.
func TestNotOnIngressNames(t *testing.T) {
	f := newFixture(t)
	f.c.cfg.Foreign = func(h string) bool { return h == "sandboxes.test" || strings.HasSuffix(h, ".sandboxes.test") }
	ck := f.login(t, goodKey)
	for _, host := range []string{"8080-sb123.sandboxes.test", "sandboxes.test:443", "8080-SB123.Sandboxes.Test.:7070"} {
		for _, p := range []string{"/ui/login", "/ui/", "/ui/session"} {
			r := req("GET", "http://"+host+p, nil)
			r.Host = host
			if w := f.do(r); w.Code != http.StatusMisdirectedRequest {
				t.Errorf("GET %s%s: %d, want 421", host, p, w.Code)
			}
		}
		r := apiReq("GET", ck, "", "")
		r.Host = host
		if _, ok, err := f.c.Authenticate(r); !ok || !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Errorf("a session on %s: %v %v", host, ok, err)
		}
	}
}
