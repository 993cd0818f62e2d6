package link

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Test-specific names so the tests never touch a running daemon's links,
// namespaces or table (which use "cbx", 10.201.0.0/16 and "cagebox").
const (
	testTable  = "cagebox_linktest"
	testPrefix = "cbt"
)

var testPool = netip.MustParsePrefix("10.251.0.0/16")

const quiet = 300 * time.Millisecond // how long "nothing arrives" waits

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veth pairs and an nftables table")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		t.Skip("no network namespaces here")
	}
}

// freePorts returns n distinct TCP+UDP ports that are free right now.
func freePorts(t testing.TB, n int) []uint16 {
	t.Helper()
	var out []uint16
	seen := map[uint16]bool{}
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := uint16(l.Addr().(*net.TCPAddr).Port)
		l.Close()
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

type testEnv struct {
	m                  *Manager
	proxyPort, dnsPort uint16
	stateDir           string
}

func newTestManager(t testing.TB, mod func(*Config)) *testEnv {
	t.Helper()
	requireRoot(t)
	ports := freePorts(t, 2)
	cfg := Config{
		Pool:      testPool,
		TableName: testTable,
		IfPrefix:  testPrefix,
		ProxyPort: ports[0],
		DNSPort:   ports[1],
		StateDir:  t.TempDir(),
	}
	if mod != nil {
		mod(&cfg)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	m, err := NewManager(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teardown(t, m) })
	if err := m.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &testEnv{m: m, proxyPort: cfg.ProxyPort, dnsPort: cfg.DNSPort, stateDir: cfg.StateDir}
}

// teardown removes everything a test manager made, even after a failure.
func teardown(t testing.TB, m *Manager) {
	ctx := context.Background()
	if err := m.DestroyAll(ctx); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	if err := m.Close(ctx); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	if err := m.Recover(ctx, func(string) bool { return false }, nil); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

func mustCreate(t testing.TB, m *Manager, id string) *Link {
	t.Helper()
	l, err := m.Create(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// inNS runs fn on a locked OS thread switched into the namespace at path.
// Sockets made by fn live in that namespace.
func inNS(t testing.TB, path string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("cannot return to the host netns: %v", err)) // thread stays locked
		}
		runtime.UnlockOSThread()
	}()
	fn()
}

func dialFrom(t testing.TB, l *Link, network, addr string) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	var err error
	inNS(t, l.NetNSPath, func() {
		d := net.Dialer{Timeout: 2 * time.Second}
		c, err = d.Dial(network, addr)
	})
	return c, err
}

// tcpProbe listens on addr and reports every accepted connection.
type tcpProbe struct {
	ln    net.Listener
	conns chan *net.TCPConn
}

func listenTCP(t testing.TB, addr string) *tcpProbe {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProbe{ln: ln, conns: make(chan *net.TCPConn, 16)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.conns <- c.(*net.TCPConn)
		}
	}()
	return p
}

func (p *tcpProbe) expect(t testing.TB) *net.TCPConn {
	t.Helper()
	select {
	case c := <-p.conns:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(3 * time.Second):
		t.Fatalf("no connection at %s", p.ln.Addr())
		return nil
	}
}

func (p *tcpProbe) expectNone(t testing.TB) {
	t.Helper()
	select {
	case c := <-p.conns:
		c.Close()
		t.Errorf("unexpected connection at %s from %s", p.ln.Addr(), c.RemoteAddr())
	case <-time.After(quiet):
	}
}

// udpProbe reads datagrams on addr; it answers "pong:<payload>".
type udpProbe struct {
	pc  net.PacketConn
	got chan string // "payload from addr"
}

func listenUDP(t testing.TB, addr string) *udpProbe {
	t.Helper()
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &udpProbe{pc: pc, got: make(chan string, 16)}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			p.got <- string(buf[:n]) + " from " + from.String()
			_, _ = pc.WriteTo(append([]byte("pong:"), buf[:n]...), from)
		}
	}()
	return p
}

