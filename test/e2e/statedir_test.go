package e2e

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// asNobody runs name args as uid/gid 65534 and returns its combined output
// and whether it succeeded.
func asNobody(t *testing.T, name string, args ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("run %s as nobody: %v", name, err)
		}
	}
	return out.String(), err == nil
}

// TestImageBuildHomeClosed: `cagebox image build` into a home that does
// not exist yet (before any daemon ran) makes it 0700, so a local user
// cannot reach the image's root-owned (setuid) files through the cache.
func TestImageBuildHomeClosed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a local user is simulated with uid 65534)")
	}
	parent, err := os.MkdirTemp("", "cbxopen")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(parent)
	if err := os.Chmod(parent, 0o755); err != nil { // a local user can reach it
		t.Fatal(err)
	}
	home := filepath.Join(parent, "home")
	cmd := exec.Command(filepath.Join(binDir, "cagebox"), "--home", home, "image", "build", "busybox")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("image build: %v\n%s", err, out)
	}
	bb := filepath.Join(home, "images", "busybox", "rootfs", "bin", "busybox")
	if _, err := os.Stat(bb); err != nil {
		t.Fatalf("the build made no %s: %v", bb, err)
	}
	if out, ok := asNobody(t, "/bin/ls", parent); !ok || !strings.Contains(out, "home") {
		t.Fatalf("nobody cannot list the parent (the test proves nothing): %s", out)
	}
	if out, ok := asNobody(t, "/bin/ls", home); ok {
		t.Errorf("a local user lists the home:\n%s", out)
	}
	for _, p := range []string{filepath.Join(home, "images"), bb} {
		if out, ok := asNobody(t, "/usr/bin/stat", p); ok {
			t.Errorf("a local user reaches %s:\n%s", p, out)
		}
	}
	for _, d := range []string{home, filepath.Join(home, "images")} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want 0700", d, fi.Mode(), err)
		}
	}
}

// TestDaemonNarrowsStateDirs: a daemon started on a home whose
// directories an older release (or an operator's mkdir) left 0755 narrows
// them to 0700 and logs each one.
func TestDaemonNarrowsStateDirs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	e := newEnv(t)
	open := []string{e.home, filepath.Join(e.home, "images"), filepath.Join(e.home, "volumes")}
	for _, d := range open {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e.startDaemon()
	for _, d := range open {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != fs.ModeDir|0o700 {
			t.Errorf("%s: %v after the daemon started, want drwx------", d, fi.Mode())
		}
		if !strings.Contains(e.logBuf.String(), "dir="+d+" ") {
			t.Errorf("the daemon's log does not name %s:\n%s", d, e.logBuf.String())
		}
	}
}
