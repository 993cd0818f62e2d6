package image

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestValidateName(t *testing.T) {
	long := strings.Repeat("a", 63)
	tests := []struct {
		name string
		ok   bool
	}{
		{"default", true},
		{"busybox", true},
		{"a", true},
		{"0", true},
		{"py3.12-slim_v2", true},
		{long, true},
		{long + "a", false},
		{"", false},
		{".", false},
		{"..", false},
		{"a..b", false},
		{"../etc", false},
		{"a/b", false},
		{"/abs", false},
		{`a\b`, false},
		{".hidden", false},
		{"-dash", false},
		{"_under", false},
		{"Upper", false},
		{"sp ace", false},
		{"tab\t", false},
		{"nul\x00", false},
		{"ünï", false},
	}
	for _, tt := range tests {
		err := ValidateName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalid", tt.name, err)
		}
	}
	if err := ValidateName("a/../b"); err == nil || !strings.Contains(err.Error(), "slash") {
		t.Errorf("error for a path should mention slashes, got %v", err)
	}
}

func TestBadNamesRejectedEverywhere(t *testing.T) {
	c := &Cache{Dir: t.TempDir()}
	ctx := context.Background()
	for _, name := range []string{"../x", "a/b", "", "X"} {
		if _, err := c.Get(name); !errors.Is(err, ErrInvalid) {
			t.Errorf("Get(%q) = %v, want ErrInvalid", name, err)
		}
		if err := c.Remove(name); !errors.Is(err, ErrInvalid) {
			t.Errorf("Remove(%q) = %v, want ErrInvalid", name, err)
		}
		if _, err := c.BuildBusybox(ctx, name); !errors.Is(err, ErrInvalid) {
			t.Errorf("BuildBusybox(%q) = %v, want ErrInvalid", name, err)
		}
		if _, err := c.Build(ctx, BuildOptions{Name: name}); !errors.Is(err, ErrInvalid) {
			t.Errorf("Build(%q) = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := c.Build(ctx, BuildOptions{Name: "x", Packages: []string{"--foo"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Build with bad package = %v, want ErrInvalid", err)
	}
	if ents, _ := os.ReadDir(c.Dir); len(ents) != 0 {
		t.Errorf("rejected requests left files: %v", ents)
	}
}

func needBusybox(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(BusyboxPath); err != nil {
		t.Skipf("no static busybox at %s (apt-get install busybox-static): %v", BusyboxPath, err)
	}
}

func TestBuildBusybox(t *testing.T) {
	needBusybox(t)
	c := &Cache{Dir: t.TempDir()}
	start := time.Now()
	img, err := c.BuildBusybox(context.Background(), "busybox")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built in %v: %d bytes, %s, %s", time.Since(start), img.SizeBytes, img.Digest, img.Source)
	if want := filepath.Join(c.Dir, "busybox", "rootfs"); img.Path != want {
		t.Errorf("Path = %q, want %q", img.Path, want)
	}
	for _, p := range []string{"bin/busybox", "bin/sh", "bin/ls", "bin/echo", "etc/passwd", "etc/group", "etc/hosts", "etc/resolv.conf", "tmp", "usr/bin/env"} {
		if _, err := os.Stat(filepath.Join(img.Path, p)); err != nil {
			t.Errorf("missing %s: %v", p, err)
		}
	}
	for _, p := range []string{"etc/hosts", "etc/resolv.conf"} {
		fi, err := os.Lstat(filepath.Join(img.Path, p))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s should be a regular file: %v %v", p, fi, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(img.Path, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp should be 1777: %v %v", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(img.Path, "bin/sh")); err != nil || target != "busybox" {
		t.Errorf("bin/sh -> %q, %v; want busybox", target, err)
	}
	// The copied binary runs (no chroot needed: it is static), also as an applet via its symlink.
	out, err := exec.Command(filepath.Join(img.Path, "bin/busybox"), "echo", "hello", "cagebox").Output()
	if err != nil || string(out) != "hello cagebox\n" {
		t.Errorf("busybox echo = %q, %v", out, err)
	}
	out, err = exec.Command(filepath.Join(img.Path, "bin/sh"), "-c", "echo $((6*7))").Output()
	if err != nil || string(out) != "42\n" {
		t.Errorf("sh -c = %q, %v", out, err)
	}
	if img.SizeBytes <= 0 || !strings.HasPrefix(img.Digest, "sha256:") || img.CreatedAt.IsZero() {
		t.Errorf("bad metadata: %+v", img)
	}

	// Building again is a no-op returning the same image.
	again, err := c.BuildBusybox(context.Background(), "busybox")
	if err != nil || again.Digest != img.Digest || !again.CreatedAt.Equal(img.CreatedAt) {
		t.Errorf("rebuild = %+v, %v; want the cached image", again, err)
	}
	// A second image from the same busybox has the same tree digest.
	other, err := c.BuildBusybox(context.Background(), "busybox2")
	if err != nil {
		t.Fatal(err)
	}
	if other.Digest != img.Digest {
		t.Errorf("same tree, different digests: %s vs %s", other.Digest, img.Digest)
	}
	assertNoLeftovers(t, c.Dir)
}

func TestListGetRemove(t *testing.T) {
	needBusybox(t)
	c := &Cache{Dir: filepath.Join(t.TempDir(), "images")} // not created yet
	if imgs, err := c.List(); err != nil || len(imgs) != 0 {
		t.Fatalf("List on missing dir = %v, %v", imgs, err)
	}
	_, err := c.Get("default")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "cagebox image build default") {
		t.Fatalf("Get(missing) = %v; want ErrNotFound naming the build command", err)
	}
	if err := c.Remove("default"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Remove(missing) = %v; want ErrNotFound", err)
	}
	ctx := context.Background()
	for _, n := range []string{"zeta", "alpha"} {
		if _, err := c.BuildBusybox(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	// Stray entries are ignored.
	os.MkdirAll(filepath.Join(c.Dir, "junk"), 0o755)
	os.MkdirAll(filepath.Join(c.Dir, ".build-x-123"), 0o755)
	imgs, err := c.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range imgs {
		names = append(names, i.Name)
	}
	if strings.Join(names, ",") != "alpha,zeta" {
		t.Fatalf("List = %v, want alpha,zeta", names)
	}
	got, err := c.Get("alpha")
	if err != nil || got.Name != "alpha" || got.Path != filepath.Join(c.Dir, "alpha", "rootfs") || got.Digest != imgs[0].Digest {
		t.Fatalf("Get(alpha) = %+v, %v", got, err)
	}
	if err := c.Remove("alpha"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("alpha"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Remove = %v", err)
	}
	if _, err := os.Stat(filepath.Join(c.Dir, "alpha")); !os.IsNotExist(err) {
		t.Fatalf("alpha dir still there: %v", err)
	}
	imgs, _ = c.List()
	if len(imgs) != 1 || imgs[0].Name != "zeta" {
		t.Fatalf("List after Remove = %v", imgs)
	}
	// Remove refuses while a build of that name holds the lock.
	unlock, err := c.tryLock("zeta")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Remove("zeta"); !errors.Is(err, ErrBusy) {
		t.Errorf("Remove while locked = %v, want ErrBusy", err)
	}
	unlock()
	if err := c.Remove("zeta"); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentBusyboxBuilds(t *testing.T) {
	needBusybox(t)
	c := &Cache{Dir: t.TempDir()}
	var wg sync.WaitGroup
	digests := make([]string, 8)
	errs := make([]error, 8)
	for i := range digests {
		wg.Go(func() {
			img, err := c.BuildBusybox(context.Background(), "bb")
			errs[i] = err
			if err == nil {
				digests[i] = img.Digest
			}
		})
	}
	wg.Wait()
	for i := range digests {
		if errs[i] != nil || digests[i] != digests[0] {
			t.Errorf("build %d: %s, %v", i, digests[i], errs[i])
		}
	}
	assertNoLeftovers(t, c.Dir)
}

func TestDigest(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/os-release", "ID=test\n")
	write("bin/tool", "#!/bin/sh\necho hi\n")
	write("usr/share/a", "")
	os.Symlink("tool", filepath.Join(root, "bin/alias"))

	d1, err := Digest(root)
	if err != nil {
		t.Fatal(err)
	}
	d2, _ := Digest(root)
	if d1 != d2 || !strings.HasPrefix(d1, "sha256:") || len(d1) != len("sha256:")+64 {
		t.Fatalf("digest not stable: %s vs %s", d1, d2)
	}
	// mtimes are not part of the digest.
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(root, "bin/tool"), old, old)
	if d, _ := Digest(root); d != d1 {
		t.Errorf("mtime changed the digest")
	}

	changes := []struct {
		name   string
		change func()
		undo   func()
	}{
		{"content", func() { write("etc/os-release", "ID=tesT\n") }, func() { write("etc/os-release", "ID=test\n") }},
		{"mode", func() { os.Chmod(filepath.Join(root, "bin/tool"), 0o755) }, func() { os.Chmod(filepath.Join(root, "bin/tool"), 0o644) }},
		{"new empty file", func() { write("usr/share/b", "") }, func() { os.Remove(filepath.Join(root, "usr/share/b")) }},
		{"rename", func() { os.Rename(filepath.Join(root, "usr/share/a"), filepath.Join(root, "usr/share/c")) }, func() { os.Rename(filepath.Join(root, "usr/share/c"), filepath.Join(root, "usr/share/a")) }},
		{"symlink target", func() {
			os.Remove(filepath.Join(root, "bin/alias"))
			os.Symlink("other", filepath.Join(root, "bin/alias"))
		}, func() {
			os.Remove(filepath.Join(root, "bin/alias"))
			os.Symlink("tool", filepath.Join(root, "bin/alias"))
		}},
		{"empty dir", func() { os.Mkdir(filepath.Join(root, "var"), 0o755) }, func() { os.Remove(filepath.Join(root, "var")) }},
	}
	for _, ch := range changes {
		ch.change()
		d, err := Digest(root)
		if err != nil {
			t.Fatal(err)
		}
		if d == d1 {
			t.Errorf("%s: digest did not change", ch.name)
		}
		ch.undo()
		if d, _ := Digest(root); d != d1 {
			t.Errorf("%s: digest not restored after undo", ch.name)
		}
	}
}

func TestDetect(t *testing.T) {
	dir := t.TempDir()
	osr := filepath.Join(dir, "os-release")
	os.WriteFile(osr, []byte("PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\n"), 0o644)
	if s, err := suiteFromOSRelease(osr); err != nil || s != "bookworm" {
		t.Errorf("suite = %q, %v", s, err)
	}
	os.WriteFile(osr, []byte("ID=alpine\n"), 0o644)
	if _, err := suiteFromOSRelease(osr); err == nil {
		t.Errorf("want error without VERSION_CODENAME")
	}

	apt := filepath.Join(dir, "apt")
	os.MkdirAll(filepath.Join(apt, "sources.list.d"), 0o755)
	if m := mirrorFromApt(apt, "bookworm"); m != FallbackMirror {
		t.Errorf("empty apt dir: mirror = %q", m)
	}
	os.WriteFile(filepath.Join(apt, "sources.list.d", "a-other.list"), []byte("deb https://packages.example.com/apt cloud-sdk-bookworm main\n"), 0o644)
	os.WriteFile(filepath.Join(apt, "sources.list.d", "b.sources.disabled"), []byte("Types: deb\nURIs: http://wrong.example/\nSuites: bookworm\n"), 0o644)
	os.WriteFile(filepath.Join(apt, "sources.list.d", "debian.sources"), []byte(`Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://disabled.example/debian
Suites: bookworm
Enabled: no

Types: deb-src deb
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
`), 0o644)
	if m := mirrorFromApt(apt, "bookworm"); m != "http://mirror.example/debian" {
		t.Errorf("deb822: mirror = %q", m)
	}
	os.WriteFile(filepath.Join(apt, "sources.list"), []byte("# comment\ndeb-src http://src.example/debian bookworm main\ndeb [arch=amd64 signed-by=/x.gpg] http://one.example/debian bookworm main contrib\n"), 0o644)
	if m := mirrorFromApt(apt, "bookworm"); m != "http://one.example/debian" {
		t.Errorf("one-line: mirror = %q", m)
	}
	if m := mirrorFromApt(apt, "trixie"); m != FallbackMirror {
		t.Errorf("other suite: mirror = %q", m)
	}
}

func TestProgressParse(t *testing.T) {
	in := `P: 0 100 DOWNREL
PF: Downloading Release file
I: VALIDRELSIG
IA: ABCD
IF: Valid Release signature (key id %s)
I: RESOLVEREQ
IF: Resolving dependencies of required packages...
P: 0 1 SIZEDEBS
PF: Finding package sizes
I: RETRIEVING
IA: InRelease
IF: Retrieving %s
P: 3 3 SIZEDEBS
PF: Finding package sizes
P: 0 2500000 DOWNDEBS
PF: Downloading packages
I: RETRIEVING
IA: libc6
IA: 2.36-9
IF: Retrieving %s %s
P: 10 20
I: VALIDATING
IA: libc6
IA: 2.36-9
IF: Validating %s %s
I: EXTRACTING
IA: libc6
IF: Extracting %s...
I: INSTCORE
IF: Installing core packages...
I: UNPACKING
IA: libc6
IF: Unpacking %s...
I: CONFREQ
IF: Configuring required packages...
W: SOMETHING
WA: x
WF: careful with %s
E: COULDNTDL
EA: curl
EF: Couldn't download package %s
`
	var out bytes.Buffer
	p := newProgress(&out)
	p.parseDebootstrap(strings.NewReader(in))
	got := out.String()
	for _, want := range []string{
		"release signature valid",
		"resolving dependencies",
		"[1/4] fetching and unpacking 3 packages (2.5 MB)… (0s)",
		"      retrieving InRelease\n",
		"      retrieving libc6 2.36-9 (1/3)\n",
		"[2/4] installing the base system",
		"      configuring required packages\n",
		"      warning: careful with x\n",
		"      error: Couldn't download package curl\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("progress missing %q in:\n%s", want, got)
		}
	}
	for _, noise := range []string{"Validating", "Extracting", "Unpacking libc6", "Downloading Release"} {
		if strings.Contains(got, noise) {
			t.Errorf("progress should not contain %q:\n%s", noise, got)
		}
	}
	if p.lastError != "Couldn't download package curl" {
		t.Errorf("lastError = %q", p.lastError)
	}
}

func TestPackExt4(t *testing.T) {
	needBusybox(t)
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		if _, err := os.Stat("/usr/sbin/mkfs.ext4"); err != nil {
			t.Skip("mkfs.ext4 not installed (e2fsprogs)")
		}
	}
	c := &Cache{Dir: t.TempDir()}
	img, err := c.BuildBusybox(context.Background(), "busybox")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "root.ext4")
	if err := PackExt4Context(context.Background(), img, out, 0); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(out)
	if err != nil || fi.Size() != Ext4Size(img) {
		t.Fatalf("ext4 image: %v %v, want size %d", fi, err, Ext4Size(img))
	}
	if b, err := exec.Command("/usr/sbin/e2fsck", "-fn", out).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck: %v\n%s", err, b)
	}
	b, err := exec.Command("/usr/sbin/debugfs", "-R", "stat /bin/busybox", out).CombinedOutput()
	if err != nil || !strings.Contains(string(b), "Type: regular") {
		t.Fatalf("debugfs stat /bin/busybox: %v\n%s", err, b)
	}
	b, _ = exec.Command("/usr/sbin/dumpe2fs", "-h", out).CombinedOutput()
	if !strings.Contains(string(b), "Filesystem volume name:   "+Ext4Label) {
		t.Errorf("label not set:\n%s", b)
	}
	if _, err := os.Stat(out + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind")
	}
}

