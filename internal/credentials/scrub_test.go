package credentials

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/cagebox/cagebox/internal/hexdigit"
	"github.com/cagebox/cagebox/internal/substitute"
)

const alnum = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

func randFrom(t testing.TB, alphabet string, n int) string {
	t.Helper()
	b := make([]byte, n)
	for i := range b {
		k, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			t.Fatal(err)
		}
		b[i] = alphabet[k.Int64()]
	}
	return string(b)
}

// pair is a real value and its placeholder (same length, as NewPlaceholder
// makes them for values of 80 bits or more).
func pair(t testing.TB, real string) Swap {
	t.Helper()
	ph, err := substitute.NewPlaceholder([]byte(real))
	if err != nil {
		t.Fatal(err)
	}
	return Swap{Name: "TOKEN", Real: real, Placeholder: ph}
}

func pctAll(s string, upper bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if upper {
			fmt.Fprintf(&b, "%%%02X", s[i])
		} else {
			fmt.Fprintf(&b, "%%%02x", s[i])
		}
	}
	return b.String()
}

func jsonU(s string, upper bool) string {
	var b strings.Builder
	for _, r := range s {
		if upper {
			fmt.Fprintf(&b, `\u%04X`, r)
		} else {
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	return b.String()
}

// encodings are the forms an upstream may reflect a value in; each maps a
// value to its encoded form, so f(real) must become f(placeholder).
var encodings = map[string]func(string) string{
	"raw":            func(s string) string { return s },
	"query-escape":   url.QueryEscape,
	"path-escape":    url.PathEscape,
	"percent-lower":  func(s string) string { return pctAll(s, false) },
	"percent-upper":  func(s string) string { return pctAll(s, true) },
	"percent-twice":  func(s string) string { return strings.ReplaceAll(pctAll(s, true), "%", "%25") },
	"json-u":         func(s string) string { return jsonU(s, false) },
	"json-U":         func(s string) string { return jsonU(s, true) },
	"json-slash":     func(s string) string { return strings.ReplaceAll(s, "/", `\/`) },
	"json-mixed":     func(s string) string { return s[:3] + jsonU(s[3:7], false) + pctAll(s[7:9], false) + s[9:] },
	"hex":            func(s string) string { return hex.EncodeToString([]byte(s)) },
	"HEX":            func(s string) string { return strings.ToUpper(hex.EncodeToString([]byte(s))) },
	"b64-std-0":      func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
	"b64-std-1":      func(s string) string { return base64.StdEncoding.EncodeToString([]byte("?" + s + "~")) },
	"b64-std-2":      func(s string) string { return base64.StdEncoding.EncodeToString([]byte("??" + s + "~~")) },
	"b64-url-0":      func(s string) string { return base64.URLEncoding.EncodeToString([]byte(s + "?")) },
	"b64-url-1":      func(s string) string { return base64.URLEncoding.EncodeToString([]byte(">" + s)) },
	"b64-url-2":      func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(">>" + s)) },
	"b64-raw-std":    func(s string) string { return base64.RawStdEncoding.EncodeToString([]byte("x" + s)) },
	"basic-user":     func(s string) string { return base64.StdEncoding.EncodeToString([]byte("x-access-token:" + s)) },
	"basic-value":    func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s + ":")) },
	"basic-user-raw": func(s string) string { return base64.RawStdEncoding.EncodeToString([]byte("u:" + s)) },
}

// reals are values of the shapes credentials have, including ones with
// characters that need escaping.
func reals(t testing.TB) map[string]string {
	return map[string]string{
		"ghp":     "ghp_" + randFrom(t, alnum, 36),
		"aws-key": "AKIA" + randFrom(t, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16),
		"aws-sec": randFrom(t, alnum, 10) + "/" + randFrom(t, alnum, 10) + "+" + randFrom(t, alnum, 19),
		"sig-hex": randFrom(t, "0123456789abcdef", 64),
		"slack":   "xoxb-" + randFrom(t, "0123456789", 12) + "-" + randFrom(t, alnum, 24),
	}
}

// leaks reports the forms of real that text carries, decoding the way a
// guest could: raw, percent (once or twice, with JSON escapes mixed in),
// hex, and base64 at every alignment in both alphabets.
func leaks(text, real string) []string {
	var out []string
	if strings.Contains(text, real) {
		out = append(out, "raw")
	}
	for _, d := range []string{decodeMixed(text), decodeMixed(decodeMixed(text))} {
		if strings.Contains(d, real) {
			out = append(out, "decoded")
			break
		}
	}
	h := hex.EncodeToString([]byte(real))
	if strings.Contains(text, h) || strings.Contains(text, strings.ToUpper(h)) {
		out = append(out, "hex")
	}
	for k := range 3 {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			if c := b64Core(real, k, enc); len(c) >= minB64Core && strings.Contains(text, c) {
				out = append(out, fmt.Sprintf("base64@%d", k))
			}
		}
	}
	return out
}

