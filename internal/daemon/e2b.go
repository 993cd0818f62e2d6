package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/cagebox/cagebox/internal/e2b"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/ingress"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
)

// E2BConfig configures the E2B protocol front (package e2b).
type E2BConfig struct {
	// Listen is where the front serves E2B's control plane and envd
	// (E2B_API_URL and E2B_SANDBOX_URL); "" = no front. Plain HTTP on
	// loopback only, as --listen; with the daemon's --tls-cert, HTTPS.
	Listen string
	// Domain is the sandboxes' domain the front reports (E2B_DOMAIN).
	Domain string
}

// E2BKeyPrefix is the E2B form of a tenant API key: "cbk_HEX" is also
// accepted as "e2b_HEX", which passes the SDK's key check
// (^e2b_[0-9a-f]+$).
const E2BKeyPrefix = "e2b_"

// tenantOfKey is the tenant of an API key (either form), or
// errdefs.ErrUnauthorized.
func (s *Server) tenantOfKey(ctx context.Context, key string) (*store.Tenant, error) {
	if rest, ok := strings.CutPrefix(key, E2BKeyPrefix); ok {
		key = "cbk_" + rest
	}
	if s.isAdminKey(key) {
		return s.tenant(ctx, adminTenantID)
	}
	k, err := s.store.APIKeyByHash(ctx, HashKey(key))
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("%w: unknown or revoked API key", errdefs.ErrUnauthorized)
		}
		return nil, err
	}
	return s.tenant(ctx, k.TenantID)
}

// startE2B serves the E2B front on l until stop.
// Guest ports under the front's domain go on through ing (nil: the
// daemon runs no ingress).
func startE2B(cfg Config, l *apiListener, srv *Server, mgr *sandbox.Manager, ing *ingress.Server, log *slog.Logger) (stop func(), err error) {
	key, err := ingress.LoadOrCreateKey(filepath.Join(cfg.Home, "e2b", "envd.key"))
	if err != nil {
		return nil, fmt.Errorf("e2b envd key: %w", err)
	}
	fc := e2b.Config{
		Manager: mgr, Authenticate: srv.tenantOfKey, Key: key, Domain: cfg.E2B.Domain, Logger: log,
		Status: func(err error) int { code, _ := httpError(err); return code },
	}
	if ing != nil {
		fc.Ingress, fc.IngressDomain = ing, cfg.Ingress.Domain
	}
	front := e2b.New(fc)
	hs := &http.Server{Handler: front, ReadHeaderTimeout: 10 * time.Second, TLSConfig: l.tls}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var err error
		if l.tls != nil {
			err = hs.ServeTLS(l.Listener, "", "")
		} else {
			err = hs.Serve(l.Listener)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("e2b front stopped", "err", err)
		}
	}()
	log.Info("e2b front (E2B_API_URL, E2B_SANDBOX_URL)", "addr", l.Addr().String(), "https", l.tls != nil)
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		front.Close()
		<-done
	}, nil
}
