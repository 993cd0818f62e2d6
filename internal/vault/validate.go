package vault

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cagebox/cagebox/internal/hostname"
)

// Limits.
const (
	MaxValueLen  = 64 << 10 // bytes of one value
	MaxNameLen   = 128
	MaxTenantLen = 256
	MaxHosts     = 64
	MaxHostLen   = hostname.MaxLen
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

// NormalizeHosts validates hosts and returns them in canonical form (see
// package hostname: lower-case, without a trailing dot), in order, without
// duplicates. Each is a DNS name ("api.github.com") or a wildcard "*."
// followed by a name that is not a public suffix ("*.github.com", which
// matches every name below github.com but not github.com itself; "*.com"
// and "*.github.io" are refused). IP addresses, ports, schemes, paths and
// non-ASCII names are refused. At least one host is required and at most
// MaxHosts. hostname.MatchAny matches a request's host against the result.
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
		n, err := hostname.ParseCredentialPattern(h)
		if err != nil {
			return nil, fmt.Errorf("host %w: %w", err, ErrInvalid)
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out, nil
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
