package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/isolation"
)

// TestHTTPError pins the one mapping of error kinds to status codes and
// api.Error kinds, for the kinds themselves and for errors that wrap them.
func TestHTTPError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
		kind   string
	}{
		{"nil", nil, http.StatusOK, ""},
		{"not found", errdefs.ErrNotFound, http.StatusNotFound, "not_found"},
		{"store not found", store.ErrNotFound, http.StatusNotFound, "not_found"},
		{"vault not found", vault.ErrNotFound, http.StatusNotFound, "not_found"},
		{"invalid", errdefs.ErrInvalid, http.StatusBadRequest, "invalid"},
		{"vault invalid", vault.ErrInvalid, http.StatusBadRequest, "invalid"},
		{"image not found", fmt.Errorf("pull x: %w", image.ErrNotFound), http.StatusNotFound, "not_found"},
		{"image invalid", image.ErrInvalid, http.StatusBadRequest, "invalid"},
		{"image limit", fmt.Errorf("layer 0: %w", image.ErrLimit), http.StatusBadRequest, "invalid"},
		{"image unsafe", image.ErrUnsafe, http.StatusBadRequest, "invalid"},
		{"image exists", image.ErrExists, http.StatusConflict, "conflict"},
		{"image busy", image.ErrBusy, http.StatusConflict, "conflict"},
		{"unauthorized", errdefs.ErrUnauthorized, http.StatusUnauthorized, "unauthorized"},
		{"denied", errdefs.ErrDenied, http.StatusForbidden, "denied"},
		{"conflict", errdefs.ErrConflict, http.StatusConflict, "conflict"},
		{"store conflict", store.ErrConflict, http.StatusConflict, "conflict"},
		{"vault revoked", vault.ErrRevoked, http.StatusConflict, "conflict"},
		{"unavailable", errdefs.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
		{"runtime unavailable", isolation.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
		{"deadline", context.DeadlineExceeded, http.StatusGatewayTimeout, "internal"},
		{"unknown", errors.New("disk on fire"), http.StatusInternalServerError, "internal"},
		{"canceled", context.Canceled, http.StatusInternalServerError, "internal"},
		{"wrapped", fmt.Errorf("sandbox %q: %w", "sb-1", errdefs.ErrNotFound), http.StatusNotFound, "not_found"},
		{"wrapped twice", fmt.Errorf("create: %w", fmt.Errorf("%w: runtime: nope", errdefs.ErrInvalid)), http.StatusBadRequest, "invalid"},
		{"wrapped runtime", fmt.Errorf("create qemu sandbox: %w", isolation.ErrUnavailable), http.StatusServiceUnavailable, "unavailable"},
		// A revoked secret is a conflict even when the error also says invalid.
		{"revoked and invalid", errors.Join(vault.ErrInvalid, vault.ErrRevoked), http.StatusConflict, "conflict"},
		// Not found wins over every other kind.
		{"not found and conflict", errors.Join(errdefs.ErrConflict, store.ErrNotFound), http.StatusNotFound, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, kind := httpError(tc.err)
			if status != tc.status || kind != tc.kind {
				t.Errorf("httpError(%v) = %d %q, want %d %q", tc.err, status, kind, tc.status, tc.kind)
			}
		})
	}
}

// TestWriteError: the answer to a failed request carries the mapped status
// code and a JSON api.Error with the message and the kind.
func TestWriteError(t *testing.T) {
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/v1/sandboxes/sb-x", nil)
	s.writeError(rec, req, fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, "sb-x"))
	if rec.Code != http.StatusNotFound {
		t.Errorf("status %d, want %d", rec.Code, http.StatusNotFound)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var body api.Error
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	if body.Kind != "not_found" || body.Error != `not found: no sandbox "sb-x"` {
		t.Errorf("body %+v", body)
	}
}
