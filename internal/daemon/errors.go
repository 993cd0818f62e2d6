package daemon

import (
	"context"
	"errors"
	"net/http"

	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/isolation"
)

// errorKinds maps errors to the status code and the api.Error kind the API
// answers with: the one place where an error kind meets HTTP. The first row
// an error matches wins (a revoked secret is a conflict, not "invalid").
var errorKinds = []struct {
	errs   []error
	status int
	kind   string
}{
	{[]error{errdefs.ErrNotFound, store.ErrNotFound, vault.ErrNotFound, image.ErrNotFound}, http.StatusNotFound, "not_found"},
	{[]error{vault.ErrRevoked, image.ErrExists, image.ErrBusy}, http.StatusConflict, "conflict"},
	{[]error{errdefs.ErrInvalid, vault.ErrInvalid, image.ErrInvalid, image.ErrLimit, image.ErrUnsafe}, http.StatusBadRequest, "invalid"},
	{[]error{errdefs.ErrUnauthorized}, http.StatusUnauthorized, "unauthorized"},
	{[]error{errdefs.ErrDenied}, http.StatusForbidden, "denied"},
	{[]error{errdefs.ErrConflict, store.ErrConflict}, http.StatusConflict, "conflict"},
	{[]error{errdefs.ErrUnavailable, isolation.ErrUnavailable}, http.StatusServiceUnavailable, "unavailable"},
	{[]error{context.DeadlineExceeded}, http.StatusGatewayTimeout, "internal"},
}

// httpError returns the status code and api.Error kind for err: 200 and ""
// for nil, 500 and "internal" for an error of no known kind.
func httpError(err error) (status int, kind string) {
	if err == nil {
		return http.StatusOK, ""
	}
	for _, row := range errorKinds {
		for _, target := range row.errs {
			if errors.Is(err, target) {
				return row.status, row.kind
			}
		}
	}
	return http.StatusInternalServerError, "internal"
}
