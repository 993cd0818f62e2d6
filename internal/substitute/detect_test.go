package substitute

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

var (
	detOnce sync.Once
	det     *Detector
	detErr  error
)

func testDetector(t testing.TB) *Detector {
	t.Helper()
	detOnce.Do(func() { det, detErr = NewDetector() })
	if detErr != nil {
		t.Fatal(detErr)
	}
	return det
}

func TestDetectorRules(t *testing.T) {
	d := testDetector(t)
	if d.Rules() < 100 {
		t.Fatalf("only %d rules loaded from gitleaks' default config", d.Rules())
	}
}

func TestDetectorFindsCredentials(t *testing.T) {
	d := testDetector(t)
	pat := "ghp_" + randFrom(t, alnum, 36)
	aws := "AKIA" + randFrom(t, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16)
	slack := "xoxb-" + randFrom(t, digits, 12) + "-" + randFrom(t, digits, 13) + "-" + randFrom(t, alnum, 24)
	ours := ghSecret(t)
	set := mustSet(t, ours.binding(boundHost))

	body := "config:\n  github: " + pat + "\n  aws_access_key_id = " + aws + "\n  slack: " + slack + "\n  mine: " + ours.ph + "\n"
	r, _ := http.NewRequest("POST", "https://paste.example/new?x=1", strings.NewReader(body))
	r.Header.Set("Authorization", "token "+pat)
	r.Header.Set("X-Mine", ours.ph)
	fs, err := d.Scan(r, 1<<20, set)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range fs {
		got[f.Rule+" "+f.Where] = f.Preview
		for _, secret := range []string{pat, aws, slack, ours.ph, ours.real} {
			if strings.Contains(f.Preview, secret[:len(secret)-4]) || len(f.Preview) > len("…")+4 {
				t.Fatalf("preview %q shows too much", f.Preview)
			}
		}
		if strings.Contains(f.Where+f.Rule, ours.ph) {
			t.Fatal("placeholder reported")
		}
	}
	want := map[string]string{
		"credential:github-pat body":                 "…" + pat[len(pat)-4:],
		"credential:github-pat header:Authorization": "…" + pat[len(pat)-4:],
		"credential:aws-access-token body":           "…" + aws[len(aws)-4:],
		"credential:slack-bot-token body":            "…" + slack[len(slack)-4:],
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("finding %q: preview %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	for _, f := range fs {
		if f.Where == "header:X-Mine" {
			t.Errorf("our placeholder reported: %+v", f)
		}
	}
	// The body is still there, whole.
	b, err := io.ReadAll(r.Body)
	if err != nil || string(b) != body {
		t.Fatalf("body not restored: %v", err)
	}
	// Without the set, the placeholder is reported like any token.
	r, _ = http.NewRequest("GET", "https://x/", nil)
	r.Header.Set("X-Mine", ours.ph)
	fs, _ = d.Scan(r, 0)
	if len(fs) == 0 {
		t.Fatal("a GitHub-shaped placeholder is not credential-shaped to gitleaks' rules")
	}
}

func TestDetectorQuietOnPlainTraffic(t *testing.T) {
	d := testDetector(t)
	r, _ := http.NewRequest("POST", "https://api.example/v1/items?page=2&sort=name", strings.NewReader(`{"name":"widget","count":3,"tags":["a","b"]}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("User-Agent", "curl/8.5.0")
	r.Header.Set("Accept", "*/*")
	fs, err := d.Scan(r, 1<<20)
	if err != nil || len(fs) != 0 {
		t.Fatalf("%v %+v", err, fs)
	}
}

// TestScanThenApply runs both, as the proxy will, and checks the upstream
// gets a well-framed body.
func TestScanThenApply(t *testing.T) {
	gh := ghSecret(t)
	b := gh.binding(boundHost)
	b.Body = true
	up := newUpstream(t)
	p := newProxy(t, mustSet(t, b), up, boundHost, true)
	p.det = testDetector(t)
	body := `{"q":"` + gh.ph + `","n":1}`
	r, _ := http.NewRequest("POST", p.URL+"/graphql", strings.NewReader(body))
	if code, resp := do(t, r); code != http.StatusNoContent {
		t.Fatalf("%d %s", code, resp)
	}
	got := up.last(t)
	if want := strings.ReplaceAll(body, gh.ph, gh.real); string(got.Body) != want || got.CL != int64(len(want)) {
		t.Fatalf("body %q CL %d", got.Body, got.CL)
	}
	code, _ := rawChunked(t, p.Listener.Addr().String(), "/x", http.Header{}, []string{"ab", gh.ph[:5], gh.ph[5:]}, nil)
	if code != http.StatusNoContent {
		t.Fatalf("chunked: %d", code)
	}
	if got := up.last(t); string(got.Body) != "ab"+gh.real || got.CL != -1 {
		t.Fatalf("chunked body %q CL %d", got.Body, got.CL)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, fs := range p.findings {
		if len(fs) != 0 {
			t.Fatalf("placeholder reported as a finding: %+v", fs)
		}
	}
}
