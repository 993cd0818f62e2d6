package qemu

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
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

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/kvm"
	"github.com/cagebox/cagebox/internal/vmimage"
	"github.com/cagebox/cagebox/internal/vmnet"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/internal/runlog"
	"github.com/cagebox/cagebox/isolation/isolationtest"
)

func TestArgs(t *testing.T) {
	tcg := (&vmConfig{MemoryMiB: 256, CPUs: 2, Append: "console=ttyS0"}).args()
	joined := strings.Join(tcg, " ")
	for _, want := range []string{
		"-M microvm,x-option-roms=off,isa-serial=on,rtc=on,acpi=on,auto-kernel-cmdline=off,pit=on,pic=on",
		"-accel tcg,tb-size=64", "-smp 2", "-m 256M",
		"-nodefaults -no-user-config -nographic -no-reboot",
		"-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-kernel /proc/self/fd/3", "-initrd /proc/self/fd/4",
		"-add-fd fd=5,set=1,opaque=rootdisk",
		"filename=/dev/fdset/1,read-only=on",
		"-device virtio-blk-device,drive=rootdisk",
		"socket,id=agent,fd=6,server=on,wait=off",
		"virtserialport,chardev=agent,name=cagebox.agent",
		"socket,id=qmp,fd=7,server=on,wait=off", "-mon chardev=qmp,mode=control",
		"-append console=ttyS0",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("tcg args lack %q:\n%s", want, joined)
		}
	}
	if strings.Contains(joined, "netdev") {
		t.Errorf("a VM without network has a NIC: %s", joined)
	}
	// Every option's value is the next argument: no path of the host
	// appears (QEMU opens none).
	for _, a := range tcg {
		if strings.HasPrefix(a, "/") && !strings.HasPrefix(a, "/proc/self/fd/") {
			t.Errorf("argument %q is a host path", a)
		}
	}

	kvm := strings.Join((&vmConfig{KVM: true, MemoryMiB: 512, CPUs: 1, Net: true, MAC: "02:00:00:00:00:01"}).args(), " ")
	for _, want := range []string{"-accel kvm", "-cpu host", "pit=off,pic=off", "-netdev tap,id=net0,fd=8", "virtio-net-device,netdev=net0,mac=02:00:00:00:00:01"} {
		if !strings.Contains(kvm, want) {
			t.Errorf("kvm args lack %q:\n%s", want, kvm)
		}
	}
}

func TestKernelCmdline(t *testing.T) {
	none := agentproto.ParseKernelCmdline(kernelCmdline(0, nil))
	if none["console"] != "ttyS0" || none[agentproto.VMParamAgent] != "serial:"+agentproto.VMSerialPort || none["rdinit"] != "/init" {
		t.Fatalf("cmdline %v", none)
	}
	if _, ok := none[agentproto.VMParamAddr]; ok {
		t.Fatal("network parameters without a network")
	}
	withNet := agentproto.ParseKernelCmdline(kernelCmdline(2096031, &netParams{
		Addr: netip.MustParsePrefix("10.253.1.2/30"), Gateway: netip.MustParseAddr("10.253.1.1"),
	}))
	if withNet["tsc_early_khz"] != "2096031" {
		t.Errorf("tsc_early_khz %q", withNet["tsc_early_khz"])
	}
	if _, ok := none["tsc_early_khz"]; ok {
		t.Error("tsc_early_khz given without a frequency")
	}
	if withNet[agentproto.VMParamAddr] != "10.253.1.2/30" || withNet[agentproto.VMParamGateway] != "10.253.1.1" {
		t.Fatalf("network parameters %v", withNet)
	}
}

func TestOOMLine(t *testing.T) {
	log := "[    3.1] virtio_blk virtio0: [vda]\n" +
		"[   12.345678] Out of memory: Killed process 123 (sh) total-vm:1kB\n" +
		"time=x level=WARN msg=\"Out of memory: Killed process 1\"\n" +
		"[   13.000001] Memory cgroup out of memory: Killed process 7 (tr)\n"
	if n := len(oomLine.FindAllString(log, -1)); n != 2 {
		t.Fatalf("matched %d lines, want 2", n)
	}
}