// expect waits for a datagram whose "payload from addr" starts with prefix.
func (p *udpProbe) expect(t testing.TB, prefix string) {
	t.Helper()
	select {
	case s := <-p.got:
		if !strings.HasPrefix(s, prefix) {
			t.Errorf("at %s got %q, want %q...", p.pc.LocalAddr(), s, prefix)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("nothing arrived at %s", p.pc.LocalAddr())
	}
}

func (p *udpProbe) expectNone(t testing.TB) {
	t.Helper()
	select {
	case s := <-p.got:
		t.Errorf("unexpected datagram at %s: %q", p.pc.LocalAddr(), s)
	case <-time.After(quiet):
	}
}

// sendUDP sends payload from inside l's namespace (optionally from src) and
// returns the reply and its source, or "" after a short wait.
func sendUDP(t testing.TB, l *Link, src netip.Addr, dst, payload string) (reply, from string) {
	t.Helper()
	var pc net.PacketConn
	var err error
	inNS(t, l.NetNSPath, func() {
		laddr := ":0"
		if src.IsValid() {
			laddr = netip.AddrPortFrom(src, 0).String()
		}
		pc, err = net.ListenPacket("udp4", laddr)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ua, err := net.ResolveUDPAddr("udp4", dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pc.WriteTo([]byte(payload), ua); err != nil {
		t.Fatal(err)
	}
	_ = pc.SetReadDeadline(time.Now().Add(quiet))
	buf := make([]byte, 1500)
	n, fa, err := pc.ReadFrom(buf)
	if err != nil {
		return "", ""
	}
	return string(buf[:n]), fa.String()
}

// ping sends one ICMP echo request over a raw socket (made in netnsPath, or
// the host's namespace when "") bound to src and reports whether an echo
// reply from dst came back.
func ping(t testing.TB, netnsPath string, src, dst netip.Addr) bool {
	t.Helper()
	var pc net.PacketConn
	var err error
	listen := func() { pc, err = net.ListenPacket("ip4:icmp", src.String()) }
	if netnsPath == "" {
		listen()
	} else {
		inNS(t, netnsPath, listen)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	id := uint16(os.Getpid())
	msg := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 'c', 'b', 'x'}
	cs := checksum(msg)
	msg[2], msg[3] = byte(cs>>8), byte(cs)
	if _, err := pc.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		if errors.Is(err, unix.EPERM) {
			return false // dropped on output (the host into a link)
		}
		t.Fatal(err)
	}
	deadline := time.Now().Add(quiet)
	buf := make([]byte, 1500)
	for {
		_ = pc.SetReadDeadline(deadline)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return false
		}
		if n >= 8 && buf[0] == 0 && binary.BigEndian.Uint16(buf[4:]) == id && from.String() == dst.String() {
			return true
		}
	}
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// counter returns the packet counter of the idx-th rule of chain that has one.
func counter(t testing.TB, chain string, idx int) uint64 {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := c.GetRules(&nftables.Table{Family: nftables.TableFamilyINet, Name: testTable},
		&nftables.Chain{Name: chain})
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	for _, r := range rules {
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				if i == idx {
					return ctr.Packets
				}
				i++
			}
		}
	}
	t.Fatalf("chain %s has no counter #%d", chain, idx)
	return 0
}

func setElems(t testing.TB, m *Manager) map[string]bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	els, err := c.GetSetElements(m.linksSet())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range els {
		if len(e.Key) != 20 {
			t.Fatalf("set key of %d bytes", len(e.Key))
		}
		name := string(bytes.TrimRight(e.Key[:16], "\x00"))
		out[name+" . "+netip.AddrFrom4([4]byte(e.Key[16:])).String()] = true
	}
	return out
}

func elemName(l *Link) string { return l.HostIf + " . " + l.GuestAddr.String() }

func nftList(t testing.TB) string {
	out, err := exec.Command("nft", "list", "table", "inet", testTable).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("nft list: %v: %s", err, out)
	}
	return string(out)
}

