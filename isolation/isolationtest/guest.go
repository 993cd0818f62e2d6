package isolationtest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/rootfs"
	"github.com/cagebox/cagebox/internal/testpki"
	"github.com/cagebox/cagebox/isolation"
)

// guestFilesNameserver is the suite's main sandbox's DNS server (it has no
// network; only its resolv.conf says so).
const guestFilesNameserver = "192.0.2.53"

// testCA is a CA certificate (PEM) for a guest to trust.
func testCA(t testing.TB) []byte {
	t.Helper()
	pki, err := testpki.New(time.Hour, "conformance.test")
	if err != nil {
		t.Fatal(err)
	}
	return pki.CAPEM
}

// guestFiles checks the files every guest finds about itself (see
// rootfs.Guest), whichever side of the runtime writes them: g was started
// with hostname "conformance", guestFilesNameserver and caPEM.
func guestFiles(t *testing.T, g *Guest, o Options, caPEM []byte) {
	// The image's own bundle (if any) must stay in the guest's, with the
	// CA added.
	bundle := ""
	if b, err := os.ReadFile(filepath.Join(o.RootFS, rootfs.SystemBundle)); err == nil {
		bundle = string(b)
		if bundle != "" && !strings.HasSuffix(bundle, "\n") {
			bundle += "\n"
		}
	}
	bundle += string(caPEM)
	for _, f := range []struct{ path, want string }{
		{"/etc/hostname", "conformance\n"},
		{"/etc/hosts", "127.0.0.1\tlocalhost conformance\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		{"/etc/resolv.conf", "nameserver " + guestFilesNameserver + "\noptions ndots:0 attempts:2 timeout:2\n"},
		{isolation.GuestCAPath, string(caPEM)},
		{isolation.GuestCABundlePath, bundle},
		{isolation.GuestSystemBundle, bundle},
	} {
		out, errOut, res := g.Exec(t, "cat", f.path)
		if res.ExitCode != 0 || out != f.want {
			t.Errorf("guest %s = %q (exit %d %s), want %q", f.path, out, res.ExitCode, errOut, f.want)
		}
	}
	// The environment that points clients at the bundle names files that
	// exist.
	for _, kv := range isolation.CAEnv() {
		_, p, _ := strings.Cut(kv, "=")
		if _, _, res := g.Exec(t, "test", "-s", p); res.ExitCode != 0 {
			t.Errorf("%s: no such file in the guest", kv)
		}
	}
}

// Link is a routed link like the daemon's: a network namespace holding
// eth0 with Guest/Prefix and a default route via Host, the other end of a
// veth on the host.
type Link struct {
	NSName, NSPath, HostIf string
	Guest, Host            netip.Addr
	Prefix                 netip.Prefix
}

// NewLink makes a link on a random /30 of 10.253.0.0/16 (not the
// daemon's pool); cleanup removes it.
func NewLink(t testing.TB, runtime string) *Link {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		Unavailable(t, runtime, "ip (iproute2) is not installed: run scripts/setup.sh")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	// Third octets 0 to 2 are left to tests that use fixed links.
	base := netip.AddrFrom4([4]byte{10, 253, 3 + b[0]%250, b[1] % 64 * 4})
	name := "cbn" + hex.EncodeToString(b[2:])
	l := &Link{
		NSName: name, NSPath: "/run/netns/" + name, HostIf: name,
		Host: base.Next(), Guest: base.Next().Next(),
		Prefix: netip.PrefixFrom(base, 30),
	}
	// Registered first: runs even if a step below fails.
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", l.HostIf).Run()
		_ = exec.Command("ip", "netns", "del", l.NSName).Run()
		if _, err := os.Stat(l.NSPath); err == nil {
			t.Errorf("netns %s left behind", l.NSPath)
		}
	})
	bits := "/" + strconv.Itoa(l.Prefix.Bits())
	for _, c := range [][]string{
		{"netns", "add", l.NSName},
		{"link", "add", l.HostIf, "type", "veth", "peer", "name", "eth0", "netns", l.NSName},
		{"addr", "add", l.Host.String() + bits, "dev", l.HostIf},
		{"link", "set", l.HostIf, "up"},
		{"-n", l.NSName, "link", "set", "lo", "up"},
		{"-n", l.NSName, "addr", "add", l.Guest.String() + bits, "dev", "eth0"},
		{"-n", l.NSName, "link", "set", "eth0", "up"},
		{"-n", l.NSName, "route", "add", "default", "via", l.Host.String()},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	return l
}

// Join sets spec's network fields to put the sandbox on l, with its
// resolver on the host end.
func (l *Link) Join(spec *isolation.Spec) {
	spec.NetNS, spec.GuestIf = l.NSPath, "eth0"
	spec.GuestAddr, spec.Gateway, spec.Prefix = l.Guest, l.Host, l.Prefix
	spec.Nameserver = l.Host.String()
}