// testRuntime returns the runtime with the shared test artifact cache, or
// skips saying what is missing.
func testRuntime(t *testing.T) *Runtime {
	t.Helper()
	if os.Geteuid() != 0 {
		isolationtest.Unavailable(t, Name, "the qemu runtime needs root")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		isolationtest.Unavailable(t, Name, "qemu-system-x86_64 not installed (apt-get install --no-install-recommends qemu-system-x86)")
	}
	c := &vmimage.Cache{Dir: vmimage.TestCacheDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := c.FetchKernel(ctx); err != nil {
		isolationtest.Unavailable(t, Name, fmt.Sprintf("no guest kernel: %v", err))
	}
	// Cold boots unless a test asks for templates (templateRuntime).
	rt := New(Options{Dir: c.Dir, DisableTemplates: true})
	isolationtest.CheckAvailable(t, rt)
	t.Logf("qemu runtime: %s", rt.Detail())
	return rt
}

const startTimeout = 90 * time.Second

// TestConformance runs the suite on sandboxes restored from templates:
// the templates of the suite's sandboxes (its size classes, with and
// without a NIC) are built first, and every sandbox restores and is
// claimed (isolationtest claims Claimable sandboxes).
func TestConformance(t *testing.T) {
	rt := testRuntime(t)
	rt = New(Options{Dir: rt.cache.Dir, NoBackgroundTemplates: true})
	o := isolationtest.Options{
		RootFS:       isolationtest.BusyboxRoot(t),
		AgentPath:    isolationtest.BuildAgent(t),
		StartTimeout: startTimeout,
		Restarted:    func() isolation.Runtime { return New(Options{Dir: rt.cache.Dir, NoBackgroundTemplates: true}) },
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, spec := range []*isolation.Spec{
		{Resources: isolation.Resources{MemoryBytes: 256 << 20, PIDs: 64, CPUs: 1}},
		{},
		{NetNS: "(a NIC)"},
	} {
		spec.RootFS, spec.AgentPath = o.RootFS, o.AgentPath
		tp, err := rt.BuildTemplate(ctx, spec)
		if err != nil {
			t.Fatalf("build template: %v", err)
		}
		t.Logf("template %s (%s)", tp.Name, tp.Digest)
	}
	isolationtest.Run(t, rt, o)
}

// TestConformanceColdBoot runs the suite with templates off.
func TestConformanceColdBoot(t *testing.T) {
	rt := testRuntime(t)
	rt = New(Options{Dir: rt.cache.Dir, DisableTemplates: true})
	isolationtest.Run(t, rt, isolationtest.Options{
		RootFS:       isolationtest.BusyboxRoot(t),
		AgentPath:    isolationtest.BuildAgent(t),
		StartTimeout: startTimeout,
		Restarted:    func() isolation.Runtime { return New(Options{Dir: rt.cache.Dir, DisableTemplates: true}) },
	})
}

// nsState is what the test checks the runtime leaves in the namespace.
func nsState(t *testing.T, path string) (addrs []string, links []string, qdiscs int) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ll, _ := h.LinkList()
	for _, l := range ll {
		links = append(links, l.Attrs().Name)
		if qs, err := h.QdiscList(l); err == nil {
			for _, q := range qs {
				if _, ok := q.(*netlink.Ingress); ok {
					qdiscs++
				}
			}
		}
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	al, _ := h.AddrList(eth, netlink.FAMILY_V4)
	for _, a := range al {
		addrs = append(addrs, a.IPNet.String())
	}
	slices.Sort(links)
	return addrs, links, qdiscs
}

// startGuest creates and starts a VM with spec's network fields set, and
// connects to its agent.
func startGuest(t *testing.T, rt *Runtime, mod func(*isolation.Spec)) (*Sandbox, *agentproto.Client, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	tok := make([]byte, 16)
	rand.Read(tok)
	idb := make([]byte, 6)
	rand.Read(idb)
	id := "q" + hex.EncodeToString(idb)
	spec := &isolation.Spec{
		ID:         id,
		StateDir:   filepath.Join(os.TempDir(), "cbx-state", id),
		RootFS:     isolationtest.BusyboxRoot(t),
		AgentPath:  isolationtest.BuildAgent(t),
		AgentToken: hex.EncodeToString(tok),
		Hostname:   "qemu-test",
		Resources:  isolation.Resources{MemoryBytes: 256 << 20},
	}
	if mod != nil {
		mod(spec)
	}
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	s := sb.(*Sandbox)
	var c *agentproto.Client
	t.Cleanup(func() {
		if c != nil {
			c.Close()
		}
		if t.Failed() {
			t.Logf("guest console:\n%s", runlog.Tail(s.sd.path("console.log"), 4000))
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		if err := sb.Destroy(dctx); err != nil {
			t.Errorf("destroy: %v", err)
		}
		if left := s.Leftovers(dctx); len(left) > 0 {
			t.Errorf("left behind: %q", left)
		}
	})
	t0 := time.Now()
	if err := sb.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	c = isolationtest.Connect(t, ctx, sb, spec.AgentToken)
	t.Logf("agent answered %v after start", time.Since(t0).Round(time.Millisecond))
	return s, c, spec.AgentToken
}

func execOut(t *testing.T, c *agentproto.Client, argv ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out strings.Builder
	res, err := c.Exec(ctx, &agentproto.ExecRequest{Argv: argv}, nil, &out, &out)
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return out.String(), res.ExitCode
}

// TestNetworkPlumbing boots a VM on a routed link (the conformance suite
// checks what the guest sees of it) and checks what only a VM does with
// it: the guest address moves off the namespace's eth0 to the guest, whose
// NIC is a TAP joined to eth0 by ingress redirects; agent connections can
// be redialled, with and without the reconnect gap; Stop presses the power
// button, which the guest's init turns into the agent's SIGTERM and a
// power-off; and Destroy gives the namespace back as it was.
func TestNetworkPlumbing(t *testing.T) {
	rt := testRuntime(t)
	l := isolationtest.NewLink(t, Name)
	addrsBefore, linksBefore, _ := nsState(t, l.NSPath)

	s, c, tok := startGuest(t, rt, l.Join)

	addrs, links, qdiscs := nsState(t, l.NSPath)
	if len(addrs) != 0 || !slices.Contains(links, vmnet.TapName) || qdiscs != 2 {
		t.Errorf("namespace while running: addrs %v links %v ingress qdiscs %d", addrs, links, qdiscs)
	}
	out, _ := execOut(t, c, "sh", "-c", "ip -4 addr show eth0 2>/dev/null || cat /proc/net/route")
	t.Logf("guest network: %s", out)

	// A redial after a dropped connection reaches the agent again.
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		c2 := isolationtest.Connect(t, ctx, s, tok)
		if out, code := execOut(t, c2, "echo", "again"); out != "again\n" || code != 0 {
			t.Fatalf("after redial %d: %q %d", i, out, code)
		}
		c2.Close()
	}
	// Without the gap, a hello can reach the old session; the answer
	// timeout makes the caller redial.
	oldGap := reconnectGap
	reconnectGap = 0
	for i := 0; i < 4; i++ {
		t0 := time.Now()
		c2 := isolationtest.Connect(t, ctx, s, tok)
		if out, code := execOut(t, c2, "echo", "again"); out != "again\n" || code != 0 {
			t.Fatalf("after gapless redial %d: %q %d", i, out, code)
		}
		c2.Close()
		t.Logf("gapless redial %d answered in %v", i, time.Since(t0).Round(time.Millisecond))
	}
	reconnectGap = oldGap

	// Whether the guest powered off on the power button is read from its
	// console below, not from how long Stop took (a loaded machine's TCG
	// guest may take most of the grace period to shut down).
	if err := s.Stop(ctx, 20*time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
	console, _ := os.ReadFile(s.sd.path("console.log"))
	if !strings.Contains(string(console), "power button") || !strings.Contains(string(console), "powering off") {
		t.Errorf("the guest did not shut down through its init:\n%s", runlog.Tail(s.sd.path("console.log"), 2000))
	}

	dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer dcancel()
	if err := s.Destroy(dctx); err != nil {
		t.Fatal(err)
	}
	addrs, links, qdiscs = nsState(t, l.NSPath)
	if !slices.Equal(addrs, addrsBefore) || !slices.Equal(links, linksBefore) || qdiscs != 0 {
		t.Errorf("namespace after destroy: addrs %v (before %v) links %v (before %v) ingress qdiscs %d", addrs, addrsBefore, links, linksBefore, qdiscs)
	}
	out2, err := exec.Command("ip", "-n", l.NSName, "route", "show", "default").CombinedOutput()
	if err != nil || !strings.Contains(string(out2), "via "+l.Host.String()) {
		t.Errorf("default route not restored: %q %v", out2, err)
	}
}

// TestBareBoot measures the baseline the benchmark compares with.
func TestBareBoot(t *testing.T) {
	rt := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k, err := rt.cache.Kernel()
	if err != nil {
		t.Fatal(err)
	}
	initrd, err := rt.cache.Initrd(ctx, isolationtest.BuildAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	d, err := BareBoot(ctx, "", k.Vmlinuz, initrd, rt.KVM().Usable)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bare microvm boot to init and power-off: %v", d)
}

// BenchmarkColdStart measures create → start → agent answers → first exec
// (echo) and reports the median; BenchmarkBareBoot measures the bare boot
// of the same kernel and initramfs to init and power-off (BareBoot).
func BenchmarkColdStart(b *testing.B) {
	rt := benchRuntime(b)
	root, agent := isolationtest.BusyboxRoot(b), isolationtest.BuildAgent(b)
	var ds []time.Duration
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		tok := make([]byte, 16)
		rand.Read(tok)
		id := "b" + hex.EncodeToString(tok[:5])
		spec := &isolation.Spec{ID: id, StateDir: filepath.Join(os.TempDir(), "cbx-state", id), RootFS: root,
			AgentPath: agent, AgentToken: hex.EncodeToString(tok), Resources: isolation.Resources{MemoryBytes: 256 << 20}}
		t0 := time.Now()
		sb, err := rt.Create(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		if err := sb.Start(ctx); err != nil {
			b.Fatal(err)
		}
		c := isolationtest.Connect(b, ctx, sb, spec.AgentToken)
		var out strings.Builder
		if _, err := c.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"echo", "hi"}}, nil, &out, &out); err != nil || out.String() != "hi\n" {
			b.Fatalf("exec: %q %v", out.String(), err)
		}
		ds = append(ds, time.Since(t0))
		c.Close()
		sb.Destroy(context.Background())
		cancel()
	}
	reportMedian(b, ds)
}

func BenchmarkBareBoot(b *testing.B) {
	rt := benchRuntime(b)
	k, err := rt.cache.Kernel()
	if err != nil {
		b.Fatal(err)
	}
	initrd, err := rt.cache.Initrd(context.Background(), isolationtest.BuildAgent(b))
	if err != nil {
		b.Fatal(err)
	}
	var ds []time.Duration
	for i := 0; i < b.N; i++ {
		d, err := BareBoot(context.Background(), "", k.Vmlinuz, initrd, rt.KVM().Usable)
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, d)
	}
	reportMedian(b, ds)
}