// TestConfinement checks, with two real links, every path out of a sandbox.
func TestConfinement(t *testing.T) {
	env := newTestManager(t, nil)
	m := env.m
	a := mustCreate(t, m, "sandbox-a")
	b := mustCreate(t, m, "sandbox-b")
	t.Logf("A: %s %s gw %s; B: %s %s gw %s", a.HostIf, a.GuestAddr, a.HostAddr, b.HostIf, b.GuestAddr, b.HostAddr)
	t.Logf("nft list table inet %s:\n%s", testTable, nftList(t))

	hp := func(a netip.Addr, p uint16) string { return netip.AddrPortFrom(a, p).String() }
	other := freePorts(t, 3)
	proxyA := listenTCP(t, hp(a.HostAddr, env.proxyPort))
	proxyB := listenTCP(t, hp(b.HostAddr, env.proxyPort))
	dnsTCP := listenTCP(t, hp(a.HostAddr, env.dnsPort))
	dnsUDP := listenUDP(t, hp(a.HostAddr, env.dnsPort))
	dnsUDPB := listenUDP(t, hp(b.HostAddr, env.dnsPort))
	otherTCP := listenTCP(t, hp(a.HostAddr, other[0]))
	otherUDP := listenUDP(t, hp(a.HostAddr, other[1]))
	apiTCP := listenTCP(t, fmt.Sprintf("0.0.0.0:%d", other[2])) // a wildcard host listener, like the daemon's TCP API
	var guestB *tcpProbe
	inNS(t, b.NetNSPath, func() { guestB = listenTCP(t, "0.0.0.0:80") })

	// viaProxy dials dst from A and checks that the connection ends at A's
	// proxy with dst as its original destination.
	viaProxy := func(t *testing.T, dst string) {
		t.Helper()
		c, err := dialFrom(t, a, "tcp", dst)
		if err != nil {
			t.Fatalf("dial %s from A: %v", dst, err)
		}
		defer c.Close()
		sc := proxyA.expect(t)
		// The peer is A's address. Its port is the client's unless the
		// redirect's NAT had to change it: a new connection whose tuple
		// after the redirect clashes with one still in conntrack (an
		// earlier dial from the same port) gets another source port, as
		// happened under load. The proxy identifies sandboxes by address.
		if got := sc.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != a.GuestAddr {
			t.Errorf("proxy sees peer %s, want %s", sc.RemoteAddr(), a.GuestAddr)
		}
		od, err := OriginalDst(sc)
		if err != nil {
			t.Fatal(err)
		}
		if od.String() != dst {
			t.Errorf("OriginalDst = %s, want %s", od, dst)
		}
		if l, ok := m.LookupByAddr(sc.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()); !ok || l.ID != a.ID {
			t.Errorf("LookupByAddr(peer) = %v, %v", l, ok)
		}
		if _, err := sc.Write([]byte("proxy")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "proxy" {
			t.Fatalf("client read %q, %v", buf, err)
		}
	}

	t.Run("tcp to any address reaches the proxy", func(t *testing.T) {
		viaProxy(t, "203.0.113.7:443")
		viaProxy(t, "8.8.8.8:80")
		viaProxy(t, "169.254.169.254:80")
	})
	t.Run("tcp to other host ports is redirected", func(t *testing.T) {
		viaProxy(t, hp(a.HostAddr, 22))
		viaProxy(t, hp(a.HostAddr, other[0]))
		viaProxy(t, hp(a.HostAddr, other[2]))
		otherTCP.expectNone(t)
		apiTCP.expectNone(t)
	})
	t.Run("tcp to another sandbox or its gateway is redirected", func(t *testing.T) {
		viaProxy(t, hp(b.GuestAddr, 80))
		viaProxy(t, hp(b.HostAddr, env.proxyPort))
		guestB.expectNone(t)
		proxyB.expectNone(t)
	})
	t.Run("dns over udp and tcp reaches the resolver", func(t *testing.T) {
		reply, from := sendUDP(t, a, netip.Addr{}, "8.8.8.8:53", "q1")
		dnsUDP.expect(t, "q1 from "+a.GuestAddr.String()+":")
		if reply != "pong:q1" || from != "8.8.8.8:53" {
			t.Fatalf("reply %q from %q", reply, from)
		}
		reply, from = sendUDP(t, a, netip.Addr{}, hp(a.HostAddr, env.dnsPort), "q3")
		dnsUDP.expect(t, "q3 from ")
		if reply != "pong:q3" || from != hp(a.HostAddr, env.dnsPort) {
			t.Fatalf("direct: reply %q from %q", reply, from)
		}
		c, err := dialFrom(t, a, "tcp", "8.8.8.8:53")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sc := dnsTCP.expect(t)
		if od, err := OriginalDst(sc); err != nil || od.String() != "8.8.8.8:53" {
			t.Fatalf("tcp dns OriginalDst = %s, %v", od, err)
		}
		proxyA.expectNone(t)
	})
	t.Run("udp other than dns is dropped", func(t *testing.T) {
		if reply, _ := sendUDP(t, a, netip.Addr{}, hp(a.HostAddr, other[1]), "x"); reply != "" {
			t.Errorf("reply %q", reply)
		}
		otherUDP.expectNone(t)
	})
	t.Run("nothing is forwarded even with forwarding on", func(t *testing.T) {
		// Turn forwarding on for A's host end only (our own interface; the
		// host's setting is untouched), so that only the forward chain
		// stands between A and B.
		if err := writeSysctl("net/ipv4/conf/"+a.HostIf+"/forwarding", "1"); err != nil {
			t.Fatal(err)
		}
		var udpB *udpProbe
		inNS(t, b.NetNSPath, func() { udpB = listenUDP(t, "0.0.0.0:5353") })
		fwd := counter(t, chainForward, 0)
		if reply, _ := sendUDP(t, a, netip.Addr{}, hp(b.GuestAddr, 5353), "to-b"); reply != "" {
			t.Errorf("reply %q", reply)
		}
		udpB.expectNone(t)
		if ping(t, a.NetNSPath, a.GuestAddr, b.GuestAddr) {
			t.Error("A pinged B")
		}
		if got := counter(t, chainForward, 0); got < fwd+2 {
			t.Errorf("forward drop counter %d -> %d, want +2", fwd, got)
		}
	})
	t.Run("dns port of another gateway is dropped", func(t *testing.T) {
		if reply, _ := sendUDP(t, a, netip.Addr{}, hp(b.HostAddr, env.dnsPort), "x"); reply != "" {
			t.Errorf("reply %q", reply)
		}
		dnsUDPB.expectNone(t)
		// While B itself reaches it.
		if reply, _ := sendUDP(t, b, netip.Addr{}, hp(b.HostAddr, env.dnsPort), "y"); reply != "pong:y" {
			t.Errorf("B to its own resolver: %q", reply)
		}
		dnsUDPB.expect(t, "y from "+b.GuestAddr.String()+":")
	})
	t.Run("icmp to the host is dropped", func(t *testing.T) {
		if ping(t, a.NetNSPath, a.GuestAddr, a.HostAddr) {
			t.Error("sandbox pinged its gateway")
		}
		if ping(t, a.NetNSPath, a.GuestAddr, b.GuestAddr) {
			t.Error("sandbox pinged another sandbox")
		}
		// Nothing new enters a link from the host either (only the
		// daemon's marked ingress connections to published ports).
		if ping(t, "", a.HostAddr, a.GuestAddr) {
			t.Error("host pinged into the sandbox")
		}
	})
	t.Run("inbound only marked connections to published ports", func(t *testing.T) {
		var guestA, guestA2 *tcpProbe
		inNS(t, a.NetNSPath, func() {
			guestA = listenTCP(t, "0.0.0.0:8080")
			guestA2 = listenTCP(t, "0.0.0.0:8081")
		})
		dial := func(mark uint32, dst netip.Addr, port uint16) error {
			d := net.Dialer{Timeout: quiet}
			if mark != 0 {
				d.Control = func(_, _ string, c syscall.RawConn) error {
					var serr error
					_ = c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark)) })
					return serr
				}
			}
			c, err := d.Dial("tcp", hp(dst, port))
			if err == nil {
				c.Close()
			}
			return err
		}
		mark := m.IngressMark()
		if err := dial(0, a.GuestAddr, 8080); err == nil {
			t.Error("unmarked host connection into an unpublished port connected")
		}
		if err := dial(mark, a.GuestAddr, 8080); err == nil {
			t.Error("marked connection to an unpublished port connected")
		}
		if err := m.SetPublished(a.ID, []uint16{8080}); err != nil {
			t.Fatal(err)
		}
		if err := dial(mark, a.GuestAddr, 8080); err != nil {
			t.Errorf("marked connection to the published port: %v", err)
		} else {
			guestA.expect(t)
		}
		if err := dial(0, a.GuestAddr, 8080); err == nil {
			t.Error("unmarked connection to a published port connected")
		}
		if err := dial(mark, a.GuestAddr, 8081); err == nil {
			t.Error("marked connection to another, unpublished port connected")
		}
		guestA2.expectNone(t)
		// A's published port opens nothing on B.
		if err := dial(mark, b.GuestAddr, 8080); err == nil {
			t.Error("marked connection to B on A's published port connected")
		}
		if err := m.SetPublished(a.ID, nil); err != nil {
			t.Fatal(err)
		}
		if err := dial(mark, a.GuestAddr, 8080); err == nil {
			t.Error("marked connection after unpublishing connected")
		}
		if l, _ := m.Get(a.ID); len(l.Published) != 0 {
			t.Errorf("Published = %v after unpublishing", l.Published)
		}
	})
	t.Run("spoofed source is dropped", func(t *testing.T) {
		// Give A's eth0 B's address too, then send from it.
		inNS(t, a.NetNSPath, func() {
			eth, err := netlink.LinkByName("eth0")
			if err != nil {
				t.Fatal(err)
			}
			addr := &netlink.Addr{IPNet: ipNet(b.GuestAddr, 32)}
			if err := netlink.AddrAdd(eth, addr); err != nil {
				t.Fatal(err)
			}
		})
		before := counter(t, chainSpoof, 1)
		if reply, _ := sendUDP(t, a, b.GuestAddr, hp(a.HostAddr, env.dnsPort), "spoof"); reply != "" {
			t.Errorf("reply to spoofed packet %q", reply)
		}
		dnsUDP.expectNone(t)
		if _, err := dialFrom(t, a, "tcp", "203.0.113.9:80"); err != nil {
			t.Fatal(err) // from A's own address: fine
		}
		proxyA.expect(t)
		inNS(t, a.NetNSPath, func() {
			d := net.Dialer{Timeout: quiet, LocalAddr: &net.TCPAddr{IP: b.GuestAddr.AsSlice()}}
			if c, err := d.Dial("tcp", "203.0.113.9:80"); err == nil {
				c.Close()
				t.Error("spoofed TCP connected")
			}
		})
		proxyA.expectNone(t)
		if after := counter(t, chainSpoof, 1); after < before+2 {
			t.Errorf("antispoof counter %d -> %d, want at least +2", before, after)
		}
	})
	t.Cleanup(func() { t.Logf("after the traffic above:\n%s", nftList(t)) })
	t.Run("ipv6 disabled", func(t *testing.T) {
		if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
			t.Skip("no IPv6 on this host")
		}
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + a.HostIf + "/disable_ipv6")
		if err != nil || strings.TrimSpace(string(b)) != "1" {
			t.Errorf("host end disable_ipv6 = %q, %v", b, err)
		}
		inNS(t, a.NetNSPath, func() {
			for _, f := range []string{"all", "default", "eth0"} {
				b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + f + "/disable_ipv6")
				if err != nil || strings.TrimSpace(string(b)) != "1" {
					t.Errorf("guest %s disable_ipv6 = %q, %v", f, b, err)
				}
			}
		})
	})
}

