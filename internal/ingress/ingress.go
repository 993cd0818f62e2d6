package ingress

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/reserved"
)

// Defaults for the zero fields of a Config.
const (
	DefaultMaxBody           = 100 << 20
	DefaultMaxHeader         = 64 << 10
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultWakeTimeout       = 60 * time.Second
	DefaultRate              = 100 // requests a second per port
	DefaultBurst             = 200
	// retryAfter is what a 503 after a failed wake, or a 429, asks for.
	retryAfter = "5"
)

// ErrNotFound is what a Backend returns for an unknown sandbox, another
// tenant's, or a port that is not published (the client sees one answer
// for all of them: no oracle for sandbox IDs).
var ErrNotFound = errors.New("no such published port")

// Target is a published port as the Backend knows it.
type Target struct {
	Tenant string
	// Addr is the guest's address on its link and the port.
	Addr netip.AddrPort
	// Public ports need no token.
	Public bool
	// TokenHash is the SHA-256 of the port's access token.
	TokenHash []byte
}

// Backend is the sandbox side of ingress (the sandbox manager).
type Backend interface {
	// Resolve returns a published port of a sandbox, or an error wrapping
	// ErrNotFound.
	Resolve(ctx context.Context, id string, port uint16) (*Target, error)
	// Begin wakes the sandbox if the idle timeout paused it (reason says
	// why, e.g. "ingress 8080") and counts it busy until end is called:
	// no idle pause mid-request or mid-WebSocket.
	Begin(ctx context.Context, id, reason string) (end func(), err error)
	// Guest returns a sandbox's tenant and its address on its link, or an
	// error wrapping ErrNotFound (Send: webhooks and relays).
	Guest(ctx context.Context, id string) (tenant string, addr netip.Addr, err error)
}

// Config configures a Server.
type Config struct {
	// Domain is the ingress domain D: hosts PORT-ID.D.
	Domain  string
	Backend Backend
	// Signer checks signed URLs (nil: none are accepted).
	Signer *Signer
	// Emit records an ingress.request event (nil: none).
	Emit func(tenant, sandbox string, ev api.EventPayload)
	// Mark is set (SO_MARK) on every connection to a guest: the nftables
	// rule admits exactly these connections to published ports.
	Mark uint32
	// MaxBody bounds a request body (413 beyond); MaxHeader the request
	// header bytes.
	MaxBody   int64
	MaxHeader int
	// ReadHeaderTimeout and IdleTimeout bound slow and idle clients.
	ReadHeaderTimeout, IdleTimeout time.Duration
	// WakeTimeout bounds how long a request waits for a paused sandbox.
	WakeTimeout time.Duration
	// Rate and Burst are each port's token bucket (requests a second);
	// SandboxRate/SandboxBurst each sandbox's (all its ports). Negative
	// rate: no limit.
	Rate, SandboxRate   float64
	Burst, SandboxBurst int
	Logger              *slog.Logger
	// Now is the clock (tests).
	Now func() time.Time
	// Hooks serves webhook URLs: requests to hooks.D, and to /w/… on D
	// itself (package hooks). Nil: none (404).
	Hooks http.Handler
}

// Server is the ingress listener's handler.
type Server struct {
	cfg   Config
	log   *slog.Logger
	proxy *httputil.ReverseProxy
	tr    *http.Transport
	// inlineProxy serves the requests inline admits, through the guest
	// client (guestclient.go).
	inlineProxy *httputil.ReverseProxy
	guests      *guestClient

	// mu guards limiters.
	mu       sync.Mutex
	limiters map[string]*rate.Limiter

	// live are the requests under way, for Revoke.
	live deliveries
}

// ctx values passed from ServeHTTP to the proxy's hooks.
type reqInfo struct {
	route  Route
	target *Target
	query  query
	status int // the guest's status (101 for an upgrade, which bypasses WriteHeader)
}

