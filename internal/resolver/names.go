package resolver

import "strings"

// MaxNameLen is the longest name accepted, in presentation form without the
// trailing dot.
const MaxNameLen = 253

// reservedZones are answered NXDOMAIN whatever the policy: loopback and
// link-local names, internal (cloud metadata, e.g. metadata.google.internal),
// reverse lookups (.arpa) and names that must never leave the host.
var reservedZones = []string{"localhost", "local", "internal", "arpa", "invalid", "onion"}

// Normalize lower-cases name (ASCII only) and strips one trailing dot. ok is
// false unless the result is a valid host name: at most MaxNameLen
// characters, dot-separated labels of 1 to 63 characters made of letters,
// digits, '-' and '_', not starting or ending with '-'. Escaped or binary
// characters, as miekg/dns renders them (\DDD, \.), are therefore rejected.
func Normalize(name string) (norm string, ok bool) {
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > MaxNameLen {
		return name, false
	}
	var buf []byte // allocated only when an upper-case letter is seen
	labelStart := 0
	for i := 0; i <= len(name); i++ {
		if i == len(name) || name[i] == '.' {
			n := i - labelStart
			if n == 0 || n > 63 || name[labelStart] == '-' || name[i-1] == '-' {
				return name, false
			}
			labelStart = i + 1
			continue
		}
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
		case 'A' <= c && c <= 'Z':
			if buf == nil {
				buf = []byte(name)
			}
			buf[i] = c + ('a' - 'A')
		default:
			return name, false
		}
	}
	if buf != nil {
		return string(buf), true
	}
	return name, true
}

// ValidName reports whether name is a host name Normalize accepts.
func ValidName(name string) bool {
	_, ok := Normalize(name)
	return ok
}

// Reserved reports whether the normalized name is localhost or lies under a
// zone that is never resolved (.localhost, .local, .internal, .arpa,
// .invalid, .onion).
func Reserved(name string) bool {
	for _, z := range reservedZones {
		if name == z || (len(name) > len(z) && strings.HasSuffix(name, z) && name[len(name)-len(z)-1] == '.') {
			return true
		}
	}
	return false
}