func TestDestroyLeavesNothing(t *testing.T) {
	env := newTestManager(t, nil)
	m := env.m
	l := mustCreate(t, m, "doomed")
	if _, err := netlink.LinkByName(l.HostIf); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.NetNSPath); err != nil {
		t.Fatal(err)
	}
	if !setElems(t, m)[elemName(l)] {
		t.Fatalf("set element %s missing: %v", elemName(l), setElems(t, m))
	}
	state, _ := os.ReadFile(filepath.Join(env.stateDir, stateFile))
	if !strings.Contains(string(state), `"doomed"`) {
		t.Fatalf("state file lacks the link: %s", state)
	}
	if err := m.Destroy(context.Background(), "doomed"); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(l.HostIf); err == nil {
		t.Error("veth still there")
	}
	if _, err := os.Stat(l.NetNSPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns file: %v", err)
	}
	if els := setElems(t, m); len(els) != 0 {
		t.Errorf("set elements left: %v", els)
	}
	state, _ = os.ReadFile(filepath.Join(env.stateDir, stateFile))
	if strings.Contains(string(state), `"doomed"`) {
		t.Errorf("state file still has the link: %s", state)
	}
	if _, ok := m.Get("doomed"); ok {
		t.Error("Get still finds it")
	}
	if _, ok := m.LookupByAddr(l.GuestAddr); ok {
		t.Error("LookupByAddr still finds it")
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), filepath.Base(l.NetNSPath)) {
		t.Errorf("ip netns list still shows it: %s", out)
	}
	if err := m.Destroy(context.Background(), "doomed"); err != nil {
		t.Errorf("second destroy: %v", err)
	}
	if err := m.Destroy(context.Background(), "never-existed"); err != nil {
		t.Errorf("destroy of unknown id: %v", err)
	}
	// The /30 is free again.
	if l2 := mustCreate(t, m, "next"); l2.Prefix != l.Prefix {
		t.Errorf("prefix not reused: %s then %s", l.Prefix, l2.Prefix)
	}
}

