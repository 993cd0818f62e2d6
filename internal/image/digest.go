package image

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Digest returns "sha256:HEX" over a deterministic walk of the tree at root.
// See Image.Digest.
func Digest(root string) (string, error) {
	d, _, err := digestTree(context.Background(), root)
	return d, err
}

// digestTree walks root in lexical order and hashes, for every entry, its
// relative path, raw mode (type and permission bits), owner, size and:
// the contents of a regular file, the target of a symlink, the device number
// of a device node. It also returns the disk usage of the tree (allocated
// blocks, hard links counted once).
func digestTree(ctx context.Context, root string) (digest string, size int64, err error) {
	h := sha256.New()
	seen := make(map[[2]uint64]bool) // (dev, ino) of multiply-linked files
	buf := make([]byte, 256<<10)
	n := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		if st.Nlink > 1 && st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			k := [2]uint64{st.Dev, st.Ino}
			if !seen[k] {
				size += st.Blocks * 512
			}
			seen[k] = true
		} else {
			size += st.Blocks * 512
		}
		writeField(h, []byte(rel))
		var hdr [4 * 8]byte
		binary.BigEndian.PutUint64(hdr[0:], uint64(st.Mode))
		binary.BigEndian.PutUint64(hdr[8:], uint64(st.Uid))
		binary.BigEndian.PutUint64(hdr[16:], uint64(st.Gid))
		binary.BigEndian.PutUint64(hdr[24:], uint64(st.Size))
		h.Write(hdr[:])
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFREG:
			sum, err := hashFile(p, buf)
			if err != nil {
				return err
			}
			h.Write(sum)
		case syscall.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			writeField(h, []byte(target))
		case syscall.S_IFCHR, syscall.S_IFBLK:
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], st.Rdev)
			h.Write(b[:])
		}
		return nil
	})
	if err != nil {
		return "", 0, fmt.Errorf("digest %s: %w", root, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), size, nil
}

// writeField writes a length-prefixed byte string, so that no two different
// sequences of fields hash the same.
func writeField(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

func hashFile(p string, buf []byte) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fh := sha256.New()
	if _, err := io.CopyBuffer(fh, f, buf); err != nil {
		return nil, err
	}
	return fh.Sum(nil), nil
}
