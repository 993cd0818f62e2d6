// Package errdefs holds the kinds of error the daemon's packages return.
// Wrap them: fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound). It is a
// leaf: it imports nothing of cagebox's and knows nothing of HTTP; the
// daemon maps each kind (and the sentinels of the store, vault and
// isolation packages) to a status code, in one place (internal/daemon).
package errdefs

import "errors"

// Kinds of error.
var (
	ErrNotFound     = errors.New("not found")
	ErrInvalid      = errors.New("invalid request")
	ErrDenied       = errors.New("denied")
	ErrConflict     = errors.New("conflict")
	ErrUnavailable  = errors.New("unavailable")
	ErrUnauthorized = errors.New("unauthorized")
)
