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

func needDebootstrap(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("debootstrap builds need root")
	}
	if _, err := os.Stat("/usr/sbin/debootstrap"); err != nil {
		t.Skip("debootstrap not installed")
	}
	if _, err := DetectSuite(); err != nil {
		t.Skipf("not a Debian host: %v", err)
	}
}

func slowEnabled() bool { return os.Getenv("CAGEBOX_SLOW_TESTS") == "1" }

// cancelWriter collects progress and cancels when a line contains trigger.
type cancelWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	trigger string
	cancel  context.CancelFunc
	fired   bool
}

func (w *cancelWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	if !w.fired && strings.Contains(w.buf.String(), w.trigger) {
		w.fired = true
		w.cancel()
	}
	return len(b), nil
}

func testCancel(t *testing.T, trigger string, limit time.Duration) {
	needDebootstrap(t)
	c := &Cache{Dir: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	w := &cancelWriter{trigger: trigger, cancel: cancel}
	start := time.Now()
	_, err := c.Build(ctx, BuildOptions{Name: "cancelled", Progress: w})
	t.Logf("build returned after %v: %v\nprogress:\n%s", time.Since(start), err, w.buf.String())
	if err == nil {
		t.Fatal("cancelled build succeeded")
	}
	w.mu.Lock()
	fired := w.fired
	w.mu.Unlock()
	if !fired && ctx.Err() == nil {
		assertNoLeftovers(t, c.Dir)
		t.Skipf("build failed before %q (mirror unreachable?): %v", trigger, err)
	}
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error should wrap the context's: %v", err)
	}
	if _, err := c.Get("cancelled"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after cancel = %v, want ErrNotFound", err)
	}
	assertNoLeftovers(t, c.Dir)
	ents, _ := os.ReadDir(c.Dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".lock-") {
			t.Errorf("cancelled build left %s", e.Name())
		}
	}
	// Nothing of the build is still running.
	abs, _ := filepath.Abs(c.Dir)
	killRootedIn(abs) // no-op if clean; the check below is what matters
	out, _ := exec.Command("pgrep", "-f", abs).Output()
	if len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("processes still running on the build dir: %s", out)
	}
}

// TestBuildCancelEarly cancels a debootstrap build while it fetches (or after
// a few seconds if the mirror is slow or unreachable) and checks that
// nothing is left behind.
func TestBuildCancelEarly(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the Debian mirror; takes ~15s")
	}
	testCancel(t, "fetching and unpacking", time.Minute)
}

// TestBuildCancelDuringInstall cancels while debootstrap runs maintainer
// scripts in the chroot with proc and sys mounted in the target.
func TestBuildCancelDuringInstall(t *testing.T) {
	if testing.Short() || !slowEnabled() {
		t.Skip("slow (fetches ~100 packages); set CAGEBOX_SLOW_TESTS=1")
	}
	testCancel(t, "configuring required packages", 10*time.Minute)
}

// testImageCache is where TestBuildDefault keeps its image, so that a second
// run reuses it: $CAGEBOX_HOME/images, or a fixed directory under TMPDIR.
func testImageCache() *Cache {
	if h := os.Getenv("CAGEBOX_HOME"); h != "" {
		return &Cache{Dir: filepath.Join(h, "images")}
	}
	return &Cache{Dir: filepath.Join(os.TempDir(), "cagebox-test-images")}
}

// TestBuildDefault builds the real default image with debootstrap (2-5
// minutes, needs the Debian mirror) unless it already exists, then checks it.
func TestBuildDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	needDebootstrap(t)
	c := testImageCache()
	if _, err := c.Get(DefaultName); err != nil && !slowEnabled() {
		t.Skipf("default image not built in %s and CAGEBOX_SLOW_TESTS!=1 (building takes minutes)", c.Dir)
	}
	start := time.Now()
	var progress bytes.Buffer
	img, err := c.Build(context.Background(), BuildOptions{Name: DefaultName, Progress: &progress})
	t.Logf("Build took %v\n%s", time.Since(start), progress.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image: %d bytes (%.1f MB), %s, %s, %v", img.SizeBytes, float64(img.SizeBytes)/1e6, img.Digest, img.Source, img.Packages)

	for _, p := range []string{"usr/bin/curl", "usr/bin/python3", "etc/ssl/certs/ca-certificates.crt", "bin/sh", "usr/bin/ps", "bin/ls"} {
		if _, err := os.Stat(filepath.Join(img.Path, p)); err != nil {
			t.Errorf("missing %s: %v", p, err)
		}
	}
	for _, p := range []string{"etc/resolv.conf", "etc/hosts", "etc/machine-id"} {
		fi, err := os.Lstat(filepath.Join(img.Path, p))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s should be a regular file: %v %v", p, fi, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(img.Path, "etc/machine-id")); len(b) != 0 {
		t.Errorf("machine-id not empty: %q", b)
	}
	for _, d := range []string{"var/lib/apt/lists", "var/cache/apt/archives", "usr/share/man", "debootstrap"} {
		ents, _ := os.ReadDir(filepath.Join(img.Path, d))
		for _, e := range ents {
			if e.Name() != "partial" && e.Name() != "lock" {
				t.Errorf("%s not cleaned: has %s", d, e.Name())
				break
			}
		}
	}
	if m, _ := filepath.Glob(filepath.Join(img.Path, "usr/share/doc/*/changelog*")); len(m) > 0 {
		t.Errorf("docs not cleaned: %v", m[:1])
	}
	// Programs run inside the tree.
	for _, args := range [][]string{
		{"/bin/sh", "-c", "echo ok"},
		{"/usr/bin/python3", "-c", "import ssl, json; print('ok')"},
		{"/usr/bin/curl", "--version"},
	} {
		out, err := exec.Command("chroot", append([]string{img.Path}, args...)...).CombinedOutput()
		if err != nil {
			t.Errorf("chroot %v: %v\n%s", args, err, out)
		}
	}
	// The stored digest describes the tree.
	if d, err := Digest(img.Path); err != nil || d != img.Digest {
		t.Errorf("recomputed digest %s, %v; stored %s", d, err, img.Digest)
	}
	// A VM runtime can pack it.
	if _, err := os.Stat("/usr/sbin/mkfs.ext4"); err == nil {
		out := filepath.Join(t.TempDir(), "default.ext4")
		start := time.Now()
		if err := PackExt4Context(context.Background(), img, out, 0); err != nil {
			t.Fatal(err)
		}
		t.Logf("PackExt4Context took %v (%d MiB)", time.Since(start), Ext4Size(img)>>20)
		if b, err := exec.Command("/usr/sbin/e2fsck", "-fn", out).CombinedOutput(); err != nil {
			t.Errorf("e2fsck: %v\n%s", err, b)
		}
	}
	assertNoLeftovers(t, c.Dir)
}
