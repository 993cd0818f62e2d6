package substitute

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// benchSet is a sandbox with three bindings: GitHub (header), OpenAI
// (header), Stripe (body, opted in).
func benchSet(b *testing.B) (*Set, []secret) {
	gh := ghSecret(b)
	oa := newSecret(b, "OPENAI_API_KEY", "sk-proj-"+randFrom(b, alnum, 120))
	st := newSecret(b, "STRIPE_KEY", "sk_live_"+randFrom(b, alnum, 24))
	sb := st.binding(boundHost)
	sb.Body = true
	return mustSet(b, gh.binding(boundHost), oa.binding("api.openai.com"), sb), []secret{gh, oa, st}
}

func typicalRequest(ph string, body []byte) *http.Request {
	r, _ := http.NewRequest("POST", "https://api.github.com/repos/o/r/issues?per_page=100&state=open", bytes.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+ph)
	r.Header.Set("Accept", "application/vnd.github+json")
	r.Header.Set("User-Agent", "python-requests/2.32.3")
	r.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	r.Header.Set("Accept-Encoding", "gzip, deflate")
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Connection", "keep-alive")
	return r
}

func BenchmarkApply(b *testing.B) {
	set, s := benchSet(b)
	body := []byte(`{"title":"bug","body":"it broke","labels":["bug"]}`)
	b.ReportAllocs()
	for b.Loop() {
		r := typicalRequest(s[0].ph, body)
		res, err := set.Apply(r, boundHost, true)
		if err != nil || res.Refusal != nil || len(res.Replaced) != 1 {
			b.Fatal(err, res)
		}
		io.Copy(io.Discard, r.Body)
	}
}

func BenchmarkApplyBody64K(b *testing.B) {
	set, s := benchSet(b)
	line := `{"id":12345,"name":"widget","description":"a reasonably ordinary line of JSON","ok":true},` + "\n"
	body := []byte(strings.Repeat(line, 64<<10/len(line)))
	body = append(body, []byte(`{"key":"`+s[2].ph+`"}`)...)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r := typicalRequest(s[0].ph, body)
		res, err := set.Apply(r, boundHost, true)
		if err != nil || res.Refusal != nil || len(res.Replaced) != 2 {
			b.Fatal(err, res)
		}
		io.Copy(io.Discard, r.Body)
	}
}

func BenchmarkApplyChunked64K(b *testing.B) {
	set, s := benchSet(b)
	body := bytes.Repeat([]byte("0123456789abcdef"), 4<<10)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r := typicalRequest(s[0].ph, nil)
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = -1
		if _, err := set.Apply(r, boundHost, true); err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, r.Body)
	}
}

func BenchmarkDetectorScan(b *testing.B) {
	d := testDetector(b)
	set, s := benchSet(b)
	body := []byte(`{"title":"bug","body":"it broke","labels":["bug"]}`)
	b.ReportAllocs()
	for b.Loop() {
		r := typicalRequest(s[0].ph, body)
		if _, err := d.Scan(r, 1<<20, set); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDetectorScan64K(b *testing.B) {
	d := testDetector(b)
	set, s := benchSet(b)
	line := `{"id":12345,"name":"widget","description":"a reasonably ordinary line of JSON","ok":true},` + "\n"
	body := []byte(strings.Repeat(line, 64<<10/len(line)))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r := typicalRequest(s[0].ph, body)
		if _, err := d.Scan(r, 1<<20, set); err != nil {
			b.Fatal(err)
		}
	}
}
