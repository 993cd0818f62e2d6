// Package vmimage makes and caches what a microVM guest boots from: a
// Debian kernel (pinned, fetched with apt-get download and unpacked with
// dpkg-deb), a base initramfs (cagebox-agent as /init plus the kernel
// modules it needs), and one read-only ext4 disk per image digest. QEMU and
// Firecracker runtimes share these artifacts.
//
// The cache is one directory ($CAGEBOX_HOME/vm):
//
//	kernel/RELEASE/vmlinuz       the kernel (bzImage)
//	kernel/RELEASE/modules/*.ko  the guest modules and their dependencies
//	kernel/RELEASE/kernel.json   package, version, sha256s, module load order
//	initrd/HASH.img              base initramfs (gzip newc cpio), by inputs
//	disks/DIGEST.ext4            an image's root filesystem, by image digest
//
// Files appear by rename only, so readers never see half-written ones;
// concurrent builders of one artifact are serialised with lock files.
package vmimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/statedir"
)

// Artifacts are the host files one VM boots from.
type Artifacts struct {
	// Kernel is the Debian bzImage (QEMU boots it directly; a VMM that
	// wants an uncompressed ELF vmlinux must extract it).
	Kernel string
	// Initrd is the base initramfs; append the sandbox's configuration
	// with WriteSandboxInitrd.
	Initrd string
	// RootDisk is the image's root filesystem as ext4, attached read-only.
	RootDisk string
}

// Cache is a directory of VM artifacts. Set Dir ($CAGEBOX_HOME/vm).
type Cache struct {
	Dir string
	// Progress, if set, receives a line per slow step (fetching the
	// kernel, packing a disk).
	Progress io.Writer
}

func (c *Cache) progressf(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, format+"\n", args...)
	}
}

func (c *Cache) check() error {
	if c == nil || c.Dir == "" {
		return errors.New("vm artifact cache: no directory configured")
	}
	return nil
}

// lock takes an exclusive flock on Dir/.NAME.lock, waiting for ctx.
func (c *Cache) lock(ctx context.Context, name string) (func(), error) {
	if err := statedir.Make(c.Dir); err != nil {
		return nil, fmt.Errorf("create vm cache %s: %w", c.Dir, err)
	}
	f, err := os.OpenFile(filepath.Join(c.Dir, "."+name+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another build of %s: %w", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Artifacts returns (building what is missing) the kernel, base initramfs
// and root disk for a sandbox of the image at rootfs, with the agent at
// agentPath. The kernel is never fetched here: that is `cagebox image
// build`'s job (FetchKernel).
func (c *Cache) Artifacts(ctx context.Context, rootfs, agentPath string) (*Artifacts, error) {
	k, err := c.Kernel()
	if err != nil {
		return nil, err
	}
	initrd, err := c.Initrd(ctx, agentPath)
	if err != nil {
		return nil, err
	}
	disk, err := c.RootDisk(ctx, rootfs)
	if err != nil {
		return nil, err
	}
	return &Artifacts{Kernel: k.Vmlinuz, Initrd: initrd, RootDisk: disk}, nil
}

// Prepare makes everything a VM of img needs ahead of time (for `cagebox
// image build`): it fetches the pinned kernel if it is missing, then builds
// the base initramfs and the image's disk.
func (c *Cache) Prepare(ctx context.Context, img *image.Image, agentPath string) (*Artifacts, error) {
	if _, err := c.FetchKernel(ctx); err != nil {
		return nil, err
	}
	return c.Artifacts(ctx, img.Path, agentPath)
}

// initrdFormat changes whenever WriteInitrd's layout does, so that cached
// base initramfs files of an older layout are not reused.
const initrdFormat = "cagebox-initrd-2" // 2: module signatures stripped

// Initrd returns the base initramfs for the installed kernel and the agent
// at agentPath, building it if needed. It is named for the sha256 of its
// inputs; older ones are removed after a new one is built.
func (c *Cache) Initrd(ctx context.Context, agentPath string) (string, error) {
	k, err := c.Kernel()
	if err != nil {
		return "", err
	}
	agentSum, err := fileSHA256(agentPath)
	if err != nil {
		return "", fmt.Errorf("cagebox-agent binary: %w (build it with `make build`)", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", initrdFormat, k.Release, k.VmlinuzSHA256, agentSum)
	for _, m := range k.Modules {
		fmt.Fprintf(h, "%s\n", m)
	}
	dir := filepath.Join(c.Dir, "initrd")
	out := filepath.Join(dir, hex.EncodeToString(h.Sum(nil))[:24]+".img")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	unlock, err := c.lock(ctx, "initrd")
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := statedir.Make(dir); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	mods := make([]Module, len(k.Modules))
	for i, n := range k.Modules {
		mods[i] = Module{Name: n, Path: filepath.Join(k.Dir, "modules", n+".ko")}
	}
	tmp, err := os.CreateTemp(dir, ".initrd-*")
	if err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = WriteInitrd(tmp, agentPath, mods)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), out)
	}
	if err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}
	// Sandboxes copy the base at create time, so older bases are unused
	// (once no create can still be copying one).
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			if fi, err := e.Info(); err == nil && p != out && strings.HasSuffix(e.Name(), ".img") && time.Since(fi.ModTime()) > 10*time.Minute {
				os.Remove(p)
			}
		}
	}
	return out, nil
}

