package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/image"
)

// startRegistry serves an in-process OCI registry on loopback and returns
// its host:port. The daemon fetches images itself (the egress policy is
// for sandboxes), and reaches a loopback registry over plain HTTP.
func startRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// tarTree makes a layer tar of the tree at root (owners, modes, times and
// symlinks kept; hard links written as files).
func tarTree(t *testing.T, root string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		target := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0 {
			return nil // nodes and sockets: not in a layer
		}
		h, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		h.Name = rel
		if fi.IsDir() {
			h.Name += "/"
		}
		st := fi.Sys().(*syscall.Stat_t)
		h.Uid, h.Gid, h.Uname, h.Gname = int(st.Uid), int(st.Gid), "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func tarFiles(t *testing.T, files ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		n, body, _ := strings.Cut(f, "=")
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body)), ModTime: time.Now()}); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	tw.Close()
	return buf.Bytes()
}

func gzipLayer(t *testing.T, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// ociImage is a linux/amd64 image of layers.
func ociImage(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin"}
	cf.Config.Cmd = []string{"/bin/sh"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

func pushTo(t *testing.T, ref string, img v1.Image) string {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	return d.String()
}

// cachedImages lists the image cache's entries (lock files aside).
func (e *env) cachedImages() string {
	ents, _ := os.ReadDir(filepath.Join(e.home, "images"))
	var out []string
	for _, en := range ents {
		if !image.IsLockFile(en.Name()) {
			out = append(out, en.Name())
		}
	}
	return strings.Join(out, ",")
}

// TestImagePull: an image built from the busybox rootfs, pushed to a
// registry on loopback, pulled through the CLI, runs in a real sandbox;
// NAME@sha256: pins it (the right digest runs, a wrong one is a 4xx); a
// `docker save` archive imports and runs too; a failed pull leaves nothing.
func TestImagePull(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	reg := startRegistry(t)
	base := tarTree(t, filepath.Join(e.home, "images", "busybox", "rootfs"))
	img := ociImage(t, gzipLayer(t, base), gzipLayer(t, tarFiles(t, "hello.txt=from layer two", "etc/.wh.hostname=")))
	digest := pushTo(t, reg+"/e2e/busybox:1", img)

	start := time.Now()
	r := e.cli("", "image", "pull", reg+"/e2e/busybox:1", "--name", "bb")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "bb@"+digest {
		t.Fatalf("image pull: %+v (want bb@%s)", r, digest)
	}
	t.Logf("pull of a %d KiB busybox image (2 layers) through the CLI: %s", len(base)>>10, time.Since(start).Round(time.Millisecond))

	r = e.cli("", "run", "--runtime", "container", "--image", "bb", "--", "/bin/sh", "-c", "echo ok; cat /hello.txt")
	if r.code != 0 || r.stdout != "ok\nfrom layer two" {
		t.Fatalf("run in the pulled image: %+v", r)
	}
	r = e.cli("", "run", "--runtime", "container", "--image", "bb@"+digest, "--", "/bin/sh", "-c", "echo ok")
	if r.code != 0 || r.stdout != "ok\n" {
		t.Fatalf("run pinned to the right digest: %+v", r)
	}
	wrong := "sha256:" + strings.Repeat("0", 64)
	r = e.cli("", "run", "--runtime", "container", "--image", "bb@"+wrong, "--", "/bin/sh", "-c", "echo ok")
	if r.code != 125 || !strings.Contains(r.stderr, digest) {
		t.Fatalf("run pinned to a wrong digest: %+v (want 125, naming the digest the image has)", r)
	}
	ctx := context.Background()
	var ae *client.Error
	if _, err := e.client().Create(ctx, &api.CreateSandboxRequest{Runtime: "container", Image: "bb@" + wrong}); !errors.As(err, &ae) || ae.Status != 404 {
		t.Fatalf("create pinned to a wrong digest: %v (want 404)", err)
	}
	if _, err := e.client().Create(ctx, &api.CreateSandboxRequest{Runtime: "container", Image: "bb@sha256:abc"}); !errors.As(err, &ae) || ae.Status != 400 {
		t.Fatalf("create with a malformed pin: %v (want 400)", err)
	}

	// gVisor reads the same tree (the image dir is root-only, 0700).
	if _, err := exec.LookPath("runsc"); err == nil {
		r = e.cli("", "run", "--runtime", "gvisor", "--image", "bb", "--", "/bin/sh", "-c", "cat /hello.txt")
		if r.code != 0 || r.stdout != "from layer two" {
			t.Fatalf("run in the pulled image on gvisor: %+v", r)
		}
	}
	// A VM finds the pulled image's ext4 disk as it finds a built one's:
	// packed on first use, keyed by the tree digest (vmimage.RootDisk).
	if _, err := exec.LookPath("qemu-system-x86_64"); err == nil && fileExists(filepath.Join(e.home, "vm", "kernel")) {
		r = e.cli("", "run", "--runtime", "qemu", "--image", "bb@"+digest, "--", "/bin/sh", "-c", "echo ok; cat /hello.txt")
		if r.code != 0 || r.stdout != "ok\nfrom layer two" {
			t.Fatalf("run in the pulled image on qemu: %+v", r)
		}
	} else {
		t.Log("qemu not checked: no qemu-system-x86_64 or no VM artifacts (set CAGEBOX_TEST_VM)")
	}

	// A `docker save` archive.
	archive := filepath.Join(t.TempDir(), "saved.tar")
	tag, _ := name.NewTag("example.com/e2e/saved:7")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	if r := e.cli("", "image", "import", archive); r.code != 0 || !strings.HasPrefix(r.stdout, "saved-7@sha256:") {
		t.Fatalf("image import: %+v", r)
	}
	if r := e.cli("", "run", "--runtime", "container", "--image", "saved-7", "--", "cat", "/hello.txt"); r.code != 0 || r.stdout != "from layer two" {
		t.Fatalf("run in the imported image: %+v", r)
	}

	// Failures: 4xx, and nothing half-made in the cache.
	pushTo(t, reg+"/e2e/evil:1", ociImage(t, gzipLayer(t, tarFiles(t, "../../escape=x"))))
	for _, tc := range []struct {
		args []string
		sub  string
	}{
		{[]string{"image", "pull", reg + "/e2e/nope:1"}, "no such image"},
		{[]string{"image", "pull", reg + "/e2e/evil:1"}, ".."},
		{[]string{"image", "pull", reg + "/e2e/busybox:1", "--name", "tiny", "--max-files", "10"}, "max-files"},
		{[]string{"image", "pull", reg + "/e2e/busybox:1", "--name", "saved-7"}, "--force"},
	} {
		if r := e.cli("", tc.args...); r.code == 0 || !strings.Contains(r.stderr, tc.sub) {
			t.Errorf("%v: %+v (want a failure containing %q)", tc.args, r, tc.sub)
		}
	}
	if got := e.cachedImages(); got != "bb,busybox,default,saved-7" {
		t.Fatalf("image cache holds %s after failed pulls; want bb,busybox,default,saved-7", got)
	}
	if _, err := os.Stat(filepath.Join(e.home, "escape")); err == nil {
		t.Fatal("a layer wrote outside its image")
	}
}

// TestImagePullDebian measures a pull of a larger image: the Debian image
// setup built ($CAGEBOX_TEST_IMAGES/default), as one gzip layer.
func TestImagePullDebian(t *testing.T) {
	shared := os.Getenv("CAGEBOX_TEST_IMAGES")
	rootfs := filepath.Join(shared, "default", "rootfs")
	if shared == "" || !fileExists(rootfs) {
		t.Skip("CAGEBOX_TEST_IMAGES/default is not there (scripts/test.sh sets it after building the Debian image)")
	}
	e := newEnv(t)
	e.startDaemon()
	reg := startRegistry(t)
	layer := tarTree(t, rootfs)
	pushTo(t, reg+"/e2e/debian:12", ociImage(t, gzipLayer(t, layer)))
	start := time.Now()
	r := e.cli("", "image", "pull", reg+"/e2e/debian:12")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "debian-12@sha256:") {
		t.Fatalf("image pull: %+v", r)
	}
	t.Logf("pull of the %d MiB Debian image (one gzip layer) through the CLI: %s", len(layer)>>20, time.Since(start).Round(time.Millisecond))
	if r := e.cli("", "run", "--runtime", "container", "--image", "debian-12", "--", "sh", "-c", "python3 -c 'print(6*7)'"); r.code != 0 || r.stdout != "42\n" {
		t.Fatalf("run in the pulled Debian image: %+v", r)
	}
}
