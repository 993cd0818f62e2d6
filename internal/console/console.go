// Package console is cagebox's web console: a small single-page app
// (embedded HTML, CSS and JS modules, no build step, nothing loaded from
// elsewhere) over the daemon's existing /v1 API, and the browser sessions
// that let it call that API with a cookie instead of a Bearer key.
//
// A session is made by logging in with an API key (POST /ui/login) or by
// exchanging a one-time token that `cagebox console` got from the daemon
// over its unix socket. It lives in memory only (a daemon restart ends every
// session), expires when idle and at an absolute age, and is bound to the
// API key it was made with (the key is looked up again on every request, so
// revoking a key ends its sessions), to the origin it was made on and to
// the client address it was made from: a cookie replayed under another
// host name or from another address is refused. The console does not
// answer on the ingress domain's names (a sandbox's PORT-ID.D), where a
// guest's page would share its cookies. Each tenant holds at most
// maxTenantSessions sessions (its new login ends its own oldest, never
// another tenant's or the admin's), and logins are throttled per key and
// per client address even when they succeed. Every state-changing request with a
// session cookie must carry the session's CSRF token (X-CSRF-Token; a
// WebSocket upgrade, which cannot set headers, passes it as ?csrf=) and an
// Origin equal to the console's own.
package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/internal/errdefs"
	"golang.org/x/time/rate"
)

// CookieName is the session cookie.
const CookieName = "cagebox_session"

// Defaults for Config.
const (
	DefaultIdle     = 30 * time.Minute
	DefaultMaxAge   = 12 * time.Hour
	DefaultTokenTTL = 60 * time.Second
	// maxSessions bounds the memory sessions take. When it is reached,
	// the oldest session of the tenant holding the most goes.
	maxSessions = 4096
	// maxTenantSessions bounds one tenant's sessions (the admin's too): a
	// login beyond it ends that tenant's own oldest session.
	maxTenantSessions = 16
	// Login throttling: loginBurst failures per client address, then one
	// more try per loginEvery.
	loginBurst = 5
	loginEvery = 12 * time.Second
	// Successful logins: okBurst per API key and per client address,
	// then one more per okEvery.
	okBurst = 10
	okEvery = 6 * time.Second
)

// Config configures a Console.
type Config struct {
	// Lookup returns the tenant the API key whose hash (HashKey) is given
	// belongs to, or an error if there is no such key (revoked or never
	// made). It is called at login and on every request of a session.
	Lookup func(ctx context.Context, keyHash []byte) (tenant string, err error)
	// HashKey is how the daemon stores API keys (sha256 of the key).
	HashKey func(key string) []byte
	// AdminTenant is the tenant a one-time token's session acts as.
	AdminTenant string
	// Foreign reports a host name (no port) the console must not answer
	// on: the ingress domain and its PORT-ID names (nil: none).
	Foreign func(host string) bool
	// Idle and MaxAge bound a session (0: DefaultIdle, DefaultMaxAge);
	// TokenTTL bounds a one-time token (0: DefaultTokenTTL).
	Idle, MaxAge, TokenTTL time.Duration
	Log                    *slog.Logger
	// Now is the clock (nil: time.Now); tests move it.
	Now func() time.Time
}

// Console holds the sessions and serves /ui.
type Console struct {
	cfg Config

	// mu guards the fields below.
	mu       sync.Mutex
	sessions map[[32]byte]*session // by sha256 of the cookie value
	count    map[string]int        // sessions by tenant
	tokens   map[[32]byte]token    // one-time tokens, by sha256
	failures map[string]*throttle  // failed logins by client address
	okByKey  map[[32]byte]*okThrottle
	okByAddr map[string]*okThrottle
}

type session struct {
	tenant  string
	keyHash []byte // nil: an admin session made from a one-time token
	csrf    string
	origin  string // scheme://host:port the session was made on
	addr    string // the client address it was made from
	created time.Time
	seen    time.Time
}

// okThrottle paces successful logins of one key or address.
type okThrottle struct {
	lim  *rate.Limiter
	last time.Time
}

type token struct {
	origin  string
	expires time.Time
}

type throttle struct {
	fails int
	next  time.Time // no try before this once fails >= loginBurst
	last  time.Time
}

