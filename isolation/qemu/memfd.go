package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Guest RAM of templates lives in memfds: a template's build maps one
// shared (guest RAM lands in it), and every restore of the template maps
// one sealed memfd holding the template's RAM privately, so restored
// sandboxes share its pages until they write them (copy-on-write) and
// none of them can change it: F_SEAL_WRITE refuses write(2), shared
// writable mappings and hole punching to every holder, QEMU included; a
// private mapping is all it can make. On disk the RAM is a sparse file
// (untouched and zero pages are holes), loaded into a sealed memfd once
// per template per daemon.

// newMemfd returns a memfd of size bytes that can be sealed.
func newMemfd(name string, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd size: %w", err)
	}
	return f, nil
}

// sealMemfd forbids every change to f's contents and size, for good.
func sealMemfd(f *os.File) error {
	_, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	if err != nil {
		return fmt.Errorf("seal memfd: %w", err)
	}
	return nil
}

const pageSize = 4096

var zeroPage [pageSize]byte

// copySparse copies size bytes of src to dst at the same offsets, reading
// only src's data extents (SEEK_DATA/SEEK_HOLE) and writing only pages
// that are not all zero, so dst (a new sparse file or memfd) holds only
// what the guest left in its RAM. It returns the bytes written.
func copySparse(dst, src *os.File, size int64) (int64, error) {
	buf := make([]byte, 1<<20)
	var written int64
	sfd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // no data past off
		}
		if err != nil {
			return written, fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return written, fmt.Errorf("seek hole: %w", err)
		}
		hole = min(hole, size)
		for pos := data; pos < hole; {
			n := int(min(int64(len(buf)), hole-pos))
			if _, err := src.ReadAt(buf[:n], pos); err != nil && !errors.Is(err, io.EOF) {
				return written, fmt.Errorf("read at %d: %w", pos, err)
			}
			for p := 0; p < n; p += pageSize {
				page := buf[p:min(p+pageSize, n)]
				if bytes.Equal(page, zeroPage[:len(page)]) {
					continue
				}
				if _, err := dst.WriteAt(page, pos+int64(p)); err != nil {
					return written, fmt.Errorf("write at %d: %w", pos+int64(p), err)
				}
				written += int64(len(page))
			}
			pos += int64(n)
		}
		off = hole
	}
	return written, nil
}

// loadSealed returns a sealed memfd holding the sparse RAM file at path
// (size bytes).
func loadSealed(path string, size int64) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	if fi, err := src.Stat(); err != nil {
		return nil, err
	} else if fi.Size() != size {
		return nil, fmt.Errorf("%s holds %d bytes, want %d", path, fi.Size(), size)
	}
	m, err := newMemfd("cagebox-template-ram", size)
	if err != nil {
		return nil, err
	}
	// Every page allocated now, holes included: a write fault on a hole
	// of a private mapping allocates the page it copies in the memfd,
	// charged to the faulting QEMU's cgroup, so a sandbox touching its
	// untouched RAM first would be charged twice (its copy and the
	// shared page). Allocated here, the template's RAM is charged once,
	// to the daemon, and each sandbox only for its own copies.
	if err := unix.Fallocate(int(m.Fd()), 0, 0, size); err != nil {
		m.Close()
		return nil, fmt.Errorf("allocate template RAM: %w", err)
	}
	if _, err := copySparse(m, src, size); err != nil {
		m.Close()
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	if err := sealMemfd(m); err != nil {
		m.Close()
		return nil, err
	}
	// The file's page cache is not needed any more: the memfd holds the
	// pages every restore maps.
	_ = unix.Fadvise(int(src.Fd()), 0, 0, unix.FADV_DONTNEED)
	return m, nil
}

// dupFile returns a new descriptor of f (for a child to inherit; the
// caller closes it).
func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// allocatedBytes is the disk space the file at p uses.
func allocatedBytes(p string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}
