package credentials

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/andybalholm/brotli"
)

func newScrub(t testing.TB, swaps ...Swap) (*Scrub, *[]Reflection) {
	t.Helper()
	var got []Reflection
	s := &Scrub{Reals: &Reals{}, OnReflect: func(r Reflection) { got = append(got, r) }}
	for _, sw := range swaps {
		s.Reals.Add(sw)
	}
	return s, &got
}

func response(body io.Reader, h http.Header) *http.Response {
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{
		StatusCode: 200, Status: "200 OK", Header: h, Body: io.NopCloser(body), ContentLength: -1,
		Request: &http.Request{Method: "GET"}, Trailer: http.Header{},
	}
}

// flushedWriter writes parts through a compressor, flushing between them,
// so each part boundary is a block boundary of the compressed stream.
func compress(t testing.TB, coding string, parts ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w interface {
		io.WriteCloser
		Flush() error
	}
	switch coding {
	case "gzip":
		w = gzip.NewWriter(&buf)
	case "deflate-zlib":
		w = zlib.NewWriter(&buf)
	case "deflate-raw":
		w, _ = flate.NewWriter(&buf, flate.DefaultCompression)
	case "br":
		w = brotli.NewWriter(&buf)
	}
	for _, p := range parts {
		if _, err := io.WriteString(w, p); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func decompress(t testing.TB, coding string, b []byte) string {
	t.Helper()
	var r io.Reader
	var err error
	switch coding {
	case "gzip":
		r, err = gzip.NewReader(bytes.NewReader(b))
	case "deflate-zlib":
		r, err = zlib.NewReader(bytes.NewReader(b))
	case "deflate-raw":
		r = flate.NewReader(bytes.NewReader(b))
	case "br":
		r = brotli.NewReader(bytes.NewReader(b))
	}
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("%s: decoding the scrubbed body: %v", coding, err)
	}
	return string(out)
}

func TestFilterHeadersStatusTrailers(t *testing.T) {
	sw := pair(t, "ghp_"+randFrom(t, alnum, 36))
	s, refl := newScrub(t, sw)
	h := http.Header{
		"Location":       {"https://example.test/cb?token=" + url.QueryEscape(sw.Real) + "&x=1"},
		"Set-Cookie":     {"session=" + base64.RawURLEncoding.EncodeToString([]byte("t:"+sw.Real)) + "; Path=/"},
		"X-Echo":         {"Bearer " + sw.Real},
		"Content-Length": {"1234"},
		"X-" + sw.Real:   {"name"},
	}
	res := response(strings.NewReader("body "+sw.Real), h)
	res.Status = "400 bad token " + sw.Real
	res.Trailer = http.Header{"X-Trailer": nil}
	res.Body = io.NopCloser(&trailerSetter{r: strings.NewReader("body " + sw.Real), tr: res.Trailer, v: sw.Real})
	if err := s.Filter(res); err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	all := res.Status + "\n" + string(body)
	for k, vs := range res.Header {
		all += "\n" + k + ": " + strings.Join(vs, ",")
	}
	for k, vs := range res.Trailer {
		all += "\n" + k + ": " + strings.Join(vs, ",")
	}
	if l := leaks(all, sw.Real); len(l) > 0 {
		t.Fatalf("leaks %v:\n%s", l, all)
	}
	if res.Header.Get("Location") != "https://example.test/cb?token="+url.QueryEscape(sw.Placeholder)+"&x=1" {
		t.Fatalf("Location %q", res.Header.Get("Location"))
	}
	if res.Header.Get("Set-Cookie") != "session="+base64.RawURLEncoding.EncodeToString([]byte("t:"+sw.Placeholder))+"; Path=/" {
		t.Fatalf("Set-Cookie %q", res.Header.Get("Set-Cookie"))
	}
	if res.Trailer.Get("X-Trailer") != "sig="+sw.Placeholder {
		t.Fatalf("trailer %q", res.Trailer.Get("X-Trailer"))
	}
	if res.ContentLength != -1 || res.Header.Get("Content-Length") != "" {
		t.Fatal("Content-Length kept on a rewritten body")
	}
	wheres := map[string]bool{}
	for _, r := range *refl {
		wheres[r.Where] = true
		if strings.Contains(r.Name+r.Where+r.Encoding, sw.Real) {
			t.Fatal("a reflection carries the value")
		}
	}
	for _, w := range []string{"status", "header:Location", "header:Set-Cookie", "header:X-Echo", "header:name", "body", "trailer:X-Trailer"} {
		if !wheres[w] {
			t.Errorf("no reflection for %s (got %v)", w, wheres)
		}
	}
}

// trailerSetter sets a trailer value when its body ends, as net/http does.
type trailerSetter struct {
	r  io.Reader
	tr http.Header
	v  string
}

func (t *trailerSetter) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err == io.EOF {
		t.tr.Set("X-Trailer", "sig="+t.v)
	}
	return n, err
}