// decodeMixed decodes %XX, \uXXXX, \xHH and \/-style escapes in one pass.
func decodeMixed(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%' && i+2 < len(s) && hexdigit.Is(s[i+1]) && hexdigit.Is(s[i+2]):
			b.WriteByte(hexdigit.Val(s[i+1])<<4 | hexdigit.Val(s[i+2]))
			i += 2
			continue
		case c == '\\' && i+5 < len(s) && s[i+1] == 'u' && hexdigit.Is(s[i+2]) && hexdigit.Is(s[i+3]) && hexdigit.Is(s[i+4]) && hexdigit.Is(s[i+5]):
			b.WriteRune(rune(hexdigit.Val(s[i+2]))<<12 | rune(hexdigit.Val(s[i+3]))<<8 | rune(hexdigit.Val(s[i+4]))<<4 | rune(hexdigit.Val(s[i+5])))
			i += 5
			continue
		case c == '\\' && i+3 < len(s) && s[i+1] == 'x' && hexdigit.Is(s[i+2]) && hexdigit.Is(s[i+3]):
			b.WriteByte(hexdigit.Val(s[i+2])<<4 | hexdigit.Val(s[i+3]))
			i += 3
			continue
		case c == '\\' && i+1 < len(s) && strings.IndexByte(`/\"'`, s[i+1]) >= 0:
			b.WriteByte(s[i+1])
			i++
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// scrubAll runs text through a scrubReader reading src's chunks.
func scrubAll(t testing.TB, swaps []Swap, src io.Reader) (string, []Reflection) {
	t.Helper()
	var got []Reflection
	s := &Scrub{Reals: &Reals{}, OnReflect: func(r Reflection) { got = append(got, r) }}
	for _, sw := range swaps {
		s.Reals.Add(sw)
	}
	swaps2, gen, _ := s.Reals.snapshot()
	m := newMatcher(swaps2)
	sr := &scrubReader{s: s, src: src, reals: s.Reals, gen: gen, e: &engine{m: m, onHit: s.hits(m, "body")}}
	b, err := io.ReadAll(sr)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), got
}

func TestScrubEveryEncoding(t *testing.T) {
	for rname, real := range reals(t) {
		sw := pair(t, real)
		for ename, enc := range encodings {
			t.Run(rname+"/"+ename, func(t *testing.T) {
				in := "before " + enc(real) + " between " + enc(real) + " after"
				want := "before " + enc(sw.Placeholder) + " between " + enc(sw.Placeholder) + " after"
				for _, rd := range []struct {
					name string
					r    io.Reader
				}{
					{"whole", strings.NewReader(in)},
					{"one-byte", iotest.OneByteReader(strings.NewReader(in))},
					{"half", iotest.HalfReader(strings.NewReader(in))},
				} {
					got, refl := scrubAll(t, []Swap{sw}, rd.r)
					if got != want {
						t.Fatalf("%s: got  %q\nwant %q", rd.name, got, want)
					}
					if l := leaks(got, real); len(l) > 0 {
						t.Fatalf("%s: output leaks %v", rd.name, l)
					}
					if len(refl) == 0 || refl[0].Name != "TOKEN" || refl[0].Where != "body" || refl[0].Encoding == "" {
						t.Fatalf("%s: reflections %+v", rd.name, refl)
					}
				}
			})
		}
	}
}

// Every split point of the input into two reads gives the same output.
func TestScrubEverySplit(t *testing.T) {
	real := "ghp_" + randFrom(t, alnum, 36)
	sw := pair(t, real)
	var in, want strings.Builder
	for _, name := range []string{"raw", "percent-upper", "json-u", "hex", "b64-std-1", "basic-user", "b64-url-2"} {
		in.WriteString("<" + encodings[name](real) + ">")
		want.WriteString("<" + encodings[name](sw.Placeholder) + ">")
	}
	s := in.String()
	for i := 0; i <= len(s); i++ {
		got, _ := scrubAll(t, []Swap{sw}, io.MultiReader(strings.NewReader(s[:i]), strings.NewReader(s[i:])))
		if got != want.String() {
			t.Fatalf("split at %d: got %q", i, got)
		}
	}
}