type infoKey struct{}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.MaxBody == 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.MaxHeader == 0 {
		cfg.MaxHeader = DefaultMaxHeader
	}
	if cfg.ReadHeaderTimeout == 0 {
		cfg.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.WakeTimeout == 0 {
		cfg.WakeTimeout = DefaultWakeTimeout
	}
	if cfg.Rate == 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.Burst == 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.SandboxRate == 0 {
		cfg.SandboxRate = 4 * cfg.Rate
	}
	if cfg.SandboxBurst == 0 {
		cfg.SandboxBurst = 4 * cfg.Burst
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, log: cfg.Logger, limiters: map[string]*rate.Limiter{}}
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if cfg.Mark != 0 {
		mark := int(cfg.Mark)
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark)
			}); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("set SO_MARK on ingress connection: %w", serr)
			}
			return nil
		}
	}
	s.tr = &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ReadBufferSize:      64 << 10,
		WriteBufferSize:     64 << 10,
		// The guest speaks plain HTTP/1.1 on its link.
		ForceAttemptHTTP2: false,
		Proxy:             nil,
	}
	s.proxy = &httputil.ReverseProxy{
		Rewrite:        s.rewrite,
		Transport:      s.tr,
		FlushInterval:  -1, // SSE and streaming responses are never buffered
		ModifyResponse: s.modifyResponse,
		ErrorHandler:   s.proxyError,
		BufferPool:     bufPool{},
		ErrorLog:       slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	s.guests = newGuestClient(d.DialContext)
	ip := *s.proxy
	ip.Transport = s.guests
	s.inlineProxy = &ip
	return s
}

// HTTPServer returns the http.Server to run the handler with: header size
// and timeouts from the Config, HTTP/2 over TLS (tlsConf may be nil).
func (s *Server) HTTPServer(tlsConf *tls.Config) *http.Server {
	return &http.Server{
		Handler:           s,
		TLSConfig:         tlsConf,
		MaxHeaderBytes:    s.cfg.MaxHeader,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelDebug),
	}
}

// CloseIdle drops idle connections to guests (after a port is removed).
func (s *Server) CloseIdle() {
	s.tr.CloseIdleConnections()
	s.guests.CloseIdleConnections()
}

// fail writes a JSON error.
func fail(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

const notFoundMsg = "no published port here: check the URL (https://PORT-ID.DOMAIN/ or /s/ID/PORT/) and `cagebox port ls ID`"

// ServeHTTP routes, checks access and limits, and proxies.
//
// Every header of cagebox's (package reserved) is taken off the request
// first, whatever it is for; the path form is served only on the domain
// itself, never on another host name (the API's or the console's, whose
// cookies the browser would send along: cookies are not bound to a port).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	presented := r.Header.Get(AccessHeader)
	reserved.StripHeaders(r.Header)
	if s.isHooks(r) {
		if s.cfg.Hooks == nil {
			fail(w, http.StatusNotFound, notFoundMsg)
			return
		}
		s.cfg.Hooks.ServeHTTP(w, r)
		return
	}
	rt, ok := ParseHost(r.Host, s.cfg.Domain)
	if !ok && s.isDomain(r.Host) {
		rt, _, ok = ParsePath(r.URL.Path)
	}
	if !ok {
		fail(w, http.StatusNotFound, notFoundMsg)
		return
	}
	q, err := parseQuery(r.URL.RawQuery)
	if err != nil {
		fail(w, http.StatusBadRequest, "ambiguous query: at most one "+SigParam+", and no cagebox parameter after a ';'")
		return
	}
	// Tracked before Resolve: a Revoke after this cuts the request, and
	// one before it is seen by Resolve.
	ctx, done := s.live.track(r.Context(), rt.ID, rt.Port)
	defer done()
	r = r.WithContext(ctx)
	t, err := s.cfg.Backend.Resolve(r.Context(), rt.ID, rt.Port)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			s.log.Error("ingress: resolve", "sandbox", rt.ID, "port", rt.Port, "err", err)
		}
		fail(w, http.StatusNotFound, notFoundMsg)
		return
	}
	if code, msg := s.access(w, r, rt, t, presented, q.sig); code != 0 {
		s.record(r, rt, t, code, 0, 0, 0)
		fail(w, code, msg)
		return
	}
	s.deliver(w, r, &reqInfo{route: rt, target: t, query: q})
}

// SetHooks sets the handler of webhook URLs (Config.Hooks) before the
// listener serves.
func (s *Server) SetHooks(h http.Handler) { s.cfg.Hooks = h }

// isHooks reports whether r is for a webhook URL: any path on hooks.D, or
// /w/… on D itself (single-host setups).
func (s *Server) isHooks(r *http.Request) bool {
	host, d := hostOf(r.Host), hostOf(s.cfg.Domain)
	return host == "hooks."+d || (host == d && strings.HasPrefix(r.URL.Path, "/w/"))
}

// isDomain reports whether a Host header names the domain D itself.
func (s *Server) isDomain(host string) bool { return hostOf(host) == hostOf(s.cfg.Domain) }

