package substitute

import (
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
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
	if len(d.rules) < 100 {
		t.Fatalf("only %d rules loaded from gitleaks' default config", len(d.rules))
	}
}

// Scan is ScanBudget with no byte or time budget, returning the findings
// only: the first limit bytes of the body are scanned (limit ≤ 0: none).
func (d *Detector) Scan(r *http.Request, limit int64, known ...Known) ([]Finding, error) {
	res, err := d.ScanBudget(r, Budget{Bytes: math.MaxInt64, Time: 24 * time.Hour, Body: limit}, known...)
	return res.Findings, err
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

// TestScanWorkIsLinear: the regex work of a scan grows in proportion to
// the input for every adversarial shape. Before the fix, a line-targeted
// allowlist regex ran over the whole line once per match, so a long
// header line with many candidates cost time quadratic in its length (a
// 57 KiB header: 6.7 s).
func TestScanWorkIsLinear(t *testing.T) {
	d := testDetector(t)
	work := func(kind string, n int) int64 {
		r, _ := http.NewRequest("GET", "https://api.example/", nil)
		r.Header.Set("X-Data", adversarial(kind, n))
		res, err := d.ScanBudget(r, Budget{Bytes: 1 << 30, Time: time.Hour})
		if err != nil || !res.Complete {
			t.Fatalf("%s: %v %q", kind, err, res.Gap)
		}
		return res.work
	}
	// Shapes whose vocabulary does not grow with their length, so the same
	// rules pass the keyword prefilter at both sizes (in random text, more
	// rules' keywords turn up by chance as it grows, up to all of them).
	for _, kind := range []string{"kv-tokens", "near-miss"} {
		small, big := work(kind, 8<<10), work(kind, 32<<10)
		if ratio := float64(big) / float64(small); ratio > 5 {
			t.Errorf("%s: 4× the input costs %.1f× the regex work (%d → %d bytes): not linear", kind, ratio, small, big)
		}
	}
}

func TestScanByteBudget(t *testing.T) {
	d := testDetector(t)
	early := "ghp_" + randFrom(t, alnum, 36)
	late := "ghp_" + randFrom(t, alnum, 36)
	r, _ := http.NewRequest("GET", "https://api.example/", nil)
	r.Header.Set("X-Data", "token "+early+" "+strings.Repeat("x", 32<<10)+" token "+late)
	res, err := d.ScanBudget(r, Budget{Bytes: 16 << 10, Time: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if res.Complete || res.Limit != LimitBytes || !strings.Contains(res.Gap, "header:X-Data") || res.Scanned != 16<<10 {
		t.Fatalf("result %+v", res)
	}
	if len(res.Findings) != 1 || res.Findings[0].Preview != "…"+early[len(early)-4:] {
		t.Fatalf("findings %+v: want the credential within the budget only", res.Findings)
	}
	// The same request within budget: both found, complete.
	res, _ = d.ScanBudget(r, Budget{Time: time.Hour})
	if !res.Complete || res.Limit != "" || len(res.Findings) != 2 {
		t.Fatalf("within budget: %+v", res)
	}
}

func TestScanTimeBudget(t *testing.T) {
	d := testDetector(t)
	r, _ := http.NewRequest("GET", "https://api.example/", nil)
	r.Header.Set("X-Data", adversarial("keywords", 4<<10))
	res, err := d.ScanBudget(r, Budget{Time: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Complete || res.Limit != LimitTime || !strings.Contains(res.Gap, "time budget") {
		t.Fatalf("result %+v", res)
	}
}

func TestScanBodyWindow(t *testing.T) {
	d := testDetector(t)
	pat := "ghp_" + randFrom(t, alnum, 36)
	body := "token " + pat + "\n" + strings.Repeat("y", 8<<10)
	r, _ := http.NewRequest("POST", "https://api.example/", strings.NewReader(body))
	res, err := d.ScanBudget(r, Budget{Body: 4 << 10, Time: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if res.Complete || res.Limit != LimitBody || res.Gap != "body after the first 4096 bytes" || len(res.Findings) != 1 {
		t.Fatalf("result %+v", res)
	}
	if b, _ := io.ReadAll(r.Body); string(b) != body {
		t.Fatal("body not restored whole")
	}
	// Not read at all: incomplete too, and the body is untouched.
	r, _ = http.NewRequest("POST", "https://api.example/", strings.NewReader(body))
	res, _ = d.ScanBudget(r, Budget{Time: time.Hour})
	if res.Complete || res.Limit != LimitBody || len(res.Findings) != 0 {
		t.Fatalf("body not read: %+v", res)
	}
	// A body within the window: complete.
	r, _ = http.NewRequest("POST", "https://api.example/", strings.NewReader(body))
	res, _ = d.ScanBudget(r, Budget{Body: 64 << 10, Time: time.Hour})
	if !res.Complete || len(res.Findings) != 1 {
		t.Fatalf("whole body: %+v", res)
	}
}
