package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cagebox/cagebox/internal/tarx"
)

// binDir builds a small static program as both cagebox-server and cagebox-agent
// (building the real ones takes minutes on a shared machine; the image
// builder treats them as opaque files).
func binDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() { println(\"cagebox\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, name := range []string{serverBin, "cagebox-agent"} {
		cmd := exec.Command(gobin, "build", "-trimpath", "-o", filepath.Join(dir, name), src)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	return dir
}

// readOCI loads the one image of an OCI archive written by write.
func readOCI(t *testing.T, p string) (v1.Image, string) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := tarx.Extract(f, dir, tarx.Limits{}); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index: %+v, %v", im, err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img, im.Manifests[0].Annotations["org.opencontainers.image.ref.name"]
}

// files lists the image's flattened file system: name → header.
func files(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, data
		}
		if err != nil {
			t.Fatal(err)
		}
		n := strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		hdrs[n] = h
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			data[n] = b
		}
	}
}

func TestControllerImage(t *testing.T) {
	bins := binDir(t)
	out := filepath.Join(t.TempDir(), "controller.tar")
	o := options{kind: "controller", binDir: bins, out: out, tag: "registry.example/cagebox-controller:v1", format: "oci", created: time.Unix(0, 0).UTC()}
	digest, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	img, ref := readOCI(t, out)
	if ref != "registry.example/cagebox-controller:v1" {
		t.Errorf("ref name %q", ref)
	}
	if d, _ := img.Digest(); d.String() != digest {
		t.Errorf("read back %s, wrote %s", d, digest)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/cagebox", "controller"}) || len(c.Cmd) != 0 {
		t.Errorf("entrypoint %v cmd %v", c.Entrypoint, c.Cmd)
	}
	if c.User != "65532:65532" || cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("user %q os %s arch %s", c.User, cf.OS, cf.Architecture)
	}
	layers, _ := img.Layers()
	if len(layers) != 1 {
		t.Errorf("%d layers, want 1 (empty base)", len(layers))
	}
	hdrs, data := files(t, img)
	var names []string
	for n := range hdrs {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"etc", "etc/group", "etc/passwd", "home", "home/nonroot", "usr", "usr/local", "usr/local/bin", "usr/local/bin/cagebox"}
	if !slices.Equal(names, want) {
		t.Errorf("files %v, want %v (nothing else: no shell)", names, want)
	}
	for n := range hdrs {
		if strings.HasSuffix(n, "/sh") || strings.HasSuffix(n, "bash") || strings.HasSuffix(n, "busybox") {
			t.Errorf("a shell in the controller image: %s", n)
		}
	}
	src, _ := os.ReadFile(filepath.Join(bins, serverBin))
	if h := hdrs["usr/local/bin/cagebox"]; h.Mode != 0o755 || h.Uid != 0 || !bytes.Equal(data["usr/local/bin/cagebox"], src) {
		t.Errorf("cagebox: mode %o uid %d, %d bytes (want %d)", h.Mode, h.Uid, len(data["usr/local/bin/cagebox"]), len(src))
	}
	if h := hdrs["home/nonroot"]; h.Uid != 65532 {
		t.Errorf("home owned by %d", h.Uid)
	}
	if !strings.Contains(string(data["etc/passwd"]), "nonroot:x:65532:65532:") {
		t.Errorf("passwd %q", data["etc/passwd"])
	}
	// Same inputs, same digest.
	again, err := run(options{kind: "controller", binDir: bins, out: filepath.Join(t.TempDir(), "again.tar"), tag: "x:y", format: "oci", created: time.Unix(0, 0).UTC()})
	if err != nil || again != digest {
		t.Errorf("rebuilt: %s, %v; want %s", again, err, digest)
	}
	// The docker format holds the same config and layer.
	dout := filepath.Join(t.TempDir(), "docker.tar")
	if _, err := run(options{kind: "controller", binDir: bins, out: dout, tag: "cagebox-controller:dev", format: "docker", created: time.Unix(0, 0).UTC()}); err != nil {
		t.Fatal(err)
	}
	dimg, err := tarball.ImageFromPath(dout, nil)
	if err != nil {
		t.Fatal(err)
	}
	dcf, _ := dimg.ConfigFile()
	if !slices.Equal(dcf.Config.Entrypoint, c.Entrypoint) || dcf.Config.User != c.User {
		t.Errorf("docker archive config %+v", dcf.Config)
	}
}

func TestRefusesDynamicBinary(t *testing.T) {
	dir := t.TempDir()
	dyn := ""
	for _, p := range []string{"/bin/true", "/usr/bin/true"} {
		if _, err := staticBinary(p); err != nil && strings.Contains(err.Error(), "dynamically linked") {
			dyn = p
			break
		}
	}
	if dyn == "" {
		t.Skip("no dynamically linked /bin/true here to try")
	}
	b, _ := os.ReadFile(dyn)
	if err := os.WriteFile(filepath.Join(dir, serverBin), b, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := run(options{kind: "controller", binDir: dir, out: filepath.Join(dir, "x.tar"), tag: "x:y", format: "oci"})
	if err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("dynamic binary: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x.tar")); err == nil {
		t.Error("an image was written")
	}
}

func TestNodeImage(t *testing.T) {
	bins := binDir(t)
	root := t.TempDir()
	for _, d := range []string{"usr/sbin", "usr/bin", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/sbin/nft"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "node.tar")
	if _, err := run(options{kind: "node", binDir: bins, baseRootfs: root, out: out, tag: "cagebox-node:dev", format: "oci", created: time.Unix(0, 0).UTC()}); err != nil {
		t.Fatal(err)
	}
	img, _ := readOCI(t, out)
	cf, _ := img.ConfigFile()
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/cagebox"}) || !slices.Equal(cf.Config.Cmd, []string{"node"}) {
		t.Errorf("entrypoint %v cmd %v", cf.Config.Entrypoint, cf.Config.Cmd)
	}
	if layers, _ := img.Layers(); len(layers) != 2 {
		t.Errorf("%d layers, want base + binaries", len(layers))
	}
	hdrs, _ := files(t, img)
	for _, n := range []string{"usr/sbin/nft", "usr/local/bin/cagebox", "usr/local/bin/cagebox-agent"} {
		if hdrs[n] == nil || hdrs[n].Mode&0o111 == 0 {
			t.Errorf("%s missing or not executable", n)
		}
	}
	if h := hdrs["bin"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/bin" {
		t.Errorf("bin symlink: %+v", h)
	}
	// The node image built on that image as a base (an OCI archive).
	out2 := filepath.Join(t.TempDir(), "node2.tar")
	if _, err := run(options{kind: "node", binDir: bins, baseImage: out, out: out2, tag: "cagebox-node:dev2", format: "docker", created: time.Unix(0, 0).UTC()}); err != nil {
		t.Fatal(err)
	}
	img2, err := tarball.ImageFromPath(out2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if layers, _ := img2.Layers(); len(layers) != 3 {
		t.Errorf("%d layers on the base image, want 3", len(layers))
	}
	// No base: refused, saying what to give.
	if _, err := run(options{kind: "node", binDir: bins, out: filepath.Join(t.TempDir(), "x.tar"), tag: "x:y", format: "oci"}); err == nil || !strings.Contains(err.Error(), "-base-rootfs") {
		t.Errorf("no base: %v", err)
	}
}
