package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/rootfs"
	"github.com/cagebox/cagebox/isolation"
)

// A filesystem snapshot of an OCI sandbox is a copy of its overlay's upper
// directory (the writable layer: what the guest wrote, whiteouts of what
// it removed, opaque directories) in the snapshot's layerDir. A sandbox
// started from it mounts that copy, read-only, as the overlay layer
// between a fresh writable layer and the image: every sandbox started
// from one snapshot shares it copy-on-write, and nothing is copied at a
// start.
//
// Nothing in the writable layer is trusted: the guest made it. The copy
// follows no symlink, copies no device node but the overlay's whiteouts
// (0:0), drops setuid and setgid bits (the guest root is nosuid anyway),
// copies only the overlay's own extended attributes (opaque, redirect),
// and is taken with the guest frozen. The files the host writes into every
// guest (rootfs.Guest: hostname, hosts, resolv.conf, the CA files) are
// left out: a sandbox started from the snapshot gets its own.
const layerDir = "layer"

// overlayXattrs are the extended attributes of the writable layer a copy
// keeps: what makes it an overlay layer.
var overlayXattrs = []string{"trusted.overlay.opaque", "trusted.overlay.redirect"}

// Snapshot implements isolation.Snapshotter: the sandbox is frozen while
// its writable layer is copied into dir, then thawed. The caller flushes
// the guest's files first (agentproto's Sync).
func (s *Sandbox) Snapshot(ctx context.Context, dir string) (isolation.SnapshotInfo, error) {
	if err := s.Pause(ctx); err != nil {
		return isolation.SnapshotInfo{}, fmt.Errorf("freeze the sandbox for its snapshot: %w", err)
	}
	cerr := CopyLayer(s.Path(rwDir, "upper"), filepath.Join(dir, layerDir))
	// Thawed whatever happened, even when ctx is done.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	rerr := s.Resume(rctx)
	cancel()
	if cerr != nil {
		return isolation.SnapshotInfo{}, fmt.Errorf("copy the writable layer: %w", cerr)
	}
	if rerr != nil {
		return isolation.SnapshotInfo{}, fmt.Errorf("thaw the sandbox after its snapshot: %w", rerr)
	}
	digest, bytes, err := LayerDigest(filepath.Join(dir, layerDir))
	if err != nil {
		return isolation.SnapshotInfo{}, err
	}
	return isolation.SnapshotInfo{Bytes: bytes, Digest: digest}, nil
}

// snapshotLayer is the layer of the snapshot spec starts from, checked
// against the digest the daemon recorded ("" when spec starts from none).
func snapshotLayer(spec *isolation.Spec) (string, error) {
	if spec.FromSnapshot == "" {
		return "", nil
	}
	if spec.FromSnapshotDigest == "" {
		return "", errors.New("start from a snapshot: no digest to check it against")
	}
	layer := filepath.Join(spec.FromSnapshot, layerDir)
	got, _, err := LayerDigest(layer)
	if err != nil {
		return "", fmt.Errorf("start from a snapshot: %w", err)
	}
	if got != spec.FromSnapshotDigest {
		return "", fmt.Errorf("start from a snapshot: its files changed since it was taken (digest %s, recorded %s): remove it and take it again", got, spec.FromSnapshotDigest)
	}
	return layer, nil
}

// hostWritten are the guest paths (relative to its root) the host writes
// at every start: not part of a snapshot.
func hostWritten() map[string]bool {
	out := map[string]bool{}
	for _, f := range (rootfs.Guest{Nameserver: "x", TrustedCAPEM: []byte("x")}).FilesOver(nil) {
		out[strings.TrimPrefix(f.Path, "/")] = true
	}
	return out
}

