package vmimage

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cavaliergopher/cpio"

	"github.com/cagebox/cagebox/agentproto"
)

// fakeIndex is a module index whose .modinfo data is given, not read.
func fakeIndex(infos map[string]*modInfo) *moduleIndex {
	idx := &moduleIndex{byName: map[string]string{}, infos: infos}
	for n := range infos {
		idx.byName[n] = "/lib/modules/x/" + n + ".ko"
	}
	return idx
}

func TestResolveOrder(t *testing.T) {
	idx := fakeIndex(map[string]*modInfo{
		"virtio":         {},
		"virtio_ring":    {},
		"virtio_mmio":    {depends: []string{"virtio", "virtio_ring"}},
		"ext4":           {depends: []string{"jbd2", "mbcache", "crc16"}, pre: []string{"crypto-crc32c"}},
		"jbd2":           {pre: []string{"crypto-crc32c"}},
		"mbcache":        {},
		"crc16":          {},
		"crc32c_generic": {aliases: []string{"crypto-crc32c", "crc32c"}},
		"overlay":        {pre: []string{"no-such-alias"}}, // optional softdep: ignored
		"loop_a":         {depends: []string{"loop_b"}},
		"loop_b":         {depends: []string{"loop_a"}},
	})
	mods, err := resolve(idx, "testdir", []string{"virtio_mmio", "ext4", "overlay", "virtio-ring"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.Name)
	}
	want := []string{"virtio", "virtio_ring", "virtio_mmio", "crc32c_generic", "jbd2", "mbcache", "crc16", "ext4", "overlay"}
	if !slices.Equal(names, want) {
		t.Fatalf("order %v, want %v", names, want)
	}
	if _, err := resolve(idx, "testdir", []string{"nope"}); err == nil || !strings.Contains(err.Error(), `"nope" not found`) {
		t.Fatalf("missing module: %v", err)
	}
	if _, err := resolve(idx, "testdir", []string{"loop_a"}); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Fatalf("cycle: %v", err)
	}
	idx.infos["ext4"].depends = append(idx.infos["ext4"].depends, "gone")
	if _, err := resolve(idx, "testdir", []string{"ext4"}); err == nil || !strings.Contains(err.Error(), "needed by ext4") {
		t.Fatalf("missing dependency: %v", err)
	}
}

// readCpio lists an archive's entries (name → header and data).
func readCpio(t *testing.T, r io.Reader) (map[string]*cpio.Header, map[string][]byte, []string) {
	t.Helper()
	hdrs, data := map[string]*cpio.Header{}, map[string][]byte{}
	var order []string
	cr := cpio.NewReader(r)
	for {
		h, err := cr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read cpio: %v", err)
		}
		b, err := io.ReadAll(cr)
		if err != nil {
			t.Fatal(err)
		}
		hdrs[h.Name], data[h.Name] = h, b
		order = append(order, h.Name)
	}
	return hdrs, data, order
}

func TestInitrdContents(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent")
	os.WriteFile(agent, []byte("agent-binary"), 0o755)
	var mods []Module
	for _, n := range []string{"virtio", "virtio_mmio", "ext4"} {
		p := filepath.Join(dir, n+".ko")
		os.WriteFile(p, []byte("module "+n), 0o644)
		mods = append(mods, Module{Name: n, Path: p})
	}
	base := filepath.Join(dir, "base.img")
	f, _ := os.Create(base)
	if err := WriteInitrd(f, agent, mods); err != nil {
		t.Fatal(err)
	}
	f.Close()

	cfg := &agentproto.VMConfig{Token: "secret-token", Env: []string{"A=b"}, Hostname: "h", PIDs: 64}
	out := filepath.Join(dir, "sandbox.img")
	if err := WriteSandboxInitrd(out, base, cfg); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o400 {
		t.Fatalf("sandbox initrd mode: %v %v", fi, err)
	}
	raw, _ := os.ReadFile(out)

	// The base: one gzip member holding the newc archive.
	br := bufio.NewReader(bytes.NewReader(raw))
	zr, err := gzip.NewReader(br)
	if err != nil {
		t.Fatal(err)
	}
	zr.Multistream(false)
	hdrs, data, order := readCpio(t, zr)
	io.Copy(io.Discard, zr)
	if string(data["init"]) != "agent-binary" || hdrs["init"].Mode.Perm() != 0o755 || !hdrs["init"].Mode.IsRegular() {
		t.Errorf("init: %+v %q", hdrs["init"], data["init"])
	}
	wantMods := []string{"lib/modules/00-virtio.ko", "lib/modules/01-virtio_mmio.ko", "lib/modules/02-ext4.ko"}
	var gotMods []string
	for _, n := range order {
		if strings.HasPrefix(n, "lib/modules/") {
			gotMods = append(gotMods, n)
		}
	}
	if !slices.Equal(gotMods, wantMods) || string(data["lib/modules/02-ext4.ko"]) != "module ext4" {
		t.Errorf("modules %v, want %v", gotMods, wantMods)
	}
	for _, d := range []string{"dev", "proc", "sys", "mnt"} {
		if h := hdrs[d]; h == nil || !h.Mode.IsDir() {
			t.Errorf("no directory %s", d)
		}
	}
	if _, ok := hdrs["cagebox/config.json"]; ok {
		t.Error("the base holds a sandbox configuration")
	}

	// Then, 4-byte aligned, the configuration archive, uncompressed.
	rest, _ := io.ReadAll(br)
	rest = bytes.TrimLeft(rest, "\x00")
	if off := len(raw) - len(rest); off%4 != 0 {
		t.Fatalf("config archive at offset %d, not 4-byte aligned", off)
	}
	hdrs, data, _ = readCpio(t, bytes.NewReader(rest))
	h := hdrs["cagebox/config.json"]
	if h == nil || h.Mode.Perm() != 0o400 {
		t.Fatalf("config entry: %+v", h)
	}
	var back agentproto.VMConfig
	if err := json.Unmarshal(data["cagebox/config.json"], &back); err != nil || back.Token != "secret-token" || back.PIDs != 64 || back.Env[0] != "A=b" {
		t.Fatalf("config %+v %v", back, err)
	}
	if strings.Contains(cfg.String(), "secret-token") {
		t.Fatal("VMConfig.String shows the token")
	}
}

