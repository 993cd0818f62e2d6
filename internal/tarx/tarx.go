// Package tarx writes directory trees as tar streams and extracts tar
// streams that nobody vouches for: the host extracting what a guest (which
// may be compromised) sent, and the guest's agent extracting what it is
// given. It links only the standard library and golang.org/x/sys (the
// in-guest agent uses it).
//
// Extraction keeps every entry under its destination directory: names that
// are absolute or hold "..", resolution through a symlink that leads out
// (openat2 with RESOLVE_BENEATH where the kernel has it; else each parent
// component opened with O_NOFOLLOW, so no symlink is traversed at all), and
// hard links to anything outside are refused; device nodes and FIFOs are
// refused; the total size and the number of entries are bounded. The
// archive/tar and os packages alone check none of this, hence this package.
//
// Nor does the archive decide modes or owners beyond what a plain mkdir and
// open would: only the permission bits (0777) of an entry are used, masked
// by the process's umask (setuid, setgid and sticky are dropped, so a
// root-run extraction never makes a setuid-root file); ownership is the
// extracting process's (no chown to the archive's ids); and the
// destination directory itself and directories that existed before are
// never chmodded or touched — only what the extraction created takes the
// archive's (masked) mode and time.
package tarx

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrUnsafe: an entry would land outside the destination, or is a
	// kind of file that is refused (device node, FIFO).
	ErrUnsafe = errors.New("unsafe archive entry")
	// ErrLimit: the archive is larger or has more entries than allowed.
	ErrLimit = errors.New("archive over its limit")
)

// Limits bound an extraction.
type Limits struct {
	MaxBytes   int64 // sum of the regular files' sizes
	MaxEntries int
}

// DefaultLimits are the limits used when a field is zero.
var DefaultLimits = Limits{MaxBytes: 1 << 30, MaxEntries: 100_000}

// Stats count what an extraction wrote.
type Stats struct {
	Entries int
	Bytes   int64
}

// Extract writes the tar stream r under dir, creating dir if needed. It
// stops at the first refused entry or error; what was written before
// stays. Files and directories it creates take the archive's permission
// bits (0777 only) masked by the umask, and its modification times;
// ownership is the caller's; the root entry ("./") and directories that
// already exist keep their mode and times.
func Extract(r io.Reader, dir string, lim Limits) (Stats, error) {
	var st Stats
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultLimits.MaxBytes
	}
	if lim.MaxEntries <= 0 {
		lim.MaxEntries = DefaultLimits.MaxEntries
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return st, fmt.Errorf("create %s: %w", dir, err)
	}
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(root)
	x := &extractor{root: root}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return st, fmt.Errorf("read archive: %w", err)
		}
		st.Entries++
		if st.Entries > lim.MaxEntries {
			return st, fmt.Errorf("%w: more than %d entries", ErrLimit, lim.MaxEntries)
		}
		if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeRegA || hdr.Typeflag == tar.TypeGNUSparse {
			if hdr.Size < 0 || hdr.Size > lim.MaxBytes-st.Bytes {
				return st, fmt.Errorf("%w: %s would take the files past %d bytes", ErrLimit, safeName(hdr.Name), lim.MaxBytes)
			}
			st.Bytes += hdr.Size
		}
		if err := x.entry(hdr, tr); err != nil {
			return st, err
		}
	}
	// Directory modes last: a read-only directory must not stop its own
	// entries from being written.
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		if err := x.finishDir(d); err != nil {
			return st, err
		}
	}
	return st, nil
}

// pendingDir is a directory the extraction created, whose final mode
// (chmod: when it differs from the one it was made with) and time are set
// after its entries.
type pendingDir struct {
	name  string
	mode  uint32
	chmod bool
	mtime time.Time
}

type extractor struct {
	root int
	dirs []pendingDir
}

// safeName quotes a name from an archive for an error message.
func safeName(name string) string {
	if len(name) > 200 {
		name = name[:200] + "…"
	}
	return fmt.Sprintf("%q", name)
}

// cleanName checks an entry's name and returns it relative to the root
// ("" for the root itself).
func cleanName(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("%w: empty or NUL in name %s", ErrUnsafe, safeName(name))
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: absolute name %s", ErrUnsafe, safeName(name))
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("%w: name %s leads out with ..", ErrUnsafe, safeName(name))
		}
	}
	n := path.Clean(name)
	if n == "." {
		return "", nil
	}
	return n, nil
}

