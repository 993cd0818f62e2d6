package policy

import (
	"fmt"
	"net/url"
	"path"
	"strings"
	"unicode"

	"github.com/cagebox/cagebox/internal/hexdigit"
)

// reqPath is a request path in the canonical form decisions are made on,
// with the other readings servers give it.
type reqPath struct {
	raw       string // as sent (escaped)
	clean     string // decoded once, cleaned, no trailing slash ("/" for the root)
	ambiguous bool   // see the package documentation
	// readings are the path's segments as servers read it, computed on
	// first use: [0] is clean's; then, when the path has an encoded slash,
	// with "%2F" kept inside its segment; and, when it has ";", each of
	// those with the ";..." path parameters cut from every segment.
	readings [][]string
	folded   [][]string // readings, case-folded (for deny rules)
	split    bool
}

// canonicalPath decodes and cleans a request path (as sent, still
// percent-encoded). problem is non-empty if the path must be refused
// whatever the rules say.
func canonicalPath(raw string) (p reqPath, problem string) {
	if raw == "" {
		return reqPath{raw: "/", clean: "/"}, ""
	}
	if raw[0] != '/' {
		return p, "the request path does not start with \"/\""
	}
	dec := raw
	if strings.IndexByte(raw, '%') >= 0 {
		var err error
		if dec, err = url.PathUnescape(raw); err != nil {
			return p, "the request path has a malformed percent-escape"
		}
	}
	if strings.IndexByte(dec, 0) >= 0 {
		return p, "the request path contains NUL"
	}
	p.raw = raw
	p.ambiguous = isAmbiguousPath(dec)
	p.clean = path.Clean(dec) // dec starts with "/", so clean does too and has no trailing slash
	return p, ""
}

// isAmbiguousPath reports whether servers disagree about what a decoded path
// names: backslashes (a separator to some servers), escapes left after one
// decoding (decoded again by some), and "..;" / ".;" segments (a dot segment
// to servlet containers).
func isAmbiguousPath(dec string) bool {
	if strings.IndexByte(dec, '\\') >= 0 {
		return true
	}
	for i := strings.IndexByte(dec, '%'); i >= 0; {
		if i+2 < len(dec) && hexdigit.Is(dec[i+1]) && hexdigit.Is(dec[i+2]) {
			return true
		}
		j := strings.IndexByte(dec[i+1:], '%')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	if strings.IndexByte(dec, ';') >= 0 {
		for seg := range strings.SplitSeq(dec, "/") {
			if before, _, ok := strings.Cut(seg, ";"); ok && (before == "." || before == "..") {
				return true
			}
		}
	}
	return false
}

// segmentReadings returns the path's readings (see reqPath), case-folded
// if fold.
func (p *reqPath) segmentReadings(fold bool) [][]string {
	if !p.split {
		p.split = true
		var d []string
		if p.clean != "/" {
			d = strings.Split(p.clean[1:], "/")
		}
		p.readings = [][]string{d}
		if strings.Contains(p.raw, "%2F") || strings.Contains(p.raw, "%2f") {
			// Servers that route before decoding keep "a%2Fb" as one
			// segment "a/b".
			var r []string
			for seg := range strings.SplitSeq(p.raw, "/") {
				d, _ := url.PathUnescape(seg) // the whole path decoded
				r = append(r, d)
			}
			p.readings = append(p.readings, cleanSegments(r))
		}
		if strings.IndexByte(p.clean, ';') >= 0 || strings.Contains(p.raw, ";") {
			// Servlet containers and others drop ";params" from each
			// segment before routing: "/admin;x/y" is "/admin/y" there.
			for _, r := range p.readings {
				var cut []string
				for _, seg := range r {
					seg, _, _ = strings.Cut(seg, ";")
					cut = append(cut, seg)
				}
				p.readings = append(p.readings, cleanSegments(cut))
			}
		}
	}
	if !fold {
		return p.readings
	}
	if p.folded == nil {
		for _, r := range p.readings {
			f := make([]string, len(r))
			for i, seg := range r {
				f[i] = foldCase(seg)
			}
			p.folded = append(p.folded, f)
		}
	}
	return p.folded
}

// cleanSegments resolves "." and ".." segments and drops empty ones, as
// path.Clean does for a whole path.
func cleanSegments(segs []string) []string {
	out := make([]string, 0, len(segs))
	for _, s := range segs {
		switch s {
		case "", ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, s)
		}
	}
	return out
}

// foldCase maps s to a form in which every case variant of it is equal,
// including the variants some servers' case-insensitive routing equates
// beyond ASCII ("ſ" is "s", the Kelvin sign "k", dotless "ı" "i").
func foldCase(s string) string {
	return strings.Map(func(r rune) rune { return unicode.ToLower(unicode.ToUpper(r)) }, s)
}

