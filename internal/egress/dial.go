package egress

import (
	"github.com/cagebox/cagebox/internal/safedial"
)

// The upstream dialer is package safedial's, shared with every other
// connection the host makes toward an address it was not configured with
// (tenants' URLs); these names keep egress's API.

// Built-in rules named when the guard refuses an upstream's address.
const (
	// RuleBlockedAddress: the name resolves to an address no upstream may
	// have (loopback, private, link-local, metadata, …; see safedial.CheckAddr).
	RuleBlockedAddress = safedial.RuleBlockedAddress
	// RuleHostAddress: the name resolves to an address of the host itself.
	RuleHostAddress = safedial.RuleHostAddress
)

// RefusedError is an upstream connection the dial guard would not make
// (safedial.RefusedError: Reason is safe to show to the sandbox).
type RefusedError = safedial.RefusedError

// refusalRule returns the built-in rule that refused a dial, or "".
func refusalRule(err error) string { return safedial.Rule(err) }