func (x *extractor) entry(hdr *tar.Header, tr io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	// Permission bits only: never setuid, setgid or sticky.
	mode := uint32(hdr.Mode) & 0o777
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader, tar.TypeXHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
		return nil // metadata archive/tar has applied
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Errorf("%w: %s is a device node (refused)", ErrUnsafe, safeName(hdr.Name))
	case tar.TypeFifo:
		return fmt.Errorf("%w: %s is a FIFO (refused)", ErrUnsafe, safeName(hdr.Name))
	}
	if name == "" {
		if hdr.Typeflag == tar.TypeDir {
			return nil // dir itself: its mode is its owner's, not the archive's
		}
		return fmt.Errorf("%w: the root entry %s is not a directory", ErrUnsafe, safeName(hdr.Name))
	}
	parent, base := path.Split(name)
	pfd, err := x.openDir(strings.TrimSuffix(parent, "/"))
	if err != nil {
		return fmt.Errorf("%s: %w", safeName(hdr.Name), err)
	}
	defer x.closeDir(pfd)
	switch hdr.Typeflag {
	case tar.TypeDir:
		// Owner rwx until the end, so that the directory's own entries
		// can be written; the kernel applies the umask.
		merr := unix.Mkdirat(pfd, base, mode|0o700)
		if merr != nil && merr != unix.EEXIST {
			return fmt.Errorf("mkdir %s: %w", safeName(hdr.Name), merr)
		}
		var s unix.Stat_t
		if err := unix.Fstatat(pfd, base, &s, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat %s: %w", safeName(hdr.Name), err)
		}
		if merr == unix.EEXIST {
			if s.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("%w: %s is a directory in the archive but exists as another kind of file", ErrUnsafe, safeName(hdr.Name))
			}
			return nil // not ours: its mode and times stay
		}
		// (mode|0700) &^ umask is what the kernel made; mode &^ umask is
		// the mode to end with.
		made := s.Mode & 0o777
		final := made &^ (0o700 &^ mode)
		x.dirs = append(x.dirs, pendingDir{name: name, mode: final, chmod: final != made, mtime: hdr.ModTime})
		return nil
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		if err := removeNonDir(pfd, base); err != nil {
			return fmt.Errorf("replace %s: %w", safeName(hdr.Name), err)
		}
		// Created with the archive's permission bits, which the kernel
		// masks with the umask (a new file is writable through this
		// descriptor even when its mode says read-only).
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err != nil {
			return fmt.Errorf("create %s: %w", safeName(hdr.Name), err)
		}
		f := os.NewFile(uintptr(fd), base)
		_, err = io.CopyN(f, tr, hdr.Size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", safeName(hdr.Name), err)
		}
	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
			return fmt.Errorf("%w: symlink %s has an empty or NUL target", ErrUnsafe, safeName(hdr.Name))
		}
		if err := removeNonDir(pfd, base); err != nil {
			return fmt.Errorf("replace %s: %w", safeName(hdr.Name), err)
		}
		// The link may point anywhere: nothing here ever follows it (every
		// later entry resolves beneath the root).
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink %s: %w", safeName(hdr.Name), err)
		}
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hard link %s: %w", safeName(hdr.Name), err)
		}
		if target == "" {
			return fmt.Errorf("%w: hard link %s to the root", ErrUnsafe, safeName(hdr.Name))
		}
		tparent, tbase := path.Split(target)
		tfd, err := x.openDir(strings.TrimSuffix(tparent, "/"))
		if err != nil {
			return fmt.Errorf("hard link %s: %w", safeName(hdr.Name), err)
		}
		defer x.closeDir(tfd)
		if err := removeNonDir(pfd, base); err != nil {
			return fmt.Errorf("replace %s: %w", safeName(hdr.Name), err)
		}
		// No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink.
		if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
			return fmt.Errorf("hard link %s: %w", safeName(hdr.Name), err)
		}
		return nil
	default:
		return fmt.Errorf("%w: %s has an entry type %q that is not supported", ErrUnsafe, safeName(hdr.Name), hdr.Typeflag)
	}
	if !hdr.ModTime.IsZero() {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}

// removeNonDir removes base in dirfd unless it is missing; a directory is
// not removed (an error says so).
func removeNonDir(dirfd int, base string) error {
	err := unix.Unlinkat(dirfd, base, 0)
	switch err {
	case nil, unix.ENOENT:
		return nil
	case unix.EISDIR:
		return fmt.Errorf("%w: a directory is in the way", ErrUnsafe)
	}
	return err
}

