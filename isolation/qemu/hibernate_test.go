package qemu

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/vmproc"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/isolationtest"
)

// TestHibernate saves a restored, claimed sandbox on a link to disk, ends
// its QEMU, recovers it with a new runtime (a daemon restart) and resumes
// it: the guest's files, hostname, MAC, address and link are as before,
// and its agent answers the sandbox's token. Then the same for a
// cold-booted sandbox without a network.
func TestHibernate(t *testing.T) {
	rt := templateRuntime(t)
	l := isolationtest.NewLink(t, Name)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := rt.BuildTemplate(ctx, templateSpec(t, l.Join)); err != nil {
		t.Fatal(err)
	}
	r := restoreSandbox(t, rt, templateSpec(t, l.Join))
	if err := isolationtest.ClaimSandbox(ctx, r.s, r.spec); err != nil {
		t.Fatal(err)
	}
	hibernateRoundTrip(t, rt, r.s, r.spec, true)

	cold := New(Options{Dir: rt.cache.Dir, DisableTemplates: true})
	spec := templateSpec(t, nil)
	sb, err := cold.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	s := sb.(*Sandbox)
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		s.Destroy(dctx)
		if left := s.Leftovers(dctx); len(left) > 0 {
			t.Errorf("left behind: %q", left)
		}
	})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hibernateRoundTrip(t, cold, s, spec, false)
}

func hibernateRoundTrip(t *testing.T, rt *Runtime, s *Sandbox, spec *isolation.Spec, withNet bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := isolationtest.Connect(t, ctx, s, spec.AgentToken)
	execOut(t, c, "sh", "-c", "echo kept > /tmp/mark")
	mac, _ := execOut(t, c, "sh", "-c", "cat /sys/class/net/eth0/address 2>/dev/null; true")
	c.Close()
	old, err := vmproc.ReadFile(s.sd.path("vmm.pid"))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := s.Hibernate(ctx); err != nil {
		t.Fatalf("hibernate: %v", err)
	}
	t.Logf("hibernated in %v", time.Since(t0).Round(time.Millisecond))
	if old.Alive() {
		t.Fatal("QEMU still runs after Hibernate")
	}
	if err := s.Stop(ctx, time.Second); err != nil {
		t.Errorf("stop of a hibernated sandbox: %v", err)
	}
	// A restarted daemon recovers it hibernated and resumes it.
	rt2 := New(Options{Dir: rt.cache.Dir, TemplateDir: rt.tpl.dir, NoBackgroundTemplates: true})
	sb2, err := rt2.Recover(ctx, s.State())
	if err != nil {
		t.Fatalf("recover a hibernated sandbox: %v", err)
	}
	t0 = time.Now()
	if err := sb2.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	c = isolationtest.Connect(t, ctx, sb2, spec.AgentToken)
	defer c.Close()
	t.Logf("resumed and answering in %v", time.Since(t0).Round(time.Millisecond))
	s2 := sb2.(*Sandbox)
	if out, _ := execOut(t, c, "cat", "/tmp/mark"); out != "kept\n" {
		t.Errorf("after resume /tmp/mark = %q", out)
	}
	if out, _ := execOut(t, c, "hostname"); strings.TrimSpace(out) != spec.Hostname {
		t.Errorf("after resume hostname %q", out)
	}
	if withNet {
		if out, _ := execOut(t, c, "cat", "/sys/class/net/eth0/address"); out != mac {
			t.Errorf("after resume eth0 MAC %q, before %q", out, mac)
		}
		if peer := tcpFromGuest(t, c, spec.Gateway); peer != spec.GuestAddr.String() {
			t.Errorf("after resume the host end saw %q, want %s", peer, spec.GuestAddr)
		}
	}
	for _, f := range []string{hibernateFile, hibStateFile} {
		if _, err := os.Stat(s2.sd.path(f)); err == nil {
			t.Errorf("%s left after resume", f)
		}
	}
	// Pause and resume still work on the woken sandbox.
	if err := sb2.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb2.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if out, _ := execOut(t, c, "echo", "ok"); out != "ok\n" {
		t.Errorf("exec after pause/resume: %q", out)
	}
}
