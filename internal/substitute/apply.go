package substitute

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Result is what Apply decided for one request.
type Result struct {
	// Replaced names the bindings whose real value was put into the
	// request's headers, query or buffered body, or injected. Substitutions
	// in a streamed body happen later, as it is read, and are not listed.
	Replaced []string
	// Refusal, when set, means the request must not be forwarded.
	Refusal *Refusal
	// Alert marks a refusal that looks like exfiltration: a placeholder
	// heading to a host it is not bound to, or over plain HTTP.
	Alert bool
	// Streaming: the body is substituted as it is forwarded, so more real
	// values may be reported after Apply returns.
	Streaming bool
}

// Report hears each real value put into a request: the binding's name, the
// real value and its placeholder, so that the gateway can scrub the value
// out of the response. It is called during Apply and, for a streamed body,
// from the body's Read. It must keep the value in memory for the request
// only, and never log it or send it anywhere.
type Report func(name, real, placeholder string)

// Refusal says why a request is refused. Neither field ever holds a real
// value or a placeholder.
type Refusal struct {
	Rule   string // "secret:NAME"
	Reason string
}

// RefusalError is returned by the Read of a streamed request body (see
// Apply) when the stream turns out to carry a placeholder it may not. It
// reaches the proxy wrapped in the transport's error; find it with
// errors.As and answer the guest as for Result.Refusal.
type RefusalError struct {
	Refusal Refusal
	Alert   bool
}

func (e *RefusalError) Error() string {
	return "substitute: request refused: " + e.Refusal.Reason
}

// occ records where, and in which forms, one binding's placeholder occurs.
type occ struct {
	header, headerName, query, path, body hit
	headerKeys                            []string
	// bad is the first place found that the binding does not allow.
	bad *misplaced
}

func (o *occ) any() bool {
	return o.header|o.headerName|o.query|o.path|o.body != 0 || o.bad != nil
}

func (o *occ) misplace(m misplaced) {
	if o.bad == nil {
		o.bad = &m
	}
}

func (o *occ) where() string {
	var w []string
	add := func(h hit, s string) {
		if h != 0 {
			w = append(w, h.String()+" in "+s)
		}
	}
	add(o.header, strings.TrimSpace("header "+strings.Join(o.headerKeys, ", ")))
	add(o.headerName, "a header name")
	add(o.query, "query")
	add(o.path, "path")
	add(o.body, "body")
	return strings.Join(w, "; ")
}

// opened is what a binding's Real returned for a request.
type opened struct {
	real []byte
	err  error
}

// sub is one substitution: a placeholder and its real value.
type sub struct {
	e    *entry
	real string
	used bool
}

// Apply swaps placeholders for real values in r, or refuses r. The proxy
// calls it for every intercepted request its policy allowed. host is the
// TLS SNI (already checked equal to Host); tlsIntercepted is false for plain
// HTTP.
//
// For each binding whose placeholder occurs in r, in any form:
//   - sent to a host the binding does not name, or over plain HTTP: refused,
//     with Alert;
//   - in the URL path (or userinfo, or a header name): refused, without
//     substitution — a credential in a path ends up in access logs and
//     Referer headers, so it is never put there;
//   - anywhere its binding does not allow (a header other than
//     Authorization, Inject's header and Binding.Headers; a query parameter
//     not in Binding.Query; a parameter name; a body without Body; a
//     trailer not among the headers): refused, without an alert, the reason
//     naming the allowed places and the flag that adds one;
//   - in an allowed header value: replaced; in "Authorization: Basic" the
//     user:password pair is decoded, replaced and re-encoded;
//   - in an allowed query parameter's value: replaced, raw or
//     percent-decoded, and the value re-escaped; the rest of the query is
//     left byte for byte;
//   - in the body: replaced only if the binding opted in (Body), in bodies up
//     to its BodyLimit — a larger body carrying the placeholder is refused.
//     The real value is JSON-escaped in JSON bodies and query-escaped in
//     form bodies. Encoded forms (base64, …) in allowed places are
//     forwarded unchanged (worthless upstream), never substituted.
//
// A binding with Inject sets its header on every request to a bound host over
// intercepted TLS. Real is called once per binding bound to host over
// intercepted TLS whose placeholder the request carries or that injects
// (for a streamed body, when the placeholder first shows); its error
// refuses the request, and one wrapping ErrNotBound makes host one the
// binding does not name (see Binding.Real). The real value is put in a
// header only if it has no CR, LF or NUL.
//
// Bodies: a body of known length up to the read-ahead bound
// (max(ScanLimit, BodyLimit of the bindings bound here)) is read, checked and
// rewritten whole; r.Body, r.ContentLength, the Content-Length header and
// r.GetBody are set to match. Any other body — chunked, of unknown length or
// longer than the bound — is never read ahead (an interactive stream would
// stall): r.Body is wrapped so that it is checked, and for opted-in bindings
// substituted, as it is forwarded, with a look-behind buffer that catches a
// placeholder split across reads. A refusal found there is returned by
// r.Body's Read as a *RefusalError, aborting the upstream request. Framing
// is kept: chunked stays chunked, and a long known-length body is only
// checked (a substitution would change its length; it is over every
// BodyLimit anyway). Trailers are checked and substituted when the body ends.
//
// Apply's error reports a failure to read the request (the proxy must
// refuse it too); r.Body is restored as well as it can be.
func (s *Set) Apply(r *http.Request, host string, tlsIntercepted bool) (*Result, error) {
	return s.ApplyReport(r, host, tlsIntercepted, nil)
}