func (x *extractor) finishDir(d pendingDir) error {
	parent, base := path.Split(d.name)
	pfd, err := x.openDir(strings.TrimSuffix(parent, "/"))
	if err != nil {
		return fmt.Errorf("directory %s: %w", safeName(d.name), err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	x.closeDir(pfd)
	if err != nil {
		return fmt.Errorf("directory %s: %w", safeName(d.name), err)
	}
	defer unix.Close(fd)
	if d.chmod {
		if err := unix.Fchmod(fd, d.mode&0o777); err != nil {
			return fmt.Errorf("chmod directory %s: %w", safeName(d.name), err)
		}
	}
	if !d.mtime.IsZero() {
		tv := unix.NsecToTimeval(d.mtime.UnixNano())
		_ = unix.Futimes(fd, []unix.Timeval{tv, tv})
	}
	return nil
}

// openDir opens the directory rel (clean, relative; "" is the root) under
// the root without leaving it.
func (x *extractor) openDir(rel string) (int, error) {
	if rel == "" {
		return x.root, nil
	}
	return openBeneath(x.root, rel)
}

func (x *extractor) closeDir(fd int) {
	if fd != x.root {
		unix.Close(fd)
	}
}

// openat2Missing is set once openat2 has said ENOSYS (older kernels,
// gVisor): the component walk is used from then on.
var openat2Missing atomic.Bool

// openBeneath opens directory rel under root as O_PATH, refusing any
// resolution that leaves root.
func openBeneath(root int, rel string) (int, error) {
	if !openat2Missing.Load() {
		fd, err := unix.Openat2(root, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
		})
		switch err {
		case nil:
			return fd, nil
		case unix.ENOSYS, unix.EPERM: // EPERM: a seccomp filter that does not know it
			openat2Missing.Store(true)
		case unix.EXDEV, unix.ELOOP:
			return -1, fmt.Errorf("%w: %s leads out of the destination (through a symlink)", ErrUnsafe, safeName(rel))
		case unix.ENOENT:
			return -1, fmt.Errorf("%w: its directory %s is not in the archive before it", ErrUnsafe, safeName(rel))
		default:
			return -1, fmt.Errorf("open %s: %w", safeName(rel), err)
		}
	}
	return walkBeneath(root, rel)
}

// walkBeneath is openBeneath without openat2: one component at a time,
// each opened with O_NOFOLLOW, so no symlink is traversed at all (stricter
// than RESOLVE_BENEATH, which follows one that stays inside).
func walkBeneath(root int, rel string) (int, error) {
	fd, err := unix.Openat(root, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for _, c := range strings.Split(rel, "/") {
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			unix.Close(fd)
			return -1, fmt.Errorf("%w: %s leads out with ..", ErrUnsafe, safeName(rel))
		}
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			var s unix.Stat_t
			isLink := unix.Fstatat(fd, c, &s, unix.AT_SYMLINK_NOFOLLOW) == nil && s.Mode&unix.S_IFMT == unix.S_IFLNK
			unix.Close(fd)
			switch {
			case isLink:
				return -1, fmt.Errorf("%w: %s goes through a symlink", ErrUnsafe, safeName(rel))
			case err == unix.ENOENT:
				return -1, fmt.Errorf("%w: its directory %s is not in the archive before it", ErrUnsafe, safeName(rel))
			}
			return -1, fmt.Errorf("open %s: %w", safeName(rel), err)
		}
		unix.Close(fd)
		fd = next
	}
	return fd, nil
}

// Create writes p as a tar stream to w: a directory's contents (names
// relative to it, the directory itself as "./"), or a single file under
// its base name. Symlinks are stored as links; device nodes, FIFOs and
// sockets are skipped. Hard links are stored as separate files.
func Create(w io.Writer, p string) error {
	tw := tar.NewWriter(w)
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		if err := addEntry(tw, p, fi.Name(), fi); err != nil {
			return err
		}
		return tw.Close()
	}
	err = filepath.WalkDir(p, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(p, full)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed meanwhile
			}
			return err
		}
		name := filepath.ToSlash(rel)
		if name == "." {
			name = "./"
		}
		return addEntry(tw, full, name, info)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func addEntry(tw *tar.Writer, full, name string, fi fs.FileInfo) error {
	link := ""
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		l, err := os.Readlink(full)
		if err != nil {
			return err
		}
		link = l
	case fi.IsDir(), fi.Mode().IsRegular():
	default:
		return nil // device, FIFO, socket: skipped
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	if fi.IsDir() && !strings.HasSuffix(name, "/") {
		hdr.Name += "/"
	}
	hdr.Format = tar.FormatPAX
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("%s: %w", full, err)
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	fd, err := unix.Open(full, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), full)
	defer f.Close()
	// The header promised hdr.Size bytes: a file that shrank meanwhile is
	// padded, one that grew is cut.
	n, err := io.CopyN(tw, f, hdr.Size)
	if err == io.EOF {
		_, err = io.CopyN(tw, zeros{}, hdr.Size-n)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", full, err)
	}
	return nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
