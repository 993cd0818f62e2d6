// Package safedial is the one dialer of every connection the host makes
// toward an address it was not configured with by the operator: the egress
// proxy's upstreams (a sandbox's names) and every URL a tenant supplies
// (WebSocket relays, approval webhooks, anything later).
//
// A Dialer resolves a name at connect time, refuses it when any of its
// addresses is loopback, private (RFC 1918, unique-local), CGNAT,
// link-local, a cloud metadata or host endpoint, multicast, reserved,
// synthetic (198.18.0.0/15) or an address of the host itself (learned from
// its interfaces and local routes, plus Config.HostAddrs) — also in every
// IPv6 form that embeds an IPv4 address — and dials the checked address
// itself, so a name that rebinds between check and connect has nothing to
// work with. Literal IP addresses are refused. Only an explicit
// Config.Overrides entry (per host and port) reaches such an address, and
// Config.AllowPrivate (an operator's flag) lifts the class checks, not the
// metadata ones.
//
// A refusal is a *RefusedError whose Reason names the class of address,
// never the address, and whose Rule names the built-in rule
// (RuleBlockedAddress, RuleHostAddress). Callers that serve a tenant show
// no more than that (and the egress proxy names the rule); transport
// errors and answers are for the operator's log only.
package safedial

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/hostname"
)

// Built-in rules named when the guard refuses an upstream's address.
const (
	// RuleBlockedAddress: the name resolves to an address no upstream may
	// have (loopback, private, link-local, metadata, …; see CheckAddr).
	RuleBlockedAddress = "builtin:blocked-address"
	// RuleHostAddress: the name resolves to an address of the host itself.
	RuleHostAddress = "builtin:host-address"
)

// RefusedError is an upstream connection the dial guard would not make. Reason
// is safe to show to the sandbox: it names the class of address, never the
// address itself. Rule is the built-in rule that refused the address
// (RuleBlockedAddress or RuleHostAddress), or "" when the dial failed for
// another reason (no such name, connection refused).
type RefusedError struct {
	Reason string
	Rule   string
	Err    error // underlying cause, if any (not shown to the sandbox)
}

func (e *RefusedError) Error() string {
	if e.Err != nil {
		return "upstream refused: " + e.Reason + ": " + e.Err.Error()
	}
	return "upstream refused: " + e.Reason
}

func (e *RefusedError) Unwrap() error { return e.Err }

func refused(format string, args ...any) *RefusedError {
	return &RefusedError{Reason: fmt.Sprintf(format, args...)}
}

func blocked(format string, args ...any) *RefusedError {
	return &RefusedError{Reason: fmt.Sprintf(format, args...), Rule: RuleBlockedAddress}
}

// Rule returns the built-in rule that refused a dial, or "".
func Rule(err error) string {
	var re *RefusedError
	if errors.As(err, &re) {
		return re.Rule
	}
	return ""
}

type classed struct {
	prefix netip.Prefix
	class  string
}

func prefixes(pairs ...string) []classed {
	out := make([]classed, 0, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, classed{netip.MustParsePrefix(pairs[i]), pairs[i+1]})
	}
	return out
}

