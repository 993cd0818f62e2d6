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
