// Package hostname is cagebox's one notion of a DNS host name and of a host
// pattern, shared by the egress policy, the vault's secret bindings, the
// placeholder substitution, the synthetic DNS and the proxy, so that they
// all accept, canonicalise and match the same names.
//
// A name is what a request or a DNS query carries: dot-separated labels of
// 1 to 63 characters made of ASCII letters, digits, '-' and '_' (no label
// starts or ends with '-'), at most 253 characters in all, whose last label
// is not numeric (so "127.1", "2130706433" and "0x7f.1", which resolvers
// and URL parsers read as IPv4 addresses, are not names). One trailing dot
// is allowed and dropped.
//
// The canonical form is lower-case (ASCII letters only: Unicode case
// mapping would turn the Kelvin sign into "k" and make a non-ASCII name
// compare equal to an ASCII one) without the trailing dot.
//
// Internationalised names are refused, not converted: a request and a DNS
// query carry their ASCII (punycode, "xn--") form, so a Unicode spelling
// could only ever be written by an operator, and converting it would bring
// in UTS #46 mapping, under which distinct spellings become one name. The
// error for a Unicode name gives its punycode form (computed with
// golang.org/x/net/idna) to copy. "xn--" labels are taken as they are.
//
// A pattern is a name ("api.github.com", matching that name only) or a
// wildcard: "*." followed by a name ("*.github.com"), matching every name
// below it at any depth ("a.github.com", "a.b.github.com") but not the name
// itself ("github.com"). A wildcard may not cover a top-level domain or an
// ICANN public suffix ("*.com", "*.co.uk", per golang.org/x/net/publicsuffix):
// the names below belong to unrelated owners. A credential's pattern
// (ParseCredentialPattern) may not cover the list's private section either
// ("*.github.io", "*.herokuapp.com", "*.s3.amazonaws.com"): anyone can own a
// name there, and a real value sent to it is stolen — where a policy rule
// allowing "*.githubusercontent.com" is an operator's informed choice of
// reachability.
package hostname

import (
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
)

// Limits.
const (
	// MaxLen is the longest name or pattern, without a trailing dot.
	MaxLen = 253
	// MaxLabelLen is the longest label.
	MaxLabelLen = 63
)

// Error is a name or pattern that is not valid. Its message quotes the
// input (cut to MaxLen+2 bytes) and says what to write instead.
type Error struct {
	Input  string
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("%q: %s", e.Input, e.Reason) }

func invalid(input, format string, args ...any) *Error {
	if len(input) > MaxLen+2 {
		input = input[:MaxLen+2] + "…"
	}
	return &Error{Input: input, Reason: fmt.Sprintf(format, args...)}
}

// Canonical returns s lower-cased (ASCII letters only) without one
// trailing dot. It does not validate s; see Valid, Normalize and Parse.
func Canonical(s string) string { return Lower(strings.TrimSuffix(s, ".")) }

// Lower lower-cases the ASCII letters of s and nothing else: Unicode case
// mapping would turn e.g. the Kelvin sign into "k" and make a non-ASCII
// name look valid. It is Canonical without dropping a trailing dot, for
// showing a host as it was sent.
func Lower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			return asciiLower(s)
		}
	}
	return s
}

// Valid reports whether s is a name in canonical form.
func Valid(s string) bool { return nameProblem(s) == "" }

// Normalize returns a name as a request or a DNS query carries it (any
// case, an optional trailing dot, no port) in canonical form; ok is false
// unless the result is a valid name. It is Parse for the request path:
// no error to build, a name to match with Match.
func Normalize(s string) (name string, ok bool) {
	name = Canonical(s)
	return name, Valid(name)
}

// Parse validates a name (any case, an optional trailing dot) and returns
// its canonical form. Wildcards are refused; see ParsePattern.
func Parse(s string) (string, error) {
	if err := shapeProblem(s); err != nil {
		return "", err
	}
	n := Canonical(s)
	if strings.Contains(n, "*") {
		return "", invalid(s, `a wildcard is not allowed here; write one host name, e.g. "api.github.com"`)
	}
	if r := nameProblem(n); r != "" {
		return "", invalid(s, "%s", r)
	}
	return n, nil
}

// ParsePattern validates a pattern — a name, or "*." followed by a name
// that is neither a top-level domain nor an ICANN public suffix — and
// returns its canonical form. Policy rules use it.
func ParsePattern(s string) (string, error) { return parsePattern(s, false) }

// ParseCredentialPattern is ParsePattern for the hosts a credential may be
// sent to: a wildcard over any public suffix, the private section included
// (hosting platforms where anyone can own a name), is refused too.
func ParseCredentialPattern(s string) (string, error) { return parsePattern(s, true) }