// Addresses no upstream may have. Order matters only for the class named.
var (
	forbidden4 = prefixes(
		"0.0.0.0/8", "unspecified",
		"168.63.129.16/32", "cloud host endpoint (Azure WireServer)",
		"10.0.0.0/8", "private",
		"100.64.0.0/10", "shared (CGNAT)",
		"127.0.0.0/8", "loopback",
		"169.254.0.0/16", "link-local",
		"172.16.0.0/12", "private",
		"192.0.0.0/24", "reserved",
		"192.0.2.0/24", "reserved",
		"192.88.99.0/24", "reserved",
		"192.168.0.0/16", "private",
		"198.18.0.0/15", "reserved (synthetic)",
		"198.51.100.0/24", "reserved",
		"203.0.113.0/24", "reserved",
		"224.0.0.0/4", "multicast",
		"255.255.255.255/32", "broadcast",
		"240.0.0.0/4", "reserved",
	)
	forbidden6 = prefixes(
		"::/128", "unspecified",
		"::1/128", "loopback",
		"::/96", "IPv4-compatible",
		"64:ff9b:1::/48", "NAT64 (local use)",
		"100::/64", "discard",
		"2001:db8::/32", "reserved",
		"fc00::/7", "unique local",
		"fe80::/10", "link-local",
		"fec0::/10", "site-local",
		"ff00::/8", "multicast",
	)
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	siit      = netip.MustParsePrefix("::ffff:0:0:0/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
	teredo    = netip.MustParsePrefix("2001::/32")
)

// CheckAddr reports whether a resolved address may be an upstream. It refuses
// loopback, private (RFC 1918), CGNAT, link-local (including the cloud metadata
// addresses 169.254.169.254 and fd00:ec2::254), Azure's host endpoint
// 168.63.129.16 (WireServer: VM agent, health probes, DNS), unique-local,
// multicast, unspecified, broadcast, reserved and the synthetic
// 198.18.0.0/15 range, and every IPv6 form that embeds one of those IPv4
// addresses (IPv4-mapped, IPv4-compatible, SIIT, NAT64, 6to4, Teredo). It
// does not know the host's own addresses; the proxy's dialer checks those
// too. A refusal names RuleBlockedAddress.
func CheckAddr(a netip.Addr) error {
	if !a.IsValid() {
		return blocked("invalid address")
	}
	if a.Zone() != "" {
		return blocked("resolves to a scoped address")
	}
	if a.Is4In6() {
		if err := check4(a.Unmap()); err != nil {
			return blocked("resolves to an IPv4-mapped %s address", className(err))
		}
		return nil
	}
	if a.Is4() {
		return check4(a)
	}
	if kind, v4s := embeddedIPv4(a); kind != "" {
		for _, v4 := range v4s {
			if err := check4(v4); err != nil {
				return blocked("resolves to a %s form of a %s address", kind, className(err))
			}
		}
		return nil
	}
	for _, f := range forbidden6 {
		if f.prefix.Contains(a) {
			if f.class == "IPv4-compatible" {
				return blocked("resolves to an IPv4-compatible address")
			}
			return blocked("resolves to a %s address", f.class)
		}
	}
	return nil
}

// embeddedIPv4 names the IPv6 form of a that carries IPv4 addresses
// (NAT64, SIIT, 6to4, Teredo) and returns them; kind is "" for none.
// IPv4-mapped addresses are left to Unmap.
func embeddedIPv4(a netip.Addr) (kind string, v4s []netip.Addr) {
	if !a.Is6() || a.Is4In6() {
		return "", nil
	}
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return "NAT64", []netip.Addr{netip.AddrFrom4([4]byte(b[12:16]))}
	case siit.Contains(a):
		return "IPv4-translated", []netip.Addr{netip.AddrFrom4([4]byte(b[12:16]))}
	case sixToFour.Contains(a):
		return "6to4", []netip.Addr{netip.AddrFrom4([4]byte(b[2:6]))}
	case teredo.Contains(a):
		server := netip.AddrFrom4([4]byte(b[4:8]))
		client := netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})
		return "Teredo", []netip.Addr{server, client}
	}
	return "", nil
}

func check4(a netip.Addr) error {
	for _, f := range forbidden4 {
		if f.prefix.Contains(a) {
			return &RefusedError{Reason: "resolves to a " + f.class + " address", Rule: RuleBlockedAddress, Err: errClass(f.class)}
		}
	}
	return nil
}

// errClass carries the bare class name of a refused IPv4 address so the
// IPv6 forms can say what they embed.
type errClass string

func (e errClass) Error() string { return string(e) }

func className(err error) string {
	var c errClass
	if errors.As(err, &c) {
		return string(c)
	}
	return "forbidden"
}

