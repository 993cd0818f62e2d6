package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cagebox/cagebox/internal/hostname"
)

// Request is what the proxy knows about one request or connection.
type Request struct {
	// Host is the name (SNI, Host header or synthetic-DNS name). It is
	// compared case-insensitively; a trailing dot is ignored.
	Host string
	Port int
	// Protocol is "http" (also when empty) or "tcp" for a raw TCP connection.
	Protocol string
	// Method and Path are for HTTP only. Path is the path as sent on the wire
	// (still percent-encoded, e.g. URL.EscapedPath()), without the query; it
	// is decoded exactly once here — never pass an already-decoded path
	// (URL.Path), or "%252e" is decided as ".". Method is compared
	// case-insensitively: the caller must send the method upper-cased (as
	// the egress proxy does) so that what the upstream receives is what was
	// matched. Empty Method means GET, empty Path "/".
	Method, Path string
	// WebSocket marks a request to upgrade to a WebSocket.
	WebSocket bool
	// ContentType and Accept are the request's headers (several Accept
	// headers joined with ", "), for DNS-over-HTTPS detection.
	ContentType string
	Accept      string

	// For rule conditions (when, version 2) only; none of these change a
	// decision of a policy without conditions.
	Query    map[string][]string // the request's query parameters
	RawQuery string              // parsed into Query when Query is nil and a condition runs
	Header   map[string][]string // the request's headers
	BodySize int64               // Content-Length; -1 when unknown
	Time     time.Time           // when the request arrived (zero: now)
	Session  *Session            // the session so far (nil: zeros)
	// SessionFunc, when Session is nil, gives it on first use: a
	// decision whose rules have no condition never builds it.
	SessionFunc func() *Session
	// Peek reads up to n bytes of the body ahead (nil: none), for a held
	// request's preview; decisions never read it.
	Peek func(n int) []byte
}

// Decision is a policy verdict.
type Decision struct {
	Allow bool
	// Rule names the rule that decided: a rule's name, "default", or a
	// built-in ("builtin:dot", "builtin:doh", "builtin:doh-resolver",
	// "builtin:invalid-host", "builtin:invalid-path").
	Rule string
	// Reason is a human sentence saying why.
	Reason string
	// Hold (version 2) means the rule that decided holds the request for
	// an approval: Allow is false, and the caller asks for a decision and
	// waits at most HoldTimeout for it, then denies.
	Hold        bool
	HoldTimeout time.Duration
}

// Engine decides requests. It never fails open: on an error the caller must
// refuse the request.
type Engine interface {
	Decide(ctx context.Context, r *Request) (Decision, error)
}

// Names of the decisions not made by a user rule.
const (
	RuleDefault      = "default"
	RuleDoT          = "builtin:dot"
	RuleDoH          = "builtin:doh"
	RuleDoHResolver  = "builtin:doh-resolver"
	RuleInvalidHost  = "builtin:invalid-host"
	RuleInvalidPath  = "builtin:invalid-path"
	builtinPrefix    = "builtin:"
	dotPort          = 853
	defaultRuleName  = "rule[%d]"
	maxReasonPathLen = 200
)

// knownDoHResolvers lists public DNS-over-HTTPS resolvers. Every request or
// connection to one of these names, or to a sub-domain of one, is denied by
// the built-in rule "builtin:doh-resolver" before any user rule is looked at,
// and the synthetic DNS never answers for them (AllowsName is false): DNS
// from a sandbox goes through its own synthetic resolver only. Extend this
// list here; v1 documents cannot change it.
var knownDoHResolvers = []string{
	"dns.google",
	"dns.google.com",
	"cloudflare-dns.com",
	"one.one.one.one",
	"1dot1dot1dot1.cloudflare-dns.com",
	"mozilla.cloudflare-dns.com",
	"dns.quad9.net",
	"doh.opendns.com",
	"dns.adguard-dns.com",
	"doh.cleanbrowsing.org",
	"dns.nextdns.io",
}

// dohMediaTypes are the media types of DNS-over-HTTPS requests and answers.
var dohMediaTypes = []string{"application/dns-message", "application/dns-json"}