func TestInitReplacesStaleTable(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft CLI not installed")
	}
	_ = exec.Command("nft", "delete", "table", "inet", testTable).Run()
	for _, args := range [][]string{
		{"add", "table", "inet", testTable},
		{"add", "chain", "inet", testTable, "dummy"},
		{"add", "rule", "inet", testTable, "dummy", "counter"},
	} {
		if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
			t.Fatalf("nft %v: %v: %s", args, err, out)
		}
	}
	env := newTestManager(t, nil) // runs Init
	listing := nftList(t)
	if strings.Contains(listing, "dummy") {
		t.Fatalf("stale chain survived Init:\n%s", listing)
	}
	for _, want := range []string{"chain antispoof", "chain redirect", "chain input", "chain forward", "set links"} {
		if !strings.Contains(listing, want) {
			t.Errorf("table lacks %q:\n%s", want, listing)
		}
	}
	// Init again, with a link: the element survives the rebuild.
	l := mustCreate(t, env.m, "survivor")
	if err := env.m.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !setElems(t, env.m)[elemName(l)] {
		t.Error("element lost on re-Init")
	}
}

func TestCloseFailsClosed(t *testing.T) {
	env := newTestManager(t, nil)
	m := env.m
	l := mustCreate(t, m, "outlives-daemon")
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, _ := nftables.New()
	if tb, err := c.ListTableOfFamily(testTable, nftables.TableFamilyINet); err == nil && tb != nil {
		t.Fatal("table still present after Close")
	}
	hl, err := netlink.LinkByName(l.HostIf)
	if err != nil {
		t.Fatal(err)
	}
	if hl.Attrs().Flags&net.FlagUp != 0 {
		t.Error("host end still up without the table")
	}
	if _, err := m.Create(context.Background(), "x"); !errors.Is(err, ErrNotReady) {
		t.Errorf("Create after Close: %v", err)
	}
	if err := m.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	hl, _ = netlink.LinkByName(l.HostIf)
	if hl.Attrs().Flags&net.FlagUp == 0 {
		t.Error("host end not up after Init")
	}
	if !setElems(t, m)[elemName(l)] {
		t.Error("element not restored by Init")
	}
	proxy := listenTCP(t, netip.AddrPortFrom(l.HostAddr, env.proxyPort).String())
	c2, err := dialFrom(t, l, "tcp", "192.0.2.1:443")
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
	proxy.expect(t)
}

