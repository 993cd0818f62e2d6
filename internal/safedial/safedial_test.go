package safedial

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func TestCheckAddrRefuses(t *testing.T) {
	for _, tc := range []struct{ addr, class string }{
		{"127.0.0.1", "loopback"},
		{"127.255.255.254", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "IPv4-mapped loopback"},
		{"::ffff:7f00:1", "IPv4-mapped loopback"},
		{"0:0:0:0:0:ffff:a00:1", "IPv4-mapped private"},
		{"::ffff:169.254.169.254", "IPv4-mapped link-local"},
		{"::127.0.0.1", "IPv4-compatible"},
		{"::8.8.8.8", "IPv4-compatible"},
		{"::ffff:0:a00:1", "IPv4-translated form of a private"},
		{"64:ff9b::a00:1", "NAT64 form of a private"},
		{"64:ff9b::7f00:1", "NAT64 form of a loopback"},
		{"64:ff9b::a9fe:a9fe", "NAT64 form of a link-local"},
		{"64:ff9b:1::8.8.8.8", "NAT64 (local use)"},
		{"2002:a00:1::1", "6to4 form of a private"},
		{"2002:7f00:1::", "6to4 form of a loopback"},
		{"2001:0:a00:1::1", "Teredo form of a private"},           // server 10.0.0.1
		{"2001:0:808:808::f5ff:fffe", "Teredo form of a private"}, // client ^0a000001
		{"10.0.0.1", "private"},
		{"10.255.255.255", "private"},
		{"172.16.0.1", "private"},
		{"172.31.255.1", "private"},
		{"192.168.1.1", "private"},
		{"100.64.0.1", "CGNAT"},
		{"100.127.255.254", "CGNAT"},
		{"169.254.169.254", "link-local"},
		{"169.254.0.1", "link-local"},
		{"fe80::1", "link-local"},
		{"febf::1", "link-local"},
		{"fd00:ec2::254", "unique local"},
		{"fc00::1", "unique local"},
		{"fd12:3456::1", "unique local"},
		{"fec0::1", "site-local"},
		{"224.0.0.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"ff02::1", "multicast"},
		{"ff05::1:3", "multicast"},
		{"0.0.0.0", "unspecified"},
		{"0.1.2.3", "unspecified"},
		{"::", "unspecified"},
		{"255.255.255.255", "broadcast"},
		{"240.0.0.1", "reserved"},
		{"198.18.0.1", "synthetic"},
		{"198.19.255.254", "synthetic"},
		{"192.0.0.170", "reserved"},
		{"192.0.2.1", "reserved"},
		{"2001:db8::1", "reserved"},
		{"100::1", "discard"},
		{"fe80::1%eth0", "scoped"},
		{"168.63.129.16", "cloud host endpoint (Azure WireServer)"},
		{"::ffff:168.63.129.16", "IPv4-mapped cloud host endpoint"},
		{"64:ff9b::a83f:8110", "NAT64 form of a cloud host endpoint"},
		{"2002:a83f:8110::1", "6to4 form of a cloud host endpoint"},
	} {
		a, err := netip.ParseAddr(tc.addr)
		if err != nil {
			t.Fatalf("%s: %v", tc.addr, err)
		}
		err = CheckAddr(a)
		var re *RefusedError
		if !errors.As(err, &re) {
			t.Errorf("%s: allowed, want refused (%s)", tc.addr, tc.class)
			continue
		}
		if !strings.Contains(re.Reason, tc.class) {
			t.Errorf("%s: reason %q, want it to name %q", tc.addr, re.Reason, tc.class)
		}
		if strings.Contains(re.Reason, tc.addr) {
			t.Errorf("%s: reason %q leaks the address", tc.addr, re.Reason)
		}
		if re.Rule != RuleBlockedAddress {
			t.Errorf("%s: rule %q, want %s", tc.addr, re.Rule, RuleBlockedAddress)
		}
	}
}

func TestCheckAddrAllows(t *testing.T) {
	for _, s := range []string{
		"8.8.8.8", "1.1.1.1", "93.184.216.34", "172.15.255.255", "172.32.0.1", "100.63.255.255",
		"100.128.0.1", "198.17.255.255", "198.20.0.1", "223.255.255.254",
		"2606:4700:4700::1111", "2a00:1450:4001:82a::200e", "168.63.129.15", "168.63.129.17",
		"::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1",
	} {
		if err := CheckAddr(netip.MustParseAddr(s)); err != nil {
			t.Errorf("%s: %v, want allowed", s, err)
		}
	}
}

func TestHostAddrsIncludeLoopbackAndInterfaces(t *testing.T) {
	own, err := hostAddrs()
	if err != nil {
		t.Fatal(err)
	}
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"127.0.0.1", "127.0.0.2"} // 127.0.0.0/8 is a local route
	for _, a := range ifaddrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Zone() == "" {
			want = append(want, p.Addr().String())
		}
	}
	for _, w := range want {
		if !containsAddr(own, netip.MustParseAddr(w)) {
			t.Errorf("host addresses %v lack %s", own, w)
		}
	}
}

