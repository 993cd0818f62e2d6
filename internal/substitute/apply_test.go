package substitute

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
)

const boundHost = "api.github.com"

// secret is a real value with its placeholder.
type secret struct {
	name, real, ph string
}

func newSecret(t testing.TB, name, real string) secret {
	t.Helper()
	ph, err := NewPlaceholder([]byte(real))
	if err != nil {
		t.Fatal(err)
	}
	return secret{name: name, real: real, ph: ph}
}

func (s secret) binding(hosts ...string) *Binding {
	real := s.real
	return &Binding{Name: s.name, Placeholder: s.ph, Real: func(string) ([]byte, error) { return []byte(real), nil }, Hosts: hosts}
}

func mustSet(t testing.TB, bs ...*Binding) *Set {
	t.Helper()
	s, err := NewSet(bs...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ghSecret(t testing.TB) secret {
	return newSecret(t, "GITHUB_TOKEN", "ghp_"+randFrom(t, alnum, 36))
}

// noLeak fails if a refusal or error text carries the real value or the
// placeholder.
func noLeak(t *testing.T, s secret, texts ...string) {
	t.Helper()
	for _, x := range texts {
		if strings.Contains(x, s.real) || strings.Contains(x, s.ph) {
			t.Fatalf("text carries a secret or placeholder: %q", x)
		}
	}
}

func TestSwapHeader(t *testing.T) {
	gh := ghSecret(t)
	up := newUpstream(t)
	b := gh.binding(boundHost)
	b.Headers = []string{"x-other"}
	p := newProxy(t, mustSet(t, b), up, boundHost, true)
	r, _ := http.NewRequest("GET", p.URL+"/user", nil)
	r.Header.Set("Authorization", "Bearer "+gh.ph)
	r.Header.Add("X-Other", "a "+gh.ph+" b")
	r.Header.Add("X-Other", "untouched")
	if code, body := do(t, r); code != http.StatusNoContent {
		t.Fatalf("status %d: %s", code, body)
	}
	got := up.last(t)
	if got.Header.Get("Authorization") != "Bearer "+gh.real {
		t.Fatalf("Authorization = %q", got.Header.Get("Authorization"))
	}
	if v := got.Header.Values("X-Other"); len(v) != 2 || v[0] != "a "+gh.real+" b" || v[1] != "untouched" {
		t.Fatalf("X-Other = %q", v)
	}
	if res := p.lastResult(t); len(res.Replaced) != 1 || res.Replaced[0] != "GITHUB_TOKEN" || res.Alert {
		t.Fatalf("result %+v", res)
	}
}

func TestSwapBasicAuth(t *testing.T) {
	gh := ghSecret(t)
	up := newUpstream(t)
	p := newProxy(t, mustSet(t, gh.binding(boundHost)), up, boundHost, true)
	for _, user := range []string{"x-access-token", ""} {
		r, _ := http.NewRequest("GET", p.URL+"/repos", nil)
		r.SetBasicAuth(user, gh.ph)
		if code, body := do(t, r); code != http.StatusNoContent {
			t.Fatalf("status %d: %s", code, body)
		}
		req := &http.Request{Header: up.last(t).Header}
		u, pw, ok := req.BasicAuth()
		if !ok || u != user || pw != gh.real {
			t.Fatalf("basic auth upstream: %q ok=%v, password real=%v", u, ok, pw == gh.real)
		}
	}
	// The placeholder as the user name too.
	r, _ := http.NewRequest("GET", p.URL+"/repos", nil)
	r.SetBasicAuth(gh.ph, "x-oauth-basic")
	do(t, r)
	req := &http.Request{Header: up.last(t).Header}
	if u, pw, _ := req.BasicAuth(); u != gh.real || pw != "x-oauth-basic" {
		t.Fatal("placeholder as basic user name not swapped")
	}
}

func TestSwapQuery(t *testing.T) {
	gh := newSecret(t, "KEY", "sk-"+randFrom(t, alnum, 48))
	gh.real += "+/=" // a real value that needs escaping in a query
	up := newUpstream(t)
	b := gh.binding(boundHost)
	b.Query = []string{"token", "x"}
	p := newProxy(t, mustSet(t, b), up, boundHost, true)
	enc := url.QueryEscape(gh.real)
	for _, q := range []string{
		"a=1&token=" + gh.ph + "&b=x%20y",
		"a=1&token=" + pctAll(gh.ph, true) + "&b=x%20y",
		"a=1&token=" + pctAll(gh.ph, false) + "&b=x%20y",
	} {
		r, _ := http.NewRequest("GET", p.URL+"/v1?"+q, nil)
		if code, body := do(t, r); code != http.StatusNoContent {
			t.Fatalf("status %d: %s", code, body)
		}
		got := up.last(t)
		if got.RawQuery != "a=1&token="+enc+"&b=x%20y" {
			t.Fatalf("raw query %q", got.RawQuery)
		}
		if got.Query.Get("token") != gh.real {
			t.Fatal("decoded token is not the real value")
		}
	}
	// A value that merely contains it.
	r, _ := http.NewRequest("GET", p.URL+"/v1?a&x=pre-"+gh.ph, nil)
	do(t, r)
	got := up.last(t)
	if got.RawQuery != "a&x=pre-"+enc {
		t.Fatalf("raw query %q", got.RawQuery)
	}
	// The placeholder as a key, or in a parameter the binding does not
	// name: refused, saying where it may go.
	n := up.count()
	for q, want := range map[string]string{
		gh.ph + "&x=1":                 "parameter name",
		"other=" + gh.ph:               "--secret-query KEY:other",
		"other=" + pctAll(gh.ph, true): "--secret-query KEY:other",
	} {
		r, _ := http.NewRequest("GET", p.URL+"/v1?"+q, nil)
		code, resp := do(t, r)
		if code != http.StatusForbidden || !strings.Contains(resp, want) || !strings.Contains(resp, "token") {
			t.Fatalf("%s: %d %s", q, code, resp)
		}
		if res := p.lastResult(t); res.Alert {
			t.Fatalf("%s: a misplaced placeholder to its bound host is no alert", q)
		}
		noLeak(t, gh, resp)
	}
	if up.count() != n {
		t.Fatal("a refused request reached the upstream")
	}
}

// pctAll percent-encodes every byte of s.
func pctAll(s string, upperHex bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		f := "%%%02x"
		if upperHex {
			f = "%%%02X"
		}
		fmt.Fprintf(&b, f, s[i])
	}
	return b.String()
}

func TestSwapBody(t *testing.T) {
	gh := ghSecret(t)
	gh.real = gh.real[:10] + `"\` + gh.real[10:] // needs JSON escaping
	up := newUpstream(t)
	b := gh.binding(boundHost)
	b.Body = true
	p := newProxy(t, mustSet(t, b), up, boundHost, true)

	body := `{"token":"` + gh.ph + `","again":"` + gh.ph + `"}`
	r, _ := http.NewRequest("POST", p.URL+"/graphql", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if code, resp := do(t, r); code != http.StatusNoContent {
		t.Fatalf("status %d: %s", code, resp)
	}
	got := up.last(t)
	want := strings.ReplaceAll(body, gh.ph, strings.ReplaceAll(strings.ReplaceAll(gh.real, `\`, `\\`), `"`, `\"`))
	if string(got.Body) != want {
		t.Fatalf("body %q, want %q", got.Body, want)
	}
	if got.CL != int64(len(want)) {
		t.Fatalf("Content-Length %d, want %d", got.CL, len(want))
	}

	// A form body gets the value query-escaped.
	r, _ = http.NewRequest("POST", p.URL+"/login", strings.NewReader("u=me&p="+gh.ph))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	do(t, r)
	if got := up.last(t); string(got.Body) != "u=me&p="+url.QueryEscape(gh.real) || got.CL != int64(len(got.Body)) {
		t.Fatalf("form body %q (CL %d)", got.Body, got.CL)
	}
}

func TestBodyWithoutOptIn(t *testing.T) {
	gh := ghSecret(t)
	up := newUpstream(t)
	p := newProxy(t, mustSet(t, gh.binding(boundHost)), up, boundHost, true)
	body := `{"token":"` + gh.ph + `"}`
	r, _ := http.NewRequest("POST", p.URL+"/x", strings.NewReader(body))
	// Without --secret-in-body a placeholder in a body is refused, saying
	// how to opt in; known length and streamed alike.
	code, resp := do(t, r)
	if code != http.StatusForbidden || !strings.Contains(resp, "--secret-in-body GITHUB_TOKEN") {
		t.Fatalf("status %d: %s", code, resp)
	}
	code, resp = rawChunked(t, p.Listener.Addr().String(), "/x", http.Header{}, []string{`{"token":"` + gh.ph[:9], gh.ph[9:] + `"}`}, nil)
	if code != http.StatusForbidden || !strings.Contains(resp, "--secret-in-body GITHUB_TOKEN") {
		t.Fatalf("chunked: status %d: %s", code, resp)
	}
	noLeak(t, gh, resp)
	if up.count() != 0 {
		t.Fatal("a refused body reached the upstream")
	}
}

func TestBodyOverLimit(t *testing.T) {
	gh := ghSecret(t)
	up := newUpstream(t)
	b := gh.binding(boundHost)
	b.Body, b.BodyLimit = true, 64
	p := newProxy(t, mustSet(t, b), up, boundHost, true)
	body := strings.Repeat("x", 100) + gh.ph
	r, _ := http.NewRequest("POST", p.URL+"/x", strings.NewReader(body))
	code, resp := do(t, r)
	if code != http.StatusForbidden || !strings.Contains(resp, "limit") {
		t.Fatalf("status %d: %s", code, resp)
	}
	noLeak(t, gh, resp)
	// Streamed (chunked) past the limit: aborted mid-stream.
	code, resp = rawChunked(t, p.Listener.Addr().String(), "/x", http.Header{}, []string{strings.Repeat("y", 80), gh.ph}, nil)
	if code != http.StatusForbidden || !strings.Contains(resp, "limit") {
		t.Fatalf("chunked: status %d: %s", code, resp)
	}
	if up.count() != 0 {
		t.Fatal("a request over the limit reached the upstream")
	}
}

func TestInject(t *testing.T) {
	gh := ghSecret(t)
	b := gh.binding(boundHost)
	b.Inject = "Authorization: Bearer {value}"
	set := mustSet(t, b)
	up := newUpstream(t)
	p := newProxy(t, set, up, boundHost, true)
	r, _ := http.NewRequest("GET", p.URL+"/user", nil)
	r.Header.Set("Authorization", "token nothing-to-see")
	if code, _ := do(t, r); code != http.StatusNoContent {
		t.Fatalf("status %d", code)
	}
	if got := up.last(t).Header.Get("Authorization"); got != "Bearer "+gh.real {
		t.Fatalf("Authorization = %q", got)
	}
	// Nothing is injected for another host, or over plain HTTP.
	for _, c := range []struct {
		host string
		tls  bool
	}{{"other.example", true}, {boundHost, false}} {
		p := newProxy(t, set, up, c.host, c.tls)
		r, _ := http.NewRequest("GET", p.URL+"/", nil)
		if code, _ := do(t, r); code != http.StatusNoContent {
			t.Fatalf("status %d", code)
		}
		if got := up.last(t).Header.Get("Authorization"); got != "" {
			t.Fatalf("%s tls=%v: injected %q", c.host, c.tls, got)
		}
	}
	if _, err := NewSet(&Binding{Name: "X", Placeholder: gh.ph, Real: b.Real, Inject: "Authorization Bearer"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad inject accepted: %v", err)
	}
}

func TestChunkedSplit(t *testing.T) {
	gh := ghSecret(t)
	up := newUpstream(t)
	b := gh.binding(boundHost)
	b.Body = true
	b.Headers = []string{"X-Sig"}
	p := newProxy(t, mustSet(t, b), up, boundHost, true)
	// Split the placeholder over three chunks.
	pieces := []string{`{"a":"` + gh.ph[:3], gh.ph[3:17], gh.ph[17:] + `","b":"` + gh.ph[:20], gh.ph[20:] + `"}`}
	code, resp := rawChunked(t, p.Listener.Addr().String(), "/x", http.Header{"Content-Type": {"text/plain"}}, pieces, http.Header{"X-Sig": {"t=" + gh.ph}})
	if code != http.StatusNoContent {
		t.Fatalf("status %d: %s", code, resp)
	}
	got := up.last(t)
	want := `{"a":"` + gh.real + `","b":"` + gh.real + `"}`
	if string(got.Body) != want {
		t.Fatalf("body %q", got.Body)
	}
	if len(got.TE) != 1 || got.TE[0] != "chunked" || got.CL != -1 {
		t.Fatalf("framing: TE %v CL %d", got.TE, got.CL)
	}
	if got.Trailer.Get("X-Sig") != "t="+gh.real {
		t.Fatalf("trailer %q", got.Trailer.Get("X-Sig"))
	}
}

// TestStreamOneByte feeds the streaming body one byte per Read.
func TestStreamOneByte(t *testing.T) {
	gh := ghSecret(t)
	other := newSecret(t, "OTHER", "sk_live_"+randFrom(t, alnum, 24))
	b := gh.binding(boundHost)
	b.Body = true
	set := mustSet(t, b, other.binding("api.stripe.com"))
	body := "pre " + gh.ph + gh.ph + " mid " + gh.ph[:10] + " end " + gh.ph
	r, _ := http.NewRequest("POST", "https://"+boundHost+"/", nil)
	r.Body = io.NopCloser(iotest.OneByteReader(strings.NewReader(body)))
	r.ContentLength = -1
	res, err := set.Apply(r, boundHost, true)
	if err != nil || res.Refusal != nil {
		t.Fatalf("%v %+v", err, res)
	}
	got, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.ReplaceAll(body, gh.ph, gh.real); string(got) != want {
		t.Fatalf("got %q want %q", got, want)
	}

	// The other binding's placeholder, base64-encoded and dribbled a byte at
	// a time, is refused mid-stream.
	enc := base64.StdEncoding.EncodeToString([]byte("k:" + other.ph))
	r, _ = http.NewRequest("POST", "https://"+boundHost+"/", nil)
	r.Body = io.NopCloser(iotest.OneByteReader(strings.NewReader("data=" + enc)))
	r.ContentLength = -1
	if res, err := set.Apply(r, boundHost, true); err != nil || res.Refusal != nil {
		t.Fatalf("%v %+v", err, res)
	}
	_, err = io.ReadAll(r.Body)
	var re *RefusalError
	if !errors.As(err, &re) || !re.Alert || re.Refusal.Rule != "secret:OTHER" {
		t.Fatalf("stream error %v", err)
	}
	noLeak(t, other, err.Error())
}

// forms returns the encodings of ph a guest might use to smuggle it.
func forms(ph string) map[string]string {
	f := map[string]string{
		"literal":       ph,
		"percent-lower": pctAll(ph, false),
		"percent-upper": pctAll(ph, true),
		"percent-mixed": pctAll(ph[:5], true) + ph[5:10] + pctAll(ph[10:], false),
		"percent-twice": strings.ReplaceAll(pctAll(ph, true), "%", "%25"),
		"json-u":        jsonU(ph, false),
		"json-U":        jsonU(ph, true),
		"json-partial":  ph[:4] + jsonU(ph[4:9], false) + ph[9:],
		"hex":           hex.EncodeToString([]byte(ph)),
		"HEX":           strings.ToUpper(hex.EncodeToString([]byte(ph))),
	}
	for k := range 3 {
		pad := strings.Repeat("?", k) // '?' (0x3f) makes '/' appear in std base64
		f[fmt.Sprintf("base64-std-%d", k)] = base64.StdEncoding.EncodeToString([]byte(pad + ph + "~~"))
		f[fmt.Sprintf("base64-url-%d", k)] = base64.URLEncoding.EncodeToString([]byte(pad + ph + "~~"))
		f[fmt.Sprintf("base64-raw-%d", k)] = base64.RawStdEncoding.EncodeToString([]byte(pad + ph))
	}
	return f
}

func jsonU(s string, upperHex bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		f := `\u%04x`
		if upperHex {
			f = `\u%04X`
		}
		fmt.Fprintf(&b, f, s[i])
	}
	return b.String()
}

func TestRefuseOtherHost(t *testing.T) {
	gh := ghSecret(t)
	set := mustSet(t, gh.binding(boundHost, "*.githubassets.com"))
	up := newUpstream(t)
	p := newProxy(t, set, up, "other.example", true)
	locations := map[string]func(v string) *http.Request{
		"header": func(v string) *http.Request {
			r, _ := http.NewRequest("GET", p.URL+"/", nil)
			r.Header.Set("X-Data", v)
			return r
		},
		"query": func(v string) *http.Request {
			r, _ := http.NewRequest("GET", p.URL+"/?q="+url.QueryEscape(v), nil)
			return r
		},
		"path": func(v string) *http.Request {
			r, _ := http.NewRequest("GET", p.URL+"/a/"+url.PathEscape(v)+"/b", nil)
			return r
		},
		"body": func(v string) *http.Request {
			r, _ := http.NewRequest("POST", p.URL+"/", strings.NewReader(`{"x":"`+v+`"}`))
			return r
		},
	}
	for form, v := range forms(gh.ph) {
		for loc, mk := range locations {
			t.Run(form+"/"+loc, func(t *testing.T) {
				code, resp := do(t, mk(v))
				if code != http.StatusForbidden {
					t.Fatalf("status %d: %s", code, resp)
				}
				res := p.lastResult(t)
				if res.Refusal == nil || !res.Alert || res.Refusal.Rule != "secret:GITHUB_TOKEN" {
					t.Fatalf("result %+v", res)
				}
				want := "placeholder for GITHUB_TOKEN sent to other.example (bound to api.github.com, *.githubassets.com"
				if !strings.HasPrefix(res.Refusal.Reason, want) {
					t.Fatalf("reason %q", res.Refusal.Reason)
				}
				noLeak(t, gh, res.Refusal.Reason, resp)
			})
		}
	}
	if up.count() != 0 {
		t.Fatalf("%d refused requests reached the upstream", up.count())
	}
	// Chunked body to another host: refused as it streams.
	code, resp := rawChunked(t, p.Listener.Addr().String(), "/", http.Header{}, []string{"a=" + gh.ph[:7], gh.ph[7:]}, nil)
	if code != http.StatusForbidden || !strings.Contains(resp, "other.example") {
		t.Fatalf("chunked: %d %s", code, resp)
	}
	if up.count() != 0 {
		t.Fatal("refused stream reached the upstream handler")
	}
	// Wildcard hosts are bound, the apex of a wildcard is not.
	for host, ok := range map[string]bool{"raw.githubassets.com": true, "a.b.githubassets.com": true, "githubassets.com": false, "API.GITHUB.COM.": true, "api.github.com:443": true, "xapi.github.com": false} {
		r, _ := http.NewRequest("GET", "https://"+host+"/", nil)
		r.Header.Set("Authorization", "Bearer "+gh.ph)
		res, err := set.Apply(r, host, true)
		if err != nil || (res.Refusal == nil) != ok {
			t.Errorf("%s: err %v refusal %+v", host, err, res.Refusal)
		}
	}
}

func TestRefusePlainHTTP(t *testing.T) {
	gh := ghSecret(t)
	up := newUpstream(t)
	p := newProxy(t, mustSet(t, gh.binding(boundHost)), up, boundHost, false)
	r, _ := http.NewRequest("GET", p.URL+"/user", nil)
	r.Header.Set("Authorization", "Bearer "+gh.ph)
	code, resp := do(t, r)
	res := p.lastResult(t)
	if code != http.StatusForbidden || !res.Alert || !strings.Contains(res.Refusal.Reason, "plain HTTP") {
		t.Fatalf("%d %+v", code, res.Refusal)
	}
	noLeak(t, gh, resp)
}

func TestRefusePathToBoundHost(t *testing.T) {
	gh := ghSecret(t)
	up := newUpstream(t)
	p := newProxy(t, mustSet(t, gh.binding(boundHost)), up, boundHost, true)
	r, _ := http.NewRequest("GET", p.URL+"/bot"+gh.ph+"/getMe", nil)
	code, resp := do(t, r)
	if code != http.StatusForbidden || !strings.Contains(resp, "path") {
		t.Fatalf("%d %s", code, resp)
	}
	noLeak(t, gh, resp)
}

func TestRealError(t *testing.T) {
	gh := ghSecret(t)
	b := gh.binding(boundHost)
	b.Real = func(string) ([]byte, error) { return nil, errors.New("vault: secret revoked " + gh.real) }
	up := newUpstream(t)
	p := newProxy(t, mustSet(t, b), up, boundHost, true)
	r, _ := http.NewRequest("GET", p.URL+"/user", nil)
	r.Header.Set("Authorization", "Bearer "+gh.ph)
	code, resp := do(t, r)
	if code != http.StatusForbidden || !strings.Contains(resp, "unavailable") {
		t.Fatalf("%d %s", code, resp)
	}
	noLeak(t, gh, resp)
	if up.count() != 0 {
		t.Fatal("request reached upstream")
	}
}

func TestRealValueNotHeaderSafe(t *testing.T) {
	gh := ghSecret(t)
	gh.real += "\r\nX-Evil: 1"
	up := newUpstream(t)
	p := newProxy(t, mustSet(t, gh.binding(boundHost)), up, boundHost, true)
	r, _ := http.NewRequest("GET", p.URL+"/user", nil)
	r.Header.Set("Authorization", "Bearer "+gh.ph)
	if code, resp := do(t, r); code != http.StatusForbidden {
		t.Fatalf("%d %s", code, resp)
	}
}

func TestRemoveAndRotate(t *testing.T) {
	gh := ghSecret(t)
	var mu sync.Mutex
	real := gh.real
	b := gh.binding(boundHost)
	b.Real = func(string) ([]byte, error) { mu.Lock(); defer mu.Unlock(); return []byte(real), nil }
	set := mustSet(t, b)
	up := newUpstream(t)
	p := newProxy(t, set, up, boundHost, true)
	send := func() int {
		r, _ := http.NewRequest("GET", p.URL+"/user", nil)
		r.Header.Set("Authorization", "Bearer "+gh.ph)
		code, _ := do(t, r)
		return code
	}
	if send() != http.StatusNoContent {
		t.Fatal("first request refused")
	}
	// Rotation: the next request carries the new value.
	mu.Lock()
	real = "ghp_" + randFrom(t, alnum, 36)
	mu.Unlock()
	send()
	if got := up.last(t).Header.Get("Authorization"); got != "Bearer "+real {
		t.Fatal("rotated value not used on the next request")
	}
	set.Remove("GITHUB_TOKEN")
	if len(set.Bindings()) != 0 {
		t.Fatal("removed binding still listed")
	}
	if code := send(); code != http.StatusForbidden {
		t.Fatalf("after Remove: status %d", code)
	}
	if res := p.lastResult(t); !res.Alert || !strings.Contains(res.Refusal.Reason, "removed") {
		t.Fatalf("after Remove: %+v", res.Refusal)
	}
	if up.count() != 2 {
		t.Fatal("request after Remove reached upstream")
	}
	// Added again (same placeholder): swapped again.
	if err := set.Add(b); err != nil {
		t.Fatal(err)
	}
	if send() != http.StatusNoContent {
		t.Fatal("re-added binding refused")
	}
}

func TestApplyNoBindings(t *testing.T) {
	set := mustSet(t)
	r, _ := http.NewRequest("POST", "https://x/", strings.NewReader("abc"))
	res, err := set.Apply(r, "x", true)
	if err != nil || res.Refusal != nil {
		t.Fatal(err, res)
	}
}

func TestConcurrentApply(t *testing.T) {
	gh := ghSecret(t)
	set := mustSet(t, gh.binding(boundHost))
	var wg sync.WaitGroup
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			s := newSecret(t, fmt.Sprintf("S%d", i%5), "sk_live_"+randFrom(t, alnum, 24))
			set.Add(s.binding("api.stripe.com"))
			set.Remove(fmt.Sprintf("S%d", (i+2)%5))
			set.Bindings()
		}
	}()
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 300 {
				r, _ := http.NewRequest("POST", "https://api.github.com/x?y=1", strings.NewReader(`{"a":"b"}`))
				r.Header.Set("Authorization", "Bearer "+gh.ph)
				res, err := set.Apply(r, boundHost, true)
				if err != nil || res.Refusal != nil || r.Header.Get("Authorization") != "Bearer "+gh.real {
					t.Errorf("goroutine %d: %v %+v", g, err, res)
					return
				}
				if b, _ := io.ReadAll(r.Body); string(b) != `{"a":"b"}` {
					t.Errorf("body %q", b)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-done
}

func TestLargeKnownLengthBody(t *testing.T) {
	// A body longer than the read-ahead is forwarded whole, checked as it
	// streams, with its Content-Length intact.
	gh := ghSecret(t)
	set := mustSet(t, gh.binding(boundHost))
	set.ScanLimit = 1024
	up := newUpstream(t)
	p := newProxy(t, set, up, boundHost, true)
	body := bytes.Repeat([]byte("0123456789abcdef"), 1000)
	r, _ := http.NewRequest("PUT", p.URL+"/blob", bytes.NewReader(body))
	if code, resp := do(t, r); code != http.StatusNoContent {
		t.Fatalf("%d %s", code, resp)
	}
	if got := up.last(t); !bytes.Equal(got.Body, body) || got.CL != int64(len(body)) {
		t.Fatalf("CL %d, %d bytes", got.CL, len(got.Body))
	}
	// The placeholder past the read-ahead, to another host: refused.
	p2 := newProxy(t, set, up, "evil.example", true)
	body2 := append(bytes.Clone(body), []byte(gh.ph)...)
	r, _ = http.NewRequest("PUT", p2.URL+"/blob", bytes.NewReader(body2))
	if code, resp := do(t, r); code != http.StatusForbidden {
		t.Fatalf("%d %s", code, resp)
	}
	if up.count() != 1 {
		t.Fatal("refused body reached upstream")
	}
}

func TestRefusePlaceholderInHost(t *testing.T) {
	gh := ghSecret(t)
	set := mustSet(t, gh.binding(boundHost))
	for _, host := range []string{gh.ph + ".evil.example", strings.ToLower(gh.ph) + ".evil.example", "a." + strings.ToUpper(gh.ph) + ".evil.example"} {
		r, _ := http.NewRequest("GET", "https://x.evil.example/", nil)
		res, err := set.Apply(r, host, true)
		if err != nil || res.Refusal == nil || !res.Alert {
			t.Fatalf("%v %+v", err, res)
		}
		noLeak(t, gh, res.Refusal.Reason)
	}
	if name, ok := set.Contains("q=" + base64.URLEncoding.EncodeToString([]byte(gh.ph))); !ok || name != "GITHUB_TOKEN" {
		t.Fatal("Contains missed a base64 form")
	}
	if _, ok := set.Contains("nothing here"); ok {
		t.Fatal("Contains matched nothing")
	}
}

func TestReasonDoesNotEchoPlaceholderHeaderName(t *testing.T) {
	gh := ghSecret(t)
	set := mustSet(t, gh.binding(boundHost))
	r, _ := http.NewRequest("GET", "https://other.example/", nil)
	r.Header.Set("X-"+gh.ph, gh.ph)
	res, _ := set.Apply(r, "other.example", true)
	if res.Refusal == nil {
		t.Fatal("not refused")
	}
	noLeak(t, gh, res.Refusal.Reason)
}

// TestRealNotBound: a Real that refuses the request's host (ErrNotBound:
// the secret's hosts were narrowed since the binding was made) makes the
// request one to a host the binding does not name: refused with an alert
// wherever the placeholder occurs (a header, a misplaced header, a body
// read ahead or streamed), nothing injected where it does not, and the real value
// nowhere; the host Real still allows gets it.
func TestRealNotBound(t *testing.T) {
	const narrowed = "second.github.com"
	gh := ghSecret(t)
	var mu sync.Mutex
	var asked []string
	real := func(host string) ([]byte, error) {
		mu.Lock()
		asked = append(asked, host)
		mu.Unlock()
		if host != boundHost {
			return nil, fmt.Errorf("%w: secret GITHUB_TOKEN is bound to hosts %s; the destination's host %s is not one of them", ErrNotBound, boundHost, host)
		}
		return []byte(gh.real), nil
	}
	b := gh.binding(boundHost, narrowed)
	b.Real, b.Body, b.Inject = real, true, "X-Injected: Bearer {value}"
	set := mustSet(t, b)
	req := func(host string, body io.Reader, n int64) *http.Request {
		r, _ := http.NewRequest("POST", "https://"+host+"/", body)
		r.ContentLength = n
		return r
	}
	wantAlert := func(what string, res *Result, err error) {
		t.Helper()
		if err != nil || res.Refusal == nil || !res.Alert || res.Refusal.Rule != "secret:GITHUB_TOKEN" ||
			!strings.Contains(res.Refusal.Reason, "sent to "+narrowed) || !strings.Contains(res.Refusal.Reason, "not one of them") {
			t.Fatalf("%s: %+v %v, want refused with an alert by secret:GITHUB_TOKEN", what, res, err)
		}
		noLeak(t, gh, res.Refusal.Reason)
	}

	// In an allowed header, and in one the binding does not allow (which
	// to a host it names would be a plain refusal): an alert, as for a
	// host it does not name.
	for _, hdr := range []string{"Authorization", "X-Elsewhere"} {
		r := req(narrowed, nil, 0)
		r.Header.Set(hdr, "Bearer "+gh.ph)
		res, err := set.Apply(r, narrowed, true)
		wantAlert(hdr, res, err)
		if r.Header.Get(hdr) != "Bearer "+gh.ph || r.Header.Get("X-Injected") != "" {
			t.Fatalf("%s: request changed: %q", hdr, r.Header)
		}
	}
	// No placeholder: nothing injected, the request goes on.
	r := req(narrowed, nil, 0)
	res, err := set.Apply(r, narrowed, true)
	if err != nil || res.Refusal != nil || len(res.Replaced) != 0 || r.Header.Get("X-Injected") != "" {
		t.Fatalf("no placeholder: %+v %v, X-Injected %q", res, err, r.Header.Get("X-Injected"))
	}
	// A streamed body: refused as it streams, with an alert, before any
	// real value is written.
	r = req(narrowed, iotest.OneByteReader(strings.NewReader("pre "+gh.ph+" post")), -1)
	res, err = set.Apply(r, narrowed, true)
	if err != nil || res.Refusal != nil {
		t.Fatalf("streamed: %+v %v", res, err)
	}
	out, err := io.ReadAll(r.Body)
	var re *RefusalError
	if !errors.As(err, &re) || !re.Alert || re.Refusal.Rule != "secret:GITHUB_TOKEN" || !strings.Contains(re.Refusal.Reason, "not one of them") {
		t.Fatalf("streamed: %v", err)
	}
	noLeak(t, gh, string(out), re.Refusal.Reason)
	// A body of known length (read ahead): refused up front.
	body := "x=" + gh.ph
	res, err = set.Apply(req(narrowed, strings.NewReader(body), int64(len(body))), narrowed, true)
	wantAlert("body", res, err)

	// The host Real allows: swapped and injected.
	r = req(boundHost, nil, 0)
	r.Header.Set("Authorization", "Bearer "+gh.ph)
	if res, err := set.Apply(r, boundHost, true); err != nil || res.Refusal != nil ||
		r.Header.Get("Authorization") != "Bearer "+gh.real || r.Header.Get("X-Injected") != "Bearer "+gh.real {
		t.Fatalf("host kept: %+v %v %q", res, err, r.Header)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, h := range asked {
		if h != boundHost && h != narrowed {
			t.Fatalf("Real asked for host %q", h)
		}
	}
}