func parsePattern(s string, credential bool) (string, error) {
	if err := shapeProblem(s); err != nil {
		return "", err
	}
	n := Canonical(s)
	if n == "*" {
		return "", invalid(s, `a lone "*" matches no name; write "*.example.com" for the names below example.com`)
	}
	base, wildcard := strings.CutPrefix(n, "*.")
	if strings.Contains(base, "*") {
		return "", invalid(s, `a wildcard is allowed only as the whole first label, as in "*.example.com"`)
	}
	if !wildcard {
		if r := nameProblem(n); r != "" {
			return "", invalid(s, "%s", r)
		}
		return n, nil
	}
	if len(n) > MaxLen {
		return "", invalid(s, "the pattern is %d characters; the limit is %d", len(n), MaxLen)
	}
	if r := nameProblem(base); r != "" {
		return "", invalid(s, "%s", r)
	}
	if ps, icann := publicsuffix.PublicSuffix(base); ps == base {
		switch {
		case !strings.Contains(base, "."):
			return "", invalid(s, "%q is a top-level domain, so a wildcard over it covers names of unrelated owners; list the hosts, or write a wildcard below a domain someone owns, e.g. \"*.example.%s\"", base, base)
		case icann:
			return "", invalid(s, "%q is a public suffix (publicsuffix.org), so a wildcard over it covers names of unrelated owners; list the hosts, or write a wildcard below a domain someone owns, e.g. \"*.example.%s\"", base, base)
		case credential:
			return "", invalid(s, "%q is a public suffix (publicsuffix.org: anyone can own a name below it), so a credential bound to a wildcard over it could be sent to anyone; list the hosts it may go to", base)
		}
	}
	return n, nil
}

// shapeProblem refuses what is not a bare host at all — empty, an IP
// address, a URL, a host:port — with a message saying what to write.
func shapeProblem(s string) *Error {
	switch {
	case strings.TrimSpace(s) == "":
		return invalid(s, `a host is required, e.g. "api.github.com" or "*.github.com"`)
	case isIPLiteral(s):
		return invalid(s, "is an IP address; write a host name (names are matched, never addresses)")
	case strings.Contains(s, "://") || strings.ContainsAny(s, "/?#@"):
		return invalid(s, `is not a bare host name; drop the scheme, user, port and path (e.g. "api.github.com")`)
	case strings.Contains(s, ":"):
		return invalid(s, "includes a port; write the name alone (ports are given separately)")
	}
	return nil
}

// nameProblem reports what is wrong with s as a canonical name, or "".
func nameProblem(s string) string {
	if s == "" {
		return "the name is empty"
	}
	if len(s) > MaxLen {
		return fmt.Sprintf("the name is %d characters; the limit is %d", len(s), MaxLen)
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			continue
		}
		if r := labelProblem(s, s[start:i]); r != "" {
			return r
		}
		if i == len(s) && looksNumeric(s[start:]) {
			return fmt.Sprintf("the last label %q is numeric, which makes the name read as an IP address; write a host name", s[start:])
		}
		start = i + 1
	}
	return ""
}

func labelProblem(name, l string) string {
	if l == "" {
		return `it has an empty label (a leading dot or "..")`
	}
	if len(l) > MaxLabelLen {
		return fmt.Sprintf("label %q is %d characters; labels are at most %d", l, len(l), MaxLabelLen)
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
			return nonASCII(name)
		case 'A' <= c && c <= 'Z':
			return fmt.Sprintf("label %q is not lower-case", l)
		default:
			return fmt.Sprintf("label %q has character %q; labels are letters, digits, '-' and '_'", l, c)
		}
	}
	return ""
}

// nonASCII explains the refusal of a Unicode name and, when IDNA 2008
// registration rules accept it, gives its punycode form.
func nonASCII(name string) string {
	const msg = "it is not ASCII; write internationalized names in their punycode (xn--) form"
	a, err := idna.Registration.ToASCII(name)
	if err != nil || a == name {
		return msg
	}
	return fmt.Sprintf("%s: %q", msg, a)
}

// looksNumeric reports whether a label is all digits or a 0x hex number —
// the forms with which resolvers and URL parsers turn a "name" into an IPv4
// address (127.1, 2130706433, 0x7f.1).
func looksNumeric(l string) bool {
	if h, ok := strings.CutPrefix(l, "0x"); ok {
		return strings.Trim(h, "0123456789abcdef") == ""
	}
	return strings.Trim(l, "0123456789") == ""
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

// Match reports whether host matches pattern. pattern is canonical (from
// ParsePattern) and so is host (from Parse, or Canonical and Valid):
// callers that match one host against many patterns validate it once. An
// exact pattern matches itself; "*.example.com" matches every name ending
// in ".example.com", at any depth, and not "example.com".
func Match(pattern, host string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return len(host) > len(suffix) && strings.HasSuffix(host, suffix)
	}
	return host == pattern
}

// MatchAny reports whether host — as a request carries it: any case, an
// optional trailing dot, no port — is a valid name matched by one of the
// canonical patterns.
func MatchAny(patterns []string, host string) bool {
	host, ok := Normalize(host)
	if !ok {
		return false
	}
	for _, p := range patterns {
		if Match(p, host) {
			return true
		}
	}
	return false
}

// Covers reports whether every name that pattern q matches is matched by
// pattern p (both canonical): a narrower binding is covered by a wider one.
func Covers(p, q string) bool {
	if base, ok := strings.CutPrefix(q, "*."); ok {
		return p == q || strings.HasPrefix(p, "*.") && Match(p, base)
	}
	return Match(p, q)
}

// CoversAny reports whether one of the patterns ps covers q.
func CoversAny(ps []string, q string) bool {
	for _, p := range ps {
		if Covers(p, q) {
			return true
		}
	}
	return false
}

// asciiLower lower-cases ASCII letters only.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