func TestRecover(t *testing.T) {
	env := newTestManager(t, nil)
	m1 := env.m
	keep := mustCreate(t, m1, "alive")
	gone := mustCreate(t, m1, "gone")

	// A sandbox of ours whose link was plumbed but never recorded (a crash
	// inside Create): its names derive from its id.
	crashedIf, crashedNS := m1.names("crashed")
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: crashedIf}, PeerName: "cbtcrashpeer"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteVeth(crashedIf) })
	if err := createNetNS(crashedNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteNetNS(crashedNS) })

	// Look-alikes: a veth and a namespace with our naming that belong to
	// no sandbox of this daemon (another process's): never removed.
	strayIf := testPrefix + "00000000beef"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: strayIf}, PeerName: "cbtstraypeer"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteVeth(strayIf) })
	strayNS := filepath.Join(DefaultNetNSDir, testPrefix+"-00000000beef")
	if err := createNetNS(strayNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteNetNS(strayNS) })

	// "Restart": a new manager over the same state, like a daemon after a crash.
	cfg := m1.Config()
	m2, err := NewManager(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teardown(t, m2) })
	if _, ok := m2.Get("gone"); !ok {
		t.Fatal("allocations not reloaded")
	}
	if err := m2.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m2.Recover(context.Background(), func(id string) bool { return id == "alive" }, []string{"alive", "gone", "crashed", "never-plumbed"}); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(gone.HostIf); err == nil {
		t.Error("gone sandbox's veth kept")
	}
	if _, err := os.Stat(gone.NetNSPath); err == nil {
		t.Error("gone sandbox's netns kept")
	}
	if _, err := netlink.LinkByName(crashedIf); err == nil {
		t.Error("the unrecorded veth of a sandbox of ours kept")
	}
	if _, err := os.Stat(crashedNS); err == nil {
		t.Error("the unrecorded netns of a sandbox of ours kept")
	}
	if _, err := netlink.LinkByName(strayIf); err != nil {
		t.Errorf("a veth that is not ours was removed: %v", err)
	}
	if _, err := os.Stat(strayNS); err != nil {
		t.Errorf("a netns that is not ours was removed: %v", err)
	}
	if _, err := netlink.LinkByName(keep.HostIf); err != nil {
		t.Errorf("kept sandbox lost its veth: %v", err)
	}
	if _, err := os.Stat(keep.NetNSPath); err != nil {
		t.Errorf("kept sandbox lost its netns: %v", err)
	}
	if els := setElems(t, m2); len(els) != 1 || !els[elemName(keep)] {
		t.Errorf("set elements after recover: %v", els)
	}
	state, _ := os.ReadFile(filepath.Join(env.stateDir, stateFile))
	if strings.Contains(string(state), `"gone"`) || !strings.Contains(string(state), `"alive"`) {
		t.Errorf("state after recover: %s", state)
	}
	// A new link does not take the kept one's /30.
	if l := mustCreate(t, m2, "new"); l.Prefix == keep.Prefix {
		t.Error("kept prefix reallocated")
	}
	// m1 is stale now; make its cleanup a no-op for links m2 owns.
	m1.mu.Lock()
	for _, l := range m1.links {
		m1.forgetLocked(l)
	}
	m1.mu.Unlock()
}