// assertNoLeftovers fails if the cache holds temporary build or removal
// directories, or anything under it is mounted.
func assertNoLeftovers(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".build-") || strings.HasPrefix(e.Name(), ".rm-") {
			t.Errorf("leftover %s", e.Name())
		}
	}
	abs, _ := filepath.Abs(dir)
	if m := mountsUnder(abs); len(m) > 0 {
		t.Errorf("leftover mounts: %v", m)
	}
}

func TestInstallReplaces(t *testing.T) {
	dir := t.TempDir()
	dst, tmp := filepath.Join(dir, "img"), filepath.Join(dir, ".build-img-1")
	for _, d := range []string{dst, tmp} {
		os.MkdirAll(filepath.Join(d, "rootfs"), 0o755)
		os.WriteFile(filepath.Join(d, "who"), []byte(d), 0o644)
	}
	c := &Cache{Dir: dir}
	if err := c.install(tmp, dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "who")); string(b) != tmp {
		t.Errorf("dst holds %q, want the new build", b)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("old image not removed: %v", err)
	}
	// Fresh install: plain rename.
	tmp2 := filepath.Join(dir, ".build-new-1")
	os.MkdirAll(tmp2, 0o755)
	if err := c.install(tmp2, filepath.Join(dir, "new")); err != nil {
		t.Fatal(err)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/x\134y`: `/x\y`, `/end\04`: `/end\04`} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}
