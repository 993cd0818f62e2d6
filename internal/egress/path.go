package egress

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/cagebox/cagebox/internal/hexdigit"
)

const (
	ruleMethodOverride = "builtin:method-override"
	maxOverrides       = 4
)

// wirePath is the request's path exactly as the sandbox sent it: the path
// part of the request target (for HTTP/2, of :path), before any decoding.
func wirePath(r *http.Request) string {
	uri := r.RequestURI
	if uri == "" { // not read by a server (tests): what a transport would send
		return r.URL.EscapedPath()
	}
	if i := strings.IndexAny(uri, "?#"); i >= 0 {
		uri = uri[:i]
	}
	if !strings.HasPrefix(uri, "/") {
		// absolute-form, scheme://authority/path; "*" stays as it is.
		if i := strings.Index(uri, "://"); i >= 0 {
			rest := uri[i+3:]
			if j := strings.IndexByte(rest, '/'); j >= 0 {
				return rest[j:]
			}
			return "/"
		}
	}
	return uri
}

// canonicalPath is the one form of a request path that the policy decides
// on and that is sent upstream: the path as sent, with the percent-escapes
// of unreserved characters (RFC 3986: letters, digits, "-", ".", "_", "~")
// decoded, every other escape in upper case, and every byte that may not
// appear bare in a path (RFC 3986 pchar and "/") escaped. Every server reads
// it as it reads the path that was sent — the rewriting is RFC 3986's own
// normalisation — but the dot segments that "%2e" spells become visible,
// and an escape that stays ("%2F", "%25") stays escaped and is decoded by
// the policy exactly once. problem is non-empty when the path must be
// refused: it does not start with "/" or has a malformed escape.
func canonicalPath(wire string) (canon, problem string) {
	if wire == "" {
		return "/", ""
	}
	if wire[0] != '/' {
		return "", "the request path does not start with \"/\""
	}
	var b strings.Builder
	b.Grow(len(wire))
	for i := 0; i < len(wire); i++ {
		c := wire[i]
		switch {
		case c == '%':
			if i+2 >= len(wire) || !hexdigit.Is(wire[i+1]) || !hexdigit.Is(wire[i+2]) {
				return "", "the request path has a malformed percent-escape"
			}
			v := hexdigit.Val(wire[i+1])<<4 | hexdigit.Val(wire[i+2])
			i += 2
			if isUnreserved(v) {
				b.WriteByte(v)
			} else {
				writeEscape(&b, v)
			}
		case isUnreserved(c) || c == '/' || strings.IndexByte("!$&'()*+,;=:@", c) >= 0:
			b.WriteByte(c)
		default:
			writeEscape(&b, c)
		}
	}
	return b.String(), ""
}

// setPath makes u's path canon (decoded: its one decoding), so that a
// transport sends canon byte for byte.
func setPath(u *url.URL, canon, decoded string) {
	u.Opaque = ""
	u.Path, u.RawPath = decoded, canon
	if u.EscapedPath() != canon { // cannot happen for a canonical path
		u.Opaque = canon
	}
}

func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

func writeEscape(b *strings.Builder, c byte) {
	const hex = "0123456789ABCDEF"
	b.WriteByte('%')
	b.WriteByte(hex[c>>4])
	b.WriteByte(hex[c&15])
}

// hasDotSegment reports whether a decoded path has a "." or ".." segment
// (also with a backslash separator, which some servers accept, and also
// once a segment is percent-decoded again, as some servers do).
func hasDotSegment(p string) bool {
	for _, seg := range strings.FieldsFunc(p, func(r rune) bool { return r == '/' || r == '\\' }) {
		for range 3 {
			if seg == "." || seg == ".." {
				return true
			}
			d, err := url.PathUnescape(seg)
			if err != nil || d == seg {
				break
			}
			seg = d
		}
	}
	return false
}

// canonicalMethod is the method as the policy matches it and as it is
// sent upstream: methods are case-sensitive tokens (RFC 9110) but the
// policy compares them case-insensitively, so "get" is sent as "GET" —
// the request the policy allowed.
func canonicalMethod(m string) string {
	for i := 0; i < len(m); i++ {
		if 'a' <= m[i] && m[i] <= 'z' {
			return strings.ToUpper(m)
		}
	}
	return m
}

// methodOverrideHeaders make frameworks (Google APIs, Rails, Laravel,
// Symfony, Express' method-override, ASP.NET) treat a request as having
// another method.
var methodOverrideHeaders = []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"}

// methodOverrides lists the methods a request asks servers to treat it as
// (besides its own), upper-cased; bad is non-empty when an override is not
// an HTTP method at all. The "_method" form field of a POST body is not
// read (bodies are not parsed); the "_method" query parameter is.
func methodOverrides(r *http.Request) (ms []string, bad string) {
	add := func(where, v string) bool {
		for t := range strings.SplitSeq(v, ",") {
			t = strings.TrimSpace(t)
			if t == "" {
				continue
			}
			if !isToken(t) {
				bad = where + " " + quoteForReason(t) + " is not an HTTP method"
				return false
			}
			t = canonicalMethod(t)
			if t == r.Method {
				continue
			}
			if len(ms) == maxOverrides {
				bad = "too many method overrides"
				return false
			}
			seen := false
			for _, m := range ms {
				seen = seen || m == t
			}
			if !seen {
				ms = append(ms, t)
			}
		}
		return true
	}
	for _, h := range methodOverrideHeaders {
		for _, v := range r.Header.Values(h) {
			if !add(h, v) {
				return nil, bad
			}
		}
	}
	if strings.Contains(r.URL.RawQuery, "_method") {
		for _, v := range r.URL.Query()["_method"] {
			if !add("_method", v) {
				return nil, bad
			}
		}
	}
	return ms, ""
}

// isToken reports whether s is an HTTP token (RFC 9110, section 5.6.2).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// quoteForReason keeps untrusted text short and printable in a reason.
func quoteForReason(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return `"` + strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e || r == '"' {
			return '?'
		}
		return r
	}, s) + `"`
}