// A value split across compressed blocks (and read a byte at a time) is
// found and replaced; the body comes back in the same encoding.
func TestFilterContentEncodings(t *testing.T) {
	sw := pair(t, "sk_live_"+randFrom(t, alnum, 24))
	enc := base64.StdEncoding.EncodeToString([]byte("u:" + sw.Real))
	plain := `{"echo":"` + sw.Real + `","auth":"Basic ` + enc + `","url":"` + strings.ReplaceAll(url.QueryEscape(sw.Real), "%", "%25") + `"}`
	want := `{"echo":"` + sw.Placeholder + `","auth":"Basic ` + base64.StdEncoding.EncodeToString([]byte("u:"+sw.Placeholder)) + `","url":"` + strings.ReplaceAll(url.QueryEscape(sw.Placeholder), "%", "%25") + `"}`
	cut := strings.Index(plain, sw.Real) + 5
	cut2 := strings.Index(plain, enc) + 7
	for _, coding := range []string{"gzip", "deflate-zlib", "deflate-raw", "br"} {
		t.Run(coding, func(t *testing.T) {
			s, refl := newScrub(t, sw)
			z := compress(t, coding, plain[:cut], plain[cut:cut2], plain[cut2:])
			name, _, _ := strings.Cut(coding, "-")
			res := response(&oneByte{bytes.NewReader(z)}, http.Header{"Content-Encoding": {name}, "Content-Length": {"99"}})
			if err := s.Filter(res); err != nil {
				t.Fatal(err)
			}
			out, err := io.ReadAll(res.Body)
			if err != nil {
				t.Fatal(err)
			}
			if got := decompress(t, coding, out); got != want {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
			if res.Header.Get("Content-Encoding") != name || res.Header.Get("Content-Length") != "" {
				t.Fatalf("headers %v", res.Header)
			}
			if len(*refl) < 2 {
				t.Fatalf("reflections %+v", *refl)
			}
		})
	}
}

type oneByte struct{ r io.Reader }

func (o *oneByte) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

func TestFilterRefusesUndecodable(t *testing.T) {
	sw := pair(t, "ghp_"+randFrom(t, alnum, 36))
	for _, ce := range []string{"zstd", "compress", "gzip, br", "x-custom"} {
		s, _ := newScrub(t, sw)
		res := response(strings.NewReader("..."), http.Header{"Content-Encoding": {ce}})
		err := s.Filter(res)
		var e *Error
		if !errors.As(err, &e) || !strings.Contains(e.Reason, "gzip") {
			t.Fatalf("%s: %v", ce, err)
		}
	}
	// Nothing was swapped: nothing to scrub, any encoding passes.
	s := &Scrub{Reals: &Reals{}}
	res := response(strings.NewReader("..."), http.Header{"Content-Encoding": {"zstd"}, "Content-Length": {"3"}})
	if err := s.Filter(res); err != nil || res.Header.Get("Content-Length") != "3" {
		t.Fatalf("%v %v", err, res.Header)
	}
}

func TestFilterNoBody(t *testing.T) {
	sw := pair(t, "ghp_"+randFrom(t, alnum, 36))
	s, _ := newScrub(t, sw)
	res := response(http.NoBody, http.Header{"Content-Length": {"10"}, "X-E": {sw.Real}})
	res.Request.Method = "HEAD"
	if err := s.Filter(res); err != nil {
		t.Fatal(err)
	}
	if res.Header.Get("Content-Length") != "10" || res.Header.Get("X-E") != sw.Placeholder {
		t.Fatalf("%v", res.Header)
	}
}

// Server-sent events come through one by one: each event is readable
// before the next is written (identity and gzip).
func TestFilterSSEStreams(t *testing.T) {
	sw := pair(t, "ghp_"+randFrom(t, alnum, 36))
	for _, coding := range []string{"", "gzip"} {
		t.Run("enc="+coding, func(t *testing.T) {
			s, _ := newScrub(t, sw)
			pr, pw := io.Pipe()
			h := http.Header{"Content-Type": {"text/event-stream"}}
			if coding == "gzip" {
				h.Set("Content-Encoding", "gzip")
			}
			// One writer goroutine: the upstream, writing one event per
			// request on events.
			events := make(chan string)
			go func() {
				var w io.Writer = pw
				var zw *gzip.Writer
				if coding == "gzip" {
					zw = gzip.NewWriter(pw)
					w = zw
				}
				for ev := range events {
					io.WriteString(w, ev)
					if zw != nil {
						zw.Flush()
					}
				}
				pw.Close()
			}()
			defer close(events)
			res := response(pr, h)
			if err := s.Filter(res); err != nil {
				t.Fatal(err)
			}
			events <- "data: " + sw.Real + "\n\n"
			var rd *bufio.Reader
			if coding == "gzip" {
				zr, err := gzip.NewReader(res.Body)
				if err != nil {
					t.Fatal(err)
				}
				rd = bufio.NewReader(zr)
			} else {
				rd = bufio.NewReader(res.Body)
			}
			for i := range 3 {
				line, err := rd.ReadString('\n')
				if err != nil || line != "data: "+sw.Placeholder+"\n" {
					t.Fatalf("event %d: %q %v", i, line, err)
				}
				if blank, _ := rd.ReadString('\n'); blank != "\n" {
					t.Fatalf("event %d end %q", i, blank)
				}
				if i < 2 {
					events <- "data: " + sw.Real + "\n\n"
				}
			}
		})
	}
}

func TestNarrowAcceptEncoding(t *testing.T) {
	r, _ := http.NewRequest("GET", "https://x/", nil)
	r.Header.Set("Accept-Encoding", "deflate, gzip;q=1.0, br, zstd, *;q=0.1")
	NarrowAcceptEncoding(r)
	if got := r.Header.Get("Accept-Encoding"); got != "deflate, gzip;q=1.0, br" {
		t.Fatalf("Accept-Encoding %q", got)
	}
	r.Header.Set("Accept-Encoding", "zstd")
	NarrowAcceptEncoding(r)
	if got := r.Header.Get("Accept-Encoding"); got != "identity" {
		t.Fatalf("Accept-Encoding %q", got)
	}
}