func containsAddr(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// guardWith makes a Dialer whose resolver answers from a table.
func guardWith(overrides map[string]netip.AddrPort, dns map[string][]string) *Dialer {
	g := New(Config{Overrides: overrides, HostAddrs: []netip.Prefix{netip.MustParsePrefix("203.0.114.64/28")}})
	g.Lookup = func(_ context.Context, host string) ([]netip.Addr, error) {
		as, ok := dns[host]
		if !ok {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		var out []netip.Addr
		for _, a := range as {
			out = append(out, netip.MustParseAddr(a))
		}
		return out, nil
	}
	g.hostAddrs = func() ([]netip.Prefix, error) {
		return []netip.Prefix{netip.MustParsePrefix("203.0.114.7/32")}, nil
	}
	return g
}

func TestGuardDial(t *testing.T) {
	srv := listenTCP(t, func(c net.Conn) { io.WriteString(c, "hi") })
	port := strconv.Itoa(int(addrPort(t, srv.Addr()).Port()))
	up := addrPort(t, srv.Addr())
	g := guardWith(
		map[string]netip.AddrPort{"Test.Upstream.Example:" + port: up},
		map[string][]string{
			"test.upstream.example": {"127.0.0.1"},
			"evil.example":          {"127.0.0.1"},
			"mapped.example":        {"::ffff:127.0.0.1"},
			"metadata.example":      {"169.254.169.254"},
			"aws6.example":          {"fd00:ec2::254"},
			"rebind.example":        {"8.8.8.8", "10.0.0.1"},
			"host.example":          {"203.0.114.7"},
			"cgnat.example":         {"100.64.0.1"},
			"synthetic.example":     {"198.18.0.1"},
			"nat64.example":         {"64:ff9b::a00:1"},
			"azure.example":         {"168.63.129.16"},
			"azure64.example":       {"64:ff9b::a83f:8110"},
			"public.example":        {"203.0.114.70"},
			"public64.example":      {"64:ff9b::cb00:7246"},
			"host64.example":        {"2002:cb00:7207::1"},
		})
	for _, tc := range []struct {
		addr, reason string // reason "" = must connect
	}{
		{"test.upstream.example:" + port, ""},
		{"test.upstream.example.:" + port, ""}, // trailing dot, same name
		{"TEST.UPSTREAM.EXAMPLE:" + port, ""},
		{"test.upstream.example:1", "resolves to a loopback address"}, // override is per host:port
		{"evil.example:" + port, "resolves to a loopback address"},
		{"mapped.example:443", "IPv4-mapped loopback"},
		{"metadata.example:80", "link-local"},
		{"aws6.example:80", "unique local"},
		{"rebind.example:443", "private"},
		{"host.example:443", "address of the host"},
		{"host64.example:443", "6to4 form of an address of the host"},
		{"public.example:443", "address of the host"},
		{"public64.example:443", "NAT64 form of an address of the host"},
		{"azure.example:80", "cloud host endpoint (Azure WireServer)"},
		{"azure64.example:80", "NAT64 form of a cloud host endpoint"},
		{"bad name.example:443", "name not allowed"},
		{"cgnat.example:443", "CGNAT"},
		{"synthetic.example:443", "synthetic"},
		{"nat64.example:443", "NAT64 form of a private"},
		{"127.0.0.1:" + port, "literal IP"},
		{"[::1]:" + port, "literal IP"},
		{"localhost:" + port, "name not allowed"},
		{"nxdomain.example:443", "name does not resolve"},
	} {
		c, err := g.DialContext(context.Background(), "tcp", tc.addr)
		if tc.reason == "" {
			if err != nil {
				t.Errorf("%s: %v, want connected", tc.addr, err)
				continue
			}
			b, _ := io.ReadAll(c)
			c.Close()
			if string(b) != "hi" {
				t.Errorf("%s: read %q", tc.addr, b)
			}
			continue
		}
		if err == nil {
			c.Close()
			t.Errorf("%s: connected, want refused (%s)", tc.addr, tc.reason)
			continue
		}
		var re *RefusedError
		if !errors.As(err, &re) || !strings.Contains(re.Reason, tc.reason) {
			t.Errorf("%s: %v, want refusal %q", tc.addr, err, tc.reason)
			continue
		}
		wantRule := RuleBlockedAddress
		switch {
		case strings.Contains(tc.reason, "address of the host"):
			wantRule = RuleHostAddress
		case !strings.HasPrefix(re.Reason, "resolves to"):
			wantRule = ""
		}
		if re.Rule != wantRule {
			t.Errorf("%s: rule %q, want %q", tc.addr, re.Rule, wantRule)
		}
	}
	if _, err := g.DialContext(context.Background(), "udp", "test.upstream.example:"+port); err == nil {
		t.Error("udp dial allowed")
	}
}

func TestGuardHostAddrsUnavailableRefuses(t *testing.T) {
	g := guardWith(nil, map[string][]string{"pub.example": {"8.8.8.8"}})
	g.hostAddrs = func() ([]netip.Prefix, error) { return nil, errors.New("netlink down") }
	if _, err := g.DialContext(context.Background(), "tcp", "pub.example:443"); err == nil {
		t.Fatal("dial allowed without knowing the host's addresses")
	}
}

// TestHostAddrsLearnedOffline: in a private network namespace, the guard
// learns a secondary address, an IPv6 address and an AnyIP local route (a
// prefix on no interface) as the host's, without any network access, and
// refuses names resolving to them with the built-in rule named.
func TestHostAddrsLearnedOffline(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // this thread only
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer ns.Close()
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err) // leave the thread locked
		}
		runtime.UnlockOSThread()
	}()

	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	// A veth pair (the dummy driver is not everywhere); both ends stay in
	// the namespace.
	pub := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pub0"}, PeerName: "pub1"}
	if err := netlink.LinkAdd(pub); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(pub); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"203.0.114.10/24", "203.0.114.11/24", "2a00:1450:4001::10/64"} {
		addr, _ := netlink.ParseAddr(a)
		addr.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(pub, addr); err != nil {
			t.Fatalf("add %s: %v", a, err)
		}
	}
	anyIP := &netlink.Route{LinkIndex: lo.Attrs().Index, Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL,
		Scope: netlink.SCOPE_HOST, Dst: &net.IPNet{IP: net.ParseIP("203.0.115.0").To4(), Mask: net.CIDRMask(24, 32)}}
	if err := netlink.RouteAdd(anyIP); err != nil {
		t.Fatal(err)
	}
	addrs, err := netlink.AddrList(pub, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	secondary := false
	for _, a := range addrs {
		secondary = secondary || a.IP.String() == "203.0.114.11" && a.Flags&unix.IFA_F_SECONDARY != 0
	}
	if !secondary {
		t.Fatalf("203.0.114.11 is not a secondary address here: %v", addrs)
	}

	own, err := hostAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"203.0.114.10", "203.0.114.11", "2a00:1450:4001::10", "203.0.115.1", "203.0.115.254", "127.0.0.1"} {
		if !containsAddr(own, netip.MustParseAddr(a)) {
			t.Errorf("learned %v: %s missing", own, a)
		}
	}
	for _, a := range []string{"203.0.114.12", "203.0.116.1", "2a00:1450:4001::11", "8.8.8.8"} {
		if containsAddr(own, netip.MustParseAddr(a)) {
			t.Errorf("learned %v: %s is not the host's", own, a)
		}
	}

	g := New(Config{})
	g.Lookup = func(_ context.Context, host string) ([]netip.Addr, error) {
		m := map[string]string{"sec.example": "203.0.114.11", "v6.example": "2a00:1450:4001::10",
			"anyip.example": "203.0.115.77", "nat64.example": "64:ff9b::cb00:734d"}
		return []netip.Addr{netip.MustParseAddr(m[host])}, nil
	}
	for _, name := range []string{"sec.example", "v6.example", "anyip.example", "nat64.example"} {
		_, err := g.DialContext(context.Background(), "tcp", name+":443")
		var re *RefusedError
		if !errors.As(err, &re) || re.Rule != RuleHostAddress || !strings.Contains(re.Reason, "address of the host") {
			t.Errorf("%s: %v, want refused by %s", name, err, RuleHostAddress)
		}
	}
}