// RootDisk returns the ext4 disk of the image whose root filesystem is
// rootfs, packing it on first use. Disks are keyed by the image's digest
// (from the image.json beside rootfs, or computed), so an image is packed
// once however many sandboxes use it.
func (c *Cache) RootDisk(ctx context.Context, rootfs string) (string, error) {
	if err := c.check(); err != nil {
		return "", err
	}
	img, err := imageOf(rootfs)
	if err != nil {
		return "", err
	}
	hexDigest, ok := strings.CutPrefix(img.Digest, "sha256:")
	if !ok || len(hexDigest) != 64 {
		return "", fmt.Errorf("image %s: bad digest %q (rebuild it with `cagebox image build --force %s`)", img.Name, img.Digest, img.Name)
	}
	dir := filepath.Join(c.Dir, "disks")
	out := filepath.Join(dir, hexDigest+".ext4")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	unlock, err := c.lock(ctx, "disk-"+hexDigest[:16])
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := statedir.Make(dir); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	start := time.Now()
	c.progressf("vm: packing image %s as ext4 (%d MiB of files)", img.Name, img.SizeBytes>>20)
	if err := image.PackExt4Context(ctx, img, out, 0); err != nil {
		return "", err
	}
	if err := os.Chmod(out, 0o444); err != nil {
		return "", fmt.Errorf("pack ext4: %w", err)
	}
	c.progressf("vm: image %s packed in %s", img.Name, time.Since(start).Round(time.Millisecond))
	return out, nil
}

// imageOf describes the image whose tree is rootfs: from the cache's
// image.json beside it, or (a bare directory) by computing its digest.
func imageOf(rootfs string) (*image.Image, error) {
	rootfs = filepath.Clean(rootfs)
	img := &image.Image{}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(rootfs), "image.json"))
	if err == nil && json.Unmarshal(b, img) == nil && img.Digest != "" && img.SizeBytes > 0 {
		img.Path = rootfs
		return img, nil
	}
	if _, err := os.Stat(rootfs); err != nil {
		return nil, fmt.Errorf("image root %s: %w", rootfs, err)
	}
	d, err := image.Digest(rootfs)
	if err != nil {
		return nil, fmt.Errorf("digest of %s: %w", rootfs, err)
	}
	var size int64
	_ = filepath.WalkDir(rootfs, func(_ string, de fs.DirEntry, err error) error {
		if err == nil {
			if fi, err := de.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	return &image.Image{Name: filepath.Base(filepath.Dir(rootfs)), Path: rootfs, Digest: d, SizeBytes: size}, nil
}

// TestCacheDir is the cache that tests of VM runtimes share, so that the
// kernel is fetched once per machine: $CAGEBOX_TEST_VM, or a fixed
// directory under the system's temporary directory.
func TestCacheDir() string {
	if d := os.Getenv("CAGEBOX_TEST_VM"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "cagebox-test-vm")
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