// ApplyReport is Apply, telling report (when not nil) each real value it
// puts into r.
func (s *Set) ApplyReport(r *http.Request, host string, tlsIntercepted bool, report Report) (*Result, error) {
	list := s.snapshot()
	res := &Result{}
	if len(list) == 0 {
		return res, nil
	}
	host = normHost(host)
	allowed := make([]bool, len(list))
	for i, e := range list {
		allowed[i] = tlsIntercepted && e.bound(host)
	}

	// A placeholder in the host name leaks through DNS and SNI before any
	// request is sent; the reason must not echo such a name.
	for _, e := range list {
		if e.inHost(host) {
			res.Refusal = &Refusal{Rule: "secret:" + e.name, Reason: fmt.Sprintf("placeholder for %s in the host name", e.name)}
			res.Alert = true
			return res, nil
		}
	}

	found := make([]occ, len(list))
	scan := func(text string, mark func(e *entry, o *occ, h hit)) bool {
		if text == "" {
			return false
		}
		v := newViews(text)
		any := false
		for i, e := range list {
			if h := e.pat.match(&v); h != 0 {
				mark(e, &found[i], h)
				any = true
			}
		}
		return any
	}
	for _, hdr := range []http.Header{r.Header, r.Trailer} {
		for k, vs := range hdr {
			dirty := scan(k, func(_ *entry, o *occ, h hit) { o.headerName |= h })
			for _, v := range vs {
				scan(v, func(e *entry, o *occ, h hit) {
					o.header |= h
					if !dirty && len(o.headerKeys) < 5 {
						o.headerKeys = appendOnce(o.headerKeys, k)
					}
					if !e.allowsHeader(k) {
						if dirty {
							o.misplace(misplaced{where: "a header", flag: "a placeholder is never swapped in a header name"})
						} else {
							o.misplace(headerPlace(e, k))
						}
					}
				})
			}
		}
	}
	if u := r.URL; u != nil {
		scan(u.RawQuery, func(_ *entry, o *occ, h hit) { o.query |= h })
		for _, part := range strings.Split(u.RawQuery, "&") {
			k, v, _ := strings.Cut(part, "=")
			dirty := scan(k, func(_ *entry, o *occ, _ hit) { o.misplace(paramNamePlace) })
			name := k
			if d, err := url.QueryUnescape(k); err == nil {
				name = d
			}
			scan(v, func(e *entry, o *occ, _ hit) {
				if e.allowsQuery(name) {
					return
				}
				if shown := safeName(name); shown != "" && !dirty {
					o.misplace(queryPlace(e, shown))
				} else {
					o.misplace(misplaced{where: "a query parameter", flag: fmt.Sprintf("add the place with --secret-query %s:NAME", e.name)})
				}
			})
		}
		scan(u.EscapedPath(), func(_ *entry, o *occ, h hit) { o.path |= h })
		scan(u.Opaque, func(_ *entry, o *occ, h hit) { o.path |= h })
		if u.User != nil {
			scan(u.User.String(), func(_ *entry, o *occ, h hit) { o.path |= h })
		}
	}

	// Read ahead a body of known length, up to the bound.
	bound := s.ScanLimit
	if bound <= 0 {
		bound = DefaultScanLimit
	}
	for i, e := range list {
		if allowed[i] && e.body && e.bodyLimit > bound {
			bound = e.bodyLimit
		}
	}
	var head []byte
	known, complete := false, true
	hasBody := r.Body != nil && r.Body != http.NoBody
	if hasBody && r.ContentLength > 0 {
		known = true
		n := min(r.ContentLength, bound)
		complete = n == r.ContentLength
		head = make([]byte, n)
		if got, err := io.ReadFull(r.Body, head); err != nil {
			restore(r, head[:got], !complete || got < len(head))
			return nil, fmt.Errorf("substitute: reading request body (%d of %d bytes): %w", got, r.ContentLength, err)
		}
		scan(string(head), func(e *entry, o *occ, h hit) {
			o.body |= h
			if !e.body {
				o.misplace(bodyPlace(e))
			}
		})
	} else if hasBody {
		complete = false
	}

	// The values the request may use here are opened now, each Real
	// judging host by its secret's current hosts: a binding its secret
	// no longer lets go to host is treated from here on as one not bound
	// to it (refused with an alert where its placeholder occurs, nothing
	// injected where it does not).
	values := make([]opened, len(list))
	notBound := make([]string, len(list))
	for i, e := range list {
		if !allowed[i] || (!found[i].any() && e.injKey == "") {
			continue
		}
		real, err := e.b.Real(host)
		if errors.Is(err, ErrNotBound) {
			allowed[i], notBound[i] = false, err.Error()
			continue
		}
		values[i] = opened{real: real, err: err}
	}

	refuse := func(e *entry, reason string, alert bool) (*Result, error) {
		restore(r, head, !complete)
		res.Refusal = &Refusal{Rule: "secret:" + e.name, Reason: reason}
		res.Alert = alert
		return res, nil
	}
	for i, e := range list {
		o := &found[i]
		if !o.any() {
			continue
		}
		switch {
		case !e.bound(host):
			return refuse(e, fmt.Sprintf("placeholder for %s sent to %s (bound to %s; found %s)", e.name, host, e.hostList(), o.where()), true)
		case notBound[i] != "":
			return refuse(e, fmt.Sprintf("placeholder for %s sent to %s (%s; found %s)", e.name, host, notBound[i], o.where()), true)
		case !tlsIntercepted:
			return refuse(e, fmt.Sprintf("placeholder for %s sent to %s over plain HTTP (substitution needs intercepted TLS; found %s)", e.name, host, o.where()), true)
		case o.path != 0:
			return refuse(e, fmt.Sprintf("placeholder for %s in the URL path or userinfo: credentials are never put in a path; send it in a header or the query", e.name), false)
		case o.headerName != 0:
			return refuse(e, fmt.Sprintf("placeholder for %s in a header name", e.name), false)
		case o.bad != nil:
			return refuse(e, o.bad.reason(e), false)
		case e.body && o.body&hitLiteral != 0 && (!complete || int64(len(head)) > e.bodyLimit):
			return refuse(e, fmt.Sprintf("placeholder for %s in a body of %d bytes, over its %d-byte substitution limit", e.name, r.ContentLength, e.bodyLimit), false)
		}
	}

	// Everything below may substitute: fetch the real values needed.
	subs := make([]*sub, len(list))
	var hdrSubs, querySubs, bodySubs []*sub
	for i, e := range list {
		if !allowed[i] {
			continue
		}
		o := &found[i]
		inHeader := o.header != 0 || e.injKey != ""
		inQuery := o.query&(hitLiteral|hitPercent) != 0
		inBody := e.body && complete && o.body&hitLiteral != 0
		if !inHeader && !inQuery && !inBody {
			continue
		}
		real, err := values[i].real, values[i].err
		if err != nil || len(real) == 0 {
			return refuse(e, fmt.Sprintf("secret %s is unavailable (revoked, removed or unreadable); the request was not sent", e.name), false)
		}
		if inHeader && bytes.ContainsAny(real, "\r\n\x00") {
			return refuse(e, fmt.Sprintf("secret %s holds characters a header cannot carry (CR, LF or NUL)", e.name), false)
		}
		subs[i] = &sub{e: e, real: string(real)}
		if o.header != 0 {
			hdrSubs = append(hdrSubs, subs[i])
		}
		if inQuery {
			querySubs = append(querySubs, subs[i])
		}
		if inBody {
			bodySubs = append(bodySubs, subs[i])
		}
	}

	// Headers.
	if len(hdrSubs) > 0 {
		for k, vs := range r.Header {
			var here []*sub
			for _, sb := range hdrSubs {
				if sb.e.allowsHeader(k) {
					here = append(here, sb)
				}
			}
			if len(here) == 0 {
				continue
			}
			for j, v := range vs {
				vs[j] = rewriteHeader(k, v, here)
			}
		}
	}
	for _, sb := range subs {
		if sb != nil && sb.e.injKey != "" {
			r.Header.Set(sb.e.injKey, strings.Replace(sb.e.injTmpl, ValueToken, sb.real, 1))
			sb.used = true
		}
	}
	// Query.
	if len(querySubs) > 0 {
		if q, ok := rewriteQuery(r.URL.RawQuery, querySubs); ok {
			r.URL.RawQuery = q
			if r.RequestURI != "" {
				if r.URL.IsAbs() {
					r.RequestURI = r.URL.String()
				} else {
					r.RequestURI = r.URL.RequestURI()
				}
			}
		}
	}
	// Body.
	enc := encoderFor(r.Header.Get("Content-Type"))
	switch {
	case !hasBody:
	case complete:
		body := head
		if len(bodySubs) > 0 {
			for _, sb := range bodySubs {
				if n := bytes.Count(body, []byte(sb.e.ph)); n > 0 {
					body = bytes.ReplaceAll(body, []byte(sb.e.ph), []byte(enc(sb.real)))
					sb.used = true
				}
			}
		}
		setBody(r, body)
	default:
		st := &stream{
			src:    r.Body,
			out:    head,
			off:    int64(len(head)),
			host:   host,
			tls:    tlsIntercepted,
			enc:    enc,
			req:    r,
			list:   list,
			allow:  allowed,
			unb:    notBound,
			onlyCk: known,
			report: report,
		}
		st.look = tail(head, st.windowSize())
		r.Body = st
		r.GetBody = nil
		for i, e := range list {
			if allowed[i] && e.body && !known {
				res.Streaming = true
			}
		}
	}

	for _, sb := range subs {
		if sb != nil && sb.used {
			res.Replaced = append(res.Replaced, sb.e.name)
			if report != nil {
				report(sb.e.name, sb.real, sb.e.ph)
			}
		}
	}
	return res, nil
}

