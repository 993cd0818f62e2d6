// Package reserved is the one list of the names cagebox keeps for itself
// on the inbound path: cookies (cbx_*, cagebox_*), headers (X-Cagebox-*)
// and query parameters (cbx_*). Whatever the ingress listener forwards to
// a guest, and every webhook delivery, has them removed (StripHeaders,
// StripCookies, Param), and a guest's Set-Cookie of such a name is
// dropped. A name is cagebox's by a prefix rule, not by a list of today's
// names, so a cookie or header added later is covered without a change
// here (console.CookieName and ingress.CookieName, SigParam and
// AccessHeader are checked against it by tests).
//
// The rules are deliberately wider than the names themselves, because the
// guest's own HTTP stack decides what a name means, not Go's: cookie and
// parameter names match in any case; a cookie behind a __Host- or
// __Secure- prefix is the same cookie; a header name with '_' for '-'
// is the same header to CGI, WSGI and PHP (HTTP_X_CAGEBOX_…); a parameter
// name matches however many times it is percent-encoded.
//
// A leaf: the standard library only.
package reserved

import (
	"net/http"
	"strings"

	"github.com/cagebox/cagebox/internal/hexdigit"
)

// The prefixes of cagebox's own names.
const (
	// A cookie whose name starts with one of these (any case) is
	// cagebox's: cbx_access of a signed URL, cagebox_session of the
	// console.
	cookiePrefix1, cookiePrefix2 = "cbx_", "cagebox_"
	// HeaderPrefix: a header whose name starts with it is cagebox's.
	HeaderPrefix = "X-Cagebox-"
	// ParamPrefix: a query parameter whose name starts with it is
	// cagebox's (cbx_sig of a signed URL).
	ParamPrefix = "cbx_"
)

// Cookie reports whether a cookie name is cagebox's.
func Cookie(name string) bool {
	n := strings.ToLower(strings.TrimSpace(name))
	n = strings.TrimPrefix(n, "__host-")
	n = strings.TrimPrefix(n, "__secure-")
	return strings.HasPrefix(n, cookiePrefix1) || strings.HasPrefix(n, cookiePrefix2)
}

// Header reports whether a header name is cagebox's.
func Header(name string) bool {
	n := strings.ReplaceAll(strings.TrimSpace(name), "_", "-")
	return len(n) >= len(HeaderPrefix) && strings.EqualFold(n[:len(HeaderPrefix)], HeaderPrefix)
}

// Param reports whether a query parameter name, as sent (raw, possibly
// percent-encoded, '+' for space), is cagebox's: its name decoded once,
// twice, … (up to four times, leniently: a malformed escape stays as it
// is) starts with cbx_ in any case.
func Param(raw string) bool {
	n := raw
	for i := 0; ; i++ {
		if t := strings.ToLower(strings.TrimSpace(n)); strings.HasPrefix(t, ParamPrefix) {
			return true
		}
		if i == 4 || !strings.ContainsAny(n, "%+") {
			return false
		}
		n = unescape(n)
	}
}

// unescape decodes %XX escapes and '+' leniently: an escape that is not
// one stays as it is (the way Python's unquote and most servers read it).
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b.WriteByte(' ')
		case c == '%' && i+2 < len(s) && hexdigit.Is(s[i+1]) && hexdigit.Is(s[i+2]):
			b.WriteByte(hexdigit.Val(s[i+1])<<4 | hexdigit.Val(s[i+2]))
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// StripHeaders removes every header of cagebox's from h.
func StripHeaders(h http.Header) {
	for k := range h {
		if Header(k) {
			delete(h, k)
		}
	}
}

// StripCookies removes every cookie of cagebox's from h's Cookie
// headers (all of them: HTTP/2 clients send one per cookie), keeping the
// others in order as one header.
func StripCookies(h http.Header) {
	vals := h.Values("Cookie")
	if len(vals) == 0 {
		return
	}
	var keep []string
	for _, v := range vals {
		for _, part := range strings.Split(v, ";") {
			part = strings.TrimSpace(part)
			if n, _, _ := strings.Cut(part, "="); part == "" || Cookie(n) {
				continue
			}
			keep = append(keep, part)
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}
