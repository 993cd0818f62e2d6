package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cagebox/cagebox/internal/vmimage"
	"github.com/cagebox/cagebox/internal/vmnet"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/isolationtest"
)

// TestConformance runs the suite wherever /dev/kvm and the firecracker and
// jailer binaries exist (see docs/operator.md); here it skips saying why.
func TestConformance(t *testing.T) {
	rt := New(Options{Dir: vmimage.TestCacheDir(), ChrootBase: filepath.Join(os.TempDir(), "cbx-jail")})
	if err := rt.Available(); err != nil {
		t.Skipf("firecracker runtime not available here: %v", err)
	}
	isolationtest.Run(t, rt, isolationtest.Options{
		RootFS:       isolationtest.BusyboxRoot(t),
		AgentPath:    isolationtest.BuildAgent(t),
		StartTimeout: 60 * time.Second,
	})
}

func TestAvailableSaysWhatIsMissing(t *testing.T) {
	rt := New(Options{Firecracker: "/nonexistent/firecracker", Jailer: "/nonexistent/jailer", KVM: "/nonexistent/kvm", Dir: t.TempDir()})
	err := rt.Available()
	if err == nil {
		t.Fatal("available without KVM or binaries")
	}
	for _, want := range []string{"/nonexistent/kvm", "needs KVM", "firecracker binary", "jailer binary", "CAGEBOX_FIRECRACKER_BIN", "docs/operator.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Available() = %q: does not mention %q", err, want)
		}
	}
	if rt.Class() != isolation.Hypervisor || rt.Name() != "firecracker" {
		t.Fatalf("class %s name %s", rt.Class(), rt.Name())
	}
}

func testSpec() *isolation.Spec {
	return &isolation.Spec{
		ID: "sb-0123456789abcdef", AgentToken: "tok-secret-do-not-leak", NetNS: "/run/netns/cbx-x",
		GuestIf: "eth0", GuestAddr: netip.MustParseAddr("10.201.0.2"), Gateway: netip.MustParseAddr("10.201.0.1"),
		Prefix: netip.MustParsePrefix("10.201.0.0/30"),
	}
}

func TestBuildConfig(t *testing.T) {
	spec := testSpec()
	c := buildConfig(spec, isolation.Resources{MemoryBytes: 512 << 20, CPUs: 1.5}, "02:00:00:00:00:01")
	if *c.Machine.VcpuCount != 2 || *c.Machine.MemSizeMib != 512 {
		t.Errorf("machine: %s", c)
	}
	if len(c.Drives) != 1 || !*c.Drives[0].IsReadOnly || *c.Drives[0].IsRootDevice || *c.Drives[0].PathOnHost != jailRootfs {
		t.Errorf("drives: %+v", c.Drives)
	}
	if len(c.Net) != 1 || *c.Net[0].HostDevName != vmnet.TapName || c.Net[0].GuestMac != "02:00:00:00:00:01" {
		t.Errorf("network: %+v", c.Net)
	}
	if *c.Vsock.GuestCid != guestCID || *c.Vsock.UdsPath != jailVsock {
		t.Errorf("vsock: %+v", c.Vsock)
	}
	for _, want := range []string{"cagebox.agent=vsock:1024", "cagebox.ip=10.201.0.2/30", "cagebox.gw=10.201.0.1", "rdinit=/init"} {
		if !strings.Contains(c.Boot.BootArgs, want) {
			t.Errorf("boot args %q lack %q", c.Boot.BootArgs, want)
		}
	}
	if strings.Contains(c.Boot.BootArgs, spec.AgentToken) {
		t.Fatal("the agent token is on the kernel command line (readable in the guest)")
	}
	// JSON is what goes to Firecracker's API: required fields present.
	b, _ := json.Marshal(c.Machine)
	if !strings.Contains(string(b), `"vcpu_count":2`) || !strings.Contains(string(b), `"mem_size_mib":512`) {
		t.Errorf("machine JSON %s", b)
	}
	// No network: no NIC, no address parameters; small memory is raised.
	c = buildConfig(&isolation.Spec{ID: "x"}, isolation.Resources{MemoryBytes: 16 << 20}, "")
	if len(c.Net) != 0 || strings.Contains(c.Boot.BootArgs, "cagebox.ip") || *c.Machine.MemSizeMib != 128 || *c.Machine.VcpuCount != 1 {
		t.Errorf("no network: %s %q", c, c.Boot.BootArgs)
	}
}

