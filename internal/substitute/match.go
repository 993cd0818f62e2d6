package substitute

import (
	"encoding/base64"
	"encoding/hex"
	"strings"

	"github.com/cagebox/cagebox/internal/hexdigit"
)

// hit says in which forms a placeholder was found.
type hit uint8

const (
	hitLiteral hit = 1 << iota
	hitPercent
	hitBase64
	hitJSON
	hitHex
)

func (h hit) String() string {
	var f []string
	for _, x := range []struct {
		h hit
		s string
	}{{hitLiteral, "literal"}, {hitPercent, "percent-encoded"}, {hitBase64, "base64"}, {hitJSON, "JSON-escaped"}, {hitHex, "hex"}} {
		if h&x.h != 0 {
			f = append(f, x.s)
		}
	}
	return strings.Join(f, ", ")
}

// patterns are the forms of one placeholder searched for in traffic.
type patterns struct {
	lit  string
	fold string // lit lower-cased, for host names
	// b64 are the base64 (std and URL alphabet) encodings of the placeholder
	// at the three byte alignments a base64 stream can put it at, trimmed to
	// the characters that depend on the placeholder's bits alone.
	b64 []string
	hex []string // lower and upper case
	// window is the longest raw form of the placeholder (\uXXXX escapes):
	// how far back a streaming scan must look to see one split across reads.
	window int
}

func newPatterns(ph string) patterns {
	p := patterns{lit: ph, fold: strings.ToLower(ph), window: 6 * len(ph)}
	seen := map[string]bool{}
	for k := range 3 {
		buf := make([]byte, k+len(ph))
		copy(buf[k:], ph)
		enc := base64.StdEncoding.EncodeToString(buf)
		// Output character j carries input bits [6j, 6j+6); the placeholder
		// occupies bits [8k, 8(k+len)).
		start, end := (8*k+5)/6, 8*(k+len(ph))/6
		core := enc[start:end]
		url := strings.NewReplacer("+", "-", "/", "_").Replace(core)
		for _, c := range []string{core, url} {
			if !seen[c] {
				seen[c] = true
				p.b64 = append(p.b64, c)
			}
		}
	}
	h := hex.EncodeToString([]byte(ph))
	p.hex = []string{h, strings.ToUpper(h)}
	return p
}

// views are the decoded readings of one piece of traffic. A decoded view is
// "" when decoding changes nothing.
type views struct {
	raw, pct, js, pctjs string
}

func newViews(s string) views {
	v := views{raw: s}
	if strings.IndexByte(s, '%') >= 0 {
		if d := pctDecode(s); d != s {
			v.pct = d
		}
	}
	if strings.IndexByte(s, '\\') >= 0 {
		if d := jsUnescape(s); d != s {
			v.js = d
		}
	}
	if v.pct != "" && strings.IndexByte(v.pct, '\\') >= 0 {
		if d := jsUnescape(v.pct); d != v.pct {
			v.pctjs = d
		}
	}
	return v
}

// match reports the forms in which p's placeholder appears in v.
func (p *patterns) match(v *views) hit {
	var h hit
	if strings.Contains(v.raw, p.lit) {
		h |= hitLiteral
	}
	if containsAny(v.raw, p.b64) {
		h |= hitBase64
	}
	if containsAny(v.raw, p.hex) {
		h |= hitHex
	}
	if v.pct != "" {
		if strings.Contains(v.pct, p.lit) {
			h |= hitPercent
		}
		if containsAny(v.pct, p.b64) {
			h |= hitPercent | hitBase64
		}
	}
	if v.js != "" {
		if strings.Contains(v.js, p.lit) {
			h |= hitJSON
		}
		if containsAny(v.js, p.b64) {
			h |= hitJSON | hitBase64
		}
	}
	if v.pctjs != "" {
		if strings.Contains(v.pctjs, p.lit) {
			h |= hitPercent | hitJSON
		}
		if containsAny(v.pctjs, p.b64) {
			h |= hitPercent | hitJSON | hitBase64
		}
	}
	return h
}

func containsAny(s string, subs []string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}

// pctDecode decodes %XX escapes (either case) leniently, leaving anything
// malformed as it is, up to three times over (for double encoding). '+'
// stays '+': it is a base64 character before it is a space.
func pctDecode(s string) string {
	for range 3 {
		if strings.IndexByte(s, '%') < 0 {
			return s
		}
		var b strings.Builder
		b.Grow(len(s))
		changed := false
		for i := 0; i < len(s); i++ {
			if s[i] == '%' && i+2 < len(s) && hexdigit.Is(s[i+1]) && hexdigit.Is(s[i+2]) {
				b.WriteByte(hexdigit.Val(s[i+1])<<4 | hexdigit.Val(s[i+2]))
				i += 2
				changed = true
				continue
			}
			b.WriteByte(s[i])
		}
		if !changed {
			return s
		}
		s = b.String()
	}
	return s
}

// jsUnescape decodes JSON and JavaScript string escapes (\uXXXX, \xHH, \/,
// \n, …) leniently, leaving anything malformed as it is.
func jsUnescape(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		switch n := s[i+1]; n {
		case 'u':
			if i+5 < len(s) && hexdigit.Is(s[i+2]) && hexdigit.Is(s[i+3]) && hexdigit.Is(s[i+4]) && hexdigit.Is(s[i+5]) {
				r := rune(hexdigit.Val(s[i+2]))<<12 | rune(hexdigit.Val(s[i+3]))<<8 | rune(hexdigit.Val(s[i+4]))<<4 | rune(hexdigit.Val(s[i+5]))
				b.WriteRune(r)
				i += 5
				continue
			}
		case 'x':
			if i+3 < len(s) && hexdigit.Is(s[i+2]) && hexdigit.Is(s[i+3]) {
				b.WriteByte(hexdigit.Val(s[i+2])<<4 | hexdigit.Val(s[i+3]))
				i += 3
				continue
			}
		case '/', '\\', '"', '\'':
			b.WriteByte(n)
			i++
			continue
		case 'n':
			b.WriteByte('\n')
			i++
			continue
		case 't':
			b.WriteByte('\t')
			i++
			continue
		case 'r':
			b.WriteByte('\r')
			i++
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
