package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/internal/rootfs"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/isolation"
)

// CgroupParent is the cgroup (relative to each hierarchy's root) that holds
// every sandbox's cgroup, whichever OCI runtime made it.
const CgroupParent = "cagebox"

// Directories MountRoot makes below a sandbox's state dir.
const (
	rwDir     = "rw"     // tmpfs holding the overlay's upper and work dirs
	rootfsDir = "rootfs" // the overlay: the guest's root
	mntDir    = "mnt"    // the tenant's mounts, staged: mnt/0, mnt/1, …
)

// PrepareRoot makes what every OCI runtime's guest needs below
// spec.StateDir: the state dir itself, the writable root (MountRoot) with
// the guest's files written into it, and the run dir (WriteRunDir) at
// runDir. Each step's undo goes on undo; it returns the root's path.
func PrepareRoot(spec *isolation.Spec, runDir string, undo *cleanup.Stack) (string, error) {
	if err := statedir.Make(spec.StateDir); err != nil {
		return "", fmt.Errorf("create state dir: %w", err)
	}
	undo.Add(func() { _ = os.RemoveAll(spec.StateDir) })
	layer, err := snapshotLayer(spec)
	if err != nil {
		return "", err
	}
	root, err := MountRoot(spec.StateDir, spec.RootFS, layer, spec.Resources.WithDefaults().DiskBytes)
	if err != nil {
		return "", err
	}
	undo.Add(func() { UnmountRoot(spec.StateDir) })
	if err := WriteGuestFiles(root, spec); err != nil {
		return "", err
	}
	if err := WriteRunDir(runDir, spec); err != nil {
		return "", err
	}
	return root, nil
}

// MountRoot makes the writable root of a guest below dir: a tmpfs of
// diskBytes at dir/rw holding the upper layer, and an overlay of image
// (never written) under it at dir/rootfs, whose path it returns; layer (a
// snapshot's, see layerDir; "" for none) goes between the writable layer
// and the image, read-only. On error nothing stays mounted; UnmountRoot
// undoes it.
func MountRoot(dir, image, layer string, diskBytes int64) (_ string, err error) {
	if diskBytes <= 0 {
		return "", fmt.Errorf("writable layer of %d bytes: want a positive size", diskBytes)
	}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	rw, root := filepath.Join(dir, rwDir), filepath.Join(dir, rootfsDir)
	for _, d := range []string{rw, root} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return "", fmt.Errorf("create %s: %w", d, err)
		}
	}
	if err := unix.Mount("tmpfs", rw, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", diskBytes)); err != nil {
		return "", fmt.Errorf("mount writable layer: %w", err)
	}
	undo.Add(func() { Unmount(rw) })
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(rw, d), 0o755); err != nil {
			return "", fmt.Errorf("create overlay dir: %w", err)
		}
	}
	lower := image
	if layer != "" {
		lower = layer + ":" + image
	}
	ovl := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, filepath.Join(rw, "upper"), filepath.Join(rw, "work"))
	if err := unix.Mount("overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, ovl); err != nil {
		return "", fmt.Errorf("mount overlay root over image %s: %w", image, err)
	}
	return root, nil
}

// StageMounts mounts each of spec's mounts on the host below
// spec.StateDir/mnt — a bind through its checked descriptor, a volume's
// image on an auto-clearing loop device — nosuid, nodev, read-only unless
// RW and noexec unless Exec, and returns the bundle's bind mounts of them
// (carrying the same flags, so the OCI runtime's own remount enforces them
// too). Undo steps go on undo.
func StageMounts(spec *isolation.Spec, undo *cleanup.Stack) ([]specs.Mount, error) {
	var out []specs.Mount
	for i, m := range spec.Mounts {
		stage := filepath.Join(spec.StateDir, mntDir, strconv.Itoa(i))
		switch m.Type {
		case mounts.Bind:
			if m.Bind == nil {
				return nil, fmt.Errorf("bind mount at %s: no checked source", m.Target)
			}
			if err := mounts.StageBind(m.Bind, stage, m.RW, m.Exec); err != nil {
				return nil, fmt.Errorf("mount %s at %s: %w", m.Name, m.Target, err)
			}
		case mounts.Volume:
			if err := mounts.MountImage(m.Image, stage, m.RW, m.Exec); err != nil {
				return nil, fmt.Errorf("mount volume %s at %s: %w", m.Name, m.Target, err)
			}
		default:
			return nil, fmt.Errorf("mount at %s: unknown type %q", m.Target, m.Type)
		}
		undo.Add(func() { mounts.Unmount(stage) })
		opts := []string{"bind", "nosuid", "nodev"}
		if m.RW {
			opts = append(opts, "rw")
		} else {
			opts = append(opts, "ro")
		}
		if !m.Exec {
			opts = append(opts, "noexec")
		}
		out = append(out, specs.Mount{Destination: m.Target, Type: "bind", Source: stage, Options: opts})
	}
	return out, nil
}

// UnmountRoot unmounts what MountRoot mounted below dir. Idempotent.
func UnmountRoot(dir string) {
	Unmount(filepath.Join(dir, rootfsDir))
	Unmount(filepath.Join(dir, rwDir))
}

// Unmount unmounts p, lazily if it is busy; a path that is not mounted is
// not an error.
func Unmount(p string) {
	if err := unix.Unmount(p, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		_ = unix.Unmount(p, unix.MNT_DETACH)
	}
}

// MountsBelow lists the host's mounts below dir (for leak checks).
func MountsBelow(dir string) []string {
	mi, err := mounts.MountInfo()
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, dir+"/") {
			out = append(out, "mount "+line)
		}
	}
	return out
}

// WriteGuestFiles writes the files every guest expects to find about itself
// (rootfs.Guest) into its root.
func WriteGuestFiles(root string, spec *isolation.Spec) error {
	return rootfs.WriteGuest(root, rootfs.Guest{Hostname: spec.Hostname, Nameserver: spec.Nameserver, TrustedCAPEM: spec.TrustedCAPEM})
}
