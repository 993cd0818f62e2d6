package gvisor_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/gvisor"
	"github.com/cagebox/cagebox/isolation/isolationtest"
)

func newRuntime(t *testing.T) *gvisor.Runtime {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the gvisor runtime needs root")
	}
	rt := gvisor.New(gvisor.Options{StateRoot: t.TempDir()})
	if err := rt.Available(); err != nil {
		t.Skipf("gvisor not available here: %v", err)
	}
	t.Logf("gvisor runtime: %s", rt.Detail())
	return rt
}

func TestConformance(t *testing.T) {
	rt := newRuntime(t)
	isolationtest.Run(t, rt, isolationtest.Options{
		RootFS:    isolationtest.BusyboxRoot(t),
		AgentPath: isolationtest.BuildAgent(t),
	})
}

// TestNetwork gives a guest a routed link like the daemon's (a namespace
// holding eth0 with the guest's address and a default route via the host
// end of a veth) and checks the sentry's netstack reaches a TCP server on
// the host end, and that resolv.conf and the CA files are the spec's.
func TestNetwork(t *testing.T) {
	rt := newRuntime(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) is not installed: run scripts/setup.sh")
	}
	var (
		prefix  = netip.MustParsePrefix("10.253.0.0/30")
		gateway = netip.MustParseAddr("10.253.0.1")
		guest   = netip.MustParseAddr("10.253.0.2")
	)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := "cbg" + hex.EncodeToString(suffix) // netns and host interface
	nsPath := filepath.Join("/run/netns", name)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", name).Run()
		_ = exec.Command("ip", "netns", "del", name).Run()
	})
	ip("netns", "add", name)
	ip("link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name)
	ip("addr", "add", gateway.String()+"/30", "dev", name)
	ip("link", "set", name, "up")
	ip("-n", name, "link", "set", "lo", "up")
	ip("-n", name, "addr", "add", guest.String()+"/30", "dev", "eth0")
	ip("-n", name, "link", "set", "eth0", "up")
	ip("-n", name, "route", "add", "default", "via", gateway.String())

	ln, err := net.Listen("tcp4", net.JoinHostPort(gateway.String(), "0"))
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
			peers <- c.RemoteAddr().String()
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Write([]byte("host got " + line))
			c.Close()
		}
	}()

	caPEM := testCA(t)
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	id := "n" + hex.EncodeToString(suffix)
	stateDir := filepath.Join(os.TempDir(), "cbx-state", id)
	spec := &isolation.Spec{
		ID: id, StateDir: stateDir,
		RootFS:     isolationtest.BusyboxRoot(t),
		AgentPath:  isolationtest.BuildAgent(t),
		AgentToken: hex.EncodeToString(tok),
		Hostname:   "net",
		NetNS:      nsPath, GuestIf: "eth0", GuestAddr: guest, Gateway: gateway, Prefix: prefix,
		Nameserver:   gateway.String(),
		TrustedCAPEM: caPEM,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		if err := sb.Destroy(dctx); err != nil {
			t.Errorf("destroy: %v", err)
		}
		if left := sb.(isolation.LeakChecker).Leftovers(dctx); len(left) > 0 {
			t.Errorf("destroy left things behind: %q", left)
		}
	})
	if err := sb.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	c := isolationtest.Connect(t, ctx, sb, spec.AgentToken)
	defer c.Close()
	g := &isolationtest.Guest{Sandbox: sb, Client: c, Token: spec.AgentToken}

	port := ln.Addr().(*net.TCPAddr).Port
	out, errOut, res := g.Exec(t, "sh", "-c", "echo hello | nc "+gateway.String()+" "+strconv.Itoa(port))
	if res.ExitCode != 0 || out != "host got hello\n" {
		t.Fatalf("guest to host TCP: exit %d, out %q, err %q", res.ExitCode, out, errOut)
	}
	select {
	case peer := <-peers:
		if host, _, _ := net.SplitHostPort(peer); host != guest.String() {
			t.Errorf("connection came from %s, want the guest address %s", peer, guest)
		}
	case <-time.After(5 * time.Second):
		t.Error("the host server saw no connection")
	}

	out, _, _ = g.Exec(t, "cat", "/etc/resolv.conf")
	if !strings.HasPrefix(out, "nameserver "+gateway.String()+"\n") {
		t.Errorf("/etc/resolv.conf = %q, want nameserver %s", out, gateway)
	}
	out, _, _ = g.Exec(t, "cat", isolation.GuestCAPath)
	if out != string(caPEM) {
		t.Errorf("%s = %q, want the spec's CA", isolation.GuestCAPath, out)
	}
	out, _, _ = g.Exec(t, "cat", isolation.GuestCABundlePath)
	if !strings.Contains(out, string(caPEM)) {
		t.Errorf("%s lacks the spec's CA", isolation.GuestCABundlePath)
	}
	out, _, _ = g.Exec(t, "cat", "/proc/net/dev")
	if !strings.Contains(out, "eth0:") {
		t.Errorf("guest has no eth0:\n%s", out)
	}
	// The sentry's netstack owns the guest address now: the namespace's
	// eth0 has none left for the host kernel to answer with.
	if b, err := exec.Command("ip", "-n", name, "-4", "addr", "show", "dev", "eth0").CombinedOutput(); err != nil || bytes.Contains(b, []byte(guest.String())) {
		t.Errorf("namespace eth0 still holds the guest address: %s %v", b, err)
	}
}

