package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/mounts"
)

// TestMounts: through the real CLI, a daemon with --mount-root binds host
// code read-only and a named volume read-write; a volume has one
// read-write holder (also across a daemon restart) and outlives its
// sandbox; paths outside the root, symlinks out of it and `..` are refused
// with a clear message; a read-only root refuses writes outside /tmp; and
// after rm nothing of the sandbox is left (mounts, loop devices, state).
func TestMounts(t *testing.T) {
	e := newEnv(t)
	base := t.TempDir()
	root := filepath.Join(base, "root")
	code := filepath.Join(root, "code")
	if err := os.MkdirAll(code, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(code, "main.py"), []byte("print('hi')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "secret"), []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(base, filepath.Join(root, "out")); err != nil {
		t.Fatal(err)
	}

	// The daemon refuses a mount root that would expose everything, or
	// its own home.
	for _, bad := range []struct{ dir, says string }{{"/", "host's root"}, {e.home, "daemon's home"}, {"relative", "absolute"}} {
		if r := e.cli("", "daemon", "--agent", filepath.Join(binDir, "cagebox-agent"), "--mount-root", bad.dir); r.code == 0 || !strings.Contains(r.stderr, bad.says) {
			t.Errorf("daemon --mount-root %s: %+v, want a refusal saying %q", bad.dir, r, bad.says)
		}
	}
	e.startDaemon("--mount-root", root)
	rt := e2eRuntime()

	if r := e.cli("", "volume", "create", "data", "--size", "64M"); r.code != 0 || strings.TrimSpace(r.stdout) != "data" {
		t.Fatalf("volume create: %+v", r)
	}
	if r := e.cli("", "volume", "create", "data"); r.code == 0 || !strings.Contains(r.stderr, "exists") {
		t.Errorf("volume create twice: %+v", r)
	}
	if r := e.cli("", "volume", "create", "../x"); r.code == 0 || !strings.Contains(r.stderr, "volume name") {
		t.Errorf("bad volume name: %+v", r)
	}

	// Code read-only, the volume read-write.
	bindCode := "type=bind,src=" + code + ",dst=/code"
	r := e.cli("", "run", "--runtime", rt, "--mount", bindCode, "--mount", "type=volume,src=data,dst=/data,rw", "--",
		"sh", "-c", "cat /code/main.py && echo from-run > /data/note && echo poison > /code/main.py")
	if r.code == 0 || r.stdout != "print('hi')\n" || !strings.Contains(r.stderr, "Read-only file system") {
		t.Errorf("run with mounts: %+v; want the code read, the volume written and the code write refused", r)
	}
	if b, _ := os.ReadFile(filepath.Join(code, "main.py")); string(b) != "print('hi')\n" {
		t.Errorf("host code changed: %q", b)
	}

	// Refusals say what to do.
	for _, c := range []struct{ spec, says string }{
		{"type=bind,src=" + base + "/secret,dst=/s", "not below a mount root"},
		{"type=bind,src=/etc,dst=/etc2", "not below a mount root"},
		{"type=bind,src=" + root + "/out/secret,dst=/s", "leads out of the mount root"},
		{"type=bind,src=" + code + "/../../secret,dst=/s", `".."`},
		{"type=bind,src=" + code + ",dst=/proc/x", "kernel or agent"},
		{"type=volume,src=nope,dst=/data", "cagebox volume create nope"},
		{"type=bind,src=" + code + ",dst=/code,suid", "unknown option"},
	} {
		r := e.cli("", "run", "--runtime", rt, "--mount", c.spec, "--", "true")
		if r.code != 125 || !strings.Contains(r.stderr, c.says) {
			t.Errorf("--mount %s: %+v, want exit 125 saying %q", c.spec, r, c.says)
		}
	}
	// One read-write holder, also across a daemon restart.
	a := strings.TrimSpace(e.cli("", "create", "--runtime", rt, "--mount", "type=volume,src=data,dst=/data,rw").stdout)
	if a == "" {
		t.Fatal("create with a rw volume failed")
	}
	if r := e.cli("", "exec", a, "--", "cat", "/data/note"); r.stdout != "from-run\n" {
		t.Errorf("the volume lost what run wrote: %+v", r)
	}
	e.stopDaemon(syscall.SIGKILL)
	e.startDaemon("--mount-root", root)
	if r := e.cli("", "create", "--runtime", rt, "--mount", "type=volume,src=data,dst=/data"); r.code == 0 || !strings.Contains(r.stderr, "mounted read-write by sandbox "+a) {
		t.Errorf("second attach while %s runs: %+v, want a conflict naming it", a, r)
	}
	if r := e.cli("", "volume", "rm", "data"); r.code == 0 || !strings.Contains(r.stderr, "cagebox rm "+a) {
		t.Errorf("volume rm while mounted: %+v", r)
	}
	var vols []api.Volume
	if r := e.cli("", "volume", "ls", "--json"); json.Unmarshal([]byte(r.stdout), &vols) != nil || len(vols) != 1 || len(vols[0].AttachedTo) != 1 || vols[0].AttachedTo[0].Sandbox != a || !vols[0].AttachedTo[0].RW {
		t.Errorf("volume ls: %+v", vols)
	}
	if r := e.cli("", "exec", a, "--", "sh", "-c", "echo from-a >> /data/note"); r.code != 0 {
		t.Errorf("write after the daemon restart: %+v", r)
	}
	stateDir := filepath.Join(e.home, "sandboxes", a)
	if r := e.cli("", "rm", a); r.code != 0 {
		t.Fatalf("rm: %+v", r)
	}
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		t.Errorf("state dir of %s left: %v", a, err)
	}
	if left := mounts.MountPointsBelow(stateDir); len(left) > 0 {
		t.Errorf("mounts of %s left: %v", a, left)
	}
	img := filepath.Join(e.home, "volumes", "admin", "data.ext4")
	if l := mounts.LoopsOf(img); len(l) > 0 {
		t.Errorf("loop devices left on the volume: %v", l)
	}

	// Read-only root: the volume (read-only now) has both writes; /etc is
	// not writable, /tmp is.
	r = e.cli("", "run", "--runtime", rt, "--read-only-root", "--mount", "type=volume,src=data,dst=/data", "--",
		"sh", "-c", "cat /data/note; echo x > /tmp/ok && echo tmp-ok; echo x > /etc/poison")
	if r.code == 0 || r.stdout != "from-run\nfrom-a\ntmp-ok\n" || !strings.Contains(r.stderr, "Read-only file system") {
		t.Errorf("read-only root: %+v", r)
	}

	// A holder that dies while no daemon runs releases the volume when
	// the daemon, restarted, finds it gone.
	if rt == "container" {
		c := strings.TrimSpace(e.cli("", "create", "--runtime", rt, "--mount", "type=volume,src=data,dst=/data,rw").stdout)
		if c == "" {
			t.Fatal("create with a rw volume failed")
		}
		e.stopDaemon(syscall.SIGKILL)
		if out, err := exec.Command("runc", "--root", filepath.Join(e.home, "oci"), "kill", c, "KILL").CombinedOutput(); err != nil {
			t.Logf("kill %s: %v %s", c, err, out)
		}
		time.Sleep(300 * time.Millisecond)
		e.startDaemon("--mount-root", root)
		d := strings.TrimSpace(e.cli("", "create", "--runtime", rt, "--mount", "type=volume,src=data,dst=/data,rw").stdout)
		if d == "" {
			t.Fatalf("the volume of %s, which died while the daemon was down, was not released", c)
		}
		if r := e.cli("", "rm", d); r.code != 0 {
			t.Fatalf("rm: %+v", r)
		}
		if l := mounts.LoopsOf(img); len(l) > 0 {
			t.Errorf("loop devices left on the volume: %v", l)
		}
	}

	if r := e.cli("", "volume", "rm", "data"); r.code != 0 {
		t.Fatalf("volume rm: %+v", r)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("volume image left after volume rm: %v", err)
	}
	if r := e.cli("", "volume", "ls"); r.code != 0 || !strings.Contains(r.stdout, "no volumes") {
		t.Errorf("volume ls after rm: %+v", r)
	}
}

// TestBindMountsOff: a daemon without --mount-root refuses every bind
// mount, saying how to allow them.
func TestBindMountsOff(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	dir := t.TempDir()
	r := e.cli("", "run", "--runtime", e2eRuntime(), "--mount", "type=bind,src="+dir+",dst=/code", "--", "true")
	if r.code != 125 || !strings.Contains(r.stderr, "--mount-root") {
		t.Errorf("bind without --mount-root: %+v", r)
	}
}