// kind is what a request asks for, in terms of rule protocols.
type kind uint8

const (
	kindHTTP kind = iota
	kindWebSocket
	kindTCP
)

type compiledRule struct {
	name    string
	allow   bool // allow or hold
	hold    bool
	timeout time.Duration // hold only
	when    *condition    // nil: always
	proto   string        // ProtocolHTTP, ProtocolWebSocket or ProtocolTCP
	host    string        // canonical pattern (see package hostname)
	ports   []int
	methods []string // nil: any
	paths   []pathPattern
	// folded are paths case-folded: a deny rule matches a path in any case.
	folded []pathPattern
}

func (r *compiledRule) allows(k kind) bool {
	switch r.proto {
	case ProtocolTCP:
		return k == kindTCP
	case ProtocolWebSocket:
		return k == kindHTTP || k == kindWebSocket
	default:
		return k == kindHTTP
	}
}

func (r *compiledRule) matchMethod(m string) bool {
	return r.methods == nil || slices.Contains(r.methods, m)
}

// matchPath reports whether the rule's paths match p. Servers read some
// paths in more than one way (see reqPath.readings): an allow rule must
// match every reading, a deny rule matches if any reading does, in any
// letter case (some servers route case-insensitively). Ambiguous paths never
// match an allow rule's paths and always match a deny rule's.
func (r *compiledRule) matchPath(p *reqPath) bool {
	if r.paths == nil {
		return true
	}
	if p.ambiguous {
		return !r.allow
	}
	if r.allow {
		for _, segs := range p.segmentReadings(false) {
			if !matchAny(r.paths, segs) {
				return false
			}
		}
		return true
	}
	for _, segs := range p.segmentReadings(true) {
		if matchAny(r.folded, segs) {
			return true
		}
	}
	return false
}

func matchAny(pps []pathPattern, segs []string) bool {
	for _, pp := range pps {
		if pp.match(segs) {
			return true
		}
	}
	return false
}

// Policy is a compiled, immutable Document. It implements Engine and is safe
// for concurrent use.
type Policy struct {
	doc            *Document // normalized; never handed out
	defaultAllow   bool
	rules          []compiledRule
	only           []string // canonical patterns; nil: no narrowing
	budgets        []CompiledBudget
	triggers       []CompiledTrigger
	webhookTimeout time.Duration
}

var (
	_ Engine = (*Policy)(nil)
	_ Engine = (*Live)(nil)
)

// Compile validates d and compiles it. d is not retained.
func Compile(d *Document) (*Policy, error) {
	return compile(d)
}