// network gives a guest a routed link and checks that it reaches a TCP
// server on the host end from its own address, sees its interface, and
// has the link's resolver and the spec's CA; a guest with a kernel of its
// own (not the host's) must own the address, so the namespace's eth0 no
// longer holds it.
func network(t *testing.T, rt isolation.Runtime, o Options) {
	l := NewLink(t, rt.Name())
	ln, err := net.Listen("tcp4", net.JoinHostPort(l.Host.String(), "0"))
	if err != nil {
		t.Fatalf("listen on the host end: %v", err)
	}
	defer ln.Close()
	peers := make(chan string, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case peers <- c.RemoteAddr().String():
			default:
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Write([]byte("host got " + line))
			c.Close()
		}
	}()
	caPEM := testCA(t)
	g := StartSpec(t, rt, o, func(s *isolation.Spec) {
		l.Join(s)
		s.Hostname, s.TrustedCAPEM = "net", caPEM
	})

	port := ln.Addr().(*net.TCPAddr).Port
	out, errOut, res := g.Exec(t, "sh", "-c", "echo hello | nc "+l.Host.String()+" "+strconv.Itoa(port))
	if res.ExitCode != 0 || out != "host got hello\n" {
		t.Fatalf("guest to host TCP: exit %d, out %q, err %q", res.ExitCode, out, errOut)
	}
	select {
	case peer := <-peers:
		if host, _, _ := net.SplitHostPort(peer); host != l.Guest.String() {
			t.Errorf("connection came from %s, want the guest address %s", peer, l.Guest)
		}
	case <-time.After(5 * time.Second):
		t.Error("the host server saw no connection")
	}
	out, _, _ = g.Exec(t, "cat", "/proc/net/dev")
	if !strings.Contains(out, "eth0:") {
		t.Errorf("guest has no eth0:\n%s", out)
	}
	out, _, _ = g.Exec(t, "cat", "/etc/resolv.conf")
	if !strings.HasPrefix(out, "nameserver "+l.Host.String()+"\n") {
		t.Errorf("/etc/resolv.conf = %q, want nameserver %s", out, l.Host)
	}
	out, _, _ = g.Exec(t, "cat", isolation.GuestCAPath)
	if out != string(caPEM) {
		t.Errorf("%s = %q, want the spec's CA", isolation.GuestCAPath, out)
	}
	out, _, _ = g.Exec(t, "cat", isolation.GuestCABundlePath)
	if !strings.HasSuffix(out, string(caPEM)) {
		t.Errorf("%s lacks the spec's CA: %q", isolation.GuestCABundlePath, out)
	}
	if rt.Class() > isolation.Namespaces {
		b, err := exec.Command("ip", "-n", l.NSName, "-4", "addr", "show", "dev", "eth0").CombinedOutput()
		if err != nil || strings.Contains(string(b), " "+l.Guest.String()+"/") {
			t.Errorf("the namespace's eth0 still holds the guest address (the host kernel would answer for the guest): %s %v", b, err)
		}
	}
}

// recoverSandbox re-attaches to a paused sandbox from its State with a new
// runtime (o.Restarted), as a restarted daemon does: the guest keeps its
// state and answers, pauses and resumes; a graceful stop ends it well
// within its grace (the agent exits on SIGTERM); recovering it then says it
// is gone and cleans up.
func recoverSandbox(t *testing.T, rt isolation.Runtime, o Options) {
	rt2 := rt
	if o.Restarted != nil {
		rt2 = o.Restarted()
	}
	g := Start(t, rt, o, isolation.Resources{})
	g.Exec(t, "sh", "-c", "echo kept > /tmp/mark")
	// The old daemon's connection ends with it.
	g.Client.Close()
	g.Client = nil
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := g.Sandbox.Pause(ctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	st := g.Sandbox.State()
	if st.ID != g.Sandbox.ID() || st.Runtime != rt.Name() {
		t.Fatalf("state %+v of sandbox %s of runtime %s", st, g.Sandbox.ID(), rt.Name())
	}
	sb, err := rt2.Recover(ctx, st)
	if err != nil {
		t.Fatalf("recover a paused sandbox: %v", err)
	}
	if sb.ID() != st.ID {
		t.Fatalf("recovered sandbox %s, want %s", sb.ID(), st.ID)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatalf("resume the recovered sandbox: %v", err)
	}
	c := Connect(t, ctx, sb, g.Token)
	g2 := &Guest{Sandbox: sb, Client: c, Token: g.Token}
	if out, _, _ := g2.Exec(t, "cat", "/tmp/mark"); out != "kept\n" {
		t.Fatalf("recovered sandbox lost its state: %q", out)
	}
	if err := sb.Pause(ctx); err != nil {
		t.Fatalf("pause after recover: %v", err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatalf("resume after recover: %v", err)
	}
	if out, _, _ := g2.Exec(t, "echo", "recovered"); out != "recovered\n" {
		t.Fatalf("exec after recover: %q", out)
	}
	c.Close()

	const grace = 20 * time.Second
	start := time.Now()
	if err := sb.Stop(ctx, grace); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if d := time.Since(start); d > grace*3/4 {
		t.Errorf("stop took %v of its %v grace: the agent did not end the guest on SIGTERM", d, grace)
	}
	if _, err := rt2.Recover(ctx, st); !errors.Is(err, isolation.ErrGone) {
		t.Fatalf("recover a stopped sandbox: %v, want ErrGone", err)
	}
	if lc, ok := sb.(isolation.LeakChecker); ok {
		if left := lc.Leftovers(ctx); len(left) > 0 {
			t.Fatalf("recover of a stopped sandbox left things behind: %q", left)
		}
	}
}