// hostOf is a Host header's name: lower case, without port or final dot.
func hostOf(host string) string {
	host = strings.ToLower(host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(host, ".")
}

// access checks a request's token, signature (sig, from parseQuery) or
// cookie; code 0 = allowed.
func (s *Server) access(w http.ResponseWriter, r *http.Request, rt Route, t *Target, presented, sig string) (int, string) {
	if t.Public {
		return 0, ""
	}
	if presented != "" {
		if CheckToken(presented, t.TokenHash) {
			return 0, ""
		}
		return http.StatusUnauthorized, "wrong access token for this port (" + AccessHeader + ")"
	}
	if sig != "" && s.cfg.Signer != nil {
		exp, err := s.cfg.Signer.Verify(sig, rt.ID, rt.Port, t.TokenHash)
		switch {
		case errors.Is(err, ErrExpired):
			return http.StatusForbidden, "this signed URL has expired: ask for a new one (cagebox port url)"
		case err != nil:
			return http.StatusUnauthorized, "invalid signed URL"
		}
		path := rt.Prefix + "/"
		if rt.Prefix == "" {
			path = "/"
		}
		http.SetCookie(w, &http.Cookie{Name: CookieName, Value: sig, Path: path, Expires: exp,
			Secure: true, HttpOnly: true, SameSite: http.SameSiteLaxMode})
		return 0, ""
	}
	if c, err := r.Cookie(CookieName); err == nil && s.cfg.Signer != nil {
		_, err := s.cfg.Signer.Verify(c.Value, rt.ID, rt.Port, t.TokenHash)
		switch {
		case errors.Is(err, ErrExpired):
			return http.StatusForbidden, "this signed URL has expired: ask for a new one (cagebox port url)"
		case err == nil:
			return 0, ""
		}
	}
	return http.StatusUnauthorized, "this port needs an access token: send it as " + AccessHeader + ", or use a signed URL (cagebox port url)"
}

func (s *Server) limiter(key string, r float64, b int) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.limiters[key]
	if l == nil {
		if len(s.limiters) > 100000 {
			// Bounded: stale buckets go all at once (they refill anyway).
			s.limiters = map[string]*rate.Limiter{}
		}
		l = rate.NewLimiter(rate.Limit(r), b)
		s.limiters[key] = l
	}
	return l
}

func (s *Server) allow(rt Route) bool {
	now := s.cfg.Now()
	if s.cfg.Rate > 0 && !s.limiter(rt.ID+":"+strconv.Itoa(int(rt.Port)), s.cfg.Rate, s.cfg.Burst).AllowN(now, 1) {
		return false
	}
	if s.cfg.SandboxRate > 0 && !s.limiter(rt.ID, s.cfg.SandboxRate, s.cfg.SandboxBurst).AllowN(now, 1) {
		return false
	}
	return true
}

// deliver forwards a request ServeHTTP admitted (and tracked, so Revoke
// cuts it) to a sandbox's port: rate and size limits, waking the sandbox
// first when the idle timeout paused it, then the proxy; one
// ingress.request event. (Webhook deliveries and relays take Send, which
// no revocation cuts.)
func (s *Server) deliver(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	rt, t := info.route, info.target
	start := s.cfg.Now()
	if !s.allow(rt) {
		w.Header().Set("Retry-After", "1")
		s.record(r, rt, t, http.StatusTooManyRequests, 0, 0, 0)
		fail(w, http.StatusTooManyRequests, "rate limit of this port reached: slow down")
		return
	}
	if r.ContentLength > s.cfg.MaxBody {
		s.record(r, rt, t, http.StatusRequestEntityTooLarge, 0, 0, 0)
		fail(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes is over the limit of %d", r.ContentLength, s.cfg.MaxBody))
		return
	}
	wctx, cancel := context.WithTimeout(r.Context(), s.cfg.WakeTimeout)
	end, err := s.cfg.Backend.Begin(wctx, rt.ID, "ingress "+strconv.Itoa(int(rt.Port)))
	cancel()
	if err != nil && errors.Is(context.Cause(r.Context()), ErrRevoked) {
		// Revoked while the sandbox was being woken: the same answer as
		// a revocation while the guest answered.
		s.record(r, rt, t, http.StatusNotFound, 0, 0, 0)
		fail(w, http.StatusNotFound, revokedMsg)
		return
	}
	if err != nil {
		s.log.Warn("ingress: sandbox not available", "sandbox", rt.ID, "port", rt.Port, "err", err)
		w.Header().Set("Retry-After", retryAfter)
		s.record(r, rt, t, http.StatusServiceUnavailable, 0, 0, 0)
		fail(w, http.StatusServiceUnavailable, "the sandbox is not running and could not be woken; try again later")
		return
	}
	defer end()
	proxy := s.proxy
	if inline(r) {
		proxy = s.inlineProxy
	}
	in := &countReader{rc: http.MaxBytesReader(w, r.Body, s.cfg.MaxBody)}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = in
	}
	cw := &countWriter{ResponseWriter: w}
	r = r.WithContext(context.WithValue(r.Context(), infoKey{}, info))
	done := func() {
		status := cw.status
		if status == 0 {
			status = info.status
		}
		if status == 0 {
			status = http.StatusOK
		}
		s.record(r, rt, t, status, in.n+cw.hijackedIn.Load(), cw.n.Load(), s.cfg.Now().Sub(start))
	}
	defer recordAborted(done)
	proxy.ServeHTTP(cw, r)
	done()
}

