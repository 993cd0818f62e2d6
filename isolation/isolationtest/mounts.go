package isolationtest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/isolation"
)

// Mounts checks a runtime's mounts and read-only root (needs root: it
// makes a mount root with a setuid binary and a device node, and volume
// images): a read-only bind cannot be written and the host file stays as
// it was; a volume written by one sandbox is read by the next; noexec,
// nosuid and nodev hold; a read-only root refuses writes outside /tmp,
// whose size is bounded; and nothing is left once each sandbox is
// destroyed (StartSpec's cleanup checks Leftovers: state dir, mounts,
// loop devices).
func Mounts(t *testing.T, rt isolation.Runtime, o Options) {
	CheckAvailable(t, rt)
	if os.Geteuid() != 0 {
		t.Skip("mount tests need root (mknod, setuid files, loop devices)")
	}
	base := t.TempDir()
	root := filepath.Join(base, "root")
	code := filepath.Join(root, "code")
	if err := os.MkdirAll(code, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(p, s string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	write(code+"/main.py", "print('hello')\n", 0o644)
	write(code+"/run.sh", "#!/bin/sh\necho ran\n", 0o755)
	// A setuid-root copy of the image's busybox: on a nosuid mount it
	// does not make an unprivileged caller root.
	bb, err := os.ReadFile(filepath.Join(o.RootFS, "bin", "busybox"))
	if err != nil {
		t.Fatalf("busybox in the image: %v", err)
	}
	if err := os.Mkdir(code+"/suid", 0o755); err != nil {
		t.Fatal(err)
	}
	write(code+"/suid/busybox", string(bb), 0o755|os.ModeSetuid)
	if err := unix.Mknod(code+"/null", unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatalf("mknod: %v", err)
	}
	roots, err := mounts.NewRoots([]string{root})
	if err != nil {
		t.Fatal(err)
	}
	bind := func(t *testing.T, src, dst string, rw, exec bool) isolation.Mount {
		t.Helper()
		s, err := roots.Resolve(src)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return isolation.Mount{Type: mounts.Bind, Name: src, Target: dst, RW: rw, Exec: exec, Bind: s}
	}
	vol := filepath.Join(base, "vol.ext4")
	if err := mounts.CreateImage(context.Background(), vol, 64<<20, "vol"); err != nil {
		t.Fatal(err)
	}
	volume := func(dst string, rw bool) isolation.Mount {
		return isolation.Mount{Type: mounts.Volume, Name: "vol", Target: dst, RW: rw, Image: vol}
	}
	sh := func(t *testing.T, g *Guest, user, script string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var out strings.Builder
		res, err := g.Client.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"sh", "-c", script}, User: user}, nil, &out, &out)
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return out.String(), res.ExitCode
	}
	want := func(t *testing.T, what, out string, code int, ok bool, says string) {
		t.Helper()
		if (code == 0) != ok || !strings.Contains(out, says) {
			t.Errorf("%s: exit %d, output %q; want success=%v saying %q", what, code, out, ok, says)
		}
	}

	t.Run("ReadOnlyBind", func(t *testing.T) {
		var stateDir string
		g := StartSpec(t, rt, o, func(s *isolation.Spec) {
			s.Mounts = []isolation.Mount{bind(t, code, "/code", false, false)}
			stateDir = s.StateDir
		})
		out, c := sh(t, g, "", "cat /code/main.py")
		want(t, "read", out, c, true, "print('hello')")
		out, c = sh(t, g, "", "echo poison > /code/main.py")
		want(t, "write over a file", out, c, false, "Read-only file system")
		out, c = sh(t, g, "", "touch /code/new")
		want(t, "create a file", out, c, false, "Read-only file system")
		if b, _ := os.ReadFile(code + "/main.py"); string(b) != "print('hello')\n" {
			t.Errorf("host file changed: %q", b)
		}
		if _, err := os.Stat(code + "/new"); err == nil {
			t.Error("the guest created a file in the host directory")
		}
		// noexec (the default): the script does not run, even as root.
		out, c = sh(t, g, "", "/code/run.sh")
		want(t, "exec from a noexec mount", out, c, false, "denied")
		// The mount carries every flag (the setuid test below cannot tell
		// nosuid from no_new_privs): in the guest's own view, and on the
		// host's staged mount that a VMM or gofer reads through.
		checkFlags := func(where, line string) {
			t.Helper()
			f := strings.Fields(line)
			if len(f) < 6 {
				t.Fatalf("no mount in %s: %q", where, line)
			}
			for _, flag := range []string{"ro", "nosuid", "nodev", "noexec"} {
				if !slices.Contains(strings.Split(f[5], ","), flag) {
					if flag != "ro" && flag != "noexec" && where == "guest" && rt.Class() == isolation.AppKernel {
						// gVisor's sentry serves devices itself (a node on a
						// gofer mount never reaches a host device) and this
						// runsc shows no nosuid/nodev; the host mount has them.
						t.Logf("guest view %s lacks %s (gVisor)", f[5], flag)
						continue
					}
					t.Errorf("/code is mounted %s in the %s, without %s", f[5], where, flag)
				}
			}
		}
		out, _ = sh(t, g, "", "grep ' /code ' /proc/self/mountinfo")
		checkFlags("guest", out)
		mi, _ := mounts.MountInfo()
		var host string
		for _, l := range strings.Split(string(mi), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], stateDir+"/mnt/") {
				host = l
			}
		}
		if rt.Class() != isolation.Hypervisor || host != "" {
			checkFlags("host", host)
		}
		// nodev: the host's device node in the directory does not open.
		out, c = sh(t, g, "", "echo x > /code/null")
		want(t, "write to a device node", out, c, false, "")
	})

	t.Run("ExecNosuid", func(t *testing.T) {
		g := StartSpec(t, rt, o, func(s *isolation.Spec) {
			s.Mounts = []isolation.Mount{bind(t, code, "/code", false, true)}
		})
		out, c := sh(t, g, "", "/code/run.sh")
		want(t, "exec from an exec mount", out, c, true, "ran")
		// The setuid-root busybox runs, but as the caller, not root.
		out, c = sh(t, g, "65534", "/code/suid/busybox id -u")
		want(t, "setuid binary on a nosuid mount", out, c, true, "65534")
		if strings.TrimSpace(out) == "0" {
			t.Error("a setuid binary on a nosuid mount made its caller root")
		}
	})

	t.Run("BindFile", func(t *testing.T) {
		if rt.Class() == isolation.Hypervisor {
			t.Skip("a microVM mounts host directories (as disks), not single files (the daemon refuses them)")
		}
		g := StartSpec(t, rt, o, func(s *isolation.Spec) {
			s.Mounts = []isolation.Mount{bind(t, code+"/main.py", "/app/main.py", false, false)}
		})
		out, c := sh(t, g, "", "cat /app/main.py; echo x >> /app/main.py")
		want(t, "read-only bound file", out, c, false, "print('hello')")
	})

	t.Run("VolumeOutlivesSandbox", func(t *testing.T) {
		a := StartSpec(t, rt, o, func(s *isolation.Spec) {
			s.Mounts = []isolation.Mount{volume("/data", true)}
		})
		out, c := sh(t, a, "", "echo from-a > /data/note && sync && cat /data/note")
		want(t, "write to a rw volume", out, c, true, "from-a")
		destroy(t, a)
		b := StartSpec(t, rt, o, func(s *isolation.Spec) {
			s.Mounts = []isolation.Mount{volume("/data", false)}
		})
		out, c = sh(t, b, "", "cat /data/note")
		want(t, "read what A wrote", out, c, true, "from-a")
		out, c = sh(t, b, "", "echo b > /data/note")
		want(t, "write to a ro volume", out, c, false, "Read-only file system")
	})

	t.Run("ReadOnlyRoot", func(t *testing.T) {
		g := StartSpec(t, rt, o, func(s *isolation.Spec) {
			s.ReadOnlyRoot = true
			s.Resources.DiskBytes = 8 << 20
			s.Mounts = []isolation.Mount{volume("/data", true)}
		})
		out, c := sh(t, g, "", "echo x > /etc/poison")
		want(t, "write to /etc", out, c, false, "Read-only file system")
		out, c = sh(t, g, "", "echo x > /bin/sh")
		want(t, "overwrite /bin/sh", out, c, false, "")
		out, c = sh(t, g, "", "echo x > /tmp/ok && cat /tmp/ok")
		want(t, "write to /tmp", out, c, true, "x")
		out, c = sh(t, g, "", "echo x > /data/ok && cat /data/ok")
		want(t, "write to a rw volume", out, c, true, "x")
		out, c = sh(t, g, "", "dd if=/dev/zero of=/tmp/big bs=1M count=16")
		want(t, "fill /tmp past its 8 MiB", out, c, false, "No space left")
	})
}

// destroy destroys g's sandbox now and checks nothing is left (StartSpec's
// cleanup does it again, idempotently).
func destroy(t *testing.T, g *Guest) {
	t.Helper()
	g.Client.Close()
	g.Client = nil
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := g.Sandbox.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if lc, ok := g.Sandbox.(isolation.LeakChecker); ok {
		if left := lc.Leftovers(ctx); len(left) > 0 {
			t.Errorf("destroy left things behind: %q", left)
		}
	}
}