// A value whose placeholder is longer (a short secret) is replaced by the
// whole placeholder in text forms and by its same-length start in base64.
func TestScrubLongerPlaceholder(t *testing.T) {
	real := "hunter2hunter"
	ph, err := substitute.NewPlaceholder([]byte(real))
	if err != nil {
		t.Fatal(err)
	}
	if len(ph) <= len(real) {
		t.Skip("placeholder not longer")
	}
	sw := Swap{Name: "PW", Real: real, Placeholder: ph}
	in := "a " + real + " " + url.QueryEscape(real) + " " + base64.StdEncoding.EncodeToString([]byte("u:"+real))
	got, _ := scrubAll(t, []Swap{sw}, strings.NewReader(in))
	want := "a " + ph + " " + ph + " " + base64.StdEncoding.EncodeToString([]byte("u:"+ph[:len(real)]))
	if got != want {
		t.Fatalf("got %q want %q", got, want)
	}
}

func TestScrubSeveralValues(t *testing.T) {
	a, b := pair(t, "ghp_"+randFrom(t, alnum, 36)), pair(t, "AKIA"+randFrom(t, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16))
	b.Name = "AWS"
	in := "Credential=" + b.Real + "/20250101/us-east-1/s3/aws4_request&auth=" + url.QueryEscape("Bearer "+a.Real)
	got, refl := scrubAll(t, []Swap{a, b}, iotest.OneByteReader(strings.NewReader(in)))
	want := "Credential=" + b.Placeholder + "/20250101/us-east-1/s3/aws4_request&auth=" + url.QueryEscape("Bearer "+a.Placeholder)
	if got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	if len(refl) != 2 {
		t.Fatalf("reflections %+v", refl)
	}
}

// Text that merely resembles a value's start is passed on unchanged, and
// streamed text is passed on as it comes (nothing waits for more input
// unless it may begin a value).
func TestScrubPassesOtherText(t *testing.T) {
	sw := pair(t, "ghp_"+randFrom(t, alnum, 36))
	in := "ghp_ ghp_x %67%68 \\u0067 " + strings.Repeat("lorem ipsum ", 100)
	got, refl := scrubAll(t, []Swap{sw}, iotest.OneByteReader(strings.NewReader(in)))
	if got != in || len(refl) != 0 {
		t.Fatalf("changed: %q %+v", got, refl)
	}
}

func TestScrubString(t *testing.T) {
	sw := pair(t, "sk_live_"+randFrom(t, alnum, 24))
	m := newMatcher([]Swap{sw})
	loc := "https://example.test/cb?key=" + url.QueryEscape(sw.Real) + "#" + sw.Real
	if got := scrubString(m, loc, nil); got != "https://example.test/cb?key="+url.QueryEscape(sw.Placeholder)+"#"+sw.Placeholder {
		t.Fatalf("got %q", got)
	}
}

func FuzzScrub(f *testing.F) {
	f.Add([]byte("hello world"), uint8(3), uint8(0), uint16(5))
	f.Add([]byte("%67%68%70_"), uint8(7), uint8(9), uint16(1))
	f.Add([]byte("\\u0067hp_"), uint8(1), uint8(12), uint16(2))
	f.Add([]byte("Zz=="), uint8(0), uint8(14), uint16(0))
	real := "ghp_" + "Qk8vR2nT5wY7zA1cE3gJ6mP9sU0xB4dF" + "a1b2"
	ph := "ghp_" + "Lr0aM5pW3tK8vC2nH6jD9fS1qZ7yX4bG" + "c3d4"
	sw := Swap{Name: "T", Real: real, Placeholder: ph}
	forms := []string{"raw", "query-escape", "percent-lower", "percent-upper", "percent-twice", "json-u", "json-U", "json-mixed", "hex", "HEX",
		"b64-std-0", "b64-std-1", "b64-std-2", "b64-url-0", "b64-url-1", "b64-url-2", "basic-user", "basic-value", "basic-user-raw"}
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8, form uint8, at uint16) {
		enc := encodings[forms[int(form)%len(forms)]](real)
		pos := int(at) % (len(data) + 1)
		in := append(append(append([]byte{}, data[:pos]...), enc...), data[pos:]...)
		in = append(in, data...)
		in = append(in, []byte(real[:len(real)/2])...) // a cut value at the end
		var src io.Reader = bytes.NewReader(in)
		if n := int(chunk); n > 0 {
			src = &chunkReader{b: in, n: n}
		}
		got, _ := scrubAll(t, []Swap{sw}, src)
		if l := leaks(got, real); len(l) > 0 {
			t.Fatalf("output leaks %v: %q", l, got)
		}
	})
}

// chunkReader returns n bytes per Read.
type chunkReader struct {
	b []byte
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	k := min(c.n, len(p), len(c.b))
	copy(p, c.b[:k])
	c.b = c.b[k:]
	return k, nil
}
