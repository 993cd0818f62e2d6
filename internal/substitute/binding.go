package substitute

import (
	"errors"
	"fmt"
	"net"
	"net/textproto"
	"slices"
	"strings"
	"sync"

	"github.com/cagebox/cagebox/internal/hostname"
)

// DefaultBodyLimit is a binding's BodyLimit when it sets none.
const DefaultBodyLimit = 1 << 20

// DefaultScanLimit bounds how much of a request body with a known length Apply
// reads ahead to look for placeholders before deciding.
const DefaultScanLimit = 1 << 20

// ValueToken is what an Inject template's value stands in for.
const ValueToken = "{value}"

// Binding ties a secret's placeholder to the hosts that may receive its real
// value.
type Binding struct {
	// Name is the environment variable (and secret) name, e.g. GITHUB_TOKEN.
	Name string
	// Placeholder is what the guest holds instead of the real value (see
	// NewPlaceholder). At least 12 characters.
	Placeholder string
	// Real fetches the real value for a request to host (canonical, one
	// of Hosts). It is called on every request that needs it, so
	// revocation and rotation take effect on the very next request; an
	// error refuses the request. An error wrapping ErrNotBound means the
	// value may not go to host now although Hosts name it (the secret's
	// own hosts were narrowed since it was bound): the request is then
	// treated as one to a host the binding does not name — refused with
	// an alert where it carries the placeholder, left alone (nothing
	// injected) where it does not — and the error's text, which names
	// hosts and never a value, is part of the reason.
	Real func(host string) ([]byte, error)
	// Hosts are the names the real value may be sent to: exact
	// ("api.github.com") or a wildcard ("*.github.com", any depth of
	// subdomain, not the apex itself). Case-insensitive; no ports.
	Hosts []string
	// Body opts in to substitution in request bodies of at most BodyLimit
	// bytes. Without it a placeholder in a body to a bound host is forwarded
	// unchanged (the upstream sees the placeholder, which is worthless).
	Body bool
	// BodyLimit is the largest body substituted; 0 means DefaultBodyLimit.
	BodyLimit int64
	// Inject, e.g. "Authorization: Bearer {value}", sets that header on every
	// request to a bound host over intercepted TLS, whatever the guest sent.
	Inject string
	// Headers names request headers, besides Authorization and Inject's
	// header, whose values may carry the placeholder (e.g. X-Api-Key).
	Headers []string
	// Query names query parameters whose values may carry the placeholder
	// (e.g. access_token). A placeholder anywhere else on a bound host —
	// another header or parameter, a parameter name, a body without Body —
	// is refused.
	Query []string
	// Guard marks a placeholder that is never swapped: the placeholder of a
	// signing key (an HMAC or SigV4 secret) that a gateway re-signer uses
	// and no request should ever carry. Wherever it appears the request is
	// refused with an alert. Hosts, Body, Inject and Real are ignored.
	Guard bool
}

// entry is a Binding as added: validated, normalised and with its search
// patterns precomputed. Bindings are read once, by Add.
type entry struct {
	b         *Binding
	name      string
	ph        string
	hosts     []string
	body      bool
	bodyLimit int64
	injKey    string // canonical header name, "" without Inject
	injTmpl   string
	headers   []string // canonical names of the headers it may be swapped in
	query     []string // query parameters it may be swapped in
	pat       patterns
	dead      bool // removed (or a guard): known only to be refused
	guard     bool
}

// Set holds the bindings of one sandbox. It is safe for concurrent use;
// bindings added or removed take effect on the next Apply.
type Set struct {
	// ScanLimit bounds the read-ahead of bodies with a known length (see
	// Apply); 0 means DefaultScanLimit. Set it before the first Apply.
	ScanLimit int64

	// mu guards list. list is copy-on-write: Apply takes the current slice
	// and never sees it change.
	mu   sync.RWMutex
	list []*entry
}

