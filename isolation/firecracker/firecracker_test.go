package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cagebox/cagebox/internal/cgroups"
	"github.com/cagebox/cagebox/internal/kvm"
	"github.com/cagebox/cagebox/internal/vmimage"
	"github.com/cagebox/cagebox/internal/vmnet"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/isolationtest"
	"github.com/cagebox/cagebox/isolation/qemu"
)

// TestConformance runs the suite wherever /dev/kvm and the firecracker and
// jailer binaries exist (see docs/operator.md); here it skips saying why.
func TestConformance(t *testing.T) {
	q := qemu.New(qemu.Options{Dir: vmimage.TestCacheDir()})
	o := Options{Dir: vmimage.TestCacheDir(), ChrootBase: filepath.Join(os.TempDir(), "cbx-jail"), Probe: q.KVM}
	rt := New(o)
	isolationtest.CheckAvailable(t, rt)
	isolationtest.Run(t, rt, isolationtest.Options{
		RootFS:       isolationtest.BusyboxRoot(t),
		AgentPath:    isolationtest.BuildAgent(t),
		StartTimeout: 60 * time.Second,
		Restarted:    func() isolation.Runtime { return New(o) },
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

// TestAvailableUsesTheKVMProbe: a /dev/kvm that opens is not enough; the
// shared probe's verdict decides, and its words are quoted.
func TestAvailableUsesTheKVMProbe(t *testing.T) {
	failed := func() kvm.Verdict {
		return kvm.Verdict{Reason: "KVM probe failed: QEMU could not boot the guest kernel under KVM", Evidence: "failed to set MSR 0x10a to 0x69"}
	}
	// /dev/null stands in for a device that opens.
	rt := New(Options{KVM: "/dev/null", Dir: t.TempDir(), Probe: failed})
	err := rt.Available()
	if err == nil || !strings.Contains(err.Error(), "failed to set MSR 0x10a") || !strings.Contains(err.Error(), "neither can Firecracker") {
		t.Fatalf("Available() = %v: does not quote the failed probe", err)
	}
	if d := rt.Detail(); !strings.Contains(d, "failed to set MSR 0x10a") {
		t.Fatalf("Detail %q does not quote the probe", d)
	}
	rt = New(Options{KVM: "/dev/null", Dir: t.TempDir()})
	if err := rt.Available(); err == nil || !strings.Contains(err.Error(), "not proven") {
		t.Fatalf("Available() without a probe = %v", err)
	}
	ok := func() kvm.Verdict { return kvm.Verdict{Usable: true, Reason: "booted"} }
	rt = New(Options{KVM: "/dev/null", Dir: t.TempDir(), Probe: ok, Firecracker: "/nonexistent/firecracker", Jailer: "/nonexistent/jailer"})
	if err := rt.Available(); err == nil || strings.Contains(err.Error(), "KVM") {
		t.Fatalf("Available() with a passing probe but no binaries = %v: want only the binaries named", err)
	}
}

func testSpec() *isolation.Spec {
	return &isolation.Spec{
		ID: "sb-0123456789abcdef", AgentToken: "tok-secret-do-not-leak", NetNS: "/run/netns/cbx-x",
		GuestIf: "eth0", GuestAddr: netip.MustParseAddr("10.201.0.2"), Gateway: netip.MustParseAddr("10.201.0.1"),
		Prefix: netip.MustParsePrefix("10.201.0.0/30"),
	}
}

func TestMachineSize(t *testing.T) {
	for _, tc := range []struct {
		res        isolation.Resources
		vcpus, mem int64
		wantErr    string
	}{
		{isolation.Resources{}.WithDefaults(), 1, 512, ""},
		{isolation.Resources{MemoryBytes: 256 << 20, CPUs: 1.5}, 2, 256, ""},
		{isolation.Resources{MemoryBytes: 256<<20 + 1, CPUs: 0.25}, 1, 257, ""},
		{isolation.Resources{MemoryBytes: 64 << 20, CPUs: 1}, 0, 0, "at least 128 MiB"},
		{isolation.Resources{MemoryBytes: 1 << 30, CPUs: 33}, 0, 0, "32 vCPUs"},
	} {
		v, m, err := machineSize(tc.res)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%+v: err %v, want %q", tc.res, err, tc.wantErr)
			}
			continue
		}
		if err != nil || v != tc.vcpus || m != tc.mem {
			t.Errorf("%+v: %d vcpus %d MiB %v, want %d %d", tc.res, v, m, err, tc.vcpus, tc.mem)
		}
	}
}

func TestBuildConfig(t *testing.T) {
	spec := testSpec()
	c := buildConfig(spec, 2, 512, "02:00:00:00:00:01")
	if *c.Machine.VcpuCount != 2 || *c.Machine.MemSizeMib != 512 || *c.Machine.Smt {
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
	if *c.Boot.KernelImagePath != jailKernel || c.Boot.InitrdPath != jailInitrd {
		t.Errorf("boot source: %+v", c.Boot)
	}
	for _, want := range []string{"cagebox.agent=vsock:1024", "cagebox.ip=10.201.0.2/30", "cagebox.gw=10.201.0.1", "rdinit=/init", "reboot=k", "panic=-1"} {
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
	// No network: no NIC, no address parameters.
	c = buildConfig(&isolation.Spec{ID: "x"}, 1, 128, "")
	if len(c.Net) != 0 || strings.Contains(c.Boot.BootArgs, "cagebox.ip") || strings.Contains(c.Boot.BootArgs, "cagebox.gw") {
		t.Errorf("no network: %s %q", c, c.Boot.BootArgs)
	}
}

func TestJailerArgs(t *testing.T) {
	j := jailSpec{
		ID: "sb-1", Firecracker: "/usr/local/bin/firecracker", ChrootBase: "/srv/jail", NetNS: "/run/netns/cbx-1",
		UID: 0x6cc00001, MemoryBytes: 384 << 20, CPUs: 1.5,
	}
	args := jailerArgs(j)
	joined := strings.Join(args, " ")
	for _, want := range []string{
		"--id sb-1", "--uid 1824522241", "--gid 1824522241", "--exec-file /usr/local/bin/firecracker",
		"--chroot-base-dir /srv/jail", "--netns /run/netns/cbx-1", "--new-pid-ns",
		"--cgroup memory.limit_in_bytes=402653184", "--cgroup pids.max=256", "--cgroup cpu.cfs_quota_us=150000",
		"--resource-limit fsize=33554432", "-- --api-sock /api.sock",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("jailer args %q lack %q", joined, want)
		}
	}
	for _, bad := range []string{"cpuset", "--daemonize", "--cgroup-version"} {
		if strings.Contains(joined, bad) {
			t.Errorf("jailer args %q have %q", joined, bad)
		}
	}
	sep := slices.Index(args, "--")
	if sep < 0 || sep != len(args)-3 {
		t.Errorf("firecracker's own arguments: %q", joined)
	}
	for i, a := range args[:sep] {
		if strings.HasPrefix(a, "--") && i+1 < sep && a != "--new-pid-ns" && strings.HasPrefix(args[i+1], "--") {
			t.Errorf("option %s has no value in %q", a, joined)
		}
	}
	j.CgroupV2, j.NetNS, j.CPUs = true, "", 0
	v2 := strings.Join(jailerArgs(j), " ")
	for _, want := range []string{"--cgroup-version 2", "--cgroup memory.max=402653184", "--cgroup pids.max=256"} {
		if !strings.Contains(v2, want) {
			t.Errorf("cgroup v2 args %q lack %q", v2, want)
		}
	}
	if strings.Contains(v2, "--netns") || strings.Contains(v2, "cpu.max") {
		t.Errorf("no netns, no CPU quota: %q", v2)
	}
	j.CPUs = 2
	if v2 := jailerArgs(j); !slices.Contains(v2, "cpu.max=200000 100000") {
		t.Errorf("cgroup v2 CPU quota: %q", v2)
	}
	if got := jailRoot("/srv/jail", "/usr/local/bin/firecracker", "sb-1"); got != "/srv/jail/firecracker/sb-1/root" {
		t.Errorf("jail root %s", got)
	}
	// The jailer's cgroup parent defaults to the exec file's name.
	if got := jailCgroup("/opt/fc/firecracker-v1.10.1-x86_64", "sb-1"); got != "firecracker-v1.10.1-x86_64/sb-1" {
		t.Errorf("jail cgroup %s", got)
	}
}

// fakeAPI serves the subset of Firecracker's API that the runtime uses on
// a unix socket at the jail's API path, recording each request. fail
// names a request ("PUT /vsock") to answer with a 400 and a fault message.
type fakeAPI struct {
	mu   sync.Mutex
	reqs []string // "METHOD /path body"
	fail string
}

func (f *fakeAPI) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

func startFakeAPI(t *testing.T, jailRoot string, f *fakeAPI) {
	t.Helper()
	p := filepath.Join(jailRoot, jailAPI)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := r.Method + " " + r.URL.Path
		f.mu.Lock()
		f.reqs = append(f.reqs, req+" "+strings.TrimSpace(string(body)))
		fail := f.fail
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case req == fail:
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"fault_message":"the fake says no"}`)
		case r.Method == http.MethodGet && r.URL.Path == "/":
			io.WriteString(w, `{"id":"sb","state":"Paused","vmm_version":"1.10.1","app_name":"Firecracker"}`)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// TestConfigureAPI drives a fake Firecracker API through the SDK client
// the runtime uses: the requests, their order and bodies, Pause/Resume,
// and a fault message surfacing in the error.
func TestConfigureAPI(t *testing.T) {
	root := t.TempDir()
	f := &fakeAPI{}
	startFakeAPI(t, root, f)
	s := &Sandbox{rt: New(Options{}), log: slog.Default(), sd: stateData{ID: "sb-api", JailRoot: root}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := buildConfig(testSpec(), 2, 256, "02:00:00:00:00:01")
	if err := configure(ctx, s.client(), cfg); err != nil {
		t.Fatal(err)
	}
	got := f.requests()
	want := []struct{ req, body string }{
		{"PUT /machine-config", `"mem_size_mib":256`},
		{"PUT /boot-source", `"kernel_image_path":"/vmlinux"`},
		{"PUT /drives/rootfs", `"is_read_only":true`},
		{"PUT /network-interfaces/eth0", `"host_dev_name":"` + vmnet.TapName + `"`},
		{"PUT /vsock", `"uds_path":"/v.sock"`},
		{"PUT /actions", `"action_type":"InstanceStart"`},
	}
	if len(got) != len(want) {
		t.Fatalf("requests %q", got)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w.req+" ") || !strings.Contains(got[i], w.body) {
			t.Errorf("request %d = %q, want %s with %s", i, got[i], w.req, w.body)
		}
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	got = f.requests()[len(want):]
	if len(got) != 2 || got[0] != `PATCH /vm {"state":"Paused"}` || got[1] != `PATCH /vm {"state":"Resumed"}` {
		t.Errorf("pause/resume requests %q", got)
	}

	f.mu.Lock()
	f.fail = "PUT /vsock"
	f.mu.Unlock()
	err := configure(ctx, s.client(), cfg)
	if err == nil || !strings.Contains(err.Error(), "vsock: the fake says no") {
		t.Fatalf("fault not reported: %v", err)
	}
}

// TestDialJailed: the jail's sockets are connected to without following
// a symlink the VMM could have put there, and a path longer than a socket
// address allows still works.
func TestDialJailed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	long := filepath.Join(dir, strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(long, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(long, "v.sock")
	if len(sock) < 108 {
		t.Fatalf("test path %d bytes: not longer than a sockaddr_un", len(sock))
	}
	// Listen through a short path to the same directory.
	d, err := os.Open(long)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ln, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/v.sock", d.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	c, err := dialJailed(ctx, sock)
	if err != nil {
		t.Fatalf("long path: %v", err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "hi" {
		t.Fatalf("read %q", b)
	}
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	if c, err := dialJailed(ctx, link); err == nil {
		c.Close()
		t.Fatal("followed a symlink")
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	if _, err := dialJailed(ctx, file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("regular file: %v", err)
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
// VMM's uid and joined to the link: a frame written by whoever attaches to
// it (as Firecracker does) reaches the host end, and the host's answer
// comes back through it. Teardown removes it all.
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
		{"ip", "addr", "add", "10.253.2.1/30", "dev", name + "h"},
		{"ip", "link", "set", name + "h", "up"},
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
	uid := DefaultUIDBase + 11
	ln, tap, err := vmnet.Setup(guestOf(spec), uid)
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
	arpThroughTap(t, nsPath, ln.MAC)
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

// arpThroughTap attaches to the TAP by name, as Firecracker does, asks
// for the gateway's MAC as the guest (10.253.2.2 with the link's MAC) and
// waits for the host's answer.
func arpThroughTap(t *testing.T, nsPath, macStr string) {
	t.Helper()
	mac, err := net.ParseMAC(macStr)
	if err != nil {
		t.Fatal(err)
	}
	var tap *os.File
	err = vmnet.InNetNS(nsPath, func() error {
		fd, err := syscall.Open("/dev/net/tun", syscall.O_RDWR|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		var ifr [40]byte
		copy(ifr[:], vmnet.TapName)
		*(*uint16)(unsafe.Pointer(&ifr[16])) = syscall.IFF_TAP | syscall.IFF_NO_PI
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TUNSETIFF, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
			syscall.Close(fd)
			return fmt.Errorf("attach to %s: %w", vmnet.TapName, e)
		}
		tap = os.NewFile(uintptr(fd), "tap")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	guest, gw := []byte{10, 253, 2, 2}, []byte{10, 253, 2, 1}
	frame := append([]byte{}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	frame = append(frame, mac...)
	frame = append(frame, 0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1) // ARP, Ethernet/IPv4, request
	frame = append(frame, mac...)
	frame = append(frame, guest...)
	frame = append(frame, 0, 0, 0, 0, 0, 0)
	frame = append(frame, gw...)
	deadline := time.Now().Add(3 * time.Second)
	tap.SetReadDeadline(deadline)
	buf := make([]byte, 2048)
	for time.Now().Before(deadline) {
		if _, err := tap.Write(frame); err != nil {
			t.Fatalf("write to the TAP: %v", err)
		}
		for {
			tap.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			n, err := tap.Read(buf)
			if err != nil {
				break // resend
			}
			f := buf[:n]
			// An ARP reply to the guest's MAC from the gateway's address.
			if n >= 42 && string(f[0:6]) == string(mac) && f[12] == 0x08 && f[13] == 0x06 && f[21] == 2 && string(f[28:32]) == string(gw) {
				return
			}
		}
	}
	t.Fatal("no ARP answer from the host end through the TAP: the redirects do not carry frames")
}

func mustLink(t *testing.T, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// halfMade is a sandbox as Create leaves it part-way: a populated jail
// and state dir, a reserved uid, a cgroup (when root), no VMM.
func halfMade(t *testing.T, id string) *Sandbox {
	t.Helper()
	base := t.TempDir()
	rt := New(Options{ChrootBase: base, Firecracker: "/nonexistent/firecracker"})
	root := jailRoot(base, rt.fc, id)
	s := &Sandbox{rt: rt, log: slog.Default(), sd: stateData{
		ID: id, Dir: filepath.Join(t.TempDir(), id), JailDir: filepath.Dir(root), JailRoot: root,
		PIDFile: filepath.Join(root, "firecracker.pid"), UID: DefaultUIDBase + 7,
		Cgroup: "cbf-test-" + id,
	}}
	rt.uids.Reserve(s.sd.UID)
	for _, d := range []string{filepath.Join(root, "run"), s.sd.Dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(root, "initrd"), []byte("x"), 0o400)
	os.WriteFile(filepath.Join(s.sd.Dir, "vmm.log"), []byte("log"), 0o600)
	if os.Geteuid() == 0 {
		if err := cgroups.Create(s.sd.Cgroup, cgroups.Limits{MemoryBytes: 64 << 20}); err != nil {
			t.Fatalf("make a cgroup to destroy: %v", err)
		}
		t.Cleanup(func() { cgroups.Remove(s.sd.Cgroup) })
	}
	return s
}

// TestDestroyHalfMade: Destroy of a sandbox whose Create stopped half-way
// removes everything, twice over, and releases its uid; Recover of it
// says it is gone and cleans up.
func TestDestroyHalfMade(t *testing.T) {
	ctx := context.Background()
	s := halfMade(t, "sb-half")
	// A pid file naming a process that is not this sandbox's VMM (this
	// test, running as root) is not trusted.
	os.WriteFile(s.sd.PIDFile, []byte(strconv.Itoa(os.Getpid())), 0o644)
	if len(s.Leftovers(ctx)) == 0 {
		t.Fatal("no leftovers before destroy")
	}
	for i := 0; i < 2; i++ {
		if err := s.Destroy(ctx); err != nil {
			t.Fatalf("destroy %d: %v", i, err)
		}
	}
	if left := s.Leftovers(ctx); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
	if s.rt.uids.Reserved(s.sd.UID) {
		t.Error("uid still reserved after destroy")
	}

	s = halfMade(t, "sb-gone")
	sb, err := s.rt.Recover(ctx, s.State())
	if sb != nil || !errors.Is(err, isolation.ErrGone) {
		t.Fatalf("recover of a sandbox with no VMM: %v %v", sb, err)
	}
	if left := s.Leftovers(ctx); len(left) != 0 {
		t.Fatalf("recover of a gone sandbox left: %v", left)
	}
}

// TestRecoverAndDestroyVMM stands a process in for a jailed Firecracker
// (running as the sandbox's uid with "--id=<id>" in its arguments, its pid
// in the jail's pid file): Recover re-attaches to it, Destroy kills it and
// removes the rest; a process that only claims the id is left alone.
func TestRecoverAndDestroyVMM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a process as another uid)")
	}
	ctx := context.Background()
	s := halfMade(t, "sb-live")
	start := func(uid uint32) *exec.Cmd {
		cmd := exec.Command("sh", "-c", "sleep 60", "--id="+s.sd.ID)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	decoy := start(s.sd.UID + 1)
	os.WriteFile(s.sd.PIDFile, []byte(strconv.Itoa(decoy.Process.Pid)), 0o644)
	if sb, err := s.rt.Recover(ctx, s.State()); sb != nil || !errors.Is(err, isolation.ErrGone) {
		t.Fatalf("recover took a process of another uid for the VMM: %v %v", sb, err)
	}
	if p, err := identify(decoy.Process.Pid, s.sd.ID, s.sd.UID+1); err != nil || !p.Alive() {
		t.Fatalf("the decoy was killed: %v", err)
	}

	s = halfMade(t, "sb-live")
	vmmCmd := start(s.sd.UID)
	os.WriteFile(s.sd.PIDFile, []byte(strconv.Itoa(vmmCmd.Process.Pid)), 0o644)
	sb, err := s.rt.Recover(ctx, s.State())
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	if left := sb.(*Sandbox).Leftovers(ctx); !slices.ContainsFunc(left, func(l string) bool { return strings.HasPrefix(l, "firecracker process") }) {
		t.Fatalf("leftovers do not show the running VMM: %q", left)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if left := sb.(*Sandbox).Leftovers(ctx); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
	if err := vmmCmd.Wait(); err == nil {
		t.Fatal("the VMM stand-in exited cleanly: it was not killed")
	}
}

func TestWaitJailPID(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "firecracker.pid")
	done := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		os.WriteFile(p, []byte("4242\n"), 0o644)
		done <- nil // the jailer exits cleanly after forking
	}()
	if pid, err := waitJailPID(context.Background(), p, done); err != nil || pid != 4242 {
		t.Fatalf("pid %d %v", pid, err)
	}
	failed := make(chan error, 1)
	failed <- errors.New("exit status 1")
	if _, err := waitJailPID(context.Background(), filepath.Join(dir, "none"), failed); err == nil || !strings.Contains(err.Error(), "jailer failed") {
		t.Fatalf("failed jailer: %v", err)
	}
	// The pid file is never read through a symlink.
	link := filepath.Join(dir, "link.pid")
	os.Symlink(p, link)
	if _, err := readJailPID(link); err == nil {
		t.Fatal("read a pid through a symlink")
	}
}

// TestWaitIdentify: the pid the jailer writes is the VMM's only once its
// child has dropped to the sandbox's uid; until then the check waits, and
// a child that dies ends the wait.
func TestWaitIdentify(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a process changing uid)")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv (util-linux)")
	}
	uid := uint32(DefaultUIDBase + 13)
	u := strconv.FormatUint(uint64(uid), 10)
	cmd := exec.Command("sh", "-c", "sleep 0.2; exec setpriv --reuid="+u+" --regid="+u+" --clear-groups sh -c 'sleep 60' --id=sb-wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ctx := context.Background()
	if _, err := identify(cmd.Process.Pid, "sb-wait", uid); err == nil {
		t.Fatal("identified the process before it dropped to the sandbox's uid")
	}
	p, err := waitIdentify(ctx, cmd.Process.Pid, "sb-wait", uid)
	if err != nil || p.PID != cmd.Process.Pid || !p.Alive() {
		t.Fatalf("waitIdentify: %+v %v", p, err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if p.Alive() {
		t.Fatal("alive after kill and reap")
	}
	start := time.Now()
	if _, err := waitIdentify(ctx, cmd.Process.Pid, "sb-wait", uid); err == nil || time.Since(start) > time.Second {
		t.Fatalf("waitIdentify of a gone process: %v after %s", err, time.Since(start))
	}
}
