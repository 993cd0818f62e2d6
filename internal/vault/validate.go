package vault

import (
	"fmt"
	"net/netip"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits.
const (
	MaxValueLen  = 64 << 10 // bytes of one value
	MaxNameLen   = 128
	MaxTenantLen = 256
	MaxHosts     = 64
	MaxHostLen   = 253
	MaxInjectLen = 1024
)

// ValueToken is the placeholder an injection template must contain once.
const ValueToken = "{value}"

func checkTenant(tenant string) error {
	if tenant == "" || len(tenant) > MaxTenantLen || strings.ContainsRune(tenant, 0) || !utf8.ValidString(tenant) {
		return fmt.Errorf("tenant %q: want 1 to %d characters of UTF-8 without NUL: %w", tenant, MaxTenantLen, ErrInvalid)
	}
	return nil
}

// CheckName reports (wrapping ErrInvalid) whether name is a valid secret
// name: [A-Za-z_][A-Za-z0-9_]{0,127}, the shape of an environment variable.
func CheckName(name string) error {
	ok := name != "" && len(name) <= MaxNameLen
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9'
	}
	if !ok {
		// Quote at most MaxNameLen bytes: a caller that passed a value by
		// mistake should not see the whole of it echoed.
		return fmt.Errorf("secret name %q: want a letter or '_' then up to %d letters, digits or '_' (like an environment variable): %w",
			truncate(name, 40), MaxNameLen-1, ErrInvalid)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func checkValue(value []byte, inject string) error {
	if len(value) == 0 {
		return fmt.Errorf("secret value is empty: %w", ErrInvalid)
	}
	if len(value) > MaxValueLen {
		return fmt.Errorf("secret value is %d bytes; the limit is %d: %w", len(value), MaxValueLen, ErrInvalid)
	}
	if inject != "" {
		// The value will go into a header: refuse what could split it.
		for i, c := range value {
			if c < 0x20 && c != '\t' || c == 0x7f {
				return fmt.Errorf("secret value has a control character at byte %d of %d, so it cannot be injected into a header: %w", i, len(value), ErrInvalid)
			}
		}
	}
	return nil
}

// NormalizeHosts validates hosts and returns them lower-cased, without a
// trailing dot, in order, without duplicates. Each is a DNS name
// ("api.github.com") or a wildcard "*." followed by a name of at least two
// labels ("*.github.com", which matches every name below github.com but
// not github.com itself). IP addresses, ports, schemes and paths are
// refused. At least one host is required and at most MaxHosts.
func NormalizeHosts(hosts []string) ([]string, error) {
	if len(hosts) == 0 {
		return nil, fmt.Errorf("no hosts: name at least one host the secret may be sent to: %w", ErrInvalid)
	}
	if len(hosts) > MaxHosts {
		return nil, fmt.Errorf("%d hosts; the limit is %d (use a wildcard such as *.example.com): %w", len(hosts), MaxHosts, ErrInvalid)
	}
	out := make([]string, 0, len(hosts))
	seen := map[string]bool{}
	for _, h := range hosts {
		n, err := normalizeHost(h)
		if err != nil {
			return nil, err
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out, nil
}

func normalizeHost(h string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("host %q: %s: %w", truncate(h, MaxHostLen+2), why, ErrInvalid)
	}
	if strings.TrimSpace(h) == "" {
		return bad(`empty; want a name such as "api.github.com" or "*.github.com"`)
	}
	if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return bad("an IP address; name the host instead")
	}
	if strings.Contains(h, "://") || strings.ContainsAny(h, "/?#@:") {
		return bad(`not a bare host name; drop any scheme, user, port and path`)
	}
	n := asciiLower(strings.TrimSuffix(h, "."))
	wildcard := false
	if rest, ok := strings.CutPrefix(n, "*."); ok {
		wildcard, n = true, rest
	}
	if strings.Contains(n, "*") {
		return bad(`a wildcard is allowed only as the whole first label, as in "*.example.com"`)
	}
	if len(n) > MaxHostLen {
		return bad(fmt.Sprintf("%d characters; the limit is %d", len(n), MaxHostLen))
	}
	labels := strings.Split(n, ".")
	for _, l := range labels {
		if why := labelProblem(l); why != "" {
			return bad(why)
		}
	}
	if looksNumeric(labels[len(labels)-1]) {
		return bad("the last label is numeric, so it reads as an IP address")
	}
	if wildcard {
		if len(labels) < 2 {
			return bad(`a wildcard needs at least two labels after "*." (e.g. "*.example.com"), so it cannot cover a whole top-level domain`)
		}
		return "*." + n, nil
	}
	return n, nil
}

func labelProblem(l string) string {
	if l == "" {
		return `it has an empty label (a leading dot or "..")`
	}
	if len(l) > 63 {
		return fmt.Sprintf("a label is %d characters; labels are at most 63", len(l))
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '_':
		case c == '-':
			if i == 0 || i == len(l)-1 {
				return fmt.Sprintf("label %q starts or ends with '-'", l)
			}
		case c >= 0x80:
			return "it is not ASCII; write internationalized names in punycode (xn--)"
		default:
			return fmt.Sprintf("label %q has character %q; labels are letters, digits, '-' and '_'", l, c)
		}
	}
	return ""
}

func looksNumeric(l string) bool {
	if h, ok := strings.CutPrefix(l, "0x"); ok {
		return strings.Trim(h, "0123456789abcdef") == ""
	}
	return strings.Trim(l, "0123456789") == ""
}

func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// MatchHost reports whether host (a request's host name, any case, an
// optional trailing dot, no port) is one a secret with these normalized
// hosts may be sent to. "*.example.com" matches every name below
// example.com, at any depth, but not example.com itself.
func MatchHost(hosts []string, host string) bool {
	host = asciiLower(strings.TrimSuffix(host, "."))
	if host == "" {
		return false
	}
	for _, p := range hosts {
		if suffix, ok := strings.CutPrefix(p, "*"); ok {
			if len(host) > len(suffix) && strings.HasSuffix(host, suffix) {
				return true
			}
		} else if host == p {
			return true
		}
	}
	return false
}

// ParseInject validates an injection template, "Header-Name: template",
// where the template holds ValueToken exactly once ("Authorization: Bearer
// {value}"). It returns the canonical header name and the template after
// the colon with surrounding blanks trimmed. "" is valid (no injection)
// and returns "", "".
func ParseInject(inject string) (header, template string, err error) {
	if inject == "" {
		return "", "", nil
	}
	bad := func(why string) (string, string, error) {
		return "", "", fmt.Errorf("inject template %q: %s: %w", truncate(inject, 80), why, ErrInvalid)
	}
	if len(inject) > MaxInjectLen {
		return bad(fmt.Sprintf("%d bytes; the limit is %d", len(inject), MaxInjectLen))
	}
	name, tmpl, ok := strings.Cut(inject, ":")
	if !ok {
		return bad(`want "Header-Name: template", e.g. "Authorization: Bearer {value}"`)
	}
	if name == "" {
		return bad("empty header name")
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return bad(fmt.Sprintf("header name %q has character %q", name, name[i]))
		}
	}
	if forbiddenHeaders[canonicalHeader(name)] {
		return bad(fmt.Sprintf("header %s frames or routes the request and cannot be injected", canonicalHeader(name)))
	}
	tmpl = strings.Trim(tmpl, " \t")
	if n := strings.Count(tmpl, ValueToken); n != 1 {
		return bad(fmt.Sprintf("the template after the colon must contain %s exactly once, not %d times", ValueToken, n))
	}
	for _, r := range tmpl {
		if r == utf8.RuneError || r != '\t' && !unicode.IsPrint(r) {
			return bad(fmt.Sprintf("the template has character %q, which cannot go into a header", r))
		}
	}
	return canonicalHeader(name), tmpl, nil
}

// forbiddenHeaders are the headers an injection may not set: they frame,
// route or hop, and the proxy owns them.
var forbiddenHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Content-Encoding": true, "Expect": true,
}

// isTokenChar reports whether c may appear in an HTTP header name (RFC
// 9110 tchar).
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func canonicalHeader(s string) string {
	b := []byte(s)
	upper := true
	for i, c := range b {
		switch {
		case upper && 'a' <= c && c <= 'z':
			b[i] = c - 'a' + 'A'
		case !upper && 'A' <= c && c <= 'Z':
			b[i] = c - 'A' + 'a'
		}
		upper = c == '-'
	}
	return string(b)
}

// preview returns the last 4 characters of value, or "****" if the value
// is shorter than 8 characters or its end is not printable text.
func preview(value []byte) string {
	const hidden = "****"
	if !utf8.Valid(value) || utf8.RuneCount(value) < 8 {
		return hidden
	}
	tail := value
	for range 4 {
		_, size := utf8.DecodeLastRune(tail)
		tail = tail[:len(tail)-size]
	}
	last := string(value[len(tail):])
	for _, r := range last {
		if !unicode.IsPrint(r) {
			return hidden
		}
	}
	return last
}