// NewSet returns a set holding bs.
func NewSet(bs ...*Binding) (*Set, error) {
	s := &Set{}
	for _, b := range bs {
		if err := s.Add(b); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// ErrInvalid marks a binding that cannot be used.
var ErrInvalid = errors.New("invalid binding")

// ErrNotBound, wrapped in the error of a Binding's Real, is a host the
// value may not be sent to (see Binding.Real).
var ErrNotBound = errors.New("not bound")

// Add adds b, replacing any binding of the same name. The binding's fields
// are read now; changing them afterwards has no effect (Add it again). A
// replaced binding's old placeholder is kept as removed (see Remove).
func (s *Set) Add(b *Binding) error {
	e, err := newEntry(b)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	list := make([]*entry, 0, len(s.list)+1)
	for _, o := range s.list {
		switch {
		case o.ph == e.ph:
			// the new binding takes over this placeholder
		case o.name == e.name && !o.dead:
			list = append(list, o.tombstone())
		default:
			list = append(list, o)
		}
	}
	s.list = append(list, e)
	return nil
}

// Remove unbinds the binding called name from every host, from the next
// Apply on. Its placeholder stays known: wherever the guest still sends it,
// the request is refused with an alert, never forwarded as a plain string.
func (s *Set) Remove(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := slices.Clone(s.list)
	for i, o := range list {
		if o.name == name && !o.dead {
			list[i] = o.tombstone()
		}
	}
	s.list = list
}

func (e *entry) tombstone() *entry {
	c := *e
	c.dead, c.hosts, c.injKey = true, nil, ""
	return &c
}

// Bindings returns the bindings in the order they were added.
func (s *Set) Bindings() []*Binding {
	list := s.snapshot()
	out := make([]*Binding, 0, len(list))
	for _, e := range list {
		if !e.dead {
			out = append(out, e.b)
		}
	}
	return out
}

// IsPlaceholder reports whether v is, contains or is part of (12 characters
// or more) one of the set's placeholders. Detector uses it to leave our own
// placeholders out of its findings.
func (s *Set) IsPlaceholder(v string) bool {
	for _, e := range s.snapshot() {
		if strings.Contains(v, e.ph) || (len(v) >= 12 && strings.Contains(e.ph, v)) {
			return true
		}
	}
	return false
}

// Contains reports the binding whose placeholder text carries, in any form
// Apply looks for (and, for names, case-folded), e.g. for a resolver to
// check a query name. It returns the name, never the placeholder.
func (s *Set) Contains(text string) (name string, ok bool) {
	v := newViews(text)
	fold := strings.ToLower(text)
	for _, e := range s.snapshot() {
		if e.pat.match(&v) != 0 || e.inHost(fold) {
			return e.name, true
		}
	}
	return "", false
}

// inHost reports whether the host name carries e's placeholder, case-folded
// (DNS is case-insensitive; folded here with Unicode rules, so that more is
// caught rather than less) or hex-encoded.
func (e *entry) inHost(host string) bool {
	host = strings.ToLower(host)
	return strings.Contains(host, e.pat.fold) || strings.Contains(host, e.pat.hex[0])
}

func (s *Set) snapshot() []*entry {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.list
}

func newEntry(b *Binding) (*entry, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil binding", ErrInvalid)
	}
	if b.Name == "" {
		return nil, fmt.Errorf("%w: a binding needs a name", ErrInvalid)
	}
	if len(b.Placeholder) < 12 {
		return nil, fmt.Errorf("%w: binding %s: placeholder shorter than 12 characters; make one with NewPlaceholder", ErrInvalid, b.Name)
	}
	for i := 0; i < len(b.Placeholder); i++ {
		if c := b.Placeholder[i]; c <= ' ' || c >= 0x7f || c == '%' || c == '\\' {
			return nil, fmt.Errorf("%w: binding %s: placeholder must be printable ASCII without spaces, %% or \\", ErrInvalid, b.Name)
		}
	}
	if b.Guard {
		e := &entry{b: b, name: b.Name, ph: b.Placeholder, dead: true, guard: true}
		e.pat = newPatterns(e.ph)
		return e, nil
	}
	if b.Real == nil {
		return nil, fmt.Errorf("%w: binding %s has no source for its real value", ErrInvalid, b.Name)
	}
	if b.BodyLimit < 0 {
		return nil, fmt.Errorf("%w: binding %s: negative body limit", ErrInvalid, b.Name)
	}
	e := &entry{b: b, name: b.Name, ph: b.Placeholder, body: b.Body, bodyLimit: b.BodyLimit}
	if e.bodyLimit == 0 {
		e.bodyLimit = DefaultBodyLimit
	}
	for _, h := range b.Hosts {
		n, err := hostname.ParseCredentialPattern(h)
		if err != nil {
			return nil, fmt.Errorf("%w: binding %s: host %v", ErrInvalid, b.Name, err)
		}
		e.hosts = append(e.hosts, n)
	}
	if b.Inject != "" {
		k, v, ok := strings.Cut(b.Inject, ":")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || strings.ContainsAny(k, " \t\r\n") || strings.Count(v, ValueToken) != 1 || strings.ContainsAny(v, "\r\n\x00") {
			return nil, fmt.Errorf("%w: binding %s: inject %q: want \"Header: text with %s once\"", ErrInvalid, b.Name, b.Inject, ValueToken)
		}
		e.injKey, e.injTmpl = textproto.CanonicalMIMEHeaderKey(k), v
	}
	if err := e.setPlaces(b); err != nil {
		return nil, err
	}
	e.pat = newPatterns(e.ph)
	return e, nil
}

// normHost drops blanks, a port and IPv6 brackets from a request's host
// and returns it in canonical form (package hostname: ASCII lower-case,
// no trailing dot).
func normHost(h string) string {
	h = strings.TrimSpace(h)
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	h = strings.TrimPrefix(strings.TrimSuffix(h, "]"), "[")
	return hostname.Canonical(h)
}

// bound reports whether host (from normHost, so already folded once: a
// name that is not canonical now, "a.example.com." from
// "a.example.com..", is no name) is matched by one of e's hosts.
func (e *entry) bound(host string) bool {
	return hostname.Valid(host) && hostname.MatchAny(e.hosts, host)
}

func (e *entry) hostList() string {
	if e.guard {
		return "no host: it is a signing key the gateway uses to re-sign, never sent"
	}
	if e.dead {
		return "no host: the binding was removed"
	}
	if len(e.hosts) == 0 {
		return "no host"
	}
	return strings.Join(e.hosts, ", ")
}
