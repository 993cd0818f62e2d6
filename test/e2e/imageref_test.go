package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// TestImageInUse: an image a sandbox uses cannot be removed under it, and
// replacing it (pull --force) leaves the sandbox its own tree while new
// sandboxes get the new one; the old tree goes with its last sandbox.
func TestImageInUse(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	reg := startRegistry(t)
	base := tarTree(t, filepath.Join(e.home, "images", "busybox", "rootfs"))
	pushTo(t, reg+"/e2e/bb:1", ociImage(t, gzipLayer(t, base), gzipLayer(t, tarFiles(t, "gen.txt=one"))))
	pushTo(t, reg+"/e2e/bb:2", ociImage(t, gzipLayer(t, base), gzipLayer(t, tarFiles(t, "gen.txt=two"))))
	if r := e.cli("", "image", "pull", reg+"/e2e/bb:1", "--name", "bb"); r.code != 0 {
		t.Fatalf("pull: %+v", r)
	}
	r := e.cli("", "create", "--runtime", e2eRuntime(), "--image", "bb")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)

	r = e.cli("", "image", "rm", "bb")
	if r.code == 0 || !strings.Contains(r.stderr, id) || !strings.Contains(r.stderr, "cagebox rm") {
		t.Fatalf("image rm of an image in use: %+v (want a refusal naming %s and what to do)", r, id)
	}
	if r := e.cli("", "exec", id, "--", "cat", "/gen.txt"); r.code != 0 || r.stdout != "one" {
		t.Fatalf("the sandbox lost its image after a refused rm: %+v", r)
	}

	// Replace the image while the sandbox runs.
	if r := e.cli("", "image", "pull", reg+"/e2e/bb:2", "--name", "bb", "--force"); r.code != 0 {
		t.Fatalf("pull --force over an image in use: %+v", r)
	}
	// The running sandbox keeps its tree: its file, and every binary it
	// starts, come from the old image.
	if r := e.cli("", "exec", id, "--", "sh", "-c", "cat /gen.txt; ls /bin | wc -l"); r.code != 0 || !strings.HasPrefix(r.stdout, "one") {
		t.Fatalf("the running sandbox's tree changed under it: %+v", r)
	}
	if r := e.cli("", "run", "--runtime", e2eRuntime(), "--image", "bb", "--", "cat", "/gen.txt"); r.code != 0 || r.stdout != "two" {
		t.Fatalf("a new sandbox after the replacement: %+v (want the new image)", r)
	}
	retired := func() int {
		m, _ := filepath.Glob(filepath.Join(e.home, "images", ".retired-*"))
		return len(m)
	}
	if n := retired(); n != 1 {
		t.Fatalf("%d retired trees, want the old one kept for its sandbox", n)
	}
	if r := e.cli("", "rm", id); r.code != 0 {
		t.Fatalf("rm: %+v", r)
	}
	deadline := time.Now().Add(30 * time.Second)
	for retired() != 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := retired(); n != 0 {
		t.Fatalf("the old tree outlived its last sandbox (%d retired trees left)", n)
	}
	if r := e.cli("", "image", "rm", "bb"); r.code != 0 {
		t.Fatalf("image rm once nothing uses it: %+v", r)
	}
	if r := e.cli("", "run", "--runtime", e2eRuntime(), "--image", "bb", "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "bb") {
		t.Fatalf("run on a removed image: %+v", r)
	}
}