// testCA returns a self-signed CA certificate in PEM.
func testCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cagebox gvisor test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestRecover re-attaches to a running (and a paused) sandbox from its
// State with a new Runtime, as a restarted daemon does, and cleans up one
// that is gone.
func TestRecover(t *testing.T) {
	rt := newRuntime(t)
	o := isolationtest.Options{RootFS: isolationtest.BusyboxRoot(t), AgentPath: isolationtest.BuildAgent(t)}
	g := isolationtest.Start(t, rt, o, isolation.Resources{})
	g.Exec(t, "sh", "-c", "echo kept > /tmp/mark")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := g.Sandbox.Pause(ctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	st := g.Sandbox.State()

	rt2 := gvisor.New(gvisor.Options{StateRoot: rt.StateRoot()})
	sb, err := rt2.Recover(ctx, st)
	if err != nil {
		t.Fatalf("recover a paused sandbox: %v", err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatalf("resume the recovered sandbox: %v", err)
	}
	c := isolationtest.Connect(t, ctx, sb, g.Token)
	defer c.Close()
	g2 := &isolationtest.Guest{Sandbox: sb, Client: c, Token: g.Token}
	if out, _, _ := g2.Exec(t, "cat", "/tmp/mark"); out != "kept\n" {
		t.Fatalf("recovered sandbox lost its state: %q", out)
	}

	if err := sb.Stop(ctx, time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, err := rt2.Recover(ctx, st); !errors.Is(err, isolation.ErrGone) {
		t.Fatalf("recover a stopped sandbox: %v, want ErrGone", err)
	}
	if left := sb.(isolation.LeakChecker).Leftovers(ctx); len(left) > 0 {
		t.Fatalf("recover of a stopped sandbox left things behind: %q", left)
	}
}

// fakeRunsc stands in for runsc on a host whose /dev/kvm opens but cannot
// run gVisor's kvm platform: with --platform=kvm it does what kvmScript
// says; otherwise it runs the real runsc.
func fakeRunsc(t *testing.T, kvmScript string) string {
	t.Helper()
	real, err := exec.LookPath("runsc")
	if err != nil {
		t.Skip("runsc not installed")
	}
	p := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in --platform=kvm) " + kvmScript + ";; esac; done\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKVMPlatformFallback simulates the two failures seen on a paravirtual
// nested KVM (the sentry fails at once; the sentry hangs) and a host
// without /dev/kvm: the runtime falls back to systrap or ptrace, says why
// quoting the probe, and runs a sandbox.
func TestKVMPlatformFallback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the gvisor runtime needs root")
	}
	for _, tc := range []struct {
		name, script, device, want string
	}{
		{"sentry fails", `echo "creating container: cannot create sandbox: cannot read client sync file: waiting for sandbox to start: EOF" >&2; exit 128`, "/dev/null", "cannot read client sync file"},
		{"sentry hangs", `exec sleep 60`, "/dev/null", "did not finish within 1.5s"},
		{"no device", `exit 99`, "/nonexistent/kvm", "no usable /nonexistent/kvm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			rt := gvisor.New(gvisor.Options{StateRoot: t.TempDir(), Binary: fakeRunsc(t, tc.script), Device: tc.device, ProbeTimeout: 1500 * time.Millisecond})
			if err := rt.Available(); err != nil {
				t.Fatalf("unavailable after a failed kvm probe (it should fall back): %v", err)
			}
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("probing took %v with a bound of 1.5s", took)
			}
			if p := rt.Platform(); p == "kvm" {
				t.Fatalf("platform kvm after a failed probe")
			}
			if d := rt.Detail(); !strings.Contains(d, tc.want) {
				t.Fatalf("Detail %q does not say %q", d, tc.want)
			}
			g := isolationtest.Start(t, rt, isolationtest.Options{RootFS: isolationtest.BusyboxRoot(t), AgentPath: isolationtest.BuildAgent(t)}, isolation.Resources{})
			if out, _, res := g.Exec(t, "echo", "fallback"); out != "fallback\n" || res.ExitCode != 0 {
				t.Fatalf("exec on the fallback platform: %q %+v", out, res)
			}
		})
	}
}

// TestKVMProbeLeavesNothing runs the real kvm platform probe (on a host
// where the platform hangs it is killed at its bound) and checks that no
// process of it is left: runsc's sandbox and gofer leave the probe's
// process group and lose their parent-death signal.
func TestKVMProbeLeavesNothing(t *testing.T) {
	rt := newRuntime(t)
	t.Logf("platform %s", rt.Platform())
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(fmt.Sprintf("cbx-runsc-kvm-probe-%d-", os.Getpid()))) {
			st, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
			if !bytes.Contains(st, []byte(") Z ")) {
				t.Errorf("the kvm probe left process %s: %s", e.Name(), bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
			}
		}
	}
}