// compile is Validate and Compile: one code path, so they cannot disagree.
func compile(d *Document) (*Policy, error) {
	if d == nil {
		return nil, &ValidationError{Reason: "no document"}
	}
	bad := func(field, format string, args ...any) (*Policy, error) {
		return nil, &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	n := &Document{Version: 1, Default: ActionDeny}
	switch d.Version {
	case 0, 1:
		if f := usesV2(d); f != "" {
			return bad(f, "%s is a version 2 feature; write version: 2", f)
		}
	case 2:
		n.Version = 2
	default:
		return bad("version", "version %d is not supported; this cagebox understands versions 1 and 2", d.Version)
	}
	switch d.Default {
	case "", ActionDeny:
	case ActionAllow:
		n.Default = ActionAllow
	default:
		return bad("default", "%q is not a default; write \"deny\" (the default) or \"allow\"", d.Default)
	}
	if len(d.Rules) > MaxRules {
		return bad("rules", "%d rules; the limit is %d", len(d.Rules), MaxRules)
	}
	p := &Policy{defaultAllow: n.Default == ActionAllow, rules: make([]compiledRule, 0, len(d.Rules))}
	n.Rules = make([]Rule, 0, len(d.Rules))
	names := make(map[string]int, len(d.Rules))
	for i, r := range d.Rules {
		f := fmt.Sprintf("rules[%d]", i)
		var nr Rule
		var cr compiledRule

		switch r.Action {
		case ActionAllow:
			cr.allow = true
		case ActionHold:
			cr.allow, cr.hold = true, true
		case ActionDeny:
		case "":
			return bad(f+".action", "action is required: \"allow\", \"deny\" or \"hold\"")
		default:
			return bad(f+".action", "%q is not an action; write \"allow\", \"deny\" or \"hold\"", r.Action)
		}
		nr.Action = r.Action
		if r.Timeout != "" && !cr.hold {
			return bad(f+".timeout", "timeout goes with action \"hold\"")
		}
		if cr.hold {
			t, reason := parseDuration(r.Timeout, DefaultHoldTimeout, MaxHoldTimeout)
			if reason != "" {
				return bad(f+".timeout", "%s", reason)
			}
			cr.timeout = t
			nr.Timeout = r.Timeout
		}
		if r.When != "" {
			c, err := compileCondition(r.When)
			if err != nil {
				return bad(f+".when", "%v", err)
			}
			cr.when = c
			nr.When = r.When
		}

		switch r.Protocol {
		case "", ProtocolHTTP:
			nr.Protocol = ProtocolHTTP
		case ProtocolWebSocket, ProtocolTCP:
			nr.Protocol = r.Protocol
		default:
			return bad(f+".protocol", "%q is not a protocol; write \"http\" (the default), \"websocket\" or \"tcp\"", r.Protocol)
		}
		cr.proto = nr.Protocol

		nr.Name = r.Name
		if nr.Name == "" {
			nr.Name = fmt.Sprintf(defaultRuleName, i)
		} else if reason := nameProblem(r.Name); reason != "" {
			return bad(f+".name", "%s", reason)
		}
		if j, dup := names[nr.Name]; dup {
			return bad(f+".name", "name %q is already used by rules[%d]; names must be unique", nr.Name, j)
		}
		names[nr.Name] = i
		cr.name = nr.Name

		host, reason := parseHostPattern(r.Host)
		if reason != "" {
			return bad(f+".host", "%s", reason)
		}
		nr.Host, cr.host = host, host

		if len(r.Ports) > MaxPortsPerRule {
			return bad(f+".ports", "%d ports; the limit is %d", len(r.Ports), MaxPortsPerRule)
		}
		ports := r.Ports
		if len(ports) == 0 {
			ports = []int{443, 80}
		}
		for j, port := range ports {
			if port < 1 || port > 65535 {
				return bad(fmt.Sprintf("%s.ports[%d]", f, j), "port %d is out of range; ports are 1-65535", port)
			}
			if port == dotPort && cr.allow {
				return bad(fmt.Sprintf("%s.ports[%d]", f, j), "port 853 (DNS over TLS) is always denied by the built-in rule %q; remove it", RuleDoT)
			}
			if !slices.Contains(nr.Ports, port) {
				nr.Ports = append(nr.Ports, port)
			}
		}
		cr.ports = nr.Ports

		if nr.Protocol == ProtocolTCP && len(r.Methods) > 0 {
			return bad(f+".methods", "a tcp rule cannot match methods (raw TCP is not parsed as HTTP); remove methods or use protocol \"http\"")
		}
		if len(r.Methods) > MaxMethods {
			return bad(f+".methods", "%d methods; the limit is %d", len(r.Methods), MaxMethods)
		}
		for j, m := range r.Methods {
			field := fmt.Sprintf("%s.methods[%d]", f, j)
			if m == "*" {
				return bad(field, "\"*\" is not a method; omit methods to match any method")
			}
			if reason := methodProblem(m); reason != "" {
				return bad(field, "%s", reason)
			}
			m = asciiUpper(m)
			if m == "CONNECT" && cr.allow {
				return bad(field, "CONNECT is always refused by the proxy; remove it")
			}
			if !slices.Contains(nr.Methods, m) {
				nr.Methods = append(nr.Methods, m)
			}
		}
		cr.methods = nr.Methods

		if nr.Protocol == ProtocolTCP && len(r.Paths) > 0 {
			return bad(f+".paths", "a tcp rule cannot match paths (raw TCP is not parsed as HTTP); remove paths or use protocol \"http\"")
		}
		if len(r.Paths) > MaxPaths {
			return bad(f+".paths", "%d paths; the limit is %d", len(r.Paths), MaxPaths)
		}
		for j, raw := range r.Paths {
			pp, reason := parsePathPattern(raw)
			if reason != "" {
				return bad(fmt.Sprintf("%s.paths[%d]", f, j), "%s", reason)
			}
			nr.Paths = append(nr.Paths, raw)
			cr.paths = append(cr.paths, pp)
			if !cr.allow {
				cr.folded = append(cr.folded, pp.folded())
			}
		}

		n.Rules = append(n.Rules, nr)
		p.rules = append(p.rules, cr)
	}
	if err := compileV2(d, n, p, names); err != nil {
		return nil, err
	}
	ruleNames := make([]string, len(n.Rules))
	for i := range n.Rules {
		ruleNames[i] = n.Rules[i].Name
	}
	for i := range p.rules {
		if p.rules[i].when != nil {
			p.rules[i].when.rules = ruleNames
		}
	}
	for i := range p.triggers {
		if p.triggers[i].when != nil {
			p.triggers[i].when.rules = ruleNames
		}
	}
	p.doc = n
	return p, nil
}

func nameProblem(s string) string {
	if utf8.RuneCountInString(s) > MaxNameLen {
		return fmt.Sprintf("the name is %d characters; the limit is %d", utf8.RuneCountInString(s), MaxNameLen)
	}
	if !utf8.ValidString(s) {
		return "the name is not valid UTF-8"
	}
	for _, c := range s {
		if !unicode.IsPrint(c) {
			return fmt.Sprintf("the name has the unprintable character %q; use letters, digits and punctuation", c)
		}
	}
	if strings.TrimSpace(s) != s {
		return "the name starts or ends with a space; remove it"
	}
	if s == RuleDefault || strings.HasPrefix(s, builtinPrefix) {
		return fmt.Sprintf("%q is reserved for the policy's own decisions; choose another name", s)
	}
	return ""
}

// methodProblem checks that m is an HTTP token (RFC 9110, section 5.6.2).
func methodProblem(m string) string {
	if m == "" {
		return "the method is empty; write e.g. \"GET\""
	}
	if len(m) > MaxMethodLen {
		return fmt.Sprintf("the method is %d characters; the limit is %d", len(m), MaxMethodLen)
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return fmt.Sprintf("%q is not an HTTP method: it has the character %q", m, c)
		}
	}
	return ""
}

