package image

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/statedir"
)

// lock takes the per-name lock file, waiting until ctx is done.
func (c *Cache) lock(ctx context.Context, name string) (unlock func(), err error) {
	for {
		unlock, err := c.tryLock(name)
		if !errors.Is(err, ErrBusy) {
			return unlock, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for image %q lock: %w", name, context.Cause(ctx))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tryLock takes the per-name lock file or fails with ErrBusy.
func (c *Cache) tryLock(name string) (unlock func(), err error) {
	if err := statedir.Make(c.Dir); err != nil {
		return nil, fmt.Errorf("create image cache: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(c.Dir, ".lock-"+name), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock image %q: %w", name, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("image %q is being built or removed: %w", name, ErrBusy)
		}
		return nil, fmt.Errorf("lock image %q: %w", name, err)
	}
	return func() { f.Close() }, nil
}

// removeTree deletes dir after making sure nothing under it is still in use:
// processes whose root is inside it are killed, and mounts under it (such as
// the proc, sys and dev mounts debootstrap makes in its target) are detached.
// If a mount cannot be removed the tree is left in place rather than
// deleting through the mount into the host's filesystems.
func removeTree(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	killRootedIn(abs)
	for _, m := range mountsUnder(abs) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", m, err)
		}
	}
	if left := mountsUnder(abs); len(left) > 0 {
		return fmt.Errorf("refusing to delete %s: still mounted: %s", abs, strings.Join(left, ", "))
	}
	if err := os.RemoveAll(abs); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", abs, err)
	}
	return nil
}

// mountsUnder returns the mount points at or below dir in this mount
// namespace, deepest first.
func mountsUnder(dir string) []string {
	// The calling thread's table, not the process's main thread's (which
	// a runtime's setup may have left in another mount namespace; see
	// internal/mounts).
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescapeMountinfo undoes the octal escapes (\040 for space, ...) that the
// kernel uses in /proc/self/mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// killRootedIn SIGKILLs every process whose root directory is dir or below
// it: stragglers from a chroot that outlived their process group.
func killRootedIn(dir string) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		root, err := os.Readlink(filepath.Join("/proc", e.Name(), "root"))
		if err != nil {
			continue
		}
		if root == dir || strings.HasPrefix(root, dir+"/") {
			unix.Kill(pid, unix.SIGKILL)
		}
	}
}
