package mounts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Flags are the mount flags of a mount a tenant asked for: always nosuid
// and nodev, read-only unless rw, noexec unless exec.
func Flags(rw, exec bool) uintptr {
	f := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if !rw {
		f |= unix.MS_RDONLY
	}
	if !exec {
		f |= unix.MS_NOEXEC
	}
	return f
}

// StageBind mounts src at dst (made here: a directory or an empty file)
// through src's descriptor, private (nothing propagates to or from the
// host's mounts), with Flags(rw, exec). On error nothing stays mounted.
func StageBind(src *Source, dst string, rw, exec bool) error {
	if err := mkMountPoint(dst, src.Dir); err != nil {
		return err
	}
	// The descriptor, not the path: see Source.
	proc := "/proc/self/fd/" + strconv.Itoa(int(src.File.Fd()))
	if err := unix.Mount(proc, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src.Path, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_PRIVATE, ""); err != nil {
		Unmount(dst)
		return fmt.Errorf("make %s private: %w", dst, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|Flags(rw, exec), ""); err != nil {
		Unmount(dst)
		return fmt.Errorf("restrict bind of %s: %w", src.Path, err)
	}
	return nil
}

func mkMountPoint(dst string, dir bool) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("create mount point: %w", err)
	}
	if dir {
		if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create mount point: %w", err)
		}
		return nil
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create mount point: %w", err)
	}
	return f.Close()
}

// CreateImage makes a volume image at p: a sparse file of size bytes
// holding an empty ext4 filesystem (the one format every runtime uses: a
// loop mount on the host for containers and gVisor, a virtio-blk disk for
// VMs). It fails if p exists; on error p is removed.
func CreateImage(ctx context.Context, p string, size int64, label string) (err error) {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create volume image: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(p)
		}
	}()
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("size volume image: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("create volume image: %w", err)
	}
	return MkfsExt4(ctx, p, "", label)
}

// MkfsExt4 makes an ext4 filesystem in the file p (populated from the
// directory from when not ""). No reserved blocks; the root directory is
// root's, mode 0755 (from's mode with from).
func MkfsExt4(ctx context.Context, p, from, label string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	args := []string{"-q", "-F", "-t", "ext4", "-m", "0", "-E", "nodiscard,root_owner=0:0"}
	if label != "" {
		if len(label) > 16 {
			label = label[:16]
		}
		args = append(args, "-L", label)
	}
	if from != "" {
		args = append(args, "-d", from)
	}
	args = append(args, p)
	out, err := exec.CommandContext(ctx, "mkfs.ext4", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// MountImage attaches the ext4 image at img to a free loop device
// (auto-clearing: it detaches when unmounted) and mounts it at dst (a
// directory it makes) private, with Flags(rw, exec). The loop device is
// read-only when rw is false. On error nothing stays attached.
func MountImage(img, dst string, rw, exec bool) error {
	if err := mkMountPoint(dst, true); err != nil {
		return err
	}
	mode := os.O_RDONLY
	if rw {
		mode = os.O_RDWR
	}
	f, err := os.OpenFile(img, mode|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open volume image: %w", err)
	}
	defer f.Close()
	if err := CheckDetached(img, rw); err != nil {
		return err
	}
	loop, dev, err := attachLoop(f, !rw)
	if err != nil {
		return err
	}
	// Closing our descriptor of an auto-clearing loop device that nothing
	// mounted detaches it; a mount holds it until unmounted.
	defer loop.Close()
	data := "errors=remount-ro"
	if !rw {
		// A read-only mount does not replay the journal (it could not
		// write the replay to a read-only loop device).
		data = "noload"
	}
	if err := unix.Mount(dev, dst, "ext4", Flags(rw, exec), data); err != nil {
		return fmt.Errorf("mount volume image (%s): %w", dev, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_PRIVATE, ""); err != nil {
		Unmount(dst)
		return fmt.Errorf("make %s private: %w", dst, err)
	}
	return nil
}

// attachLoop configures a free loop device on f.
func attachLoop(f *os.File, ro bool) (*os.File, string, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("loop devices: %w (is the loop module loaded?)", err)
	}
	defer ctl.Close()
	flags := uint32(unix.LO_FLAGS_AUTOCLEAR)
	if ro {
		flags |= unix.LO_FLAGS_READ_ONLY
	}
	for i := 0; i < 16; i++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, "", fmt.Errorf("find a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		if _, err := os.Stat(dev); errors.Is(err, os.ErrNotExist) {
			// No devtmpfs node for a new device (a container's /dev).
			if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, os.ErrExist) {
				return nil, "", fmt.Errorf("create %s: %w", dev, err)
			}
		}
		lf, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, "", fmt.Errorf("open %s: %w", dev, err)
		}
		cfg := &unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = flags
		err = unix.IoctlLoopConfigure(int(lf.Fd()), cfg)
		if errors.Is(err, unix.EBUSY) {
			lf.Close() // another process took it first
			continue
		}
		if err != nil {
			lf.Close()
			return nil, "", fmt.Errorf("configure %s: %w", dev, err)
		}
		return lf, dev, nil
	}
	return nil, "", errors.New("no free loop device after 16 tries")
}