// Document returns the policy's document with defaults filled in (version,
// default, rule names, ports, protocols; hosts lower-cased; methods
// upper-cased). The caller may modify it.
func (p *Policy) Document() *Document {
	if p == nil {
		return nil
	}
	return p.doc.clone()
}

// Decide evaluates r; see the package documentation for the order. It
// returns an error (and the caller refuses) only for a nil policy or request,
// a done context, or a request that is not well-formed (bad port or
// protocol); refusals the proxy should explain are Decisions.
func (p *Policy) Decide(ctx context.Context, r *Request) (Decision, error) {
	if p == nil {
		return Decision{}, errors.New("decide: no policy")
	}
	if r == nil {
		return Decision{}, errors.New("decide: no request")
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("decide: %w", err)
	}
	var k kind
	switch r.Protocol {
	case "", ProtocolHTTP:
		k = kindHTTP
		if r.WebSocket {
			k = kindWebSocket
		}
	case ProtocolTCP:
		if r.WebSocket {
			return Decision{}, errors.New("decide: a tcp request cannot be a websocket upgrade")
		}
		k = kindTCP
	default:
		return Decision{}, fmt.Errorf("decide: unknown request protocol %q", r.Protocol)
	}
	if r.Port < 1 || r.Port > 65535 {
		return Decision{}, fmt.Errorf("decide: port %d is out of range", r.Port)
	}
	method := ""
	if k != kindTCP {
		method = r.Method
		if method == "" {
			method = "GET"
		} else if !isUpperASCII(method) {
			method = asciiUpper(method)
		}
	}
	deny := func(rule, format string, args ...any) (Decision, error) {
		return Decision{Rule: rule, Reason: fmt.Sprintf(format, args...)}, nil
	}

	if r.Port == dotPort {
		return deny(RuleDoT, "port 853 (DNS over TLS) is always denied: %s", describe(r, k, method))
	}
	host, ok := hostname.Normalize(r.Host)
	if !ok {
		return deny(RuleInvalidHost, "%s is not a valid host name (the policy matches names, never IP addresses): %s", quoteForReason(r.Host), describe(r, k, method))
	}
	if isDoHResolver(host) {
		return deny(RuleDoHResolver, "%s is a public DNS-over-HTTPS resolver; a sandbox's DNS goes through its own resolver: %s", host, describe(r, k, method))
	}
	var rp reqPath
	if k != kindTCP {
		if mt := dohMediaType(r.ContentType, r.Accept); mt != "" {
			return deny(RuleDoH, "DNS-over-HTTPS requests (%s) are always denied: %s", mt, describe(r, k, method))
		}
		var problem string
		if rp, problem = canonicalPath(r.Path); problem != "" {
			return deny(RuleInvalidPath, "%s: %s", problem, describe(r, k, method))
		}
	}

	if p.only != nil && !matchesAny(p.only, host) {
		return deny(RuleOnly, "the policy is narrowed to %s; it denies %s", strings.Join(p.only, ", "), describe(r, k, method))
	}

	var nearMiss *compiledRule
	act := &activation{r: r}
	for i := range p.rules {
		cr := &p.rules[i]
		if !hostname.Match(cr.host, host) || !slices.Contains(cr.ports, r.Port) {
			continue
		}
		if !cr.allow {
			if k == kindTCP || cr.matchMethod(method) && cr.matchPath(&rp) {
				if cr.when != nil {
					// A deny rule's condition failing to evaluate denies.
					if ok, err := cr.when.evalIn(act); err == nil && !ok {
						continue
					}
				}
				return deny(cr.name, "rule %q denies %s", cr.name, describe(r, k, method))
			}
			continue
		}
		if !cr.allows(k) {
			if nearMiss == nil {
				nearMiss = cr
			}
			continue
		}
		if k != kindTCP && !(cr.matchMethod(method) && cr.matchPath(&rp)) {
			continue
		}
		if cr.when != nil {
			ok, err := cr.when.evalIn(act)
			if err != nil {
				// Never fail open: a condition that cannot be evaluated
				// denies, naming the rule.
				return deny(cr.name, "rule %q: its condition could not be evaluated (%v); denied %s", cr.name, err, describe(r, k, method))
			}
			if !ok {
				continue
			}
		}
		if cr.hold {
			return Decision{Hold: true, HoldTimeout: cr.timeout, Rule: cr.name, Reason: fmt.Sprintf("rule %q holds %s for approval", cr.name, describe(r, k, method))}, nil
		}
		return Decision{Allow: true, Rule: cr.name, Reason: fmt.Sprintf("rule %q allows %s", cr.name, describe(r, k, method))}, nil
	}

	if p.defaultAllow && k == kindHTTP {
		return Decision{Allow: true, Rule: RuleDefault, Reason: fmt.Sprintf("no rule matches %s (default allow)", describe(r, k, method))}, nil
	}
	hint := "default deny"
	if p.defaultAllow {
		hint = "the default allow covers plain HTTP(S) only"
	}
	switch {
	case nearMiss != nil && k == kindTCP:
		hint += fmt.Sprintf("; rule %q allows %s only, raw TCP needs protocol \"tcp\"", nearMiss.name, nearMiss.proto)
	case nearMiss != nil && k == kindWebSocket:
		hint += fmt.Sprintf("; rule %q allows %s only, WebSocket upgrades need protocol \"websocket\"", nearMiss.name, nearMiss.proto)
	case nearMiss != nil:
		hint += fmt.Sprintf("; rule %q allows raw TCP only", nearMiss.name)
	}
	return deny(RuleDefault, "no rule allows %s (%s)", describe(r, k, method), hint)
}

