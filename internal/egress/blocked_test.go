package egress

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBlockedDestinations: through the real proxy, a name the policy allows
// whose address is Azure's host endpoint, an IPv6 form of it, a metadata
// address or the host's public address behind 1:1 NAT (Config.HostAddrs,
// the daemon's --host-public-addr) is refused with the built-in rule named —
// over intercepted TLS, plain HTTP and raw TCP — without the address in the
// answer. An explicit Resolve override still reaches its loopback upstream,
// for its own host:port only, whatever the name resolves to.
func TestBlockedDestinations(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.HostAddrs = []netip.Prefix{netip.MustParsePrefix("203.0.114.7/32"), netip.MustParsePrefix("2a00:1450:4001::/64")}
	})
	var mu sync.Mutex
	var answer []netip.Addr
	lookups := 0
	h.p.guard.Lookup = func(context.Context, string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		lookups++
		return answer, nil
	}
	resolveTo := func(as ...string) {
		mu.Lock()
		defer mu.Unlock()
		answer = nil
		for _, a := range as {
			answer = append(answer, netip.MustParseAddr(a))
		}
	}
	h.setPolicy(func(_ context.Context, r *Request) (Decision, error) {
		return Decision{Allow: true, Rule: "allow-all"}, nil
	})

	for _, tc := range []struct {
		addrs        []string
		rule, reason string
	}{
		{[]string{"168.63.129.16"}, RuleBlockedAddress, "resolves to a cloud host endpoint (Azure WireServer) address"},
		{[]string{"::ffff:168.63.129.16"}, RuleBlockedAddress, "IPv4-mapped cloud host endpoint (Azure WireServer)"},
		{[]string{"64:ff9b::a83f:8110"}, RuleBlockedAddress, "NAT64 form of a cloud host endpoint (Azure WireServer)"},
		{[]string{"93.184.216.34", "168.63.129.16"}, RuleBlockedAddress, "cloud host endpoint (Azure WireServer)"},
		{[]string{"169.254.169.254"}, RuleBlockedAddress, "link-local"},
		{[]string{"203.0.114.7"}, RuleHostAddress, "resolves to an address of the host"},
		{[]string{"::ffff:203.0.114.7"}, RuleHostAddress, "resolves to an address of the host"},
		{[]string{"2002:cb00:7207::1"}, RuleHostAddress, "6to4 form of an address of the host"},
		{[]string{"2a00:1450:4001::99"}, RuleHostAddress, "resolves to an address of the host"},
	} {
		resolveTo(tc.addrs...)
		check := func(proto string, resp *http.Response, body string) {
			t.Helper()
			var d map[string]string
			if resp.StatusCode != http.StatusBadGateway || json.Unmarshal([]byte(body), &d) != nil {
				t.Fatalf("%s %v: status %d body %q", proto, tc.addrs, resp.StatusCode, body)
			}
			if d["rule"] != tc.rule || resp.Header.Get("X-Cagebox-Denied") != tc.rule || !strings.Contains(d["error"], tc.reason) {
				t.Errorf("%s %v: header %q body %q; want rule %s, reason %q", proto, tc.addrs, resp.Header.Get("X-Cagebox-Denied"), body, tc.rule, tc.reason)
			}
			for _, a := range tc.addrs {
				if strings.Contains(body, a) {
					t.Errorf("%s: body leaks the address: %q", proto, body)
				}
			}
			ev := h.waitEvents(1)
			if len(ev) != 1 || ev[0].Rule != tc.rule || ev[0].Verdict != VerdictError || !strings.Contains(ev[0].Reason, tc.reason) {
				t.Errorf("%s %v: events %+v", proto, tc.addrs, ev)
			}
		}
		// Intercepted TLS to a port without an override.
		h.setDst(netip.AddrPortFrom(dstAPI.Addr(), 8443))
		resp, body := get(t, h.client(false), newReq(t, "GET", "https://api.example.test:8443/", nil))
		check("https", resp, body)
		// Plain HTTP to a port without an override.
		h.setDst(netip.AddrPortFrom(dstPlain.Addr(), 8080))
		resp, body = get(t, h.client(false), newReq(t, "GET", "http://plain.example.test:8080/", nil))
		check("http", resp, body)
		// Raw TCP: closed without a byte, the event names the rule.
		h.setDst(netip.AddrPortFrom(dstTCP.Addr(), 6000))
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "\x00\x00\x00\x08hello")
		if b, _ := io.ReadAll(c); len(b) != 0 {
			t.Errorf("tcp %v: read %q", tc.addrs, b)
		}
		c.Close()
		ev := h.waitEvents(1)
		if len(ev) != 1 || ev[0].Rule != tc.rule || ev[0].Verdict != VerdictError || !strings.Contains(ev[0].Reason, tc.reason) {
			t.Errorf("tcp %v: events %+v", tc.addrs, ev)
		}
	}
	if n := len(h.api.seen()) + len(h.plain.seen()); n != 0 {
		t.Fatalf("upstreams saw %d requests", n)
	}

	// The overrides: the same names on their own host:port reach their
	// loopback upstreams, in any case and with a trailing dot, without a
	// lookup — even while the names resolve to a blocked address.
	resolveTo("168.63.129.16")
	mu.Lock()
	lookups = 0
	mu.Unlock()
	h.setDst(dstAPI)
	for _, u := range []string{"https://api.example.test/", "https://API.Example.Test./"} {
		resp, body := get(t, h.client(false), newReq(t, "GET", u, nil))
		if resp.StatusCode != 200 || !strings.HasPrefix(body, "hello from upstream") {
			t.Errorf("override %s: status %d body %q", u, resp.StatusCode, body)
		}
	}
	h.setDst(dstPlain)
	resp, body := get(t, h.client(false), newReq(t, "GET", "http://plain.example.test/", nil))
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "hello from upstream") {
		t.Errorf("plain override: status %d body %q", resp.StatusCode, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if lookups != 0 {
		t.Errorf("%d lookups for overridden names", lookups)
	}
}