// Config configures a Dialer.
type Config struct {
	// Overrides are explicit operator overrides, "host:port" → the
	// address to dial instead (any address, loopback included: that is
	// what overrides are for; the daemon's --resolve).
	Overrides map[string]netip.AddrPort
	// Resolver resolves names at connect time (nil: net.DefaultResolver).
	Resolver *net.Resolver
	// HostAddrs are addresses of the host it cannot learn from its
	// interfaces and local routes (public addresses behind 1:1 NAT).
	HostAddrs []netip.Prefix
	// AllowPrivate lets names and literal addresses reach loopback,
	// private, link-local and the host's own addresses — an operator's
	// explicit choice for a single-tenant host or tests. The cloud
	// metadata and host endpoints (MetadataAddrs) stay refused.
	AllowPrivate bool
	// Timeout bounds one TCP connect (default 10 s).
	Timeout time.Duration
}

// Dialer dials under the rules of the package doc. Names with an explicit
// override go to the override; every other name is resolved at connect
// time, every resolved address checked, and a checked address dialled
// itself so nothing can re-resolve in between.
type Dialer struct {
	overrides map[string]netip.AddrPort // hostname.Canonical(host) + ":" + port
	// Lookup resolves a name; replaced in tests (a table of answers).
	Lookup       func(ctx context.Context, host string) ([]netip.Addr, error)
	dialer       net.Dialer
	allowPrivate bool
	// hostAddrs learns the host's own addresses; replaced in tests.
	hostAddrs func() ([]netip.Prefix, error)
	// extra are addresses of the host it cannot learn (Config.HostAddrs).
	extra []netip.Prefix

	// mu guards the cached host addresses.
	mu        sync.Mutex
	own       []netip.Prefix
	ownExpiry time.Time
}

const ownAddrTTL = 10 * time.Second

// New returns a Dialer. Overrides whose key is not "host:port" are
// ignored (callers validate them).
func New(cfg Config) *Dialer {
	r := cfg.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	ov := make(map[string]netip.AddrPort, len(cfg.Overrides))
	for k, v := range cfg.Overrides {
		host, port, err := net.SplitHostPort(k)
		if err != nil {
			continue
		}
		ov[hostname.Canonical(host)+":"+port] = v
	}
	ex := make([]netip.Prefix, 0, len(cfg.HostAddrs))
	for _, p := range cfg.HostAddrs {
		ex = append(ex, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p.Addr())).Masked())
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return &Dialer{
		overrides: ov,
		Lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return r.LookupNetIP(ctx, "ip", host)
		},
		dialer:       net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second},
		allowPrivate: cfg.AllowPrivate,
		hostAddrs:    hostAddrs,
		extra:        ex,
	}
}

// unmapBits is what an IPv4-mapped prefix loses in length when unmapped.
func unmapBits(a netip.Addr) int {
	if a.Is4In6() {
		return 96
	}
	return 0
}

// hostAddrs learns the host's own addresses without touching the network:
// every address on its interfaces (primary and secondary, both families)
// and every destination its kernel treats as its own — the "local" routing
// table's local and anycast routes, which also hold prefixes on no
// interface (AnyIP: `ip route add local 192.0.2.0/24 dev lo`). A public
// address that reaches the host through 1:1 NAT (cloud public and elastic
// IPs) is on none of these and cannot be learned offline; the operator
// names those (Config.HostAddrs, the daemon's --host-public-addr).
func hostAddrs() ([]netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("host addresses: %w", err)
	}
	own := make([]netip.Prefix, 0, 2*len(addrs))
	for _, a := range addrs {
		var ip netip.Addr
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			ip = p.Addr()
		} else if ip, err = netip.ParseAddr(a.String()); err != nil {
			continue
		}
		ip = ip.Unmap().WithZone("")
		own = append(own, netip.PrefixFrom(ip, ip.BitLen()))
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("host addresses: local routing table: %w", err)
	}
	for _, r := range routes {
		if (r.Type != unix.RTN_LOCAL && r.Type != unix.RTN_ANYCAST) || r.Dst == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		ip = ip.Unmap()
		if ones > ip.BitLen() {
			ones = ip.BitLen()
		}
		own = append(own, netip.PrefixFrom(ip, ones).Masked())
	}
	return own, nil
}

