package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
)

// vmmAlive reports whether the sandbox's VMM process runs (vmm.pid holds
// "PID STARTTIME").
func vmmAlive(e *env, id string) bool {
	b, err := os.ReadFile(e.home + "/sandboxes/" + id + "/vmm.pid")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return false
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		return false
	}
	return syscall.Kill(pid, 0) == nil
}

// simulateReboot removes what a host reboot takes of sandbox id: its veth
// and its network namespace (the links the daemon recorded say where).
func simulateReboot(t *testing.T, e *env, id string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.home, "net", "links", "links.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Links []struct {
			ID        string `json:"id"`
			HostIf    string `json:"host_if"`
			NetNSPath string `json:"netns_path"`
		} `json:"links"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, l := range doc.Links {
		if l.ID != id {
			continue
		}
		if out, err := exec.Command("ip", "link", "del", l.HostIf).CombinedOutput(); err != nil {
			t.Fatalf("ip link del %s: %v %s", l.HostIf, err, out)
		}
		if err := syscall.Unmount(l.NetNSPath, syscall.MNT_DETACH); err != nil {
			t.Fatalf("unmount %s: %v", l.NetNSPath, err)
		}
		if err := os.Remove(l.NetNSPath); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no link recorded for %s in %s", id, b)
}

func waitStatus(t *testing.T, e *env, id, want string) *api.Sandbox {
	t.Helper()
	ctx, cancel := testContext(t)
	defer cancel()
	for {
		sb, err := e.client().Get(context.Background(), id)
		if err == nil && sb.Status == want {
			return sb
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: status %v (%v), want %s", id, sb, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHibernate: `pause --to-disk` saves a microVM whole and ends its VMM
// (its memory freed); `resume` brings it back with its state and network;
// a hibernated sandbox survives a daemon restart; --idle-action hibernate
// does it when idle and the next exec wakes it. Runtimes that cannot
// hibernate say so.
func TestHibernate(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	if rts, err := e.client().Runtimes(context.Background()); err == nil {
		for _, r := range rts {
			if r.Name == "qemu" && !r.Available {
				t.Skipf("qemu is not available here: %s", r.Reason)
			}
		}
	}
	r := e.cli("", "create", "--runtime", "qemu", "--image", "busybox", "--allow", "api.example.test")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	if r := e.cli("", "exec", id, "--", "sh", "-c", "echo kept > /tmp/state"); r.code != 0 {
		t.Fatalf("exec: %+v", r)
	}
	before, _ := e.client().Get(context.Background(), id)
	if !vmmAlive(e, id) {
		t.Fatal("no VMM process for a running qemu sandbox")
	}
	if r := e.cli("", "pause", "--to-disk", id); r.code != 0 {
		t.Fatalf("pause --to-disk: %+v", r)
	}
	waitStatus(t, e, id, "hibernated")
	if vmmAlive(e, id) {
		t.Error("the VMM still runs after hibernation")
	}
	e.waitEvent(id, "sandbox.paused to disk", func(ev api.Event) bool {
		return ev.Kind == api.EventSandboxPaused && strings.Contains(string(dataOf(ev)), `"to_disk":true`)
	})
	if r := e.cli("", "exec", id, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "cagebox resume") {
		t.Errorf("exec in a sandbox hibernated by hand: %+v", r)
	}
	// A daemon restart keeps it hibernated; resume restores it as it was.
	e.stopDaemon(syscall.SIGTERM)
	e.startDaemon()
	waitStatus(t, e, id, "hibernated")
	if r := e.cli("", "resume", id); r.code != 0 {
		t.Fatalf("resume: %+v", r)
	}
	after := waitStatus(t, e, id, "running")
	if r := e.cli("", "exec", id, "--", "cat", "/tmp/state"); r.code != 0 || r.stdout != "kept\n" {
		t.Fatalf("state after resume: %+v", r)
	}
	if before.Network == nil || after.Network == nil || before.Network.Address != after.Network.Address {
		t.Errorf("network identity changed: %+v → %+v", before.Network, after.Network)
	}
	if after.Persists != "restart" {
		t.Errorf("a running sandbox's persists = %q, want restart", after.Persists)
	}
	// A host reboot: the daemon is gone without a word and every veth and
	// namespace with it. The next daemon makes the link again and the
	// hibernated sandbox wakes on it, its state and address as they were.
	if r := e.cli("", "pause", "--to-disk", id); r.code != 0 {
		t.Fatalf("pause --to-disk: %+v", r)
	}
	if sb := waitStatus(t, e, id, "hibernated"); sb.Persists != "reboot" {
		t.Errorf("a hibernated sandbox's persists = %q, want reboot", sb.Persists)
	}
	e.stopDaemon(syscall.SIGKILL)
	simulateReboot(t, e, id)
	e.startDaemon()
	waitStatus(t, e, id, "hibernated")
	if r := e.cli("", "resume", id); r.code != 0 {
		t.Fatalf("resume after a reboot: %+v", r)
	}
	rebooted := waitStatus(t, e, id, "running")
	if r := e.cli("", "exec", id, "--", "cat", "/tmp/state"); r.code != 0 || r.stdout != "kept\n" {
		t.Fatalf("state after a reboot: %+v", r)
	}
	if rebooted.Network == nil || rebooted.Network.Address != before.Network.Address {
		t.Errorf("network identity after a reboot: %+v → %+v", before.Network, rebooted.Network)
	}
	// Idle: hibernated, then woken by the next exec.
	r = e.cli("", "create", "--runtime", "qemu", "--image", "busybox", "--idle-timeout", "3s", "--idle-action", "hibernate")
	if r.code != 0 {
		t.Fatalf("create --idle-action hibernate: %+v", r)
	}
	idle := strings.TrimSpace(r.stdout)
	waitStatus(t, e, idle, "hibernated")
	if r := e.cli("", "exec", idle, "--", "echo", "woke"); r.code != 0 || r.stdout != "woke\n" {
		t.Fatalf("exec on an idle-hibernated sandbox: %+v", r)
	}
	// A runtime that cannot hibernate says so, and nothing changes.
	r = e.cli("", "create", "--runtime", "container", "--image", "busybox")
	cid := strings.TrimSpace(r.stdout)
	if r := e.cli("", "pause", "--to-disk", cid); r.code == 0 || !strings.Contains(r.stderr, "cannot hibernate") {
		t.Errorf("pause --to-disk of a container: %+v", r)
	}
	if sb, _ := e.client().Get(context.Background(), cid); sb.Status != "running" {
		t.Errorf("container after a refused hibernate: %s", sb.Status)
	}
	if r := e.cli("", "create", "--runtime", "container", "--idle-timeout", "1m", "--idle-action", "hibernate"); r.code == 0 || !strings.Contains(r.stderr, "cannot hibernate") {
		t.Errorf("--idle-action hibernate on a container: %+v", r)
	}
}
