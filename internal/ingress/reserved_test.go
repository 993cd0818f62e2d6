package ingress

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

// guestSeen is what the stand-in guest of reservedEnv received.
type guestSeen struct {
	URI    string      `json:"uri"`
	Header http.Header `json:"header"`
}

// reservedEnv is a listener for D = sb.test in front of a guest that
// echoes what it received and answers the Set-Cookie headers asked for
// in ?set= (one per value).
func reservedEnv(t *testing.T) (srv *Server, tok string, do func(host, target string, hdr http.Header) (*http.Response, guestSeen)) {
	t.Helper()
	guest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, c := range r.URL.Query()["set"] {
			w.Header().Add("Set-Cookie", c)
		}
		_ = json.NewEncoder(w).Encode(guestSeen{URI: r.URL.RequestURI(), Header: r.Header})
	}))
	t.Cleanup(guest.Close)
	tok = NewToken()
	fb := &fakeBackend{target: &Target{Tenant: "t", Addr: netip.MustParseAddrPort(guest.Listener.Addr().String()), TokenHash: HashToken(tok)}}
	srv = New(Config{Domain: "sb.test", Backend: fb, Signer: &Signer{Key: []byte("k")}})
	do = func(host, target string, hdr http.Header) (*http.Response, guestSeen) {
		r := httptest.NewRequest("GET", target, nil)
		r.Host = host
		for k, v := range hdr {
			r.Header[k] = v
		}
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		var g guestSeen
		if w.Code == 200 {
			if err := json.Unmarshal(w.Body.Bytes(), &g); err != nil {
				t.Fatalf("%s %s: %v %q", host, target, err, w.Body)
			}
		}
		return w.Result(), g
	}
	return srv, tok, do
}

// No cagebox cookie or header reaches a guest, whatever its spelling; the
// path form is not served on any host name but D.
func TestReservedRequestNamesStripped(t *testing.T) {
	_, tok, do := reservedEnv(t)
	host := "8080-" + testID + ".sb.test"
	hdr := http.Header{
		"X-Cagebox-Access": {tok},
		"Cookie": {"cagebox_session=s1; app=1; cbx_access=x", "__Host-cagebox_session=s2; CBX_ACCESS=y",
			"Cagebox_Session=s3; cbx_other=z; b=2"},
		"X_cagebox_webhook_verified": {"github"}, // HTTP_X_CAGEBOX_WEBHOOK_VERIFIED to WSGI, CGI, PHP
		"x-cagebox-delivery":         {"1"},
	}
	for _, target := range []string{"/p", "/s/" + testID + "/8080/p"} {
		h := host
		if strings.HasPrefix(target, "/s/") {
			h = "SB.test:8443"
		}
		resp, g := do(h, target, hdr)
		if resp.StatusCode != 200 || g.URI != "/p" {
			t.Fatalf("%s%s: %d %+v", h, target, resp.StatusCode, g)
		}
		if c := g.Header.Values("Cookie"); len(c) != 1 || c[0] != "app=1; b=2" {
			t.Errorf("%s%s: guest got Cookie %q", h, target, c)
		}
		for k := range g.Header {
			if strings.Contains(strings.ToLower(strings.ReplaceAll(k, "_", "-")), "cagebox") {
				t.Errorf("%s%s: guest got header %s", h, target, k)
			}
		}
	}
	// The path form on any other host name (the API's or the console's,
	// whose cookies come along with any port of theirs) is not served.
	for _, h := range []string{"anything", "127.0.0.1:8443", "api.sb.test", "hooks.sb.test.example"} {
		if resp, _ := do(h, "/s/"+testID+"/8080/p", http.Header{"X-Cagebox-Access": {tok}}); resp.StatusCode != 404 {
			t.Errorf("path form on Host %s: %d, want 404", h, resp.StatusCode)
		}
	}
}

