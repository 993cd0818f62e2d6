package qemu

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/testpki"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/internal/runlog"
	"github.com/cagebox/cagebox/isolation/isolationtest"
)

func TestTemplateArgs(t *testing.T) {
	vc := &vmConfig{MemoryMiB: 256, CPUs: 1, Append: "x", Net: true, MAC: templateMAC, TapFD: 8, RAMFD: 9, Incoming: true}
	a := strings.Join(vc.args(), " ")
	for _, want := range []string{
		",memory-backend=ram0",
		"-object memory-backend-file,id=ram0,size=256M,mem-path=/proc/self/fd/9,share=off",
		"-incoming defer", "-netdev tap,id=net0,fd=8",
	} {
		if !strings.Contains(a, want) {
			t.Errorf("restore args lack %q:\n%s", want, a)
		}
	}
	vc.RAMShared, vc.Incoming = true, false
	a = strings.Join(vc.args(), " ")
	if !strings.Contains(a, "share=on") || strings.Contains(a, "-incoming") {
		t.Errorf("template build args: %s", a)
	}
	if c := agentproto.ParseKernelCmdline(templateCmdline(0, true)); c[agentproto.VMParamAddr] != "" || !hasKey(c, agentproto.VMParamNIC) {
		t.Errorf("template cmdline %v", c)
	}
}

func hasKey(m map[string]string, k string) bool { _, ok := m[k]; return ok }

func TestTemplateDigest(t *testing.T) {
	base := templateKey{Format: templateFormat, QEMU: "q", Kernel: "k", Initrd: "i", Disk: "d", MemoryMiB: 256, CPUs: 1, PIDs: 64, DiskBytes: 1 << 30}
	seen := map[string]string{base.digest(): "base"}
	for name, mod := range map[string]func(*templateKey){
		"qemu": func(k *templateKey) { k.QEMU = "q2" }, "kernel": func(k *templateKey) { k.Kernel = "k2" },
		"initrd": func(k *templateKey) { k.Initrd = "i2" }, "disk": func(k *templateKey) { k.Disk = "d2" },
		"memory": func(k *templateKey) { k.MemoryMiB = 512 }, "cpus": func(k *templateKey) { k.CPUs = 2 },
		"pids": func(k *templateKey) { k.PIDs = 65 }, "disk bytes": func(k *templateKey) { k.DiskBytes = 1 },
		"nic": func(k *templateKey) { k.NIC = true }, "kvm": func(k *templateKey) { k.KVM = true },
		"cmdline": func(k *templateKey) { k.Cmdline = "x" }, "format": func(k *templateKey) { k.Format = "y" },
	} {
		k := base
		mod(&k)
		d := k.digest()
		if prev, dup := seen[d]; dup {
			t.Errorf("changing %s gives the digest of %s", name, prev)
		}
		seen[d] = name
	}
}

func TestSparseCopy(t *testing.T) {
	const size = 8 << 20
	src, err := newMemfd("test-src", size)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	page := bytes.Repeat([]byte{0xab}, pageSize)
	for _, off := range []int64{0, 3 * pageSize, 5 << 20} {
		if _, err := src.WriteAt(page, off); err != nil {
			t.Fatal(err)
		}
	}
	// A page written with zeros is data to SEEK_DATA but not copied.
	if _, err := src.WriteAt(make([]byte, pageSize), 6<<20); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ram")
	dst, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	dst.Truncate(size)
	n, err := copySparse(dst, src, size)
	dst.Close()
	if err != nil || n != 3*pageSize {
		t.Fatalf("copied %d bytes (%v), want %d", n, err, 3*pageSize)
	}
	if a := allocatedBytes(p); a > 64<<10 {
		t.Errorf("sparse copy allocates %d bytes", a)
	}
	m, err := loadSealed(p, size)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	got := make([]byte, pageSize)
	m.ReadAt(got, 5<<20)
	if !bytes.Equal(got, page) {
		t.Fatal("loaded memfd lacks a page")
	}
	if _, err := m.WriteAt(page, 0); err == nil {
		t.Fatal("a sealed template memfd took a write")
	}
}

// templateSpec is a spec for the template tests (mod may join a link).
func templateSpec(t *testing.T, mod func(*isolation.Spec)) *isolation.Spec {
	tok := make([]byte, 16)
	rand.Read(tok)
	id := "s" + hex.EncodeToString(tok[:6])
	spec := &isolation.Spec{
		ID: id, StateDir: filepath.Join(os.TempDir(), "cbx-state", id),
		RootFS: isolationtest.BusyboxRoot(t), AgentPath: isolationtest.BuildAgent(t),
		AgentToken: hex.EncodeToString(tok), Hostname: "h-" + id,
		Resources: isolation.Resources{MemoryBytes: 256 << 20},
	}
	if mod != nil {
		mod(spec)
	}
	return spec
}

