package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cagebox/cagebox/internal/hostname"
)

// Rules the proxy applies itself, named in denials.
const (
	ruleConnect       = "builtin:connect"
	ruleFronting      = "builtin:domain-fronting"
	ruleLiteralIP     = "builtin:literal-ip"
	ruleUpgrade       = "builtin:upgrade"
	rulePath          = "builtin:path"
	deniedMessage     = "denied by cagebox egress policy"
	headerDenied      = "X-Cagebox-Denied"
	defaultRuleName   = "default"
	upstreamErrPrefix = "upstream refused: "
)

// reqState follows one allowed request through the reverse proxy.
type reqState struct {
	authority  string // name:port dialled upstream
	hostHeader string
	scheme     string
	name       string
	ev         *Event
	lim        *sbState       // the sandbox's pool and budgets
	body       *guestBody     // nil: no request body
	filter     ResponseFilter // from the hook; nil: the response passes as is
	// path is the canonical request path the policy decided on, sent
	// upstream as is.
	path, decodedPath string
}

type reqStateKey struct{}

// serveHTTP handles every request from a sandbox, TLS-terminated or plain,
// HTTP/1.1 or HTTP/2.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	info, _ := r.Context().Value(connInfoKey{}).(*connInfo)
	if info == nil { // cannot happen: every served conn is registered
		http.Error(w, "egress: unknown connection", http.StatusInternalServerError)
		return
	}
	info.handlers.Add(1)
	defer info.handlers.Done()

	start := time.Now()
	cw := &countingWriter{rw: w}
	var body *guestBody
	if r.Body != nil && r.Body != http.NoBody {
		body = &guestBody{rc: r.Body, sb: info.lim, ctl: http.NewResponseController(w),
			idle: p.cfg.BodyIdleTimeout, total: p.cfg.BodyTimeout, deadline: start.Add(p.cfg.BodyTimeout)}
		r.Body = body
		defer body.done()
	}
	// The method the policy decides on is the method sent upstream.
	r.Method = canonicalMethod(r.Method)
	ev := &Event{
		Host: info.name, Port: int(info.dst.Port()), Protocol: info.scheme,
		Method: r.Method, Path: r.URL.Path, Time: start,
	}
	defer func() {
		// Runs even when the reverse proxy aborts a response mid-stream.
		ev.Status = cw.status
		ev.BytesDown = cw.n.Load()
		if body != nil {
			ev.BytesUp = body.n.Load()
		}
		if cw.tunnel != nil {
			ev.BytesUp += cw.tunnel.up.Load()
			ev.BytesDown += cw.tunnel.down.Load()
		}
		ev.Duration = time.Since(start)
		p.emit(info.sb, *ev)
	}()
	hookRefused := false
	deny := func(verdict, rule, reason string) {
		if rule == "" {
			rule = defaultRuleName
		}
		ev.Verdict, ev.Rule, ev.Reason = verdict, rule, reason
		if !hookRefused && p.cfg.OnDenied != nil {
			p.cfg.OnDenied(info.sb, r, info.name)
		}
		closeUnread(cw, r, body)
		writeDenied(cw, rule, info.name, reason)
	}
	// limited answers a request stopped by a per-sandbox limit.
	limited := func(h *limitHit) {
		ev.Verdict, ev.Rule, ev.Reason = VerdictDeny, h.rule, h.reason
		closeUnread(cw, r, body)
		writeLimit(cw, h, info.name)
	}

	if r.Method == http.MethodConnect {
		deny(VerdictDeny, ruleConnect, "CONNECT is not allowed")
		return
	}
	if !info.named {
		deny(VerdictDeny, ruleLiteralIP, "destination is a literal IP address, not a name from the sandbox's DNS")
		return
	}
	host, port := splitHostPort(r.Host)
	if hostname.Canonical(host) != info.name || (port != "" && port != strconv.Itoa(int(info.dst.Port()))) {
		what := "destination"
		if info.scheme == "https" {
			what = "TLS server name"
		}
		deny(VerdictDeny, ruleFronting, fmt.Sprintf("Host %q does not match the %s %q", r.Host, what, info.name))
		return
	}
	if d := info.connDeny; d != nil {
		deny(info.connVerdict, d.Rule, d.Reason)
		return
	}
	// Decide on the path as it was sent, once: the canonical form below is
	// what the policy sees and exactly what goes upstream.
	canon, problem := canonicalPath(wirePath(r))
	if problem != "" {
		deny(VerdictDeny, rulePath, problem)
		return
	}
	decoded, _ := url.PathUnescape(canon) // canon is well-formed
	ev.Path = canon
	if hasDotSegment(decoded) {
		// "/public/../admin" would match a rule for /public/* here and be
		// normalised to /admin upstream.
		deny(VerdictDeny, rulePath, "path has dot segments")
		return
	}
	setPath(r.URL, canon, decoded)
	ws := isWebSocket(r.Header)
	if !ws {
		// h2c and other protocol switches: serve the request as plain
		// HTTP/1.1 rather than switching to something uninspected.
		r.Header.Del("Upgrade")
	}
	preq := &Request{
		Host: info.name, Port: int(info.dst.Port()), Protocol: "http",
		Method: r.Method, Path: canon, WebSocket: ws,
		ContentType: r.Header.Get("Content-Type"), Accept: r.Header.Get("Accept"),
		RawQuery: r.URL.RawQuery, Header: r.Header, BodySize: r.ContentLength,
		Peek: peeker(r),
	}
	d, verdict := p.decide(r.Context(), info.sb, preq)
	if verdict != VerdictAllow {
		deny(verdict, d.Rule, d.Reason)
		return
	}
	// A method override (X-HTTP-Method-Override and kin, ?_method=) makes
	// many servers act as if the request had that method: it must be
	// allowed too.
	overrides, bad := methodOverrides(r)
	if bad != "" {
		deny(VerdictDeny, ruleMethodOverride, bad)
		return
	}
	for _, m := range overrides {
		oreq := *preq
		oreq.Method = m
		od, overdict := p.decide(r.Context(), info.sb, &oreq)
		if overdict != VerdictAllow {
			deny(overdict, od.Rule, fmt.Sprintf("method override to %s: %s", m, od.Reason))
			return
		}
	}
	ev.Rule = d.Rule
	if ws && r.ProtoMajor != 1 {
		deny(VerdictDeny, ruleUpgrade, "WebSocket is supported over HTTP/1.1 only")
		return
	}
	var filter ResponseFilter
	if p.cfg.Hook != nil {
		ref, f := p.cfg.Hook(info.sb, r)
		if body != nil {
			// A hook that read ahead into a limit (in-flight bytes, a
			// trickling body) is answered with that limit, whatever it
			// concluded from the failed read.
			if h := body.stopped(); h != nil {
				limited(h)
				return
			}
		}
		if ref != nil {
			hookRefused = true
			ev.Verdict, ev.Rule, ev.Reason = VerdictDeny, ref.Rule, ref.Reason
			if ref.Status != 0 && ref.Status != http.StatusForbidden {
				closeUnread(cw, r, body)
				writeRefusal(cw, ref.Status, ref.Rule, info.name, ref.Reason)
				return
			}
			deny(VerdictDeny, ref.Rule, ref.Reason)
			return
		}
		if r.URL.EscapedPath() != canon || r.Method != preq.Method {
			// Hooks swap credentials and signatures; they never re-route.
			p.log.Error("egress hook changed the request's path or method", "sandbox", info.sb.ID, "host", info.name)
			deny(VerdictError, rulePath, "the gateway changed the request's path or method after the policy decided")
			return
		}
		filter = f
	}
	if body != nil && r.Body != nil && r.Body != http.NoBody {
		r.Body = forwardBody{ReadCloser: r.Body, g: body}
	}
	ev.Verdict = VerdictAllow
	ev.Reason = d.Reason
	st := &reqState{
		authority:   info.name + ":" + strconv.Itoa(int(info.dst.Port())),
		hostHeader:  info.name,
		scheme:      info.scheme,
		name:        info.name,
		ev:          ev,
		lim:         info.lim,
		body:        body,
		filter:      filter,
		path:        canon,
		decodedPath: decoded,
	}
	if (info.scheme == "https" && info.dst.Port() != 443) || (info.scheme == "http" && info.dst.Port() != 80) {
		st.hostHeader = st.authority
	}
	p.rp.ServeHTTP(cw, r.WithContext(context.WithValue(r.Context(), reqStateKey{}, st)))
}