func reportMedian(b *testing.B, ds []time.Duration) {
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(ds[0].Milliseconds()), "min-ms")
	b.ReportMetric(float64(ds[len(ds)-1].Milliseconds()), "max-ms")
}

func benchRuntime(b *testing.B) *Runtime {
	if os.Geteuid() != 0 {
		b.Skip("the qemu runtime needs root")
	}
	rt := New(Options{Dir: vmimage.TestCacheDir(), DisableTemplates: true})
	if err := rt.Available(); err != nil {
		b.Skipf("qemu runtime not available: %v", err)
	}
	return rt
}

// TestKVMProbe runs the real probe on this host: whatever kind of host it
// is (no /dev/kvm, a /dev/kvm that cannot boot the guest, real KVM), the
// verdict is bounded, consistent with the device, and explained.
func TestKVMProbe(t *testing.T) {
	rt := testRuntime(t)
	v := rt.KVM()
	t.Logf("verdict: %s (took %v)", v, v.Took)
	if v.Took > rt.probeTimeout+10*time.Second {
		t.Fatalf("the probe took %v, bound %v", v.Took, rt.probeTimeout)
	}
	if err := kvm.Open(rt.device); err != nil {
		if v.Usable || !strings.Contains(v.Reason, rt.device) {
			t.Fatalf("no device (%v) but verdict %s", err, v)
		}
		return
	}
	if !v.Usable && v.Reason == "" {
		t.Fatalf("an unusable verdict without a reason: %+v", v)
	}
	if !strings.Contains(rt.Detail(), map[bool]string{true: "kvm", false: "tcg"}[v.Usable]) {
		t.Fatalf("Detail %q disagrees with the verdict %s", rt.Detail(), v)
	}
}