// New makes a Console.
func New(cfg Config) *Console {
	if cfg.Idle <= 0 {
		cfg.Idle = DefaultIdle
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.TokenTTL <= 0 {
		cfg.TokenTTL = DefaultTokenTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.HashKey == nil {
		cfg.HashKey = func(k string) []byte { h := sha256.Sum256([]byte(k)); return h[:] }
	}
	return &Console{cfg: cfg, sessions: map[[32]byte]*session{}, count: map[string]int{}, tokens: map[[32]byte]token{}, failures: map[string]*throttle{},
		okByKey: map[[32]byte]*okThrottle{}, okByAddr: map[string]*okThrottle{}}
}

func randomString() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("console: no randomness: %v", err))
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func digest(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// Origin is the origin a request was sent to, as a browser writes it in
// the Origin header: scheme://host[:port].
func Origin(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + strings.ToLower(r.Host)
}

// NewToken makes a one-time login token for an admin session on origin
// (the console listener's http://127.0.0.1:PORT). It is good for one use
// within the token lifetime.
func (c *Console) NewToken(origin string) (string, time.Time) {
	t := randomString()
	exp := c.cfg.Now().Add(c.cfg.TokenTTL)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	for k, v := range c.tokens {
		if now.After(v.expires) {
			delete(c.tokens, k)
		}
	}
	c.tokens[digest(t)] = token{origin: origin, expires: exp}
	return t, exp
}

// redeem uses up a one-time token.
func (c *Console) redeem(t, origin string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := digest(t)
	tok, ok := c.tokens[k]
	delete(c.tokens, k)
	switch {
	case !ok:
		return errors.New("this console link was already used or is unknown: run cagebox console again for a new one")
	case c.cfg.Now().After(tok.expires):
		return errors.New("this console link expired: run cagebox console again for a new one")
	case tok.origin != origin:
		return errors.New("this console link is for another address: open it as cagebox console printed it")
	}
	return nil
}

// newSession records a session made from addr and returns its cookie
// value. Beyond maxTenantSessions the tenant's own oldest session ends;
// beyond maxSessions, the oldest of the tenant holding the most.
func (c *Console) newSession(tenant string, keyHash []byte, origin, addr string) (string, *session) {
	id := randomString()
	now := c.cfg.Now()
	s := &session{tenant: tenant, keyHash: keyHash, csrf: randomString(), origin: origin, addr: addr, created: now, seen: now}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.count[tenant] >= maxTenantSessions:
		c.evictOldestLocked(tenant)
	case len(c.sessions) >= maxSessions:
		most := ""
		for t, n := range c.count {
			if most == "" || n > c.count[most] || n == c.count[most] && t < most {
				most = t
			}
		}
		c.evictOldestLocked(most)
	}
	c.sessions[digest(id)] = s
	c.count[tenant]++
	return id, s
}

// removeLocked ends the session k names, if any (c.mu held).
func (c *Console) removeLocked(k [32]byte) {
	s := c.sessions[k]
	if s == nil {
		return
	}
	delete(c.sessions, k)
	if c.count[s.tenant]--; c.count[s.tenant] <= 0 {
		delete(c.count, s.tenant)
	}
}

// evictOldestLocked ends tenant's oldest session (c.mu held).
func (c *Console) evictOldestLocked(tenant string) {
	var oldK [32]byte
	var old *session
	for k, v := range c.sessions {
		if v.tenant == tenant && (old == nil || v.created.Before(old.created)) {
			oldK, old = k, v
		}
	}
	if old != nil {
		c.removeLocked(oldK)
		c.cfg.Log.Info("console: session ended to make room", "tenant", tenant)
	}
}

// session returns the live session the request's cookie names (nil: none),
// touching it. An expired one is removed.
func (c *Console) session(r *http.Request) (*session, error) {
	ck, err := r.Cookie(CookieName)
	if err != nil || ck.Value == "" {
		return nil, nil
	}
	k := digest(ck.Value)
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sessions[k]
	if s == nil {
		return nil, fmt.Errorf("%w: the console session ended: log in again at /ui/login", errdefs.ErrUnauthorized)
	}
	if now.Sub(s.seen) > c.cfg.Idle || now.Sub(s.created) > c.cfg.MaxAge {
		c.removeLocked(k)
		return nil, fmt.Errorf("%w: the console session expired: log in again at /ui/login", errdefs.ErrUnauthorized)
	}
	if s.origin != Origin(r) {
		// A cookie for 127.0.0.1 is sent to every port: a session is good
		// only where it was made.
		return nil, fmt.Errorf("%w: this console session belongs to %s: log in here at /ui/login", errdefs.ErrUnauthorized, s.origin)
	}
	if s.addr != clientAddr(r) {
		// The Host header is the client's to write: a cookie that leaked
		// (to a guest, a log) is no good from anywhere else.
		return nil, fmt.Errorf("%w: this console session was made from another client address: log in again at /ui/login", errdefs.ErrUnauthorized)
	}
	s.seen = now
	cp := *s
	return &cp, nil
}

func (c *Console) endSession(r *http.Request) {
	ck, err := r.Cookie(CookieName)
	if err != nil {
		return
	}
	c.mu.Lock()
	c.removeLocked(digest(ck.Value))
	c.mu.Unlock()
}

// HasSession reports whether r carries a session cookie at all (valid or
// not): the daemon then authenticates it with Authenticate.
func HasSession(r *http.Request) bool {
	ck, err := r.Cookie(CookieName)
	return err == nil && ck.Value != ""
}

// Authenticate checks the session cookie of an API request and returns
// the tenant it acts as. ok is false when the request has no session
// cookie (the caller then asks for a Bearer key). A state-changing request
// (anything but GET and HEAD), and a WebSocket upgrade, must come from the
// console's own origin with the session's CSRF token; otherwise the error
// wraps errdefs.ErrDenied (403). An ended, expired or foreign session, or
// one whose API key was revoked, wraps errdefs.ErrUnauthorized (401).
func (c *Console) Authenticate(r *http.Request) (tenant string, ok bool, err error) {
	if !HasSession(r) {
		return "", false, nil
	}
	if c.foreign(r) {
		return "", true, fmt.Errorf("%w: console sessions are not accepted on the sandboxes' ingress names: use the console at the daemon's API address", errdefs.ErrUnauthorized)
	}
	s, err := c.session(r)
	if err != nil {
		return "", true, err
	}
	if err := checkCSRF(r, s); err != nil {
		return "", true, err
	}
	if s.keyHash == nil {
		return s.tenant, true, nil
	}
	t, err := c.cfg.Lookup(r.Context(), s.keyHash)
	if err != nil || t != s.tenant {
		c.endSession(r)
		if err != nil && !errors.Is(err, errdefs.ErrUnauthorized) && !errors.Is(err, errdefs.ErrNotFound) {
			return "", true, fmt.Errorf("check the session's API key: %w", err)
		}
		return "", true, fmt.Errorf("%w: the API key this console session logged in with was revoked: log in again with a valid key", errdefs.ErrUnauthorized)
	}
	return t, true, nil
}

func isUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

func checkCSRF(r *http.Request, s *session) error {
	upgrade := isUpgrade(r)
	if !upgrade && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		return nil
	}
	if o := r.Header.Get("Origin"); o != s.origin {
		return fmt.Errorf("%w: cross-origin request refused: the Origin %q is not this console's (%s)", errdefs.ErrDenied, o, s.origin)
	}
	got := r.Header.Get("X-CSRF-Token")
	if upgrade {
		got = r.URL.Query().Get("csrf")
	}
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) != 1 {
		return fmt.Errorf("%w: missing or wrong CSRF token: send the session's token (GET /ui/session) in X-CSRF-Token", errdefs.ErrDenied)
	}
	return nil
}