// rewrite points an allowed request at its upstream: the same name and port,
// the same scheme. X-Forwarded-* headers are dropped by ReverseProxy before
// Rewrite runs and none are added: the upstream learns nothing about the
// sandbox's addressing.
func rewrite(pr *httputil.ProxyRequest) {
	st := pr.In.Context().Value(reqStateKey{}).(*reqState)
	pr.Out.URL.Scheme = st.scheme
	pr.Out.URL.Host = st.authority
	pr.Out.URL.User = nil
	pr.Out.Host = st.hostHeader
	setPath(pr.Out.URL, st.path, st.decodedPath) // exactly what was decided on
}

// roundTripper adapts a function to http.RoundTripper.
type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// roundTrip sends an allowed request over its sandbox's own pool.
func (p *Proxy) roundTrip(r *http.Request) (*http.Response, error) {
	st, _ := r.Context().Value(reqStateKey{}).(*reqState)
	if st == nil || st.lim == nil {
		return nil, errors.New("egress: request without sandbox state")
	}
	return st.lim.transport.RoundTrip(r)
}

// upstreamError answers 502 when the upstream could not be reached, or the
// refusal of a per-sandbox limit or of a hook's body reader that stopped the
// request on its way.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	st, _ := r.Context().Value(reqStateKey{}).(*reqState)
	host := ""
	if st != nil {
		host = st.name
		closeUnread(w, r, st.body)
		if st.body != nil {
			// The body ran into a limit while it streamed upstream.
			if h := st.body.stopped(); h != nil {
				// (A failed body read cancels an HTTP/1 request's
				// context; the connection can still carry the answer.)
				st.ev.Verdict, st.ev.Rule, st.ev.Reason = VerdictDeny, h.rule, h.reason
				writeLimit(w, h, host)
				return
			}
		}
		ref := (*Refusal)(nil)
		if !errors.As(err, &ref) && st.body != nil {
			ref = st.body.refused.Load()
		}
		if ref != nil {
			// A hook's body reader refused the body as it streamed (a
			// signature chunk that does not verify, say).
			st.ev.Verdict, st.ev.Rule, st.ev.Reason = VerdictDeny, ref.Rule, ref.Reason
			status := ref.Status
			if status == 0 {
				status = http.StatusForbidden
			}
			writeRefusal(w, status, ref.Rule, host, ref.Reason)
			return
		}
		if errors.Is(err, errUpstreamConns) {
			h := &limitHit{ruleUpstreamConns, upstreamReason(err), http.StatusServiceUnavailable}
			st.ev.Verdict, st.ev.Rule, st.ev.Reason = VerdictDeny, h.rule, h.reason
			writeLimit(w, h, host)
			return
		}
	}
	reason, rule := upstreamReason(err), refusalRule(err)
	if st != nil {
		st.ev.Verdict, st.ev.Reason = VerdictError, upstreamErrPrefix+reason
		if rule != "" {
			st.ev.Rule = rule
		}
	}
	if r.Context().Err() != nil {
		return // the sandbox went away
	}
	p.log.Info("egress upstream error", "host", host, "err", err)
	body := map[string]string{
		"error": upstreamErrPrefix + reason,
		"host":  host,
	}
	if rule != "" {
		// A built-in rule refused the upstream's address: name it, as a
		// denial does.
		body["rule"] = rule
		w.Header().Set(headerDenied, rule)
	}
	writeJSON(w, http.StatusBadGateway, body)
}

