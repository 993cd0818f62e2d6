package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cagebox/cagebox/internal/errdefs"
)

// tarOf makes a layer tar: "path" = content for files, "path/" for
// directories, "path -> target" for symlinks.
func tarOf(t *testing.T, entries ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Mode: 0o644, ModTime: time.Unix(1600000000, 0)}
		body := ""
		switch {
		case strings.Contains(e, " -> "):
			n, target, _ := strings.Cut(e, " -> ")
			h.Name, h.Typeflag, h.Linkname = n, tar.TypeSymlink, target
		case strings.HasSuffix(e, "/"):
			h.Name, h.Typeflag, h.Mode = e, tar.TypeDir, 0o755
		default:
			n, b, _ := strings.Cut(e, "=")
			h.Name, h.Typeflag, h.Size, body = n, tar.TypeReg, int64(len(b)), b
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// gzLayer is a gzip-compressed layer of entries.
func gzLayer(t *testing.T, entries ...string) v1.Layer {
	t.Helper()
	b := tarOf(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is a linux/amd64 image of layers with a config to record.
func testImage(t *testing.T, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"PATH=/bin", "GREETING=hi"}
	cf.Config.Entrypoint = []string{"/bin/sh"}
	cf.Config.Cmd = []string{"-c", "echo ok"}
	cf.Config.WorkingDir = "/work"
	cf.Config.User = "1000:1000"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// startRegistry serves an in-process registry on loopback; wrap may
// intercept requests (nil: none).
func startRegistry(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func push(t *testing.T, ref string, img v1.Image) string {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func pushIndex(t *testing.T, ref string, idx v1.ImageIndex) string {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// treeOf lists a rootfs like the unpack tests do.
func treeOf(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			lines = append(lines, rel+" -> "+target)
		case d.IsDir():
			lines = append(lines, rel+"/")
		default:
			b, _ := os.ReadFile(p)
			lines = append(lines, rel+"="+string(b))
		}
		return nil
	})
	sort.Strings(lines)
	return strings.Join(lines, " ")
}

// cacheHolds fails the test unless the cache directory holds exactly the
// named images (besides lock files): no temporary build or import dirs.
func cacheHolds(t *testing.T, c *Cache, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(c.Dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		if !IsLockFile(e.Name()) {
			got = append(got, e.Name())
		}
	}
	sort.Strings(names)
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Fatalf("cache holds %v; want exactly %v (a failed pull must leave nothing)", got, names)
	}
}

func TestPull(t *testing.T) {
	host := startRegistry(t, nil)
	img := testImage(t, "amd64",
		gzLayer(t, "bin/", "bin/sh=shell", "etc/", "etc/old=1", "etc/keep=2", "var/", "var/cache/", "var/cache/x=x"),
		gzLayer(t, "etc/.wh.old", "var/cache/", "var/cache/.wh..wh..opq", "var/cache/y=y", "work/"))
	digest := push(t, host+"/test/app:v1", img)
	c := &Cache{Dir: t.TempDir()}
	ctx := context.Background()
	got, err := c.Pull(ctx, PullOptions{Ref: host + "/test/app:v1"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "app-v1" || got.ManifestDigest != digest || got.Source != "oci "+host+"/test/app:v1" || got.PlatformDigest != "" {
		t.Fatalf("image = %+v; want app-v1 from %s", got, digest)
	}
	if tr := treeOf(t, got.Path); tr != "bin/ bin/sh=shell etc/ etc/keep=2 var/ var/cache/ var/cache/y=y work/" {
		t.Fatalf("tree = %s", tr)
	}
	want := Config{Env: []string{"PATH=/bin", "GREETING=hi"}, Entrypoint: []string{"/bin/sh"}, Cmd: []string{"-c", "echo ok"}, WorkingDir: "/work", User: "1000:1000"}
	loaded, err := c.Get("app-v1")
	if err != nil {
		t.Fatal(err)
	}
	if loaded.Config == nil || strings.Join(loaded.Config.Env, ",") != strings.Join(want.Env, ",") || loaded.Config.WorkingDir != want.WorkingDir ||
		loaded.Config.User != want.User || strings.Join(loaded.Config.Cmd, " ") != "-c echo ok" || loaded.Config.Entrypoint[0] != "/bin/sh" {
		t.Fatalf("config recorded = %+v; want %+v", loaded.Config, want)
	}
	if d, _ := Digest(got.Path); d != loaded.Digest || loaded.SizeBytes <= 0 {
		t.Fatalf("tree digest %s, recorded %s (size %d)", d, loaded.Digest, loaded.SizeBytes)
	}
	if fi, _ := os.Stat(filepath.Dir(got.Path)); fi.Mode().Perm() != 0o700 {
		t.Errorf("image dir mode %v, want 0700 (root only: setuid files)", fi.Mode().Perm())
	}
	cacheHolds(t, c, "app-v1")

	// Pins.
	for _, tc := range []struct {
		ref     string
		wantErr error
	}{
		{"app-v1@" + digest, nil},
		{"app-v1@" + loaded.Digest, nil},
		{"app-v1@sha256:" + strings.Repeat("0", 64), ErrNotFound},
		{"app-v1@sha256:abc", ErrInvalid},
		{"app-v1@md5:" + strings.Repeat("0", 32), ErrInvalid},
		{"nope@" + digest, ErrNotFound},
	} {
		img, err := c.Get(tc.ref)
		if !errors.Is(err, tc.wantErr) || (err == nil && img.Name != "app-v1") {
			t.Errorf("Get(%s) = %v, %v; want %v", tc.ref, img, err, tc.wantErr)
		}
		if errors.Is(err, ErrNotFound) && tc.ref[0] == 'a' && !strings.Contains(err.Error(), digest) {
			t.Errorf("a wrong pin's error should say which digest the image has: %v", err)
		}
	}

	// Pulling the same again changes nothing; another image under the same
	// name needs Force.
	again, err := c.Pull(ctx, PullOptions{Ref: host + "/test/app:v1"})
	if err != nil || again.CreatedAt != loaded.CreatedAt {
		t.Fatalf("pull again: %v (created %v, was %v)", err, again.CreatedAt, loaded.CreatedAt)
	}
	other := push(t, host+"/test/app:v2", testImage(t, "amd64", gzLayer(t, "v2=2")))
	if _, err := c.Pull(ctx, PullOptions{Ref: host + "/test/app:v2", Name: "app-v1"}); !errors.Is(err, ErrExists) {
		t.Fatalf("pull over another image: %v, want ErrExists", err)
	}
	img2, err := c.Pull(ctx, PullOptions{Ref: host + "/test/app@" + other, Name: "app-v1", Force: true})
	if err != nil || img2.ManifestDigest != other || treeOf(t, img2.Path) != "v2=2" {
		t.Fatalf("forced pull by digest: %+v %v", img2, err)
	}
	cacheHolds(t, c, "app-v1")
}

func TestPullIndexPicksAmd64(t *testing.T) {
	host := startRegistry(t, nil)
	arm := testImage(t, "arm64", gzLayer(t, "arch=arm64"))
	amd := testImage(t, "amd64", gzLayer(t, "arch=amd64"))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	idxDigest := pushIndex(t, host+"/multi:1", idx)
	amdDigest, _ := amd.Digest()
	c := &Cache{Dir: t.TempDir()}
	img, err := c.Pull(context.Background(), PullOptions{Ref: host + "/multi:1"})
	if err != nil {
		t.Fatal(err)
	}
	if treeOf(t, img.Path) != "arch=amd64" || img.ManifestDigest != idxDigest || img.PlatformDigest != amdDigest.String() {
		t.Fatalf("pulled %+v: %s", img, treeOf(t, img.Path))
	}
	for _, pin := range []string{idxDigest, amdDigest.String()} {
		if _, err := c.Get("multi-1@" + pin); err != nil {
			t.Errorf("pin %s: %v", pin, err)
		}
	}

	// An index without linux/amd64 is refused, naming what it offers.
	armOnly := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	pushIndex(t, host+"/armonly:1", armOnly)
	_, err = c.Pull(context.Background(), PullOptions{Ref: host + "/armonly:1"})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "linux/amd64") || !strings.Contains(err.Error(), "linux/arm64") {
		t.Fatalf("arm-only index: %v", err)
	}
	// So is a single-platform image of another architecture.
	push(t, host+"/armimg:1", arm)
	if _, err := c.Pull(context.Background(), PullOptions{Ref: host + "/armimg:1"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "arm64") {
		t.Fatalf("arm image: %v", err)
	}
	cacheHolds(t, c, "multi-1")
}

func TestPullErrors(t *testing.T) {
	host := startRegistry(t, nil)
	c := &Cache{Dir: t.TempDir()}
	ctx := context.Background()
	push(t, host+"/evil:dotdot", testImage(t, "amd64", gzLayer(t, "ok=1"), gzLayer(t, "../escape=x")))
	push(t, host+"/evil:symlink", testImage(t, "amd64", gzLayer(t, "etc -> /etc"), gzLayer(t, "etc/cagebox-pwned=x")))
	var many []string
	for i := 0; i < 50; i++ {
		many = append(many, "f"+strings.Repeat("x", i)+"=1")
	}
	push(t, host+"/big:many", testImage(t, "amd64", gzLayer(t, many...)))
	for _, tc := range []struct {
		opts    PullOptions
		wantErr error
		sub     string
	}{
		{PullOptions{Ref: host + "/no/such:image"}, ErrNotFound, "no such image"},
		{PullOptions{Ref: host + "/evil:dotdot"}, ErrUnsafe, ".."},
		{PullOptions{Ref: host + "/evil:symlink"}, ErrUnsafe, "symbolic link"},
		{PullOptions{Ref: host + "/big:many", Limits: Limits{MaxFiles: 10}}, ErrLimit, "max-files"},
		{PullOptions{Ref: "10.1.2.3:5000/x:1"}, ErrInvalid, "plain HTTP"},
		{PullOptions{Ref: "Bad Ref"}, ErrInvalid, "reference"},
		{PullOptions{Ref: host + "/x:1", Name: "Bad/Name"}, ErrInvalid, "name"},
		{PullOptions{Ref: "127.0.0.1:1/unreachable:1"}, errdefs.ErrUnavailable, "reach"},
	} {
		_, err := c.Pull(ctx, tc.opts)
		t.Logf("%s: %v", tc.opts.Ref, err)
		if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.sub) {
			t.Errorf("pull %s: %v; want %v containing %q", tc.opts.Ref, err, tc.wantErr, tc.sub)
		}
	}
	if _, err := os.Lstat("/etc/cagebox-pwned"); err == nil {
		t.Fatal("a layer wrote through a symlink to the host's /etc")
	}
	cacheHolds(t, c)
}

func TestPullTamperedBlob(t *testing.T) {
	content := strings.Repeat("A", 4096)
	layerTar := tarOf(t, "data="+content)
	l := static.NewLayer(layerTar, types.OCIUncompressedLayer)
	target, _ := l.Digest()
	// The registry flips one byte of the layer's file content on the way out:
	// the tar still parses, only the digest says it is wrong.
	host := startRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+target.String()) {
				h.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			b := rec.Body.Bytes()
			if i := bytes.Index(b, []byte("AAAA")); i >= 0 {
				b[i] = 'B'
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(b)
		})
	})
	push(t, host+"/tampered:1", testImage(t, "amd64", gzLayer(t, "first=1"), l))
	c := &Cache{Dir: t.TempDir()}
	_, err := c.Pull(context.Background(), PullOptions{Ref: host + "/tampered:1"})
	t.Log(err)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "digest mismatch") || !strings.Contains(err.Error(), target.String()) {
		t.Fatalf("tampered layer: %v; want a digest mismatch naming %s", err, target)
	}
	cacheHolds(t, c)
}

