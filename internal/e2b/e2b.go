// Package e2b is a protocol front: it serves E2B's control-plane API and
// its in-sandbox API ("envd": the process and filesystem Connect services,
// /files and /health) so that the official E2B SDKs drive cagebox
// unchanged. It is a thin translator onto the sandbox manager, its live
// policy, the ingress and the one agent in every guest: no second
// lifecycle, no second agent (docs/e2b.md).
package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"

	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
)

// EnvdVersion is the envd version the front reports. The SDK gates
// features on it: 0.4.0 (no implicit user "user"), 0.5.2 (closeStdin) and
// 0.5.7 (octet-stream uploads) are implemented; 0.6.2 (file metadata in
// xattrs) and 0.6.3 (watch events with entries) are not.
const EnvdVersion = "0.5.7"

// EnvdPort is the port the SDK addresses envd on (E2b-Sandbox-Port).
const EnvdPort = "49983"

// Config configures the front.
type Config struct {
	Manager *sandbox.Manager
	// Authenticate maps an API key (X-API-KEY) to its tenant; an unknown
	// key is errdefs.ErrUnauthorized.
	Authenticate func(ctx context.Context, key string) (*store.Tenant, error)
	// Status maps an error to its HTTP status (the daemon's one table).
	Status func(error) int
	// Key is a host secret from which each sandbox's envd access token is
	// derived (HMAC of the sandbox id): nothing to store, valid across
	// restarts, useless for any other sandbox.
	Key []byte
	// Domain is returned as the sandboxes' domain (E2B_DOMAIN); "" = none.
	// The front serves PORT-ID.Domain: envd, and guest ports through
	// Ingress.
	Domain string
	// Ingress is the daemon's ingress handler and IngressDomain its
	// domain (nil: no guest ports).
	Ingress       http.Handler
	IngressDomain string
	Logger        *slog.Logger
}

// Server serves both halves of the protocol on one listener: requests that
// carry E2b-Sandbox-Id go to envd, the rest to the control plane.
type Server struct {
	cfg     Config
	log     *slog.Logger
	control http.Handler
	envd    http.Handler
	// life bounds the processes started through envd (they outlive the
	// request that started them, as in E2B); Close ends it.
	life   context.Context
	cancel context.CancelFunc
	procs  *processes
	ports  portTokens
}

// New makes the front.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "e2b"), life: ctx, cancel: cancel}
	s.procs = &processes{bySandbox: map[string]*procTable{}}
	s.control = s.controlMux()
	s.envd = s.envdMux()
	return s
}

// Close ends the processes started through the front.
func (s *Server) Close() { s.cancel() }

// ServeHTTP routes a request to envd or the control plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		s.serveEnvd(w, r, id, r.Header.Get("E2b-Sandbox-Port"))
		return
	}
	if port, id, ok := hostRoute(r.Host, s.cfg.Domain); ok {
		if port != EnvdPort {
			s.serveGuestPort(w, r, id, port)
			return
		}
		s.serveEnvd(w, r, id, port)
		return
	}
	s.control.ServeHTTP(w, r)
}

// hostRoute parses PORT-ID.DOMAIN (what the SDK builds without
// E2B_SANDBOX_URL).
func hostRoute(host, domain string) (port, id string, ok bool) {
	if domain == "" {
		return "", "", false
	}
	if h, _, found := strings.Cut(host, ":"); found {
		host = h
	}
	first, rest, found := strings.Cut(host, ".")
	if !found || rest != domain {
		return "", "", false
	}
	port, id, found = strings.Cut(first, "-")
	if !found || port == "" || id == "" {
		return "", "", false
	}
	return port, id, true
}

// E2B sandbox ids are lowercase alphanumerics; cagebox's are "sb-" and 16
// hex digits. The front writes them without the hyphen.
var e2bID = regexp.MustCompile(`^sb[0-9a-f]{16}$`)

// ToE2BID is the E2B form of a cagebox sandbox id.
func ToE2BID(id string) string { return strings.Replace(id, "sb-", "sb", 1) }

