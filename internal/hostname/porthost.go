package hostname

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Port hosts. A sandbox's published port is reached at PORT-ID.DOMAIN
// (e.g. "8080-sb-0123456789abcdef.sandbox.example.com"): the node's
// ingress routes the Host header by it and the fleet router routes the TLS
// server name (SNI) by it, so both parse it here.

// ValidSandboxID reports whether id has the shape of a sandbox ID as the
// sandbox manager makes them: "sb-" and 16 lower-case hex digits.
func ValidSandboxID(id string) bool {
	if len(id) != 19 || !strings.HasPrefix(id, "sb-") {
		return false
	}
	for i := 3; i < len(id); i++ {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

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

// ParsePortHost parses a host of the form PORT-ID.DOMAIN: exactly one
// label below domain, made of a port (ParsePort) and a sandbox ID
// (ValidSandboxID). An optional :port suffix, one trailing dot and ASCII
// letter case are ignored. ok is false for any other host and when domain
// is empty.
func ParsePortHost(host, domain string) (port uint16, id string, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = Canonical(host)
	domain = Canonical(domain)
	if domain == "" {
		return 0, "", false
	}
	label, ok := strings.CutSuffix(host, "."+domain)
	if !ok || strings.Contains(label, ".") {
		return 0, "", false
	}
	p, id, ok := strings.Cut(label, "-")
	if !ok || !ValidSandboxID(id) {
		return 0, "", false
	}
	port, err := ParsePort(p)
	if err != nil {
		return 0, "", false
	}
	return port, id, true
}

// PortHost is the host name of a sandbox's port: PORT-ID.DOMAIN.
func PortHost(port uint16, id, domain string) string {
	return strconv.Itoa(int(port)) + "-" + id + "." + strings.TrimSuffix(domain, ".")
}