// clientAddr is the throttling key: the peer's IP address.
func clientAddr(r *http.Request) string {
	h, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return h
}

// loginAllowed reports whether addr may try a login now, and if not how
// long to wait.
func (c *Console) loginAllowed(addr string) (bool, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.failures[addr]
	now := c.cfg.Now()
	if f == nil || f.fails < loginBurst || !now.Before(f.next) {
		return true, 0
	}
	return false, f.next.Sub(now)
}

func (c *Console) loginFailed(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	for k, v := range c.failures {
		if now.Sub(v.last) > time.Hour {
			delete(c.failures, k)
		}
	}
	f := c.failures[addr]
	if f == nil {
		f = &throttle{}
		c.failures[addr] = f
	}
	f.fails++
	f.last = now
	if f.fails >= loginBurst {
		f.next = now.Add(loginEvery)
	}
}

func (c *Console) loginSucceeded(addr string) {
	c.mu.Lock()
	delete(c.failures, addr)
	c.mu.Unlock()
}

// okAllowed takes one successful login of keyHash from addr out of their
// allowance (okBurst each, then one per okEvery). When either is spent it
// takes nothing and says how long to wait.
func (c *Console) okAllowed(keyHash []byte, addr string) (bool, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	idle := okEvery * okBurst // a throttle idle this long is full again
	if len(c.okByKey)+len(c.okByAddr) > 1024 {
		for k, v := range c.okByKey {
			if now.Sub(v.last) > idle {
				delete(c.okByKey, k)
			}
		}
		for k, v := range c.okByAddr {
			if now.Sub(v.last) > idle {
				delete(c.okByAddr, k)
			}
		}
	}
	get := func(t *okThrottle) *okThrottle {
		if t == nil {
			t = &okThrottle{lim: rate.NewLimiter(rate.Every(okEvery), okBurst)}
		}
		return t
	}
	kk := digest(string(keyHash))
	byKey, byAddr := get(c.okByKey[kk]), get(c.okByAddr[addr])
	c.okByKey[kk], c.okByAddr[addr] = byKey, byAddr
	rk, ra := byKey.lim.ReserveN(now, 1), byAddr.lim.ReserveN(now, 1)
	if wait := max(rk.DelayFrom(now), ra.DelayFrom(now)); wait > 0 {
		rk.CancelAt(now)
		ra.CancelAt(now)
		return false, wait
	}
	byKey.last, byAddr.last = now, now
	return true, 0
}

// foreign reports whether r is addressed to a name the console does not
// answer on (Config.Foreign).
func (c *Console) foreign(r *http.Request) bool {
	if c.cfg.Foreign == nil {
		return false
	}
	h := r.Host
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	return c.cfg.Foreign(strings.TrimSuffix(strings.ToLower(h), "."))
}