// FromE2BID is the cagebox id of an E2B sandbox id ("" for an id that is
// not one of ours).
func FromE2BID(id string) string {
	if !e2bID.MatchString(id) {
		return ""
	}
	return "sb-" + id[2:]
}

// AccessToken is the envd access token (X-Access-Token) of sandbox id.
func (s *Server) AccessToken(id string) string { return s.sandboxToken("ea_", "e2b-envd-access", id) }

func (s *Server) tokenOK(id, token string) bool { return tokenIs(token, s.AccessToken(id)) }

// sandboxToken is a token of sandbox id for one use (purpose): an HMAC
// under the front's key, so it is stored nowhere and differs per use.
func (s *Server) sandboxToken(prefix, purpose, id string) string {
	m := hmac.New(sha256.New, s.cfg.Key)
	m.Write([]byte(purpose + "\x00" + id))
	return prefix + hex.EncodeToString(m.Sum(nil))
}

// tokenIs compares a presented token with the one wanted, in constant time.
func tokenIs(token, want string) bool {
	return len(token) == len(want) && subtle.ConstantTimeCompare([]byte(token), []byte(want)) == 1
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// fail answers err as E2B's {code, message}, with the daemon's status.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusInternalServerError
	if s.cfg.Status != nil {
		code = s.cfg.Status(err)
	}
	if code >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, code, apiError{Code: code, Message: err.Error()})
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrInvalid, fmt.Sprintf(format, args...))
}

// sandboxKey is the context key of the sandbox an envd request is for.
type sandboxKey struct{}

// target is the sandbox an envd request addresses, authenticated by its
// access token.
type target struct {
	id     string // cagebox id
	tenant string
}

func targetOf(ctx context.Context) target {
	t, _ := ctx.Value(sandboxKey{}).(target)
	return t
}

// serveEnvd authenticates an envd request (the sandbox's access token) and
// serves it. A sandbox that does not exist or does not run is a 502, as
// E2B's edge answers (the SDK reads it as "not running").
func (s *Server) serveEnvd(w http.ResponseWriter, r *http.Request, e2bid, port string) {
	if port != EnvdPort {
		writeJSON(w, http.StatusNotFound, apiError{Code: http.StatusNotFound,
			Message: fmt.Sprintf("port %q: E2b-Sandbox-Id requests are envd's (port %s); guest ports are Sandbox.getHost(port), PORT-ID.DOMAIN (docs/e2b.md)", port, EnvdPort)})
		return
	}
	id := FromE2BID(e2bid)
	if id == "" {
		writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, Message: fmt.Sprintf("sandbox %q not found", e2bid)})
		return
	}
	if !s.tokenOK(id, r.Header.Get("X-Access-Token")) {
		writeJSON(w, http.StatusUnauthorized, apiError{Code: http.StatusUnauthorized, Message: "missing or wrong X-Access-Token for this sandbox"})
		return
	}
	// From memory, as an exec's check is: no store read per envd call.
	tenant, ok := s.cfg.Manager.Running(id)
	if !ok {
		s.procs.drop(id) // what it ran ended with it
		writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, Message: fmt.Sprintf("sandbox %s is not running", e2bid)})
		return
	}
	ctx := context.WithValue(r.Context(), sandboxKey{}, target{id: id, tenant: tenant})
	s.envd.ServeHTTP(w, r.WithContext(ctx))
}

// processes are the envd processes of every sandbox, by cagebox id.
type processes struct {
	// mu guards bySandbox.
	mu        sync.Mutex
	bySandbox map[string]*procTable
}

func (p *processes) table(id string) *procTable {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.bySandbox[id]
	if t == nil {
		t = &procTable{byPID: map[uint32]*process{}, next: 1000}
		p.bySandbox[id] = t
	}
	return t
}

// drop forgets a removed sandbox's table.
func (p *processes) drop(id string) {
	p.mu.Lock()
	t := p.bySandbox[id]
	delete(p.bySandbox, id)
	p.mu.Unlock()
	if t != nil {
		t.killAll()
	}
}