// CopyLayer copies the overlay upper directory src into dst (made here; it
// must not exist) as described at layerDir. src is not trusted.
func CopyLayer(src, dst string) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dst, err)
	}
	skip := hostWritten()
	type dirAttr struct {
		path string
		st   unix.Stat_t
	}
	var dirs []dirAttr
	links := map[[2]uint64]string{} // (dev, ino) → the copy of a file with more than one link
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if skip[rel] {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("stat %s: %w", rel, err)
		}
		out := filepath.Join(dst, rel)
		perm := st.Mode & 0o1777 // never setuid or setgid
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if rel != "." {
				if err := unix.Mkdir(out, 0o700); err != nil {
					return fmt.Errorf("mkdir %s: %w", rel, err)
				}
			}
			if err := copyXattrs(p, out); err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			dirs = append(dirs, dirAttr{out, st}) // mode, owner and times once its entries are in
			return nil
		case unix.S_IFREG:
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := links[key]; ok {
				if err := os.Link(first, out); err != nil {
					return fmt.Errorf("link %s: %w", rel, err)
				}
				return nil
			}
			if err := copyFile(p, out, &st); err != nil {
				return fmt.Errorf("copy %s: %w", rel, err)
			}
			if st.Nlink > 1 {
				links[key] = out
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("readlink %s: %w", rel, err)
			}
			if err := os.Symlink(target, out); err != nil {
				return fmt.Errorf("symlink %s: %w", rel, err)
			}
		case unix.S_IFCHR:
			if st.Rdev != 0 {
				return fmt.Errorf("%s is a device node: a snapshot holds files, directories, links and the overlay's whiteouts only; remove it and take the snapshot again", rel)
			}
			// An overlay whiteout: what the guest removed from the image.
			if err := unix.Mknod(out, unix.S_IFCHR|0o600, 0); err != nil {
				return fmt.Errorf("whiteout %s: %w", rel, err)
			}
		case unix.S_IFIFO:
			if err := unix.Mkfifo(out, 0o600); err != nil {
				return fmt.Errorf("fifo %s: %w", rel, err)
			}
		default:
			return nil // sockets: nothing to copy
		}
		if err := unix.Lchown(out, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("chown %s: %w", rel, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			if err := unix.Fchmodat(unix.AT_FDCWD, out, perm, 0); err != nil {
				return fmt.Errorf("chmod %s: %w", rel, err)
			}
		}
		return setTimes(out, &st)
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if err := unix.Lchown(d.path, int(d.st.Uid), int(d.st.Gid)); err != nil {
			return fmt.Errorf("chown %s: %w", d.path, err)
		}
		if err := unix.Fchmodat(unix.AT_FDCWD, d.path, d.st.Mode&0o1777, 0); err != nil {
			return fmt.Errorf("chmod %s: %w", d.path, err)
		}
		if err := setTimes(d.path, &d.st); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies the regular file src (opened without following a link,
// and checked to be the file st describes) to the new file dst.
func copyFile(src, dst string, st *unix.Stat_t) error {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	var fst unix.Stat_t
	if err := unix.Fstat(int(in.Fd()), &fst); err != nil {
		return err
	}
	if fst.Mode&unix.S_IFMT != unix.S_IFREG || fst.Ino != st.Ino || fst.Dev != st.Dev {
		return errors.New("it changed while it was copied")
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := copyXattrs(src, dst); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// copyXattrs copies the overlay's attributes (overlayXattrs) of src to dst.
func copyXattrs(src, dst string) error {
	buf := make([]byte, 4096)
	for _, name := range overlayXattrs {
		n, err := unix.Lgetxattr(src, name, buf)
		if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read attribute %s: %w", name, err)
		}
		if err := unix.Lsetxattr(dst, name, buf[:n], 0); err != nil {
			return fmt.Errorf("write attribute %s: %w (the snapshot directory's filesystem must keep trusted.* attributes)", name, err)
		}
	}
	return nil
}

func setTimes(p string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", p, err)
	}
	return nil
}

// LayerDigest is the digest ("sha256:…") of a snapshot layer — every
// entry's path, type, permission bits, owner, link target, device number,
// overlay attributes and content, in path order (not its times) — and the
// disk space it takes.
func LayerDigest(dir string) (string, int64, error) {
	h := sha256.New()
	var bytes int64
	buf := make([]byte, 4096)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		bytes += st.Blocks * 512
		fmt.Fprintf(h, "%q %o %d %d %d", rel, st.Mode, st.Uid, st.Gid, st.Rdev)
		var attrs []string
		for _, name := range overlayXattrs {
			if n, err := unix.Lgetxattr(p, name, buf); err == nil {
				attrs = append(attrs, name+"="+string(buf[:n]))
			}
		}
		sort.Strings(attrs)
		fmt.Fprintf(h, " %q", attrs)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " -> %q", target)
		case unix.S_IFREG:
			f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
			if err != nil {
				return err
			}
			fh := sha256.New()
			n, err := io.Copy(fh, f)
			f.Close()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " %d %x", n, fh.Sum(nil))
		}
		h.Write([]byte{'\n'})
		return nil
	})
	if err != nil {
		return "", 0, fmt.Errorf("digest of snapshot layer %s: %w", dir, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), bytes, nil
}