func (s *Server) record(r *http.Request, rt Route, t *Target, status int, in, out int64, d time.Duration) {
	if s.cfg.Emit == nil {
		return
	}
	s.cfg.Emit(t.Tenant, rt.ID, api.IngressRequest{
		Method: r.Method, Host: r.Host, Path: r.URL.Path, Port: int(rt.Port), Status: status,
		BytesIn: in, BytesOut: out, DurationMS: float64(d.Microseconds()) / 1000,
	})
}

// recordAborted records, with record, a request whose streamed response
// the proxy cut midway (the client or the guest went, or Revoke), which it
// does by panicking with http.ErrAbortHandler; the panic goes on to the
// server.
func recordAborted(record func()) {
	v := recover()
	if v == nil {
		return
	}
	if v == http.ErrAbortHandler {
		record()
	}
	panic(v)
}

// rewrite makes the outbound request: to the guest's address only, the
// path-form prefix stripped, the query parseQuery decided on (every
// cagebox parameter removed), every cagebox cookie removed,
// X-Forwarded-* set (ReverseProxy has removed the client's).
func (s *Server) rewrite(pr *httputil.ProxyRequest) {
	info := pr.In.Context().Value(infoKey{}).(*reqInfo)
	pr.SetXForwarded()
	out := pr.Out
	if pr.In.TLS == nil {
		// The plain listener is only for a TLS-terminating proxy on this
		// host (--ingress-plain): the client's scheme was https.
		out.Header.Set("X-Forwarded-Proto", "https")
	}
	out.URL.Scheme = "http"
	out.URL.Host = info.target.Addr.String()
	out.Host = pr.In.Host
	if p := info.route.Prefix; p != "" {
		rest := strings.TrimPrefix(pr.In.URL.EscapedPath(), p)
		if rest == "" || rest[0] != '/' {
			rest = "/" + rest
		}
		if u, err := url.Parse(rest); err == nil {
			out.URL.Path, out.URL.RawPath = u.Path, u.RawPath
		}
	}
	out.URL.RawQuery, out.URL.ForceQuery = info.query.forward, false
	reserved.StripCookies(out.Header)
	reserved.StripHeaders(out.Header)
}

// modifyResponse keeps the guest's cookies to the guest's own origin
// (scopeCookies) and maps its own paths into the path form: a Location
// "/x" becomes "/s/ID/PORT/x".
func (s *Server) modifyResponse(resp *http.Response) error {
	info, _ := resp.Request.Context().Value(infoKey{}).(*reqInfo)
	if info == nil {
		return nil
	}
	info.status = resp.StatusCode
	scopeCookies(resp.Header, info.route.Prefix)
	if p := info.route.Prefix; p != "" {
		if loc := resp.Header.Get("Location"); strings.HasPrefix(loc, "/") && !strings.HasPrefix(loc, "//") {
			resp.Header.Set("Location", p+loc)
		}
	}
	return nil
}

// scopeCookies rewrites a guest's Set-Cookie headers so that each cookie
// comes back only to the port that set it: its Domain attribute goes (a
// host-only cookie of PORT-ID.D, never one for D and so for every other
// sandbox, tenant and hooks.D); in the path form (prefix "/s/ID/PORT") its
// Path is put under the prefix ("/x" → "/s/ID/PORT/x"; none or a relative
// one → the prefix itself). A cookie named like cagebox's own
// (reserved.Cookie: cbx_access, cagebox_session, …) is dropped, and so is
// a header that does not parse as a cookie (a browser might read it
// otherwise).
func scopeCookies(h http.Header, prefix string) {
	cs := h.Values("Set-Cookie")
	if len(cs) == 0 {
		return
	}
	h.Del("Set-Cookie")
	for _, v := range cs {
		c, err := http.ParseSetCookie(v)
		if err != nil || reserved.Cookie(c.Name) {
			continue
		}
		c.Domain = ""
		if prefix != "" {
			if strings.HasPrefix(c.Path, "/") {
				c.Path = prefix + c.Path
			} else {
				c.Path = prefix
			}
		}
		if out := c.String(); out != "" {
			h.Add("Set-Cookie", out)
		}
	}
}