// AllowsName reports whether any allow rule (of any protocol or port), or a
// default allow, could allow a request to name. The synthetic DNS answers
// only for such names; for the rest (including the DoH resolvers and
// anything that is not a valid host name) it answers NXDOMAIN.
func (p *Policy) AllowsName(name string) bool {
	if p == nil {
		return false
	}
	host, ok := hostname.Normalize(name)
	if !ok || isDoHResolver(host) || p.only != nil && !matchesAny(p.only, host) {
		return false
	}
	if p.defaultAllow {
		return true
	}
	for i := range p.rules {
		if p.rules[i].allow && hostname.Match(p.rules[i].host, host) {
			return true
		}
	}
	return false
}

// dohPatterns are knownDoHResolvers and their sub-domains.
var dohPatterns = func() []string {
	ps := make([]string, 0, 2*len(knownDoHResolvers))
	for _, r := range knownDoHResolvers {
		ps = append(ps, r, "*."+r)
	}
	return ps
}()

func matchesAny(patterns []string, host string) bool {
	for _, p := range patterns {
		if hostname.Match(p, host) {
			return true
		}
	}
	return false
}

func isDoHResolver(host string) bool {
	for _, p := range dohPatterns {
		if hostname.Match(p, host) {
			return true
		}
	}
	return false
}

