package link

import (
	"net"
	"runtime"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// TestOriginalDst redirects loopback connections (IPv4 and IPv6) inside a
// private network namespace and recovers their original destination.
func TestOriginalDst(t *testing.T) {
	requireRoot(t)
	const origPort, listenPort = 7777, 8888
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // this thread only; freed when nothing uses it
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
	if err := writeSysctl("net/ipv6/conf/lo/disable_ipv6", "0"); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tb := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "t"})
	ch := c.AddChain(&nftables.Chain{Name: "out", Table: tb, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	var ex []expr.Any
	ex = append(ex, l4(6)...)
	ex = append(ex, dport(origPort)...)
	ex = append(ex, redirect(listenPort)...)
	c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: ex})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct{ network, listen, dial string }{
		{"tcp4", "127.0.0.1:8888", "127.0.0.1:7777"},
		{"tcp6", "[::1]:8888", "[::1]:7777"},
		{"tcp", "[::]:8888", "127.0.0.1:7777"}, // dual-stack listener, v4-mapped peer
	} {
		ln, err := net.Listen(tc.network, tc.listen)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := net.Dial("tcp", tc.dial)
		if err != nil {
			ln.Close()
			t.Fatalf("%s: %v", tc.dial, err)
		}
		sc, err := ln.Accept()
		ln.Close()
		if err != nil {
			t.Fatal(err)
		}
		got, err := OriginalDst(sc.(*net.TCPConn))
		sc.Close()
		cc.Close()
		if err != nil {
			t.Errorf("%s via %s: %v", tc.dial, tc.listen, err)
			continue
		}
		if got.String() != tc.dial {
			t.Errorf("%s via %s: OriginalDst = %s", tc.dial, tc.listen, got)
		}
	}
}
