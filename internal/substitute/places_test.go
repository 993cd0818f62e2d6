package substitute

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
)

// A binding swaps its placeholder only where it says; anywhere else on its
// bound host the request is refused with a reason naming the places and
// the flag that adds one — never an alert, never forwarded.
func TestSubstituteOnlyWhereBound(t *testing.T) {
	gh := ghSecret(t)
	b := gh.binding(boundHost)
	b.Inject = "X-Injected: token {value}"
	b.Headers = []string{"X-Api-Key"}
	b.Query = []string{"access_token"}
	set := mustSet(t, b)
	cases := []struct {
		name    string
		mk      func() *http.Request
		ok      bool
		reason  string
		checkUp func(*http.Request) bool
	}{
		{"authorization bearer", func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.github.com/", nil)
			r.Header.Set("Authorization", "Bearer "+gh.ph)
			return r
		}, true, "", func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+gh.real }},
		{"authorization token", func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.github.com/", nil)
			r.Header.Set("Authorization", "token "+gh.ph)
			return r
		}, true, "", func(r *http.Request) bool { return r.Header.Get("Authorization") == "token "+gh.real }},
		{"named header", func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.github.com/", nil)
			r.Header.Set("x-api-key", gh.ph)
			return r
		}, true, "", func(r *http.Request) bool { return r.Header.Get("X-Api-Key") == gh.real }},
		{"injected header", func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.github.com/", nil)
			r.Header.Set("X-Injected", gh.ph)
			return r
		}, true, "", func(r *http.Request) bool { return r.Header.Get("X-Injected") == "token "+gh.real }},
		{"named query", func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.github.com/?a=1&access_token="+gh.ph, nil)
			return r
		}, true, "", func(r *http.Request) bool { return r.URL.RawQuery == "a=1&access_token="+gh.real }},
		{"cookie", func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.github.com/", nil)
			r.Header.Set("Cookie", "t="+gh.ph)
			return r
		}, false, "--secret-header GITHUB_TOKEN:Cookie", nil},
		{"other query", func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.github.com/?q="+gh.ph, nil)
			return r
		}, false, "--secret-query GITHUB_TOKEN:q", nil},
		{"query name", func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.github.com/?"+gh.ph+"=1", nil)
			return r
		}, false, "parameter name", nil},
		{"base64 in a header", func() *http.Request {
			r, _ := http.NewRequest("GET", "https://api.github.com/", nil)
			r.Header.Set("X-Debug", forms(gh.ph)["base64-std-1"])
			return r
		}, false, "--secret-header GITHUB_TOKEN:X-Debug", nil},
		{"body", func() *http.Request {
			r, _ := http.NewRequest("POST", "https://api.github.com/", strings.NewReader("k="+gh.ph))
			return r
		}, false, "--secret-in-body GITHUB_TOKEN", nil},
		{"trailer", func() *http.Request {
			r, _ := http.NewRequest("POST", "https://api.github.com/", nil)
			r.Body = io.NopCloser(iotest.OneByteReader(strings.NewReader("abc")))
			r.ContentLength = -1
			r.Trailer = http.Header{"X-Sig": {gh.ph}}
			return r
		}, false, "--secret-header GITHUB_TOKEN:X-Sig", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := c.mk()
			var mu sync.Mutex
			var reported []string
			res, err := set.ApplyReport(r, boundHost, true, func(name, real, ph string) {
				mu.Lock()
				defer mu.Unlock()
				if name != "GITHUB_TOKEN" || real != gh.real || ph != gh.ph {
					t.Errorf("report %s", name)
				}
				reported = append(reported, name)
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Refusal == nil && r.Body != nil {
				if _, err := io.ReadAll(r.Body); err != nil {
					var re *RefusalError
					if !errors.As(err, &re) {
						t.Fatal(err)
					}
					res.Refusal, res.Alert = &re.Refusal, re.Alert
				}
			}
			if c.ok {
				if res.Refusal != nil {
					t.Fatalf("refused: %s", res.Refusal.Reason)
				}
				if !c.checkUp(r) {
					t.Fatalf("not swapped: %v %s", r.Header, r.URL.RawQuery)
				}
				if len(reported) == 0 {
					t.Fatal("the real value put in was not reported")
				}
				return
			}
			if res.Refusal == nil || res.Alert || !strings.Contains(res.Refusal.Reason, c.reason) {
				t.Fatalf("want a refusal saying %q, got %+v alert=%v", c.reason, res.Refusal, res.Alert)
			}
			for _, place := range []string{"header Authorization", "header X-Injected", "header X-Api-Key", "query parameter access_token"} {
				if !strings.Contains(res.Refusal.Reason, place) {
					t.Fatalf("reason %q does not list %s", res.Refusal.Reason, place)
				}
			}
			noLeak(t, gh, res.Refusal.Reason)
		})
	}
}

// A streamed body with the opt-in reports each real value as it swaps it.
func TestStreamReports(t *testing.T) {
	gh := ghSecret(t)
	b := gh.binding(boundHost)
	b.Body = true
	set := mustSet(t, b)
	r, _ := http.NewRequest("POST", "https://api.github.com/", nil)
	r.Body = io.NopCloser(iotest.OneByteReader(strings.NewReader("x=" + gh.ph)))
	r.ContentLength = -1
	var got []string
	res, err := set.ApplyReport(r, boundHost, true, func(name, real, ph string) { got = append(got, real) })
	if err != nil || res.Refusal != nil || !res.Streaming {
		t.Fatalf("%v %+v", err, res)
	}
	if len(got) != 0 {
		t.Fatal("reported before anything was swapped")
	}
	if _, err := io.ReadAll(r.Body); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != gh.real {
		t.Fatal("streamed swap not reported")
	}
}

func TestPlacesValidated(t *testing.T) {
	gh := ghSecret(t)
	for _, b := range []*Binding{
		{Headers: []string{"Bad Header"}},
		{Headers: []string{""}},
		{Query: []string{"a=b"}},
		{Query: []string{""}},
	} {
		b.Name, b.Placeholder, b.Real, b.Hosts = "X", gh.ph, func(string) ([]byte, error) { return []byte(gh.real), nil }, []string{boundHost}
		if _, err := NewSet(b); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v accepted: %v", b, err)
		}
	}
	set := mustSet(t, gh.binding(boundHost, "*.example.com"))
	if !set.Bound("API.GITHUB.COM:443") || !set.Bound("a.example.com") || set.Bound("example.com") {
		t.Fatal("Bound")
	}
	if set.Window() < len(gh.ph) {
		t.Fatal("Window")
	}
}
