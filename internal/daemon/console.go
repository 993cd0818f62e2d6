package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/console"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

// The web console (internal/console): /ui on every listener, browser
// sessions as an alternative to a Bearer key, and a loopback listener that
// `cagebox console` opens for the host's admin.

const consoleOnlyKey ctxKey = 2

// initConsole makes the console and serves /ui on mux.
func (s *Server) initConsole(mux *http.ServeMux) {
	s.console = console.New(console.Config{
		AdminTenant: adminTenantID,
		HashKey:     HashKey,
		// Not on the ingress domain's names: a guest's page at PORT-ID.D
		// would share the console's cookies (cookies ignore ports).
		Foreign: func(h string) bool { return underDomain(s.ingressDomain, h) },
		Log:     s.log.With("part", "console"),
		Lookup: func(ctx context.Context, h []byte) (string, error) {
			k, err := s.store.APIKeyByHash(ctx, h)
			if err != nil {
				if errors.Is(err, store.ErrNotFound) {
					return "", fmt.Errorf("%w: unknown or revoked API key", errdefs.ErrUnauthorized)
				}
				return "", err
			}
			return k.TenantID, nil
		},
	})
	ui := s.console.Handler()
	mux.Handle("/ui", ui)
	mux.Handle("/ui/", ui)
}

// consoleAuth authenticates a request by its console session cookie. ok is
// false when the request is not the console's to judge (a Bearer key, or
// no session cookie, on the API listeners). On the console listener only
// sessions are accepted.
func (s *Server) consoleAuth(r *http.Request) (t *store.Tenant, ok bool, err error) {
	only, _ := r.Context().Value(consoleOnlyKey).(bool)
	if r.Header.Get("Authorization") != "" && !only {
		return nil, false, nil
	}
	tid, ok, err := s.console.Authenticate(r)
	if !ok {
		if only {
			return nil, true, fmt.Errorf("%w: this listener serves console sessions only: open the link `cagebox console` prints", errdefs.ErrUnauthorized)
		}
		return nil, false, nil
	}
	if err != nil {
		return nil, true, err
	}
	t, err = s.tenant(r.Context(), tid)
	return t, true, err
}

// consoleListener is the loopback listener of console sessions.
type consoleListener struct {
	srv    *http.Server
	origin string
}

// createConsoleSession (POST /v1/console/sessions, admin over the unix
// socket) opens the console's loopback listener if it is not open yet and
// answers a one-time login URL for it.
func (s *Server) createConsoleSession(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	if v, _ := r.Context().Value(viaUnixKey).(bool); !v {
		return fmt.Errorf("%w: a console link is made over the daemon's unix socket only: run `cagebox console` on the daemon's host", errdefs.ErrDenied)
	}
	s.consoleMu.Lock()
	defer s.consoleMu.Unlock()
	if s.consoleLn == nil {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("open the console listener on 127.0.0.1: %w", err)
		}
		host := l.Addr().String()
		// Only requests addressed to 127.0.0.1:PORT: a page of another
		// site whose name was re-bound to 127.0.0.1 (DNS rebinding) gets
		// nothing, not even the login page.
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Host != host {
				http.Error(w, "this console listener answers to http://"+host+" only", http.StatusMisdirectedRequest)
				return
			}
			s.ServeHTTP(w, r)
		})
		srv := &http.Server{Handler: console.SecureHeaders(h), ReadHeaderTimeout: 10 * time.Second,
			ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
				return context.WithValue(ctx, consoleOnlyKey, true)
			}}
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("console listener", "err", err)
			}
		}()
		s.consoleLn = &consoleListener{srv: srv, origin: "http://" + host}
		s.log.Info("console listening on loopback", "addr", host)
	}
	tok, exp := s.console.NewToken(s.consoleLn.origin)
	writeJSON(w, 200, &api.ConsoleSession{URL: console.LoginURL(s.consoleLn.origin, tok), ExpiresAt: exp.UTC()})
	return nil
}

// closeConsole closes the console listener and its connections (daemon
// shutdown: a browser's event stream would otherwise hold it open).
func (s *Server) closeConsole() {
	s.consoleMu.Lock()
	defer s.consoleMu.Unlock()
	if s.consoleLn != nil {
		_ = s.consoleLn.srv.Close()
		s.consoleLn = nil
	}
}