// dohMediaType returns the DoH media type named by a Content-Type or by any
// element of an Accept list, or "".
func dohMediaType(contentType, accept string) string {
	if contentType == "" && accept == "" {
		return ""
	}
	for _, h := range []string{contentType, accept} {
		for elem := range strings.SplitSeq(h, ",") {
			mt, _, _ := strings.Cut(elem, ";")
			mt = strings.TrimSpace(mt)
			for _, d := range dohMediaTypes {
				if strings.EqualFold(mt, d) {
					return d
				}
			}
		}
	}
	return ""
}

// describe renders a request for a reason: "POST api.example.com:443/x",
// "websocket GET host:443/ws" or "tcp db.example.com:5432".
func describe(r *Request, k kind, method string) string {
	hp := quoteForReason(hostname.Lower(r.Host)) + ":" + strconv.Itoa(r.Port)
	switch k {
	case kindTCP:
		return "tcp " + hp
	case kindWebSocket:
		return "websocket " + quoteForReason(method) + " " + hp + reasonPath(r.Path)
	default:
		return quoteForReason(method) + " " + hp + reasonPath(r.Path)
	}
}

func reasonPath(p string) string {
	if p == "" {
		return "/"
	}
	if len(p) > maxReasonPathLen {
		p = p[:maxReasonPathLen] + "..."
	}
	return quoteForReason(p)
}

// quoteForReason keeps untrusted text printable and short in reasons (which
// end up in 403 bodies and logs): it quotes it if it has anything but
// printable ASCII.
func quoteForReason(s string) string {
	if len(s) > 2*maxReasonPathLen {
		s = s[:2*maxReasonPathLen] + "..."
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e || s[i] == '"' {
			return strconv.QuoteToASCII(s)
		}
	}
	return s
}

func isUpperASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'a' <= c && c <= 'z' || c >= 0x80 {
			return false
		}
	}
	return true
}

// NamesHost reports whether the synthetic DNS should answer name: some
// rule — allow or deny — names it, or the default allows. A name only a
// deny rule mentions still resolves, so the guest's request reaches the
// proxy and gets a 403 naming that rule instead of a bare NXDOMAIN; a name
// no rule mentions stays NXDOMAIN. Nothing is ever resolved upstream.
func (p *Policy) NamesHost(name string) bool {
	if p == nil {
		return false
	}
	host, ok := hostname.Normalize(name)
	if !ok || isDoHResolver(host) || p.only != nil && !matchesAny(p.only, host) {
		return false
	}
	if p.defaultAllow {
		return true
	}
	for i := range p.rules {
		if hostname.Match(p.rules[i].host, host) {
			return true
		}
	}
	return false
}