// Unmount unmounts p, lazily if it is busy; a path that is not mounted is
// not an error.
func Unmount(p string) {
	if err := unix.Unmount(p, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		_ = unix.Unmount(p, unix.MNT_DETACH)
	}
}

// MountInfo is the mount table of the calling thread's mount namespace:
// /proc/thread-self, not /proc/self, which is the main thread's, and the
// main thread can be left in another namespace (a goroutine that unshared
// its mount namespace on a locked thread that Go cannot end, as gVisor's
// runner does, wedges it there), where it would show mounts long gone.
func MountInfo() ([]byte, error) {
	return os.ReadFile("/proc/thread-self/mountinfo")
}

// MountPointsBelow lists the mount points at or below dir, deepest first.
func MountPointsBelow(dir string) []string {
	b, err := MountInfo()
	if err != nil {
		return nil
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	return points
}

// UnmountBelow unmounts every mount at or below dir, deepest first. Call
// it before removing dir: os.RemoveAll would otherwise descend into a
// mounted volume or bound host directory and delete what it holds.
func UnmountBelow(dir string) {
	for _, p := range MountPointsBelow(dir) {
		Unmount(p)
	}
}

// CheckDetached fails when a loop device still holds the image read-write
// (or at all, when rw: a new writer): a mount of it is alive somewhere on
// the host — a copy in another process's mount namespace keeps its
// filesystem, and so its auto-clearing loop device, after the daemon
// unmounted it. Mounting the file again would put a second filesystem
// instance on one image, and the first one's late writeback would corrupt
// (or, for a reader, change under) the second. Read-only loops of
// concurrent readers do not count for a reader.
func CheckDetached(img string, rw bool) error {
	var busy []string
	for _, l := range LoopsOf(img) {
		ro, err := os.ReadFile("/sys/block/" + l + "/ro")
		if rw || err != nil || strings.TrimSpace(string(ro)) != "1" {
			busy = append(busy, l)
		}
	}
	if len(busy) > 0 {
		return fmt.Errorf("volume image %s is still attached to %s (a mount of it lives on elsewhere on the host): retry once that sandbox is gone, or see which process holds it with `losetup -l`", filepath.Base(img), strings.Join(busy, ", "))
	}
	return nil
}

// LoopsOf lists the loop devices whose backing file is p (for leak
// checks).
func LoopsOf(p string) []string {
	ents, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(e)
		if err != nil {
			continue
		}
		if strings.TrimSpace(strings.TrimSuffix(string(b), " (deleted)")) == p {
			out = append(out, strings.Split(e, "/")[3])
		}
	}
	return out
}