func TestCreateUndoesOnFailure(t *testing.T) {
	env := newTestManager(t, nil)
	m := env.m
	hostIf, nsPath := m.names("clash")
	// Occupy the interface name so the veth cannot be made.
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: "cbtclashpeer"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(hostIf); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	if _, err := m.Create(context.Background(), "clash"); err == nil {
		t.Fatal("Create succeeded over an existing interface")
	}
	if _, err := os.Stat(nsPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns left behind: %v", err)
	}
	if l, err := netlink.LinkByName(hostIf); err != nil || l.Type() != "veth" {
		t.Errorf("the pre-existing interface was touched: %v", err)
	}
	if len(setElems(t, m)) != 0 || len(m.List()) != 0 {
		t.Error("allocation or element left behind")
	}
	m.mu.Lock()
	n := len(m.used) + len(m.ifs) + len(m.busy)
	m.mu.Unlock()
	if n != 0 {
		t.Errorf("reservations left: %d", n)
	}
}

func TestPoolExhausted(t *testing.T) {
	env := newTestManager(t, func(c *Config) { c.Pool = netip.MustParsePrefix("10.251.255.0/29") })
	m := env.m
	mustCreate(t, m, "one")
	mustCreate(t, m, "two")
	if _, err := m.Create(context.Background(), "three"); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("want ErrPoolExhausted, got %v", err)
	}
	if _, err := m.Create(context.Background(), "one"); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate id: want ErrExists, got %v", err)
	}
}