// rewriteHeader replaces placeholders in one header value, decoding and
// re-encoding Basic credentials.
func rewriteHeader(key, v string, subs []*sub) string {
	if key == "Authorization" || key == "Proxy-Authorization" {
		if scheme, cred, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "Basic") {
			if dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred)); err == nil {
				if nd, ok := replaceAll(string(dec), subs, func(s string) string { return s }); ok {
					v = scheme + " " + base64.StdEncoding.EncodeToString([]byte(nd))
				}
			}
		}
	}
	nv, _ := replaceAll(v, subs, func(s string) string { return s })
	return nv
}

// replaceAll replaces every sub's placeholder in s with enc(real).
func replaceAll(s string, subs []*sub, enc func(string) string) (string, bool) {
	changed := false
	for _, sb := range subs {
		if strings.Contains(s, sb.e.ph) {
			s = strings.ReplaceAll(s, sb.e.ph, enc(sb.real))
			sb.used, changed = true, true
		}
	}
	return s, changed
}

// rewriteQuery substitutes in the value of each parameter a sub's binding
// allows, raw or percent-decoded, re-escaping only the values it changes.
func rewriteQuery(raw string, subs []*sub) (string, bool) {
	parts := strings.Split(raw, "&")
	changed := false
	for i, part := range parts {
		k, v, eq := strings.Cut(part, "=")
		name := k
		if d, err := url.QueryUnescape(k); err == nil {
			name = d
		}
		var here []*sub
		for _, sb := range subs {
			if sb.e.allowsQuery(name) {
				here = append(here, sb)
			}
		}
		if !eq || len(here) == 0 {
			continue
		}
		if nv, cv := rewriteQueryComponent(v, here); cv {
			changed = true
			parts[i] = k + "=" + nv
		}
	}
	return strings.Join(parts, "&"), changed
}