func TestImportDockerArchive(t *testing.T) {
	img := testImage(t, "amd64", gzLayer(t, "etc/", "etc/a=1", "etc/b=2"), gzLayer(t, "etc/.wh.a", "bin/", "bin/sh=sh"))
	tag, _ := name.NewTag("example.com/team/tool:2.0")
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		t.Fatal(err)
	}
	c := &Cache{Dir: t.TempDir()}
	got, err := c.Import(context.Background(), bytes.NewReader(buf.Bytes()), ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "tool-2.0" || !strings.HasPrefix(got.Source, "import docker-archive") || got.Config == nil || got.Config.WorkingDir != "/work" {
		t.Fatalf("imported %+v", got)
	}
	if tr := treeOf(t, got.Path); tr != "bin/ bin/sh=sh etc/ etc/b=2" {
		t.Fatalf("tree = %s", tr)
	}
	// Exists: refused without Force.
	if _, err := c.Import(context.Background(), bytes.NewReader(buf.Bytes()), ImportOptions{}); !errors.Is(err, ErrExists) {
		t.Fatalf("second import: %v", err)
	}
	// Garbage and oversized archives leave nothing.
	if _, err := c.Import(context.Background(), strings.NewReader("not a tar at all, not at all"), ImportOptions{Name: "x"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("garbage: %v", err)
	}
	if _, err := c.Import(context.Background(), bytes.NewReader(buf.Bytes()), ImportOptions{Name: "small", Limits: Limits{MaxBytes: 10, MaxFiles: 1}}); !errors.Is(err, ErrLimit) {
		t.Fatalf("over the limits: %v", err)
	}
	cacheHolds(t, c, "tool-2.0")
}

func TestImportOCILayout(t *testing.T) {
	arm := testImage(t, "arm64", gzLayer(t, "arch=arm64"))
	amd := testImage(t, "amd64", gzLayer(t, "arch=amd64"), gzLayer(t, "evil -> /etc/shadow"))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{"io.containerd.image.name": "docker.io/library/multi:3"})); err != nil {
		t.Fatal(err)
	}
	archive := tarDir(t, dir)
	c := &Cache{Dir: t.TempDir()}
	got, err := c.Import(context.Background(), bytes.NewReader(archive), ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	idxDigest, _ := idx.Digest()
	amdDigest, _ := amd.Digest()
	if got.Name != "multi-3" || got.ManifestDigest != idxDigest.String() || got.PlatformDigest != amdDigest.String() || got.Source != "import oci-layout index.docker.io/library/multi:3" {
		t.Fatalf("imported %+v", got)
	}
	if tr := treeOf(t, got.Path); tr != "arch=amd64 evil -> /etc/shadow" {
		t.Fatalf("tree = %s", tr)
	}

	// A layout whose manifest blob was altered is refused.
	amdHex := amdDigest.Hex
	p := filepath.Join(dir, "blobs", "sha256", amdHex)
	m, _ := os.ReadFile(p)
	os.Chmod(p, 0o644)
	if err := os.WriteFile(p, append(m, ' '), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = c.Import(context.Background(), bytes.NewReader(tarDir(t, dir)), ImportOptions{Name: "altered"})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("altered manifest: %v", err)
	}
	cacheHolds(t, c, "multi-3")
}