// TestImageConfig: a pulled image's config gives sandboxes their base
// environment and the default working directory and user of execs, as
// `docker run` does; the request overrides each.
func TestImageConfig(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	reg := startRegistry(t)
	base := tarTree(t, filepath.Join(e.home, "images", "busybox", "rootfs"))
	img := ociImage(t, gzipLayer(t, base), gzipLayer(t, tarFiles(t, "work/hello.txt=hi")))
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config.Env = []string{"PATH=/bin:/usr/bin", "FOO=from-image", "BAR=kept"}
	cf.Config.WorkingDir = "/work"
	cf.Config.User = "65534:65534"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	pushTo(t, reg+"/e2e/cfg:1", img)
	if r := e.cli("", "image", "pull", reg+"/e2e/cfg:1", "--name", "cfg"); r.code != 0 {
		t.Fatalf("pull: %+v", r)
	}
	rt := e2eRuntime()
	r := e.cli("", "run", "--runtime", rt, "--image", "cfg", "--", "sh", "-c", "echo $FOO $BAR; pwd; id -u; cat hello.txt")
	if r.code != 0 || r.stdout != "from-image kept\n/work\n65534\nhi" {
		t.Fatalf("run in an image with a config: %+v (want the image's env, cwd and user)", r)
	}
	r = e.cli("", "run", "--runtime", rt, "--image", "cfg", "--env", "FOO=mine", "--", "sh", "-c", "echo $FOO $BAR")
	if r.code != 0 || r.stdout != "mine kept\n" {
		t.Fatalf("the request's env over the image's: %+v", r)
	}
	r = e.cli("", "create", "--runtime", rt, "--image", "cfg")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	if r := e.cli("", "exec", "--user", "0", "--workdir", "/", id, "--", "sh", "-c", "id -u; pwd"); r.code != 0 || r.stdout != "0\n/\n" {
		t.Fatalf("exec naming its user and cwd: %+v", r)
	}
	// The defaults survive a daemon restart (they are in the record).
	e.stopDaemon(syscall.SIGTERM)
	e.startDaemon()
	if r := e.cli("", "exec", id, "--", "sh", "-c", "id -u; pwd"); r.code != 0 || r.stdout != "65534\n/work\n" {
		t.Fatalf("exec after a restart: %+v", r)
	}
	// Images built here have no config: root in /, as before.
	if r := e.cli("", "run", "--runtime", rt, "--image", "busybox", "--", "sh", "-c", "id -u; pwd"); r.code != 0 || r.stdout != "0\n/\n" {
		t.Fatalf("run in a built image: %+v", r)
	}
}

// TestImageRefsOfGoneHomes: an image cache is shared by homes (the tests'
// temporary ones share setup's); a reference left by a home that was
// removed, or by a sandbox its store no longer has, holds nothing — `image
// ls` does not count it and `image rm` is not refused for it — while a
// live sandbox's reference protects the image, also while its daemon is
// stopped (its store, read-only, says it exists).
func TestImageRefsOfGoneHomes(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	// A home that held the image and was removed without releasing it
	// (as a killed daemon's temporary home is): its reference names its
	// sandbox state directory.
	gone := filepath.Join(t.TempDir(), "removed-home")
	refs := filepath.Join(e.home, "images", "busybox", "refs")
	if err := os.MkdirAll(refs, 0o755); err != nil {
		t.Fatal(err)
	}
	leaked := filepath.Join(refs, "sb-gone.0123456789abcdef")
	if err := os.WriteFile(leaked, []byte(filepath.Join(gone, "sandboxes")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	r := e.cli("", "create", "--runtime", e2eRuntime(), "--image", "busybox")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	if r := e.cli("", "image", "ls"); r.code != 0 || !regexp.MustCompile(`(?m)^busybox .* 1\s*$`).MatchString(r.stdout) {
		t.Fatalf("image ls: busybox should be IN USE 1 (the live sandbox, not the removed home's): %+v", r)
	}
	if _, err := os.Stat(leaked); err == nil {
		t.Fatal("image ls kept the reference of a removed home")
	}
	if r := e.cli("", "image", "rm", "busybox"); r.code == 0 || !strings.Contains(r.stderr, id) {
		t.Fatalf("image rm while a sandbox uses it: %+v", r)
	}
	// Its daemon stopped, the sandbox still exists (its store says so).
	e.stopDaemon(syscall.SIGTERM)
	if r := e.cli("", "image", "rm", "busybox"); r.code == 0 || !strings.Contains(r.stderr, id) {
		t.Fatalf("image rm with the user's daemon stopped: %+v", r)
	}
	e.startDaemon()
	if r := e.cli("", "rm", id); r.code != 0 {
		t.Fatalf("rm: %+v", r)
	}
	// Another leak, found by `image rm` itself this time.
	if err := os.WriteFile(leaked, []byte(filepath.Join(gone, "sandboxes")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := e.cli("", "image", "rm", "busybox"); r.code != 0 {
		t.Fatalf("image rm refused for a removed home's reference: %+v", r)
	}
}