// listenTCP serves handle on a loopback listener closed with the test.
func listenTCP(t *testing.T, handle func(net.Conn)) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return l
}

func addrPort(t *testing.T, a net.Addr) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// TestAllowPrivate: the operator's flag lets a name or a literal address
// reach loopback (a test server), never a metadata endpoint, in any form.
func TestAllowPrivate(t *testing.T) {
	srv := listenTCP(t, func(c net.Conn) { io.WriteString(c, "hi") })
	port := strconv.Itoa(int(addrPort(t, srv.Addr()).Port()))
	g := New(Config{AllowPrivate: true})
	g.Lookup = func(_ context.Context, host string) ([]netip.Addr, error) {
		m := map[string]string{"lan.example": "127.0.0.1", "meta.example": "169.254.169.254", "meta64.example": "64:ff9b::a9fe:a9fe",
			"azure.example": "::ffff:168.63.129.16", "ecs.example": "169.254.170.2"}
		return []netip.Addr{netip.MustParseAddr(m[host])}, nil
	}
	for _, a := range []string{"lan.example:" + port, "127.0.0.1:" + port} {
		c, err := g.DialContext(context.Background(), "tcp", a)
		if err != nil {
			t.Errorf("%s: %v, want connected", a, err)
			continue
		}
		c.Close()
	}
	for _, a := range []string{"meta.example:80", "meta64.example:80", "azure.example:80", "ecs.example:80", "169.254.169.254:80", "[fd00:ec2::254]:80"} {
		c, err := g.DialContext(context.Background(), "tcp", a)
		if err == nil {
			c.Close()
			t.Errorf("%s: connected, want refused", a)
			continue
		}
		if Rule(err) != RuleBlockedAddress || strings.Contains(err.Error(), "169.254") {
			t.Errorf("%s: %v, want %s naming no address", a, err, RuleBlockedAddress)
		}
	}
}