func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		fail(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is over the limit of %d bytes", mbe.Limit))
		markStatus(w, http.StatusRequestEntityTooLarge)
		return
	}
	if errors.Is(context.Cause(r.Context()), ErrRevoked) {
		fail(w, http.StatusNotFound, revokedMsg)
		markStatus(w, http.StatusNotFound)
		return
	}
	if errors.Is(err, context.Canceled) {
		markStatus(w, 499)
		return
	}
	s.log.Debug("ingress: guest did not answer", "err", err)
	fail(w, http.StatusBadGateway, "the sandbox's port did not answer: is a server listening on it (on 0.0.0.0)?")
}

func markStatus(w http.ResponseWriter, code int) {
	if cw, ok := w.(*countWriter); ok {
		cw.status = code
	}
}

type countReader struct {
	rc io.ReadCloser
	n  int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.rc.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countReader) Close() error { return c.rc.Close() }

// countWriter counts response bytes, and after a hijack (WebSocket) the
// bytes either way on the client's connection; Unwrap lets the proxy
// flush through it.
type countWriter struct {
	http.ResponseWriter
	status int
	// n counts bytes to the client, hijackedIn bytes from it after a
	// hijack: the proxy copies each way in a goroutine of its own, which
	// may still be running when deliver records them.
	n, hijackedIn atomic.Int64
}

func (c *countWriter) WriteHeader(code int) {
	if c.status == 0 || c.status == http.StatusSwitchingProtocols {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// Hijack implements http.Hijacker: the client's connection, counted. An
// HTTP/2 writer cannot be hijacked (http.ErrNotSupported).
func (c *countWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(c.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	cc := &countConn{Conn: conn, in: &c.hijackedIn, out: &c.n}
	// The proxy writes the 101 response through brw, then copies on
	// conn; both are counted. The server hands over a fresh writer, so
	// nothing buffered is lost by replacing it.
	return cc, bufio.NewReadWriter(brw.Reader, bufio.NewWriter(cc)), nil
}

// countConn is a hijacked client connection that counts the bytes read
// from it (in) and written to it (out).
type countConn struct {
	net.Conn
	in, out *atomic.Int64
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.Add(int64(n))
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.Add(int64(n))
	return n, err
}

// CloseWrite passes the proxy's half-close on when the connection has
// one (TCP, TLS).
func (c *countConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("ingress: the client connection cannot be half-closed")
}

// bufPool lends the proxy 256 KiB copy buffers (its default is 32 KiB a
// copy, allocated each time): fewer, larger TLS writes for big bodies.
type bufPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

func (bufPool) Get() []byte  { return *(buffers.Get().(*[]byte)) }
func (bufPool) Put(b []byte) { buffers.Put(&b) }

// Send delivers req to port of sandbox id from the host side — waking the
// sandbox first, counting it busy meanwhile — and returns the guest's
// status (the response body is read, at most 1 MiB, and dropped). It is
// the path webhook deliveries and relays take after their own checks
// (hooks.Deliver has this shape): req's URL names only the path and query
// (its host is replaced by the guest's address), and its headers go as
// they are — X-Cagebox-* included, which the caller sets for the guest.
// The port must be admitted by the link's rules (published, or one of the
// manager's extra ports).
func (s *Server) Send(ctx context.Context, id string, port int, req *http.Request) (int, error) {
	if port < 1 || port > 65535 {
		return 0, fmt.Errorf("ingress: send to %s: port %d out of range", id, port)
	}
	_, addr, err := s.cfg.Backend.Guest(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("ingress: send to %s: %w", id, err)
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.WakeTimeout)
	end, err := s.cfg.Backend.Begin(wctx, id, "delivery "+strconv.Itoa(port))
	cancel()
	if err != nil {
		return 0, fmt.Errorf("ingress: send to %s: %w", id, err)
	}
	defer end()
	out := req.Clone(ctx)
	out.URL.Scheme, out.URL.Host = "http", netip.AddrPortFrom(addr, uint16(port)).String()
	out.RequestURI = ""
	if out.Host == "" || out.Host == req.URL.Host {
		out.Host = out.URL.Host
	}
	resp, err := s.tr.RoundTrip(out)
	if err != nil {
		return 0, fmt.Errorf("ingress: send to %s port %d: %w", id, port, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode, nil
}
