//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/rootfs"
)

// The VM side of mounts (agentproto.VMMount): the host attaches each
// volume, and each host directory copied into an ext4 image, as a
// virtio-blk disk with a serial of its own; the init finds the disk by
// that serial (the order of /dev/vdX is the order the kernel probed the
// virtio-mmio slots in, which is not the command line's) and mounts it
// in the root before switching to it.

// vmRunDirMount makes the agent's run dir a small tmpfs of its own, so
// that the token and environment files stay writable (the agent deletes
// the token) when the root is made read-only.
func vmRunDirMount(root string) error {
	dir := filepath.Join(root, rootfs.RunDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("run dir: %w", err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=0700"); err != nil {
		return fmt.Errorf("mount run dir: %w", err)
	}
	return nil
}

// vmMountDisks mounts cfg.Mounts below root, and with ReadOnlyRoot a
// tmpfs /tmp of the writable layer's size.
func vmMountDisks(root string, cfg *agentproto.VMConfig) error {
	for _, m := range cfg.Mounts {
		if !path.IsAbs(m.Target) || path.Clean(m.Target) != m.Target || m.Target == "/" {
			return fmt.Errorf("mount target %q: not a clean absolute path", m.Target)
		}
		dev, err := diskBySerial(m.Serial, 10*time.Second)
		if err != nil {
			return err
		}
		dst := filepath.Join(root, m.Target)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("mount point %s: %w", m.Target, err)
		}
		flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
		data := ""
		if !m.RW {
			// noload: a read-only disk's journal is not replayed.
			flags |= unix.MS_RDONLY
			data = "noload"
		}
		if !m.Exec {
			flags |= unix.MS_NOEXEC
		}
		if err := unix.Mount(dev, dst, "ext4", flags, data); err != nil {
			return fmt.Errorf("mount %s (%s) at %s: %w", m.Serial, dev, m.Target, err)
		}
		if m.RW {
			vmDiskMounts = append(vmDiskMounts, m.Target)
		}
	}
	if cfg.ReadOnlyRoot {
		disk := cfg.DiskBytes
		if disk <= 0 {
			disk = vmDefaultDisk
		}
		tmp := filepath.Join(root, "tmp")
		if err := os.MkdirAll(tmp, 0o1777); err != nil {
			return fmt.Errorf("/tmp: %w", err)
		}
		if err := unix.Mount("tmpfs", tmp, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=1777", disk)); err != nil {
			return fmt.Errorf("mount /tmp: %w", err)
		}
	}
	return nil
}

// vmDiskMounts are the guest paths of writable disks, after the switch
// of root (powerOff unmounts them).
var vmDiskMounts []string

// unmountVMDisks unmounts the writable disks (or, if something still
// holds one, makes it read-only), so their filesystems are clean.
func unmountVMDisks(log interface{ Warn(string, ...any) }) {
	for _, p := range vmDiskMounts {
		if err := unix.Unmount(p, 0); err != nil {
			if err := unix.Mount("", p, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				log.Warn("disk left mounted read-write at power off", "path", p, "err", err)
			}
		}
	}
}

// remountRootReadOnly makes the (switched-to) root read-only.
func remountRootReadOnly() error {
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("make the root read-only: %w", err)
	}
	return nil
}

// diskBySerial waits for the virtio-blk disk whose serial is serial.
func diskBySerial(serial string, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		ents, _ := filepath.Glob("/sys/block/vd*/serial")
		for _, e := range ents {
			b, err := os.ReadFile(e)
			if err == nil && strings.TrimSpace(string(b)) == serial {
				dev := "/dev/" + filepath.Base(filepath.Dir(e))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", errors.New("disk " + serial + " did not appear within " + d.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rootDisk is the image disk: /dev/vda when it is the only disk; with
// mounts, the one disk without a serial (the host gives every other disk
// one), once every disk has appeared.
func rootDisk(cfg *agentproto.VMConfig) (string, error) {
	if len(cfg.Mounts) == 0 {
		return vmRootDisk, nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, _ := filepath.Glob("/sys/block/vd*/serial")
		if len(ents) >= len(cfg.Mounts)+1 {
			var root []string
			for _, e := range ents {
				b, err := os.ReadFile(e)
				if err == nil && strings.TrimSpace(string(b)) == "" {
					root = append(root, "/dev/"+filepath.Base(filepath.Dir(e)))
				}
			}
			if len(root) != 1 {
				return "", fmt.Errorf("image disk: %d disks without a serial: %v", len(root), root)
			}
			return root[0], waitForPath(root[0], 10*time.Second)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("image disk: %d of %d disks appeared", len(ents), len(cfg.Mounts)+1)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