func TestConcurrentCreate(t *testing.T) {
	env := newTestManager(t, nil)
	m := env.m
	const n = 10
	links := make([]*Link, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			links[i], errs[i] = m.Create(context.Background(), fmt.Sprintf("par-%d", i))
		}()
	}
	wg.Wait()
	prefixes := map[netip.Prefix]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if prefixes[links[i].Prefix] {
			t.Fatalf("prefix %s handed out twice", links[i].Prefix)
		}
		prefixes[links[i].Prefix] = true
	}
	if got := len(setElems(t, m)); got != n {
		t.Errorf("%d set elements, want %d", got, n)
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.Destroy(context.Background(), links[i].ID)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("destroy %d: %v", i, errs[i])
		}
	}
	if len(m.List()) != 0 || len(setElems(t, m)) != 0 {
		t.Error("links left after parallel destroy")
	}
}

func BenchmarkCreateDestroy(b *testing.B) {
	env := newTestManager(b, nil)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("bench-%d", i)
		if _, err := env.m.Create(ctx, id); err != nil {
			b.Fatal(err)
		}
		if err := env.m.Destroy(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRecoverRemakesVanishedLinks: a host reboot takes every veth and
// namespace; a daemon that starts again makes the links of the sandboxes
// it keeps (a hibernated microVM's) again, with the same names and
// addresses, confined as before (the proxy on the gateway answers, the
// set holds the link).
func TestRecoverRemakesVanishedLinks(t *testing.T) {
	env := newTestManager(t, nil)
	m1 := env.m
	l := mustCreate(t, m1, "hibernated")
	// The reboot.
	if err := deleteVeth(l.HostIf); err != nil {
		t.Fatal(err)
	}
	if err := deleteNetNS(l.NetNSPath); err != nil {
		t.Fatal(err)
	}
	m2, err := NewManager(m1.Config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// m1 is stale; its cleanup must not touch what m2 owns.
	m1.mu.Lock()
	for _, x := range m1.links {
		m1.forgetLocked(x)
	}
	m1.mu.Unlock()
	t.Cleanup(func() { teardown(t, m2) })
	if err := m2.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m2.Recover(context.Background(), func(string) bool { return true }, []string{"hibernated"}); err != nil {
		t.Fatal(err)
	}
	got, ok := m2.Get("hibernated")
	if !ok || got.HostAddr != l.HostAddr || got.GuestAddr != l.GuestAddr || got.HostIf != l.HostIf {
		t.Fatalf("link after recover: %+v, want %+v", got, l)
	}
	hl, err := netlink.LinkByName(l.HostIf)
	if err != nil {
		t.Fatalf("veth not made again: %v", err)
	}
	addrs, _ := netlink.AddrList(hl, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IP.String() != l.HostAddr.String() {
		t.Errorf("host end's addresses %v, want %s", addrs, l.HostAddr)
	}
	if !setElems(t, m2)[elemName(l)] {
		t.Error("the link is not in the table's set")
	}
	proxy := listenTCP(t, netip.AddrPortFrom(l.HostAddr, env.proxyPort).String())
	c, err := dialFrom(t, l, "tcp", "192.0.2.1:443")
	if err != nil {
		t.Fatalf("guest → anything (redirected to the proxy) after the link was made again: %v", err)
	}
	defer c.Close()
	proxy.expect(t).Close()
}