func TestJailerArgs(t *testing.T) {
	args := jailerArgs("sb-1", "/usr/local/bin/firecracker", "/srv/jail", "/run/netns/cbx-1", 0x6cc00001, false, 256<<20)
	joined := strings.Join(args, " ")
	for _, want := range []string{
		"--id sb-1", "--uid 1824522241", "--gid 1824522241", "--exec-file /usr/local/bin/firecracker",
		"--chroot-base-dir /srv/jail", "--netns /run/netns/cbx-1", "--new-pid-ns",
		"--cgroup memory.limit_in_bytes=402653184", "--cgroup pids.max=256", "-- --api-sock /run/firecracker.socket",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("jailer args %q lack %q", joined, want)
		}
	}
	sep := slices.Index(args, "--")
	if sep < 0 || slices.Index(args, "--new-pid-ns") > sep || slices.Index(args, "--cgroup") > sep {
		t.Errorf("jailer options after the firecracker separator: %q", joined)
	}
	v2 := strings.Join(jailerArgs("sb-1", "/fc", "/j", "", 1000, true, 128<<20), " ")
	if !strings.Contains(v2, "--cgroup-version 2") || !strings.Contains(v2, "memory.max=268435456") || strings.Contains(v2, "--netns") {
		t.Errorf("cgroup v2 / no netns: %q", v2)
	}
	if got := jailRoot("/srv/jail", "/usr/local/bin/firecracker", "sb-1"); got != "/srv/jail/firecracker/sb-1/root" {
		t.Errorf("jail root %s", got)
	}
	if a, b := pickUID("sb-1"), pickUID("sb-2"); a == b || a < uidBase || a >= uidBase+uidCount {
		t.Errorf("uids %d %d", a, b)
	}
}

// fakeVsock serves Firecracker's host side of the hybrid vsock handshake
// on a unix socket with the given behaviour.
func fakeVsock(t *testing.T, reply func(c net.Conn, connect string)) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "v.sock")
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 0, 32)
				b := make([]byte, 1)
				for {
					if _, err := c.Read(b); err != nil || b[0] == '\n' {
						break
					}
					buf = append(buf, b[0])
				}
				reply(c, string(buf))
			}()
		}
	}()
	return p
}

