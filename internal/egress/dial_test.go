package egress

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
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
	}
}

func TestCheckAddrAllows(t *testing.T) {
	for _, s := range []string{
		"8.8.8.8", "1.1.1.1", "93.184.216.34", "172.15.255.255", "172.32.0.1", "100.63.255.255",
		"100.128.0.1", "198.17.255.255", "198.20.0.1", "223.255.255.254",
		"2606:4700:4700::1111", "2a00:1450:4001:82a::200e",
		"::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1",
	} {
		if err := CheckAddr(netip.MustParseAddr(s)); err != nil {
			t.Errorf("%s: %v, want allowed", s, err)
		}
	}
}

func TestInterfaceAddrsIncludeLoopback(t *testing.T) {
	own, err := interfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if !own[netip.MustParseAddr("127.0.0.1")] {
		t.Errorf("host addresses %v lack 127.0.0.1", own)
	}
}

// fakeDNS makes a guard whose resolver answers from a table.
func guardWith(overrides map[string]netip.AddrPort, dns map[string][]string) *guard {
	g := newGuard(overrides, nil)
	g.lookup = func(_ context.Context, host string) ([]netip.Addr, error) {
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
	g.hostAddrs = func() (map[netip.Addr]bool, error) {
		return map[netip.Addr]bool{netip.MustParseAddr("203.0.114.7"): true}, nil
	}
	return g
}

func TestGuardDial(t *testing.T) {
	srv := newTCPServer(t, func(c net.Conn) { io.WriteString(c, "hi") })
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
		}
	}
	if _, err := g.DialContext(context.Background(), "udp", "test.upstream.example:"+port); err == nil {
		t.Error("udp dial allowed")
	}
}

func TestGuardHostAddrsUnavailableRefuses(t *testing.T) {
	g := guardWith(nil, map[string][]string{"pub.example": {"8.8.8.8"}})
	g.hostAddrs = func() (map[netip.Addr]bool, error) { return nil, errors.New("netlink down") }
	if _, err := g.DialContext(context.Background(), "tcp", "pub.example:443"); err == nil {
		t.Fatal("dial allowed without knowing the host's addresses")
	}
}