// isOwn reports whether a is one of the host's addresses. If they cannot be
// learned, every address counts as the host's (refuse, never fail open).
func (g *Dialer) isOwn(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	for _, p := range g.extra {
		if p.Contains(a) {
			return true
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.own == nil || time.Now().After(g.ownExpiry) {
		own, err := g.hostAddrs()
		if err != nil {
			return true
		}
		g.own, g.ownExpiry = own, time.Now().Add(ownAddrTTL)
	}
	for _, p := range g.own {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Check is CheckAddr plus the host's own addresses, also in the IPv6 forms
// that embed an IPv4 address. With AllowPrivate only the metadata and
// host endpoints are refused.
func (g *Dialer) Check(a netip.Addr) error {
	if g.allowPrivate {
		return checkMetadata(a)
	}
	if err := CheckAddr(a); err != nil {
		return err
	}
	if g.isOwn(a) {
		return &RefusedError{Reason: "resolves to an address of the host", Rule: RuleHostAddress}
	}
	if kind, v4s := embeddedIPv4(a); kind != "" {
		for _, v4 := range v4s {
			if g.isOwn(v4) {
				return &RefusedError{Reason: "resolves to a " + kind + " form of an address of the host", Rule: RuleHostAddress}
			}
		}
	}
	return nil
}

// DialContext connects to address ("name:port") under the rules above. It
// has the signature of net.Dialer.DialContext so an http.Transport can use it.
func (g *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, refused("network %s not allowed", network)
	}
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil, &RefusedError{Reason: "bad address", Err: err}
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, refused("bad port")
	}
	name := hostname.Canonical(host)
	if ap, ok := g.overrides[name+":"+portStr]; ok {
		c, err := g.dialer.DialContext(ctx, "tcp", ap.String())
		if err != nil {
			return nil, &RefusedError{Reason: "connection failed", Err: err}
		}
		return c, nil
	}
	if lit, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		if !g.allowPrivate {
			return nil, refused("literal IP address")
		}
		if err := g.Check(lit); err != nil {
			return nil, err
		}
		return g.dial(ctx, []netip.Addr{lit}, uint16(port))
	}
	if !hostname.Valid(name) || (!g.allowPrivate && (name == "localhost" || strings.HasSuffix(name, ".localhost"))) {
		return nil, refused("name not allowed")
	}
	addrs, err := g.Lookup(ctx, name)
	if err != nil {
		return nil, &RefusedError{Reason: "name does not resolve", Err: err}
	}
	if len(addrs) == 0 {
		return nil, refused("name does not resolve")
	}
	// Every address must pass: a name that resolves to one public and one
	// private address is a rebinding attempt, not a choice.
	for _, a := range addrs {
		if err := g.Check(a); err != nil {
			return nil, err
		}
	}
	return g.dial(ctx, addrs, uint16(port))
}

// dial connects to the first of addrs (checked) that answers.
func (g *Dialer) dial(ctx context.Context, addrs []netip.Addr, port uint16) (net.Conn, error) {
	var firstErr error
	for _, a := range addrs {
		c, err := g.dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(a.Unmap(), port).String())
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, &RefusedError{Reason: "connection failed", Err: firstErr}
}

// metadata are the cloud metadata and host endpoints: refused even with
// AllowPrivate.
var metadata = prefixes(
	"169.254.169.254/32", "cloud metadata",
	"169.254.170.2/32", "cloud metadata (ECS)",
	"168.63.129.16/32", "cloud host endpoint (Azure WireServer)",
	"100.100.100.200/32", "cloud metadata (Alibaba)",
	"fd00:ec2::254/128", "cloud metadata",
)

// checkMetadata refuses the metadata endpoints, also IPv4-mapped.
func checkMetadata(a netip.Addr) error {
	u := a.Unmap().WithZone("")
	for _, f := range metadata {
		if f.prefix.Contains(u) {
			return blocked("resolves to a %s address", f.class)
		}
	}
	if kind, v4s := embeddedIPv4(u); kind != "" {
		for _, v4 := range v4s {
			if err := checkMetadata(v4); err != nil {
				return blocked("resolves to a %s form of a cloud metadata address", kind)
			}
		}
	}
	return nil
}
