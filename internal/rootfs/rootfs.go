// Package rootfs is the one description of the files cagebox writes into
// every guest (Guest: hostname, hosts, resolv.conf, the trusted CA files,
// the agent's run dir), used by the host for containers and by the VM init
// inside microVMs, and the way they are read and written inside a guest
// root without following the guest's symlinks out of it: every path is
// resolved with openat2(RESOLVE_IN_ROOT), so a link such as
// /etc/resolv.conf -> /etc/shadow in an image stays inside the image.
//
// cagebox-agent links this package: it must stay small, with nothing but
// the standard library and golang.org/x/sys.
package rootfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

func openIn(root int, rel string, flags uint64, mode uint64) (int, error) {
	return unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Mode:    mode,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// WriteFile writes data to rel (a path inside root), creating parent
// directories (0755) and replacing any file or link at rel.
func WriteFile(root, rel string, data []byte, mode os.FileMode) error {
	rel = strings.TrimPrefix(filepath.Clean("/"+rel), "/")
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open guest root: %w", err)
	}
	defer unix.Close(rfd)
	dir, name := filepath.Split(rel)
	dfd, err := mkdirAll(rfd, dir)
	if err != nil {
		return fmt.Errorf("guest %s: %w", rel, err)
	}
	defer unix.Close(dfd)
	// Replace rather than write through whatever is there (a link).
	if err := unix.Unlinkat(dfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("guest %s: %w", rel, err)
	}
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return fmt.Errorf("guest %s: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("guest %s: %w", rel, err)
	}
	return f.Close()
}

// mkdirAll opens (creating as needed) dir inside the root and returns its fd.
func mkdirAll(rfd int, dir string) (int, error) {
	cur, err := unix.Dup(rfd)
	if err != nil {
		return -1, err
	}
	for _, part := range strings.Split(strings.Trim(dir, "/"), "/") {
		if part == "" {
			continue
		}
		if err := unix.Mkdirat(cur, part, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(cur)
			return -1, err
		}
		next, err := openIn(cur, part, unix.O_PATH|unix.O_DIRECTORY, 0)
		unix.Close(cur)
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// ReadFile reads at most max bytes of rel inside root; only regular files.
func ReadFile(root, rel string, max int64) ([]byte, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open guest root: %w", err)
	}
	defer unix.Close(rfd)
	fd, err := openIn(rfd, strings.TrimPrefix(rel, "/"), unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("guest %s: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("guest %s: not a regular file", rel)
	}
	return io.ReadAll(io.LimitReader(f, max))
}
