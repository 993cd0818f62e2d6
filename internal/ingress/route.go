// Package ingress is the daemon's inbound listener: it serves the published
// ports of sandboxes over HTTPS, under https://PORT-ID.DOMAIN (Host-based
// routing) and /s/ID/PORT/… (the path form, on any Host), and proxies each
// request into the guest's port over the sandbox's own link.
//
// The package holds no sandbox state: a Backend (the sandbox manager) says
// whether a port is published and where it is, wakes an idle-paused
// sandbox, and counts the request as activity. Access is checked here: a
// per-port token (header X-Cagebox-Access, stored only as its SHA-256),
// a signed URL (HMAC under a daemon key, bound to the port's token hash so
// rotating the token revokes every URL), or a public port. Webhooks and
// relays reuse Deliver (the "to a guest port, waking it first" path).
package ingress

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
)

// Route is where one request goes: a sandbox's port, and (path form) the
// prefix stripped from the path.
type Route struct {
	ID     string
	Port   uint16
	Prefix string // "/s/ID/PORT" in the path form, "" in the host form
}

// idRE is a sandbox ID as the manager makes them ("sb-" + 16 hex digits).
var idRE = regexp.MustCompile(`^sb-[0-9a-f]{16}$`)

// ValidID reports whether id has the shape of a sandbox ID.
func ValidID(id string) bool { return idRE.MatchString(id) }

// ParsePort parses a TCP port 1-65535 written in decimal without sign or
// leading zeros.
func ParsePort(s string) (uint16, error) {
	if s == "" || len(s) > 5 || s[0] == '0' || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("port %q: want a number 1-65535", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %q: want a number 1-65535", s)
	}
	return uint16(n), nil
}

// ParseHost routes a Host header of the form PORT-ID.DOMAIN (an optional
// :port suffix and letter case are ignored). ok is false for any other
// host, which then may still use the path form.
func ParseHost(host, domain string) (Route, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	domain = strings.TrimSuffix(strings.ToLower(domain), ".")
	if domain == "" {
		return Route{}, false
	}
	label, ok := strings.CutSuffix(host, "."+domain)
	if !ok || strings.Contains(label, ".") {
		return Route{}, false
	}
	p, id, ok := strings.Cut(label, "-")
	if !ok || !ValidID(id) {
		return Route{}, false
	}
	port, err := ParsePort(p)
	if err != nil {
		return Route{}, false
	}
	return Route{ID: id, Port: port}, true
}

// ParsePath routes a path of the form /s/ID/PORT[/rest]; rest is what the
// guest sees ("/" when empty).
func ParsePath(path string) (r Route, rest string, ok bool) {
	tail, ok := strings.CutPrefix(path, "/s/")
	if !ok {
		return Route{}, "", false
	}
	id, tail, ok := strings.Cut(tail, "/")
	if !ok || !ValidID(id) {
		return Route{}, "", false
	}
	p, rest, _ := strings.Cut(tail, "/")
	port, err := ParsePort(p)
	if err != nil {
		return Route{}, "", false
	}
	return Route{ID: id, Port: port, Prefix: "/s/" + id + "/" + p}, "/" + rest, true
}

// HostFor is the host name of a port in the host form.
func HostFor(id string, port uint16, domain string) string {
	return strconv.Itoa(int(port)) + "-" + id + "." + strings.TrimSuffix(domain, ".")
}