// TestDiskCache packs a tiny image once and reuses it by digest.
func TestDiskCache(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("packing ext4 keeps owners only as root")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		if _, err := os.Stat("/usr/sbin/mkfs.ext4"); err != nil {
			t.Skip("mkfs.ext4 not installed (apt-get install e2fsprogs)")
		}
	}
	root := filepath.Join(t.TempDir(), "img", "rootfs")
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("x\n"), 0o644)
	c := &Cache{Dir: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p1, err := c.RootDisk(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	fi1, _ := os.Stat(p1)
	p2, err := c.RootDisk(ctx, root)
	if err != nil || p2 != p1 {
		t.Fatalf("second lookup %q %v, want %q", p2, err, p1)
	}
	if fi2, _ := os.Stat(p2); !fi2.ModTime().Equal(fi1.ModTime()) {
		t.Fatal("disk was packed twice")
	}
	os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("y\n"), 0o644)
	if p3, err := c.RootDisk(ctx, root); err != nil || p3 == p1 {
		t.Fatalf("changed image got disk %q %v", p3, err)
	}
}

// TestKernel fetches the pinned kernel (into $CAGEBOX_TEST_VM, default a
// fixed temp directory shared with the qemu runtime's tests) and checks the
// modules resolved from the real package.
func TestKernel(t *testing.T) {
	c := &Cache{Dir: TestCacheDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k, err := c.FetchKernel(ctx)
	if err != nil {
		t.Skipf("cannot fetch the guest kernel here: %v", err)
	}
	if k.DebSHA256 == "" || k.VmlinuzSHA256 == "" || k.Version != KernelVersion {
		t.Fatalf("kernel record %+v", k)
	}
	pos := map[string]int{}
	for i, m := range k.Modules {
		pos[m] = i
	}
	for _, need := range append(slices.Clone(GuestModules), "virtio", "virtio_ring", "jbd2", "mbcache", "crc16", "crc32c_generic", "vsock") {
		if _, ok := pos[need]; !ok {
			t.Errorf("module %s missing from %v", need, k.Modules)
		}
	}
	for _, dep := range [][2]string{{"virtio", "virtio_mmio"}, {"jbd2", "ext4"}, {"crc32c_generic", "ext4"}, {"vsock", "vmw_vsock_virtio_transport"}} {
		if pos[dep[0]] > pos[dep[1]] {
			t.Errorf("%s loads after %s", dep[0], dep[1])
		}
	}
	// The cached modules resolve to the same order.
	again, err := ResolveModules(filepath.Join(k.Dir, "modules"), GuestModules)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range again {
		names = append(names, m.Name)
	}
	if !slices.Equal(names, k.Modules) {
		t.Fatalf("re-resolved %v, recorded %v", names, k.Modules)
	}
}

func TestStripModuleSignature(t *testing.T) {
	body := []byte("\x7fELF module body")
	sig := bytes.Repeat([]byte{0xaa}, 300)
	info := []byte{0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x2c} // PKCS#7, sig_len 300
	signed := append(append(append(append([]byte{}, body...), sig...), info...), moduleSigMagic...)
	if got := stripModuleSignature(signed); !bytes.Equal(got, body) {
		t.Fatalf("stripped %q", got)
	}
	if got := stripModuleSignature(body); !bytes.Equal(got, body) {
		t.Fatal("an unsigned module changed")
	}
	bogus := append([]byte("x"), moduleSigMagic...)
	if got := stripModuleSignature(bogus); !bytes.Equal(got, bogus) {
		t.Fatal("a truncated trailer was cut")
	}
	// The pinned kernel's modules, when fetched: each is signed and strips
	// to an ELF file.
	k, err := (&Cache{Dir: TestCacheDir()}).Kernel()
	if err != nil {
		t.Skipf("no fetched kernel: %v", err)
	}
	mods, _ := filepath.Glob(filepath.Join(k.Dir, "modules", "*.ko"))
	for _, m := range mods {
		b, _ := os.ReadFile(m)
		s := stripModuleSignature(b)
		if len(s) >= len(b) || !bytes.HasPrefix(s, []byte("\x7fELF")) {
			t.Errorf("%s: %d → %d bytes", filepath.Base(m), len(b), len(s))
		}
	}
}