// restored is a sandbox restored from a template, not yet claimed.
type restored struct {
	s    *Sandbox
	spec *isolation.Spec
	took time.Duration
}

func restoreSandbox(t *testing.T, rt *Runtime, spec *isolation.Spec) *restored {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	t0 := time.Now()
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	s := sb.(*Sandbox)
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("CBX_CONSOLE") != "" {
			t.Logf("console of %s:\n%s", s.id, runlog.Tail(s.sd.path("console.log"), 20000))
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		if err := s.Destroy(dctx); err != nil {
			t.Errorf("destroy: %v", err)
		}
		if left := s.Leftovers(dctx); len(left) > 0 {
			t.Errorf("left behind: %q", left)
		}
	})
	if _, ok := s.Restored(); !ok {
		t.Fatal("the sandbox cold-boots: no template was found for its inputs")
	}
	if err := s.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	return &restored{s: s, spec: spec, took: time.Since(t0)}
}

func templateRuntime(t *testing.T) *Runtime {
	rt := testRuntime(t)
	return New(Options{Dir: rt.cache.Dir, NoBackgroundTemplates: true})
}

// TestTemplateIdentity restores three sandboxes from one template, claims
// them differently and checks that nothing of the template's identity,
// nor of each other's, is left: RNG output, agent token, MAC and address,
// hostname, trusted CA, clock.
func TestTemplateIdentity(t *testing.T) {
	rt := templateRuntime(t)
	links := []*isolationtest.Link{isolationtest.NewLink(t, Name), isolationtest.NewLink(t, Name), isolationtest.NewLink(t, Name)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tp, err := rt.BuildTemplate(ctx, templateSpec(t, links[0].Join))
	if err != nil {
		t.Fatalf("build template: %v", err)
	}
	t.Logf("template %s: %d KiB on disk, built in %v", tp.Name, tp.SizeBytes>>10, tp.BuildTime.Round(time.Millisecond))
	ramSum := fileSum(t, rt.tpl.path(tp.Digest, "ram"))

	type guest struct {
		r      *restored
		c      *agentproto.Client
		ca     []byte
		rand   string
		bootID string
		tmTok  string
	}
	var gs []*guest
	for i, l := range links {
		pki, err := testpki.New(time.Hour, "claim"+strconv.Itoa(i)+".test")
		if err != nil {
			t.Fatal(err)
		}
		spec := templateSpec(t, func(s *isolation.Spec) {
			l.Join(s)
			s.TrustedCAPEM = pki.CAPEM
			s.Env = []string{"WHO=" + strconv.Itoa(i)}
		})
		r := restoreSandbox(t, rt, spec)
		ci := r.s.ClaimInfo()
		if ci.Token == "" || !ci.GuestNet || ci.MAC == "" || ci.MAC == templateMAC {
			t.Fatalf("claim info %+v", isolation.ClaimInfo{GuestNet: ci.GuestNet, MAC: ci.MAC})
		}
		if ci.Token == spec.AgentToken {
			t.Fatal("the template token is the sandbox's")
		}
		// Before the claim the sandbox's own token opens nothing.
		if agentAnswers(r.s, spec.AgentToken) {
			t.Fatal("a restored agent answered the sandbox's token before its claim")
		}
		t1 := time.Now()
		if err := isolationtest.ClaimSandbox(ctx, r.s, spec); err != nil {
			t.Fatal(err)
		}
		t2 := time.Now()
		c := isolationtest.Connect(t, ctx, r.s, spec.AgentToken)
		t.Cleanup(func() { c.Close() })
		t3 := time.Now()
		execOut(t, c, "true")
		t.Logf("sandbox %d: claim %v, reconnect %v, exec %v", i, t2.Sub(t1).Round(time.Millisecond), t3.Sub(t2).Round(time.Millisecond), time.Since(t3).Round(time.Millisecond))
		t.Logf("sandbox %d: create+start (restore) took %v", i, r.took.Round(time.Millisecond))
		g := &guest{r: r, c: c, ca: pki.CAPEM, tmTok: ci.Token}
		out, code := execOut(t, c, "sh", "-c", "head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
		if code != 0 || len(out) != 128 {
			t.Fatalf("read /dev/urandom: %q %d", out, code)
		}
		g.rand = out
		// The kernel makes its boot id on first read: after the claim.
		g.bootID, _ = execOut(t, c, "cat", "/proc/sys/kernel/random/boot_id")
		gs = append(gs, g)
	}
	for i, g := range gs {
		for j := 0; j < i; j++ {
			if g.rand == gs[j].rand {
				t.Errorf("sandboxes %d and %d read the same 64 bytes from /dev/urandom: the RNG state is the template's", j, i)
			}
			if g.bootID == gs[j].bootID {
				t.Errorf("sandboxes %d and %d have the same boot id %q", j, i, g.bootID)
			}
		}
		// The template token no longer opens a connection.
		if agentAnswers(g.r.s, g.tmTok) {
			t.Errorf("sandbox %d: the template token still opens the agent after the claim", i)
		}
		spec := g.r.spec
		out, _ := execOut(t, g.c, "cat", "/sys/class/net/eth0/address")
		if strings.TrimSpace(out) != g.r.s.sd.Restored.MAC || strings.TrimSpace(out) == templateMAC {
			t.Errorf("sandbox %d: eth0 MAC %q, want %s", i, out, g.r.s.sd.Restored.MAC)
		}
		out, _ = execOut(t, g.c, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		want := netip.PrefixFrom(spec.GuestAddr, spec.Prefix.Bits()).String()
		if !strings.Contains(out, " "+want+" ") || strings.Count(out, "inet ") != 1 {
			t.Errorf("sandbox %d: eth0 addresses %q, want only %s", i, out, want)
		}
		out, _ = execOut(t, g.c, "ip", "route", "show", "default")
		if !strings.Contains(out, "via "+spec.Gateway.String()) {
			t.Errorf("sandbox %d: default route %q, want via %s", i, out, spec.Gateway)
		}
		// The link works: the host end sees a connection from the
		// claimed address.
		if peer := tcpFromGuest(t, g.c, spec.Gateway); peer != spec.GuestAddr.String() {
			t.Errorf("sandbox %d: connection to the host end came from %q, want %s", i, peer, spec.GuestAddr)
		}
		out, _ = execOut(t, g.c, "hostname")
		if strings.TrimSpace(out) != spec.Hostname {
			t.Errorf("sandbox %d: hostname %q, want %s", i, out, spec.Hostname)
		}
		out, _ = execOut(t, g.c, "cat", isolation.GuestCAPath)
		if out != string(g.ca) {
			t.Errorf("sandbox %d: %s is not its claim's CA", i, isolation.GuestCAPath)
		}
		out, _ = execOut(t, g.c, "cat", isolation.GuestCABundlePath)
		for j, o := range gs {
			if has := strings.Contains(out, string(o.ca)); has != (i == j) {
				t.Errorf("sandbox %d: bundle holds sandbox %d's CA: %v", i, j, has)
			}
		}
		out, _ = execOut(t, g.c, "sh", "-c", "echo $WHO")
		if strings.TrimSpace(out) != strconv.Itoa(i) {
			t.Errorf("sandbox %d: env WHO=%q", i, out)
		}
		out, _ = execOut(t, g.c, "date", "+%s")
		guestNow, _ := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		if d := time.Since(time.Unix(guestNow, 0)); d < -5*time.Second || d > 5*time.Second {
			t.Errorf("sandbox %d: guest clock %d is %v off the host's", i, guestNow, d)
		}
	}
	// The template is never written: its RAM file is as built.
	if fileSum(t, rt.tpl.path(tp.Digest, "ram")) != ramSum {
		t.Error("the template's RAM file changed while sandboxes ran from it")
	}
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// tcpFromGuest connects from the guest to a listener on the host end
// (host) and returns the address the host saw the connection come from.
func tcpFromGuest(t *testing.T, c *agentproto.Client, host netip.Addr) string {
	t.Helper()
	ln, err := net.Listen("tcp4", net.JoinHostPort(host.String(), "0"))
	if err != nil {
		t.Fatalf("listen on the host end: %v", err)
	}
	defer ln.Close()
	peer := make(chan string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			peer <- ""
			return
		}
		h, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
		conn.Write([]byte("ok\n"))
		conn.Close()
		peer <- h
	}()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	out, code := execOut(t, c, "sh", "-c", "echo hi | nc -w 5 "+host.String()+" "+port)
	if code != 0 || out != "ok\n" {
		t.Errorf("guest to host TCP: %q exit %d", out, code)
		return ""
	}
	select {
	case p := <-peer:
		return p
	case <-time.After(5 * time.Second):
		return ""
	}
}

// agentAnswers reports whether a connection with token is accepted.
func agentAnswers(s *Sandbox, token string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	conn, err := s.DialAgent(ctx)
	if err != nil {
		return false
	}
	c, err := agentproto.NewClient(ctx, conn, token)
	if err != nil {
		conn.Close()
		return false
	}
	defer c.Close()
	_, err = c.Health(ctx)
	return err == nil
}

// TestTemplateBackground: a cold boot builds its inputs' template in the
// background, the next sandbox restores from it; a half-written build is
// never used and is cleaned up; stale templates are pruned.
func TestTemplateBackground(t *testing.T) {
	base := testRuntime(t)
	dir := t.TempDir()
	rt := New(Options{Dir: base.cache.Dir, TemplateDir: dir})
	t.Cleanup(rt.Close)
	// What a build that died mid-way leaves: never listed, removed.
	if err := os.MkdirAll(filepath.Join(dir, ".build-dead", "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	spec := templateSpec(t, nil)
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sb.(*Sandbox).Restored(); ok {
		t.Fatal("restored with no template saved")
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c := isolationtest.Connect(t, ctx, sb, spec.AgentToken)
	c.Close()
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	var ts []Template
	for len(ts) == 0 {
		if ctx.Err() != nil {
			t.Fatal("no template was built in the background")
		}
		time.Sleep(time.Second)
		ts, err = rt.Templates()
		if err != nil {
			t.Fatal(err)
		}
	}
	tp := ts[0]
	t.Logf("built in the background: %+v", tp)
	if tp.Stale || tp.Image != "busybox" || tp.MemoryBytes != 256<<20 || tp.NIC || tp.SizeBytes <= 0 {
		t.Errorf("template record %+v", tp)
	}
	if _, err := os.Stat(filepath.Join(dir, ".build-dead")); err == nil {
		t.Error("a dead build's directory survived a build")
	}
	for _, f := range []string{"token", "ram", "state", "template.json"} {
		fi, err := os.Stat(filepath.Join(dir, tp.Digest, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("template file %s: %v %v", f, fi, err)
		}
	}

	r := restoreSandbox(t, rt, templateSpec(t, nil))
	if err := isolationtest.ClaimSandbox(ctx, r.s, r.spec); err != nil {
		t.Fatal(err)
	}
	c = isolationtest.Connect(t, ctx, r.s, r.spec.AgentToken)
	if out, _ := execOut(t, c, "hostname"); strings.TrimSpace(out) != r.spec.Hostname {
		t.Errorf("hostname %q", out)
	}
	c.Close()

	// A template whose image disk is gone is stale, and pruned; the
	// other stays unless keep rejects it.
	m, err := readTemplateMeta(filepath.Join(dir, tp.Digest, "template.json"))
	if err != nil {
		t.Fatal(err)
	}
	m.Key.Disk = "gone.ext4"
	m.Digest = m.Key.digest()
	if err := os.MkdirAll(filepath.Join(dir, m.Digest), 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(m)
	os.WriteFile(filepath.Join(dir, m.Digest, "template.json"), b, 0o600)
	for _, f := range []string{"token", "ram", "state"} {
		os.WriteFile(filepath.Join(dir, m.Digest, f), nil, 0o600)
	}
	// A directory without a complete record is not a template.
	os.MkdirAll(filepath.Join(dir, "0123456789abcdef0123456789abcdef"), 0o700)
	ts, _ = rt.Templates()
	if len(ts) != 2 || ts[0].Stale == ts[1].Stale {
		t.Fatalf("templates %+v: want one stale, one not", ts)
	}
	removed, err := rt.PruneTemplates(nil)
	if err != nil || len(removed) != 1 || removed[0].Digest != m.Digest {
		t.Fatalf("prune removed %+v (%v), want the stale one", removed, err)
	}
	// (A copy of the template, for the damaged-template case below.)
	keepDir := filepath.Join(t.TempDir(), "copy")
	os.Mkdir(keepDir, 0o700)
	for _, f := range []string{"token", "ram", "state", "template.json"} {
		if err := os.Link(filepath.Join(dir, tp.Digest, f), filepath.Join(keepDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	removed, err = rt.PruneTemplates(func(Template) bool { return false })
	if err != nil || len(removed) != 1 || removed[0].Digest != tp.Digest {
		t.Fatalf("prune with keep=false removed %+v (%v)", removed, err)
	}
	// The restored sandbox lives on without its template.
	c = isolationtest.Connect(t, ctx, r.s, r.spec.AgentToken)
	if out, _ := execOut(t, c, "echo", "alive"); out != "alive\n" {
		t.Errorf("after its template was removed: %q", out)
	}
	c.Close()
	if _, ok := rt.lookupTemplate(tp.Digest); ok {
		t.Error("a removed template is still found")
	}

	// A template whose RAM file is damaged is removed at the next
	// create, which cold-boots.
	if err := os.Rename(keepDir, filepath.Join(dir, tp.Digest)); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, tp.Digest, "ram"), 4096); err != nil {
		t.Fatal(err)
	}
	rt2 := New(Options{Dir: base.cache.Dir, TemplateDir: dir, NoBackgroundTemplates: true})
	spec2 := templateSpec(t, nil)
	sb2, err := rt2.Create(ctx, spec2)
	if err != nil {
		t.Fatalf("create over a damaged template: %v", err)
	}
	if _, ok := sb2.(*Sandbox).Restored(); ok {
		t.Error("restored from a damaged template")
	}
	if err := sb2.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := rt2.lookupTemplate(tp.Digest); ok {
		t.Error("a damaged template was kept")
	}
}