// A guest's cookies stay with the port that set it: no Domain (no
// cookie for D, every other sandbox and hooks.D), the path form's Path
// under its prefix, and none named like cagebox's.
func TestGuestCookiesScoped(t *testing.T) {
	_, tok, do := reservedEnv(t)
	auth := http.Header{"X-Cagebox-Access": {tok}}
	set := func(cs ...string) string {
		v := url.Values{"set": cs}
		return "?" + v.Encode()
	}
	prefix := "/s/" + testID + "/8080"
	for _, tc := range []struct {
		host, path string
		set        []string
		want       []string // the Set-Cookie headers the client gets
	}{
		{"8080-" + testID + ".sb.test", "/", []string{"a=1; Domain=sb.test; Path=/; Secure", "b=2; domain=.SB.TEST", "c=3"},
			[]string{"a=1; Path=/; Secure", "b=2", "c=3"}},
		{"8080-" + testID + ".sb.test", "/", []string{"cagebox_session=evil; Path=/", "cbx_access=evil", "__Host-cagebox_session=x; Path=/; Secure", "CBX_Access=y", "ok=1"},
			[]string{"ok=1"}},
		{"8080-" + testID + ".sb.test", "/", []string{"=novalue; Domain=sb.test", "bad name=1; Domain=sb.test"}, nil},
		{"sb.test", prefix + "/deep/x", []string{"a=1; Domain=sb.test; Path=/app", "b=2", "c=3; Path=rel", "cagebox_session=evil; Path=/"},
			[]string{"a=1; Path=" + prefix + "/app", "b=2; Path=" + prefix, "c=3; Path=" + prefix}},
	} {
		resp, _ := do(tc.host, tc.path+set(tc.set...), auth)
		if resp.StatusCode != 200 {
			t.Fatalf("%s%s: %d", tc.host, tc.path, resp.StatusCode)
		}
		got := resp.Header.Values("Set-Cookie")
		if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("%s%s with %q:\n got %q\nwant %q", tc.host, tc.path, tc.set, got, tc.want)
		}
	}
}

// The query is decided on once: a signature in any encoding of its name
// is the one checked and the one removed; duplicates and a cagebox
// parameter hidden behind ';' are refused.
func TestQueryDecidedOnce(t *testing.T) {
	srv, tok, do := reservedEnv(t)
	host := "8080-" + testID + ".sb.test"
	sig := srv.cfg.Signer.Sign(testID, 8080, time.Now().Add(time.Minute), HashToken(tok))
	for _, tc := range []struct {
		query, forward string
	}{
		{"a=1&cbx_sig=" + sig + "&b=2", "a=1&b=2"},
		{"a=1&cbx%5Fsig=" + sig, "a=1"},
		{"cbx%5fsig=" + sig + "&z=%41+b", "z=%41+b"},
		{"cbx_s%69g=" + sig + "&a", "a"},
		{"cbx%255Fsig=x&cbx_sig=" + sig, ""}, // a name a guest decoding twice reads as cbx_sig: dropped
		{"CBX_SIG=x&cbx_other=1&cbx_sig=" + sig + "&q=cbx_sig", "q=cbx_sig"},
	} {
		resp, g := do(host, "/p?"+tc.query, nil)
		if resp.StatusCode != 200 {
			t.Errorf("?%s: %d, want 200", tc.query, resp.StatusCode)
			continue
		}
		want := "/p"
		if tc.forward != "" {
			want += "?" + tc.forward
		}
		if g.URI != want {
			t.Errorf("?%s: guest got %q, want %q", tc.query, g.URI, want)
		}
		if strings.Contains(g.URI, sig[strings.IndexByte(sig, '.')+1:]) {
			t.Errorf("?%s: the signature reached the guest: %q", tc.query, g.URI)
		}
	}
	// With the token: the guest never sees a cagebox parameter either.
	if _, g := do(host, "/p?x=1&cbx%5Fsig=anything", http.Header{"X-Cagebox-Access": {tok}}); g.URI != "/p?x=1" {
		t.Errorf("with token: guest got %q", g.URI)
	}
	for _, q := range []string{
		"cbx_sig=" + sig + "&cbx_sig=" + sig,
		"cbx_sig=" + sig + "&cbx%5Fsig=1.AAAA",
		"a=1;cbx_sig=" + sig,
		"a=1;cbx%5Fsig=" + sig,
	} {
		if resp, g := do(host, "/p?"+q, nil); resp.StatusCode != 400 {
			t.Errorf("?%s: %d %+v, want 400", q, resp.StatusCode, g)
		}
	}
}