// pathPattern is a compiled path glob: a sequence of segment patterns, each
// "**" (any number of segments) or a segment glob where '*' matches any run
// of non-'/' characters.
type pathPattern struct {
	segs []string
}

// folded returns the pattern case-folded (for deny rules).
func (pp pathPattern) folded() pathPattern {
	f := pathPattern{segs: make([]string, len(pp.segs))}
	for i, s := range pp.segs {
		f.segs[i] = foldCase(s)
	}
	return f
}

// parsePathPattern validates and compiles one of a rule's paths.
func parsePathPattern(raw string) (pathPattern, string) {
	if raw == "" {
		return pathPattern{}, `the path is empty; write a glob such as "/repos/*" or "/v1/**", or omit paths to match any path`
	}
	if len(raw) > MaxPathLen {
		return pathPattern{}, fmt.Sprintf("the path is %d characters; the limit is %d", len(raw), MaxPathLen)
	}
	if raw[0] != '/' {
		return pathPattern{}, fmt.Sprintf("%q must start with \"/\" (paths match the URL path, without scheme or host)", raw)
	}
	if strings.ContainsAny(raw, "?#") {
		return pathPattern{}, fmt.Sprintf("%q has '?' or '#'; paths match the URL path without the query or fragment, so remove it", raw)
	}
	dec, err := url.PathUnescape(raw)
	if err != nil {
		return pathPattern{}, fmt.Sprintf("%q has a malformed percent-escape", raw)
	}
	if strings.IndexByte(dec, 0) >= 0 {
		return pathPattern{}, fmt.Sprintf("%q contains NUL", raw)
	}
	if isAmbiguousPath(dec) {
		return pathPattern{}, fmt.Sprintf("%q has a backslash, a double-encoded escape or a \";\" dot segment; requests with such paths are never allowed by path rules, so the pattern cannot match", raw)
	}
	if dec != "/" {
		dec = strings.TrimSuffix(dec, "/")
	}
	if c := path.Clean(dec); c != dec {
		return pathPattern{}, fmt.Sprintf("%q is not clean (\"//\", \".\" or \"..\" segments); requests are matched on cleaned paths, so write %q", raw, c)
	}
	var pp pathPattern
	if dec == "/" {
		return pp, ""
	}
	for seg := range strings.SplitSeq(dec[1:], "/") {
		if seg != "**" && strings.Contains(seg, "**") {
			return pathPattern{}, fmt.Sprintf("%q: \"**\" must be a whole segment, as in \"/v1/**\"; use \"*\" within a segment", raw)
		}
		// Consecutive "**" mean the same as one.
		if seg == "**" && len(pp.segs) > 0 && pp.segs[len(pp.segs)-1] == "**" {
			continue
		}
		pp.segs = append(pp.segs, seg)
	}
	return pp, ""
}

// match reports whether the path's segments match the pattern. "**" is
// handled like '*' in classic wildcard matching, over segments, with a single
// backtracking point, so matching is O(len(pattern)·len(path)).
func (pp pathPattern) match(segs []string) bool {
	pi, si := 0, 0
	starP, starS := -1, 0
	for si < len(segs) {
		switch {
		case pi < len(pp.segs) && pp.segs[pi] == "**":
			starP, starS = pi, si
			pi++
		case pi < len(pp.segs) && matchSegment(pp.segs[pi], segs[si]):
			pi++
			si++
		case starP >= 0:
			starS++
			pi, si = starP+1, starS
		default:
			return false
		}
	}
	for pi < len(pp.segs) && pp.segs[pi] == "**" {
		pi++
	}
	return pi == len(pp.segs)
}

// matchSegment matches one segment against a glob in which '*' matches any
// run of characters (never '/', which segments do not contain).
func matchSegment(pat, s string) bool {
	if strings.IndexByte(pat, '*') < 0 {
		return pat == s
	}
	pi, si := 0, 0
	starP, starS := -1, 0
	for si < len(s) {
		switch {
		case pi < len(pat) && pat[pi] == '*':
			starP, starS = pi, si
			pi++
		case pi < len(pat) && pat[pi] == s[si]:
			pi++
			si++
		case starP >= 0:
			starS++
			pi, si = starP+1, starS
		default:
			return false
		}
	}
	for pi < len(pat) && pat[pi] == '*' {
		pi++
	}
	if pi != len(pat) {
		return false
	}
	// A segment is never empty, and a lone "*" must match a whole segment.
	return len(s) > 0
}
