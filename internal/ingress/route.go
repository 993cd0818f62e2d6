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
// relays take Send (the "to a guest port, waking it first" path, from the
// host).
package ingress

import (
	"strings"

	"github.com/cagebox/cagebox/internal/hostname"
)

// Route is where one request goes: a sandbox's port, and (path form) the
// prefix stripped from the path.
type Route struct {
	ID     string
	Port   uint16
	Prefix string // "/s/ID/PORT" in the path form, "" in the host form
}

// ValidID reports whether id has the shape of a sandbox ID.
func ValidID(id string) bool { return hostname.ValidSandboxID(id) }

// ParseHost routes a Host header of the form PORT-ID.DOMAIN (parsed by
// hostname.ParsePortHost, which the fleet router shares). ok is false for
// any other host, which then may still use the path form.
func ParseHost(host, domain string) (Route, bool) {
	port, id, ok := hostname.ParsePortHost(host, domain)
	if !ok {
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
	port, err := hostname.ParsePort(p)
	if err != nil {
		return Route{}, "", false
	}
	return Route{ID: id, Port: port, Prefix: "/s/" + id + "/" + p}, "/" + rest, true
}

// HostFor is the host name of a port in the host form.
func HostFor(id string, port uint16, domain string) string {
	return hostname.PortHost(port, id, domain)
}
