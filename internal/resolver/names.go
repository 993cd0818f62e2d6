package resolver

import (
	"strings"

	"github.com/cagebox/cagebox/internal/hostname"
)

// MaxNameLen is the longest name accepted, in presentation form without the
// trailing dot.
const MaxNameLen = hostname.MaxLen

// reservedZones are answered NXDOMAIN whatever the policy: loopback and
// link-local names, internal (cloud metadata, e.g. metadata.google.internal),
// reverse lookups (.arpa) and names that must never leave the host.
var reservedZones = []string{"localhost", "local", "internal", "arpa", "invalid", "onion"}

// Normalize returns name in canonical form (package hostname: ASCII
// lower-case, one trailing dot dropped); ok is false unless it is a valid
// host name: at most MaxNameLen characters, dot-separated labels of 1 to 63
// characters made of letters, digits, '-' and '_', not starting or ending
// with '-', the last one not numeric. Escaped or binary characters, as
// miekg/dns renders them (\DDD, \.), are therefore rejected.
func Normalize(name string) (norm string, ok bool) {
	norm = hostname.Canonical(name)
	return norm, hostname.Valid(norm)
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