// upstreamReason says what went wrong without internal detail.
func upstreamReason(err error) string {
	var re *RefusedError
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	var rh tls.RecordHeaderError
	var ne net.Error
	if reason, ok := filterReason(err); ok {
		return reason
	}
	switch {
	case errors.As(err, &re):
		if re.Reason == "connection failed" && errors.As(re.Err, &ne) && ne.Timeout() {
			return "connection timed out"
		}
		return re.Reason
	case errors.As(err, &cv), errors.As(err, &ua), errors.As(err, &he), errors.As(err, &ci):
		return "certificate verification failed"
	case errors.As(err, &rh):
		return "upstream does not speak TLS"
	case errors.As(err, &ne) && ne.Timeout():
		return "upstream timed out"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "upstream closed the connection"
	}
	return "upstream error"
}

func writeDenied(w http.ResponseWriter, rule, host, reason string) {
	writeRefusal(w, http.StatusForbidden, rule, host, reason)
}

// writeRefusal is writeDenied with another status (a hook's 413, say).
func writeRefusal(w http.ResponseWriter, status int, rule, host, reason string) {
	w.Header().Set(headerDenied, rule)
	writeJSON(w, status, map[string]string{
		"error":  deniedMessage,
		"rule":   rule,
		"host":   host,
		"reason": reason,
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func splitHostPort(hostport string) (host, port string) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		return h, p
	}
	return strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"), ""
}

func isWebSocket(h http.Header) bool {
	return hasToken(h, "Connection", "upgrade") && strings.EqualFold(strings.TrimSpace(h.Get("Upgrade")), "websocket")
}

// hasToken reports whether a comma-separated header lists token.
func hasToken(h http.Header, key, token string) bool {
	for _, v := range h[textproto.CanonicalMIMEHeaderKey(key)] {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// countingWriter counts response bytes and keeps flushing and hijacking
// (for WebSocket tunnels) working through it.
type countingWriter struct {
	rw     http.ResponseWriter
	status int
	n      atomic.Int64
	tunnel *countingConn
}

func (w *countingWriter) Header() http.Header { return w.rw.Header() }

func (w *countingWriter) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.rw.WriteHeader(code)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.rw.Write(b)
	w.n.Add(int64(n))
	return n, err
}

func (w *countingWriter) FlushError() error { return http.NewResponseController(w.rw).Flush() }

func (w *countingWriter) Flush() { _ = w.FlushError() }

func (w *countingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.rw).Hijack()
	if err != nil {
		return nil, nil, err
	}
	w.status = http.StatusSwitchingProtocols
	w.tunnel = &countingConn{Conn: c}
	return w.tunnel, brw, nil
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.rw }

// countingConn counts a hijacked connection's bytes: reads are the
// sandbox's (up), writes the upstream's (down).
type countingConn struct {
	net.Conn
	up, down atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.up.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.down.Add(int64(n))
	return n, err
}

// peeker returns a Request.Peek for r: the first call reads up to n bytes
// of the body (the read is bounded by the body's own time limits) and puts
// them back in front of the rest.
func peeker(r *http.Request) func(int) []byte {
	var (
		done   bool
		peeked []byte
	)
	return func(n int) []byte {
		if done || r.Body == nil || r.Body == http.NoBody || n <= 0 {
			return peeked
		}
		done = true
		buf := make([]byte, n)
		k, err := io.ReadFull(r.Body, buf)
		peeked = buf[:k]
		rest := r.Body
		if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
			rest = io.NopCloser(errReader{err})
		}
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(peeked), rest), r.Body}
		return peeked
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
