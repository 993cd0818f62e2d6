package substitute

import (
	"fmt"
	"net/textproto"
	"strings"
)

// Where a binding's placeholder may be swapped: the Authorization header
// (Bearer, Basic, token, … forms), the header Inject sets, the headers and
// query parameters the binding names, and the body when it opted in.
// Anywhere else on a bound host the request is refused, saying which flag
// adds the place.

func (e *entry) setPlaces(b *Binding) error {
	e.headers = []string{"Authorization"}
	if e.injKey != "" && e.injKey != "Authorization" {
		e.headers = append(e.headers, e.injKey)
	}
	for _, h := range b.Headers {
		h = strings.TrimSpace(h)
		if h == "" || !validToken(h) {
			return fmt.Errorf("%w: binding %s: header %q: want a header name like X-Api-Key", ErrInvalid, b.Name, h)
		}
		e.headers = appendOnce(e.headers, textproto.CanonicalMIMEHeaderKey(h))
	}
	for _, q := range b.Query {
		if q == "" || strings.ContainsAny(q, "&=#? \t\r\n%+") {
			return fmt.Errorf("%w: binding %s: query parameter %q: want a plain name like access_token", ErrInvalid, b.Name, q)
		}
		e.query = appendOnce(e.query, q)
	}
	return nil
}

// validToken reports whether s is an HTTP token (a header name).
func validToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	return true
}

func (e *entry) allowsHeader(key string) bool {
	key = textproto.CanonicalMIMEHeaderKey(key)
	for _, h := range e.headers {
		if h == key {
			return true
		}
	}
	return false
}

func (e *entry) allowsQuery(name string) bool {
	for _, q := range e.query {
		if q == name {
			return true
		}
	}
	return false
}

// places lists where e's placeholder is swapped, for a refusal.
func (e *entry) places() string {
	var p []string
	for _, h := range e.headers {
		p = append(p, "header "+h)
	}
	for _, q := range e.query {
		p = append(p, "query parameter "+q)
	}
	if e.body {
		p = append(p, "the body")
	}
	return strings.Join(p, ", ")
}

// misplaced is a placeholder found where its binding does not swap it.
type misplaced struct {
	where string // "header X-Foo", "query parameter q", "the body", …
	flag  string // how to allow it there, or why it cannot be
}

func (m misplaced) reason(e *entry) string {
	return fmt.Sprintf("placeholder for %s in %s: the binding swaps it only in %s; %s", e.name, m.where, e.places(), m.flag)
}

func headerPlace(e *entry, key string) misplaced {
	return misplaced{where: "header " + key, flag: fmt.Sprintf("add the place with --secret-header %s:%s", e.name, key)}
}

func queryPlace(e *entry, name string) misplaced {
	return misplaced{where: "query parameter " + name, flag: fmt.Sprintf("add the place with --secret-query %s:%s", e.name, name)}
}

func bodyPlace(e *entry) misplaced {
	return misplaced{where: "the body", flag: fmt.Sprintf("let bodies carry it with --secret-in-body %s", e.name)}
}

var paramNamePlace = misplaced{where: "a query parameter name", flag: "a placeholder is never swapped in a parameter name"}

// safeName is a guest-chosen header or parameter name fit for a reason:
// short, printable, and "" when it cannot be shown.
func safeName(s string) string {
	if len(s) > 64 || !validToken(s) {
		return ""
	}
	return s
}

// Bound reports whether a live binding of the set is bound to host (a
// name, any case, optionally with a port).
func (s *Set) Bound(host string) bool {
	host = normHost(host)
	for _, e := range s.snapshot() {
		if !e.dead && e.bound(host) {
			return true
		}
	}
	return false
}

// Window is the longest form, in bytes, in which Contains finds a
// placeholder: how far back a scan of a stream must look to see one split
// across reads.
func (s *Set) Window() int {
	w := 0
	for _, e := range s.snapshot() {
		w = max(w, e.pat.window)
	}
	return w
}
