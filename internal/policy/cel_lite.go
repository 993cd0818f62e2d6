//go:build lite

package policy

// The client CLI (built with -tags lite, see cmd/cagebox) reads policy
// documents only to check their shape and send them: the daemon compiles
// and enforces them. CEL (cel-go and the protobuf descriptors its packages
// register at init, about a millisecond of every CLI start) is not linked
// into it: a condition is checked for its length here, and compiled — and
// refused with the compiler's words when it does not compile — by the
// daemon that receives the document (cel.go).

import "errors"

type condition struct {
	src   string
	rules []string
}

func compileCondition(src string) (*condition, error) {
	if len(src) > MaxWhenLen {
		return nil, errors.New("the condition is too long")
	}
	return &condition{src: src}, nil
}

type activation struct{ r *Request }

// evalIn never runs: the client build does not evaluate policies.
func (c *condition) evalIn(*activation) (bool, error) {
	return false, errors.New("policy conditions are evaluated by the daemon, not by this client build")
}
