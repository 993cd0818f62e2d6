package policy

import (
	"fmt"
	"net/url"
	"path"
	"strings"
)

// reqPath is a request path in the canonical form decisions are made on.
type reqPath struct {
	clean     string   // decoded once, cleaned, no trailing slash ("/" for the root)
	ambiguous bool     // see the package documentation
	segs      []string // split lazily by segments
	split     bool
}

// canonicalPath decodes and cleans a request path. problem is non-empty if
// the path must be refused whatever the rules say.
func canonicalPath(raw string) (p reqPath, problem string) {
	if raw == "" {
		return reqPath{clean: "/"}, ""
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
		if i+2 < len(dec) && isHex(dec[i+1]) && isHex(dec[i+2]) {
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

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func (p *reqPath) segments() []string {
	if !p.split {
		p.split = true
		if p.clean != "/" {
			p.segs = strings.Split(p.clean[1:], "/")
		}
	}
	return p.segs
}

// pathPattern is a compiled path glob: a sequence of segment patterns, each
// "**" (any number of segments) or a segment glob where '*' matches any run
// of non-'/' characters.
type pathPattern struct {
	segs []string
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
