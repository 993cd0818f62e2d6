package policy

import "github.com/cagebox/cagebox/internal/hostname"

// parseHostPattern validates a rule's host (see package hostname) and
// returns its canonical form; on failure reason says what to do.
func parseHostPattern(s string) (norm, reason string) {
	p, err := hostname.ParsePattern(s)
	if err != nil {
		reason = err.Error()
		if hostname.Canonical(s) == "*" {
			reason += ", or set default: allow"
		}
		return "", reason
	}
	return p, ""
}

// canonicalRequestHost lower-cases a request's host and drops one trailing
// dot; ok is false unless the result is a valid host name.
func canonicalRequestHost(h string) (string, bool) {
	h = hostname.Canonical(h)
	return h, hostname.Valid(h)
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