// tarDir tars dir's files (paths relative to dir).
func tarDir(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, _ := d.Info()
		h, _ := tar.FileInfoHeader(fi, "")
		h.Name = rel
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			tw.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tw.Close()
	return buf.Bytes()
}

func TestDeriveName(t *testing.T) {
	for in, want := range map[string]string{
		"docker.io/library/alpine:3.20":        "alpine-3.20",
		"alpine":                               "alpine",
		"alpine:latest":                        "alpine",
		"ghcr.io/org/tool_x:V1.2":              "tool_x-v1.2",
		"localhost:5000/a/b/busybox:1.36-musl": "busybox-1.36-musl",
		"quay.io/x/y@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef": "y-0123456789ab",
	} {
		ref, err := name.ParseReference(in)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got, err := DeriveName(ref); err != nil || got != want {
			t.Errorf("DeriveName(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, tc := range []struct {
		ref string
		ok  bool
	}{
		{"localhost:5000/x", true}, {"127.0.0.1:5000/x", true}, {"[::1]:5000/x", true}, {"127.0.0.5:80/x", true},
		{"10.0.0.1:5000/x", false}, {"192.168.1.1/x", false}, {"foo.localhost:5000/x", false}, {"registry.example.com/x", true},
	} {
		ref, err := ParseRef(tc.ref)
		if (err == nil) != tc.ok {
			t.Errorf("ParseRef(%s) = %v; want ok %v", tc.ref, err, tc.ok)
			continue
		}
		if err == nil {
			wantScheme := "https"
			if isLoopback(ref.Context().RegistryStr()) {
				wantScheme = "http"
			}
			if ref.Context().Scheme() != wantScheme {
				t.Errorf("%s: scheme %s, want %s", tc.ref, ref.Context().Scheme(), wantScheme)
			}
		}
	}
}

// TestPullCancelled: a pull cancelled while a layer streams (the client
// hung up) leaves nothing in the cache.
func TestPullCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	second := gzLayer(t, "two=2")
	target, _ := second.Digest()
	host := startRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+target.String()) {
				cancel()
				<-r.Context().Done()
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	push(t, host+"/slow:1", testImage(t, "amd64", gzLayer(t, "one=1"), second))
	c := &Cache{Dir: t.TempDir()}
	if _, err := c.Pull(ctx, PullOptions{Ref: host + "/slow:1"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled pull: %v", err)
	}
	cacheHolds(t, c)
}