func TestVsockHandshake(t *testing.T) {
	ctx := context.Background()
	t.Run("OK", func(t *testing.T) {
		p := fakeVsock(t, func(c net.Conn, connect string) {
			if connect != "CONNECT 1024" {
				c.Write([]byte("bad request\n"))
				c.Close()
				return
			}
			// The answer and the guest's first bytes in one write: nothing
			// past the newline may be lost.
			c.Write([]byte("OK 1073741824\nhello from the guest"))
			io.Copy(c, c)
		})
		conn, err := dialVsock(ctx, p, 1024)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		got := make([]byte, len("hello from the guest"))
		if _, err := io.ReadFull(conn, got); err != nil || string(got) != "hello from the guest" {
			t.Fatalf("stream after the handshake: %q %v", got, err)
		}
	})
	for _, tc := range []struct {
		name, want string
		reply      func(c net.Conn, connect string)
	}{
		{"refused", "want \"OK <port>\"", func(c net.Conn, _ string) { c.Write([]byte("ERR no listener\n")) }},
		{"garbage", "longer than", func(c net.Conn, _ string) { c.Write([]byte(strings.Repeat("x", 1000))) }},
		{"bad port", "bad port", func(c net.Conn, _ string) { c.Write([]byte("OK notaport\n")) }},
		{"closed early", "read the answer", func(c net.Conn, _ string) { c.Write([]byte("OK 12")); c.Close() }},
		{"silent", "no answer to CONNECT", func(c net.Conn, _ string) { time.Sleep(5 * time.Second); c.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := fakeVsock(t, tc.reply)
			start := time.Now()
			conn, err := dialVsock(ctx, p, 1024)
			if err == nil {
				conn.Close()
				t.Fatal("handshake succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q lacks %q", err, tc.want)
			}
			if d := time.Since(start); d > handshakeLimit+time.Second {
				t.Errorf("took %s", d)
			}
		})
	}
	t.Run("no socket", func(t *testing.T) {
		if _, err := dialVsock(ctx, filepath.Join(t.TempDir(), "none"), 1024); err == nil {
			t.Fatal("dialled a missing socket")
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		p := fakeVsock(t, func(c net.Conn, _ string) { time.Sleep(5 * time.Second) })
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		if _, err := dialVsock(cctx, p, 1024); err == nil || time.Since(start) > time.Second {
			t.Fatalf("cancelled dial: %v after %s", err, time.Since(start))
		}
	})
}

// TestTapRedirect: in a namespace made here (veth cbf*, 10.253.2.0/30) the
// TAP Firecracker opens by name is created persistent and owned by the
// VMM's uid, joined to the link, and removed with everything else by
// Teardown.
func TestTapRedirect(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	name := "cbf" + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	nsPath := "/run/netns/" + name
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", name+"h").Run()
		exec.Command("ip", "netns", "del", name).Run()
	})
	for _, c := range [][]string{
		{"ip", "link", "add", name + "h", "type", "veth", "peer", "name", name + "g"},
		{"ip", "link", "set", name + "g", "netns", name},
		{"ip", "-n", name, "link", "set", name + "g", "name", "eth0"},
		{"ip", "-n", name, "addr", "add", "10.253.2.2/30", "dev", "eth0"},
		{"ip", "-n", name, "link", "set", "eth0", "up"},
		{"ip", "-n", name, "route", "add", "default", "via", "10.253.2.1"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", c, err, out)
		}
	}
	spec := &isolation.Spec{ID: "sb-fc", NetNS: nsPath, GuestIf: "eth0", GuestAddr: netip.MustParseAddr("10.253.2.2"),
		Gateway: netip.MustParseAddr("10.253.2.1"), Prefix: netip.MustParsePrefix("10.253.2.0/30")}
	uid := pickUID(spec.ID)
	ln, tap, err := vmnet.Setup(spec, uid)
	if err != nil {
		t.Fatal(err)
	}
	tap.Close() // persistent: the device must outlive the creator's descriptor
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(vmnet.TapName)
	if err != nil {
		t.Fatalf("TAP gone with the creator's descriptor: %v", err)
	}
	if tt, ok := l.(*netlink.Tuntap); !ok || tt.Owner != uint32(uid) {
		t.Errorf("TAP %T owner: want uid %d (%+v)", l, uid, l)
	}
	if ln.MAC == "" || ln.Leftovers() == nil {
		t.Errorf("link record %+v, leftovers %v", ln, ln.Leftovers())
	}
	if err := ln.Teardown(); err != nil {
		t.Fatal(err)
	}
	if left := ln.Leftovers(); len(left) != 0 {
		t.Fatalf("after teardown: %v", left)
	}
	addrs, _ := h.AddrList(mustLink(t, h, "eth0"), netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IP.String() != "10.253.2.2" {
		t.Errorf("guest address not restored: %v", addrs)
	}
}

func mustLink(t *testing.T, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestDestroyHalfMade: Destroy of a sandbox whose Create stopped half-way
// (jail populated, no VMM) removes everything, twice over.
func TestDestroyHalfMade(t *testing.T) {
	base := t.TempDir()
	s := &Sandbox{rt: New(Options{ChrootBase: base}), sd: stateData{
		ID: "sb-half", Dir: t.TempDir(), JailDir: filepath.Join(base, "firecracker", "sb-half"),
		JailRoot: filepath.Join(base, "firecracker", "sb-half", "root"), Cgroup: "firecracker/sb-half-test",
	}}
	if err := os.MkdirAll(filepath.Join(s.sd.JailRoot, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(s.sd.JailRoot, "initrd"), []byte("x"), 0o400)
	os.WriteFile(filepath.Join(s.sd.JailRoot, "firecracker.pid"), []byte("999999999"), 0o644)
	for i := 0; i < 2; i++ {
		if err := s.Destroy(context.Background()); err != nil {
			t.Fatalf("destroy %d: %v", i, err)
		}
	}
	if left := s.Leftovers(context.Background()); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
	// Recover of a sandbox whose VMM is gone says so.
	if _, err := s.rt.Recover(context.Background(), s.State()); err == nil || !strings.Contains(err.Error(), isolation.ErrGone.Error()) {
		t.Fatalf("recover: %v", err)
	}
}

func TestReadPID(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "firecracker.pid")
	done := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		os.WriteFile(p, []byte("4242\n"), 0o644)
		done <- nil // the jailer exits cleanly after forking
	}()
	if pid, err := readPID(context.Background(), p, done); err != nil || pid != 4242 {
		t.Fatalf("pid %d %v", pid, err)
	}
	failed := make(chan error, 1)
	failed <- errors.New("exit status 1")
	if _, err := readPID(context.Background(), filepath.Join(dir, "none"), failed); err == nil || !strings.Contains(err.Error(), "jailer failed") {
		t.Fatalf("failed jailer: %v", err)
	}
}