func rewriteQueryComponent(c string, subs []*sub) (string, bool) {
	dec, err := url.QueryUnescape(c)
	if err != nil { // malformed escapes: substitute in the raw text
		return replaceAll(c, subs, url.QueryEscape)
	}
	nd, ok := replaceAll(dec, subs, func(s string) string { return s })
	if !ok {
		return c, false
	}
	return url.QueryEscape(nd), true
}

// encoderFor returns how a real value is written into a body of this
// content type: JSON-escaped (a JSON string's contents), query-escaped, or
// as it is.
func encoderFor(contentType string) func(string) string {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return func(s string) string {
			b, _ := json.Marshal(s)
			return string(b[1 : len(b)-1])
		}
	case mt == "application/x-www-form-urlencoded":
		return url.QueryEscape
	}
	return func(s string) string { return s }
}

// readCloser reads one thing and closes another: the original body.
type readCloser struct {
	io.Reader
	io.Closer
}

// setBody makes r carry body in full, keeping r's original closer.
func setBody(r *http.Request, body []byte) {
	r.Body = readCloser{bytes.NewReader(body), r.Body}
	r.ContentLength = int64(len(body))
	if r.Header.Get("Content-Length") != "" {
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// restore puts back what was read ahead of r's body, followed by the rest
// of it when more remains.
func restore(r *http.Request, head []byte, more bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	if !more {
		r.Body = readCloser{bytes.NewReader(head), r.Body}
		return
	}
	if len(head) > 0 {
		r.Body = readCloser{io.MultiReader(bytes.NewReader(head), r.Body), r.Body}
	}
}

func appendOnce(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return bytes.Clone(b)
}
