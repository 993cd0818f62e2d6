package policy

import (
	"fmt"
	"net/netip"
	"strings"
)

// parseHostPattern validates a rule's host and returns it lower-cased without
// a trailing dot. For a wildcard, suffix is the part after "*" (".github.com").
// On failure reason says what to do.
func parseHostPattern(s string) (norm string, wildcard bool, reason string) {
	if strings.TrimSpace(s) == "" {
		return "", false, `host is required, e.g. "api.github.com" or "*.github.com"`
	}
	if isIPLiteral(s) {
		return "", false, fmt.Sprintf("%q is an IP address; the policy matches names only (the sandbox reaches hosts through its synthetic DNS), so write the host name", s)
	}
	if strings.Contains(s, "://") || strings.ContainsAny(s, "/?#@") {
		return "", false, fmt.Sprintf("%q is not a bare host name; drop the scheme, user and path (e.g. \"api.github.com\")", s)
	}
	if strings.Contains(s, ":") {
		return "", false, fmt.Sprintf("%q includes a port; write the name only and list ports in \"ports\"", s)
	}
	n := asciiLower(strings.TrimSuffix(s, "."))
	if n == "*" || n == "*." {
		return "", false, `a lone "*" is not a host; use "*.example.com" for the sub-domains of a name, or set default: allow`
	}
	if rest, ok := strings.CutPrefix(n, "*."); ok {
		wildcard = true
		n = rest
	}
	if strings.Contains(n, "*") {
		return "", false, fmt.Sprintf("%q: a wildcard is allowed only as the whole first label, as in \"*.example.com\"", s)
	}
	if r := hostNameProblem(n); r != "" {
		return "", false, fmt.Sprintf("%q: %s", s, r)
	}
	if wildcard {
		if len(n)+2 > MaxHostLen {
			return "", false, fmt.Sprintf("host is %d characters; the limit is %d", len(n)+2, MaxHostLen)
		}
		return "*." + n, true, ""
	}
	return n, false, ""
}

// hostNameProblem reports what is wrong with a lower-case name without a
// trailing dot, or "" if it is a valid host name.
func hostNameProblem(n string) string {
	if n == "" {
		return "the name is empty"
	}
	if len(n) > MaxHostLen {
		return fmt.Sprintf("the name is %d characters; the limit is %d", len(n), MaxHostLen)
	}
	last := ""
	for label := range strings.SplitSeq(n, ".") {
		if r := labelProblem(label); r != "" {
			return r
		}
		last = label
	}
	if looksNumeric(last) {
		return fmt.Sprintf("the last label %q is numeric, which makes the name read as an IP address; write a host name", last)
	}
	return ""
}

func labelProblem(l string) string {
	if l == "" {
		return `it has an empty label (a leading dot or "..")`
	}
	if len(l) > 63 {
		return fmt.Sprintf("label %q is %d characters; labels are at most 63", l, len(l))
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '_':
		case c == '-':
			if i == 0 || i == len(l)-1 {
				return fmt.Sprintf("label %q starts or ends with '-'", l)
			}
		case c >= 0x80:
			return "it is not ASCII; write internationalized names in their punycode (xn--) form"
		default:
			return fmt.Sprintf("label %q has character %q; labels are letters, digits, '-' and '_'", l, c)
		}
	}
	return ""
}

// looksNumeric reports whether a label is all digits or a 0x hex number —
// the forms with which resolvers and URL parsers turn a "name" into an IPv4
// address (127.1, 2130706433, 0x7f.1).
func looksNumeric(l string) bool {
	if h, ok := strings.CutPrefix(l, "0x"); ok {
		l = h
		if l == "" {
			return true
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return true
}

func isIPLiteral(s string) bool {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	if _, err := netip.ParseAddrPort(s); err == nil {
		return true
	}
	if _, err := netip.ParsePrefix(s); err == nil {
		return true
	}
	return false
}

// canonicalRequestHost lower-cases a request's host and drops one trailing
// dot; ok is false unless the result is a valid host name.
func canonicalRequestHost(h string) (string, bool) {
	h = strings.TrimSuffix(h, ".")
	if !isLowerASCII(h) {
		h = asciiLower(h)
	}
	if hostNameProblem(h) != "" {
		return h, false
	}
	return h, true
}

// hostMatcher matches a canonical request host against one rule host.
type hostMatcher struct {
	exact  string // set for an exact rule
	suffix string // ".github.com" for "*.github.com"
}

func newHostMatcher(norm string, wildcard bool) hostMatcher {
	if wildcard {
		return hostMatcher{suffix: norm[1:]}
	}
	return hostMatcher{exact: norm}
}

func (m hostMatcher) match(host string) bool {
	if m.suffix == "" {
		return host == m.exact
	}
	return len(host) > len(m.suffix) && strings.HasSuffix(host, m.suffix)
}

// asciiLower lower-cases ASCII letters only: Unicode case mapping would turn
// e.g. the Kelvin sign into "k" and make a non-ASCII name look valid.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// asciiUpper upper-cases ASCII letters only.
func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - ('a' - 'A')
		}
	}
	return string(b)
}
