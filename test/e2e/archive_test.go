package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cagebox/cagebox/client"
)

// TestCopyDirectories round-trips a tree through `cagebox cp` both ways
// and sends the guest archives that try to escape.
func TestCopyDirectories(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	r := e.cli("", "create")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)

	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "sub", "deep"), 0o750))
	must(os.Mkdir(filepath.Join(src, "empty"), 0o700))
	must(os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755))
	must(os.WriteFile(filepath.Join(src, "sub", "deep", "data"), bytes.Repeat([]byte("cagebox "), 40000), 0o640))
	must(os.Symlink("sub/deep/data", filepath.Join(src, "link")))

	start := time.Now()
	if r := e.cli("", "cp", src, id+":/work/up"); r.code != 0 {
		t.Fatalf("cp up: code %d: %s", r.code, r.stderr)
	}
	t.Logf("cp up of 320 KB in %v", time.Since(start))
	r = e.cli("", "exec", id, "--", "sh", "-c", "cd /work/up && /work/up/run.sh && stat -c '%n %a %F' run.sh empty sub/deep/data link && readlink link && wc -c < link")
	if r.code != 0 {
		t.Fatalf("inspect in the guest: %d %s %s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"ran\n", "run.sh 755 regular file", "empty 700 directory", "sub/deep/data 640 regular file", "link 777 symbolic link", "sub/deep/data\n", "320000"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("guest view lacks %q:\n%s", want, r.stdout)
		}
	}

	back := filepath.Join(t.TempDir(), "back")
	start = time.Now()
	if r := e.cli("", "cp", id+":/work/up", back); r.code != 0 {
		t.Fatalf("cp down: code %d: %s", r.code, r.stderr)
	}
	t.Logf("cp down of 320 KB in %v", time.Since(start))
	for p, want := range map[string]fs.FileMode{"run.sh": 0o755, "empty": fs.ModeDir | 0o700, "sub/deep": fs.ModeDir | 0o750, "sub/deep/data": 0o640, "link": fs.ModeSymlink | 0o777} {
		fi, err := os.Lstat(filepath.Join(back, p))
		if err != nil {
			t.Fatalf("round trip lost %s: %v", p, err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v after the round trip, want %v", p, fi.Mode(), want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(back, "link")); err != nil || len(b) != 320000 {
		t.Errorf("data through the link: %d bytes, %v", len(b), err)
	}

	// Archives that try to leave the directory are refused by the agent,
	// and nothing lands outside it.
	c := e.client()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name string
		hdrs []*tar.Header
	}{
		{"dotdot", []*tar.Header{{Name: "../../escaped", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}}},
		{"absolute", []*tar.Header{{Name: "/escaped", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}}},
		{"symlink then through it", []*tar.Header{{Name: "ln", Typeflag: tar.TypeSymlink, Linkname: "/"}, {Name: "ln/escaped", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}}},
		{"hard link out", []*tar.Header{{Name: "hl", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}}},
		{"device", []*tar.Header{{Name: "mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range tc.hdrs {
				must(tw.WriteHeader(h))
				if h.Size > 0 {
					tw.Write([]byte("x"))
				}
			}
			must(tw.Close())
			err := c.ArchivePut(ctx, id, "/work/target", &buf)
			var ae *client.Error
			if err == nil || !asClientError(err, &ae) || ae.Status != 400 {
				t.Fatalf("an escaping archive: %v, want a 400", err)
			}
			r := e.cli("", "exec", id, "--", "sh", "-c", "ls /escaped /work/escaped /work/target/mem 2>/dev/null; ls -l /work/target 2>/dev/null | grep -c hl")
			if strings.Contains(r.stdout, "escaped") || strings.Contains(r.stdout, "mem") || strings.TrimSpace(r.stdout) != "0" {
				t.Fatalf("an entry landed: %q", r.stdout)
			}
		})
	}

	// Bad input: a relative path, a missing directory.
	if r := e.cli("", "cp", id+":work", back); r.code != 2 || !strings.Contains(r.stderr, "absolute path") {
		t.Errorf("relative sandbox path: %d %q", r.code, r.stderr)
	}
	if r := e.cli("", "cp", id+":/no/such/dir", back); r.code == 0 || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("missing sandbox path: %d %q", r.code, r.stderr)
	}
}

func asClientError(err error, target **client.Error) bool {
	e, ok := err.(*client.Error)
	if ok {
		*target = e
	}
	return ok
}

// TestCpDoesNotTrustGuestModes: a guest that makes its directory 1777 and
// 0777, and files setuid, setgid and world-writable, cannot through
// `cagebox cp ID:/dir LOCAL` chmod LOCAL or a directory already in it,
// nor leave a setuid file or one wider than the CLI's umask on the host
// (the CLI runs as root here: a setuid-root file would be a way in).
func TestCpDoesNotTrustGuestModes(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	r := e.cli("", "create")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	r = e.cli("", "exec", id, "--", "sh", "-c", `set -e
mkdir -p /work/x/keep /work/x/made
echo s > /work/x/suid; echo g > /work/x/made/sgid; echo w > /work/x/keep/w
chmod 4755 /work/x/suid; chmod 2777 /work/x/made/sgid; chmod 0777 /work/x/keep/w
chmod 2777 /work/x/made; chmod 0777 /work/x/keep; chmod 1777 /work/x
stat -c '%n %a' /work/x /work/x/keep /work/x/made /work/x/suid /work/x/made/sgid /work/x/keep/w`)
	if r.code != 0 {
		t.Fatalf("guest setup: %d %s %s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"/work/x 1777", "/work/x/suid 4755", "/work/x/made 2777", "/work/x/made/sgid 2777"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("the guest could not make %q (so the test proves nothing):\n%s", want, r.stdout)
		}
	}

	local := filepath.Join(t.TempDir(), "local")
	if err := os.MkdirAll(filepath.Join(local, "keep"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(local, 0o750); err != nil {
		t.Fatal(err)
	}
	if r := e.cli("", "cp", id+":/work/x", local); r.code != 0 {
		t.Fatalf("cp down: code %d: %s", r.code, r.stderr)
	}
	umask := processUmask(t)
	for p, want := range map[string]fs.FileMode{
		"":          fs.ModeDir | 0o750,
		"keep":      fs.ModeDir | 0o700,
		"made":      fs.ModeDir | 0o777&^umask,
		"suid":      0o755 &^ umask,
		"made/sgid": 0o777 &^ umask,
		"keep/w":    0o777 &^ umask,
	} {
		fi, err := os.Lstat(filepath.Join(local, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%q: mode %v, want %v", p, fi.Mode(), want)
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Getuid() {
			t.Errorf("%q: owner %d, want the CLI's user %d", p, st.Uid, os.Getuid())
		}
	}
}

// processUmask reads this process's umask (which the CLI inherits) without
// changing it.
func processUmask(t *testing.T) fs.FileMode {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Umask:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			if err != nil {
				t.Fatal(err)
			}
			return fs.FileMode(m)
		}
	}
	t.Fatal("no Umask in /proc/self/status")
	return 0
}