// TestMounts: volumes as virtio-blk disks, host directories copied into
// read-only disks, and a read-only root (isolationtest.Mounts), with
// templates on: such sandboxes boot cold all the same.
func TestMounts(t *testing.T) {
	rt := testRuntime(t)
	rt = New(Options{Dir: rt.cache.Dir, NoBackgroundTemplates: true})
	isolationtest.Mounts(t, rt, isolationtest.Options{
		RootFS:       isolationtest.BusyboxRoot(t),
		AgentPath:    isolationtest.BuildAgent(t),
		StartTimeout: startTimeout,
	})
}

func TestDiskArgs(t *testing.T) {
	a := strings.Join((&vmConfig{MemoryMiB: 256, Disks: []vmDisk{{FD: 9, RW: true, Serial: "cbxmnt0"}, {FD: 10, Serial: "cbxmnt1"}}}).args(), " ")
	for _, want := range []string{
		"-add-fd fd=9,set=2,opaque=cbxmnt0",
		"driver=file,node-name=cbxmnt0file,filename=/dev/fdset/2,read-only=off,locking=off",
		"-device virtio-blk-device,drive=cbxmnt0,serial=cbxmnt0",
		"-add-fd fd=10,set=3,opaque=cbxmnt1",
		"driver=raw,node-name=cbxmnt1,file=cbxmnt1file,read-only=on",
	} {
		if !strings.Contains(a, want) {
			t.Errorf("disk args lack %q:\n%s", want, a)
		}
	}
}
