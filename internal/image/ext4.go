package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
)

// Ext4Label is the filesystem label of packed images; a VM guest can mount its
// root by LABEL=cagebox-root.
const Ext4Label = "cagebox-root"

// PackExt4Context writes img's rootfs as an ext4 filesystem image to out (for VM
// runtimes: QEMU, Firecracker), sized by Ext4Size. It needs mkfs.ext4 from
// e2fsprogs 1.43 or later (for -d). Run as root so that file owners are kept.
// size is the filesystem size in bytes (0 = Ext4Size(img)). out is written
// via a temporary file beside it and renamed into place, so it is never
// half-written.
func PackExt4Context(ctx context.Context, img *Image, out string, size int64) error {
	if img == nil || img.Path == "" {
		return fmt.Errorf("pack ext4: no image")
	}
	if size <= 0 {
		size = Ext4Size(img)
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/mkfs.ext4"); serr != nil {
			return fmt.Errorf("pack ext4: mkfs.ext4 not found (apt-get install e2fsprogs): %w", err)
		}
		mkfs = "/usr/sbin/mkfs.ext4"
	}
	tmp := out + ".tmp"
	os.Remove(tmp)
	kib := strconv.FormatInt((size+1023)/1024, 10) + "k"
	// No journal (the disk is per-sandbox scratch or read-only), one inode
	// per 8 KiB (rootfs trees are many small files), reproducible-ish
	// defaults otherwise.
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-d", img.Path, "-L", Ext4Label,
		"-O", "^has_journal", "-i", "8192", "-m", "0", "-E", "root_owner=0:0", tmp, kib)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("pack ext4 %s: mkfs.ext4: %w: %s", img.Name, err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("pack ext4 %s: %w", img.Name, err)
	}
	return nil
}

// Ext4Size is the default filesystem size for img: its disk usage plus a
// quarter for metadata and slack, plus 64 MiB of free space, rounded up to
// a MiB.
func Ext4Size(img *Image) int64 {
	const mib = 1 << 20
	s := img.SizeBytes + img.SizeBytes/4 + 64*mib
	return (s + mib - 1) / mib * mib
}
