// Package errdefs holds the error kinds the daemon maps to HTTP status codes
// in one place. Wrap them: fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound).
package errdefs

import (
	"context"
	"errors"
	"net/http"

	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/isolation"
)

// Kinds of error.
var (
	ErrNotFound     = errors.New("not found")
	ErrInvalid      = errors.New("invalid request")
	ErrDenied       = errors.New("denied")
	ErrConflict     = errors.New("conflict")
	ErrUnavailable  = errors.New("unavailable")
	ErrUnauthorized = errors.New("unauthorized")
)

// HTTPStatus maps an error to the status code the API answers with.
func HTTPStatus(err error) int {
	switch {
	case err == nil:
		return http.StatusOK
	case errors.Is(err, ErrNotFound), errors.Is(err, store.ErrNotFound), errors.Is(err, vault.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, vault.ErrRevoked):
		return http.StatusConflict
	case errors.Is(err, ErrInvalid), errors.Is(err, vault.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, ErrDenied):
		return http.StatusForbidden
	case errors.Is(err, ErrConflict), errors.Is(err, store.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, ErrUnavailable), errors.Is(err, isolation.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}
