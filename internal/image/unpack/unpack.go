// Package unpack applies OCI image layers (tar streams, already
// decompressed) to a root directory without trusting them.
//
// It exists because a layer is untrusted input and the library unpackers
// are not safe enough for it: go-containerregistry's mutate.Extract only
// flattens layers into one tar stream (whiteouts applied, but nothing about
// writing it to disk), and the usual "for each header, os.Create(filepath.Join
// (root, name))" that most examples use follows symlinks the layer itself
// planted (a link etc -> /etc, then a file etc/passwd, writes the host's
// /etc/passwd), accepts "../" names, and links hard links to any host file.
//
// Here every path is resolved inside the root, component by component,
// with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS): a layer's symlinks are
// created as links but are never followed while unpacking — a path that goes
// through one is refused, and so is any name with a ".." component. Absolute
// names are taken relative to the root (as tar -x and every container
// runtime do). Hard links must point at a regular file already unpacked
// inside the root. Device nodes, fifos and sockets are dropped and counted
// (a guest gets its /dev from the runtime; an image has no business
// shipping nodes to the host's filesystem). Extended attributes, file
// capabilities among them, are dropped too, and so are the setuid and setgid
// bits of files: every guest process runs under no_new_privs without
// capabilities (the agent sets it in every runtime; isolationtest checks
// it), so they would grant nothing in a guest, and on the host they would
// be setuid-root binaries in the cache (whose directories are 0700 too:
// package statedir).
//
// OCI whiteouts (.wh.NAME) remove NAME from the layers below; an opaque
// directory (.wh..wh..opq) hides everything below it that an earlier layer
// made. Ownership (numeric uid/gid, when running as root), permission bits
// and modification times are kept; directories' times and modes are set
// once all layers are applied (Finish).
//
// Limits (total bytes of regular files and number of entries, over all
// layers) are enforced while streaming, before anything is written: a
// 10 GiB sparse file over an 8 GiB limit is refused on its header.
package unpack

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Default limits.
const (
	DefaultMaxBytes = 8 << 30
	DefaultMaxFiles = 500_000
)

// ErrLimit means a layer would exceed a limit (Limits).
var ErrLimit = errors.New("image exceeds a limit")

// ErrUnsafe means a layer holds an entry that could write outside the root
// or is otherwise malformed; the image is refused.
var ErrUnsafe = errors.New("unsafe or malformed layer")

// Limits bound what unpacking may write, summed over every layer (an entry a
// later layer replaces counts twice: the limits bound work as well as the
// result). Zero means the default.
type Limits struct {
	MaxBytes int64 // total size of regular files (their logical size: sparse files count whole)
	MaxFiles int64 // entries created: files, directories, links
}

// WithDefaults fills zero fields with the defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxFiles <= 0 {
		l.MaxFiles = DefaultMaxFiles
	}
	return l
}

// Stats counts what unpacking did.
type Stats struct {
	Files     int64          // entries created
	Bytes     int64          // bytes of regular files
	Whiteouts int64          // whiteout and opaque markers applied
	Dropped   map[string]int // entries not unpacked, by kind: "char device", "block device", "fifo", "xattr", "other"
}

// Unpacker applies layers, lowest first, to one root directory. It is not
// safe for concurrent use.
type Unpacker struct {
	rootfd int
	lim    Limits
	log    *slog.Logger
	chown  bool // running as root: keep owners
	stats  Stats
	// layer holds the paths the layer being applied made (an opaque
	// directory keeps those and removes the rest).
	layer map[string]bool
	// dirs holds the metadata of directory entries, applied by Finish.
	dirs map[string]*tar.Header
	buf  []byte
}

// New returns an Unpacker writing into root, an existing (empty) directory.
func New(root string, lim Limits, log *slog.Logger) (*Unpacker, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open unpack root %s: %w", root, err)
	}
	return &Unpacker{
		rootfd: fd, lim: lim.WithDefaults(), log: log, chown: os.Geteuid() == 0,
		stats: Stats{Dropped: map[string]int{}}, dirs: map[string]*tar.Header{},
		buf: make([]byte, 128<<10),
	}, nil
}

// Close releases the root.
func (u *Unpacker) Close() error {
	if u.rootfd < 0 {
		return nil
	}
	err := unix.Close(u.rootfd)
	u.rootfd = -1
	return err
}

// Stats returns what was unpacked so far.
func (u *Unpacker) Stats() Stats { return u.stats }

// metaOverhead bounds the tar framing (headers, PAX records, padding) read
// per entry on average, so that a layer of endless metadata is cut off.
const metaOverhead = 4 << 10

// Apply reads one layer's tar stream to its end and applies it. It reads r
// to EOF even after the tar's end-of-archive marker (so that a verifying
// reader underneath sees all of it), within a bound derived from the limits.
func (u *Unpacker) Apply(ctx context.Context, r io.Reader) error {
	budget := (u.lim.MaxBytes - u.stats.Bytes) + (u.lim.MaxFiles-u.stats.Files+16)*metaOverhead + 1<<20
	cr := &capReader{r: r, left: budget}
	u.layer = map[string]bool{}
	tr := tar.NewReader(cr)
	for n := 0; ; n++ {
		if n%256 == 0 {
			if err := ctx.Err(); err != nil {
				return context.Cause(ctx)
			}
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if cr.over {
				return u.limitErr("the layer's tar framing is larger than its files allow (%d bytes read)", budget)
			}
			return fmt.Errorf("read layer: %w", err)
		}
		if err := u.entry(ctx, tr, hdr); err != nil {
			if cr.over {
				return u.limitErr("the layer's tar framing is larger than its files allow (%d bytes read)", budget)
			}
			return err
		}
	}
	// Whatever follows the end-of-archive marker is read and discarded.
	if _, err := io.CopyBuffer(io.Discard, cr, u.buf); err != nil {
		if cr.over {
			return u.limitErr("the layer has more than %d bytes of trailing data", budget)
		}
		return fmt.Errorf("read layer: %w", err)
	}
	return nil
}

func (u *Unpacker) limitErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrLimit}, args...)...)
}

type capReader struct {
	r    io.Reader
	left int64
	over bool
}

var errCap = errors.New("read limit reached")

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		c.over = true
		return 0, errCap
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// Whiteout markers (OCI image spec, "Representing changes").
const (
	whPrefix = ".wh."
	whOpaque = ".wh..wh..opq"
	whMeta   = ".wh..wh." // other AUFS metadata: ignored
)

// cleanName makes a tar name a path relative to the root ("" is the root
// itself). Absolute names are taken relative to the root; a ".." component
// is refused.
func cleanName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("%w: name %q holds a NUL byte", ErrUnsafe, name)
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
		case "..":
			return "", fmt.Errorf("%w: name %q has a \"..\" component (it would leave the image root)", ErrUnsafe, name)
		default:
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "/"), nil
}

func (u *Unpacker) addFile(rel string) error {
	if u.stats.Files >= u.lim.MaxFiles {
		return u.limitErr("more than %d files (raise the file limit, --max-files)", u.lim.MaxFiles)
	}
	u.stats.Files++
	u.layer[rel] = true
	return nil
}

func (u *Unpacker) drop(kind, name string) {
	u.stats.Dropped[kind]++
	u.log.Debug("layer entry dropped", "kind", kind, "name", name)
}

func (u *Unpacker) entry(ctx context.Context, tr *tar.Reader, hdr *tar.Header) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || int64(hdr.Uid) > 1<<32-2 || int64(hdr.Gid) > 1<<32-2 {
		return fmt.Errorf("%w: %s: owner %d:%d out of range", ErrUnsafe, hdr.Name, hdr.Uid, hdr.Gid)
	}
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if strings.HasPrefix(base, whPrefix) {
		return u.whiteout(dir, base, hdr.Name)
	}
	if len(hdr.Xattrs) > 0 || hasXattr(hdr.PAXRecords) { //nolint:staticcheck // Xattrs is what older writers set
		u.drop("xattr", hdr.Name)
	}
	switch hdr.Typeflag {
	case tar.TypeChar:
		u.drop("char device", hdr.Name)
		return nil
	case tar.TypeBlock:
		u.drop("block device", hdr.Name)
		return nil
	case tar.TypeFifo:
		u.drop("fifo", hdr.Name)
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeRegA, tar.TypeSymlink, tar.TypeLink: //nolint:staticcheck // TypeRegA: old writers
	default:
		u.drop("other", hdr.Name)
		return nil
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("%w: entry %q would replace the image root with a non-directory", ErrUnsafe, hdr.Name)
		}
		u.dirs[""] = hdr
		return nil
	}
	pfd, err := u.openDir(dir, true)
	if err != nil {
		return fmt.Errorf("%s: %w", hdr.Name, err)
	}
	defer unix.Close(pfd)
	switch hdr.Typeflag {
	case tar.TypeDir:
		existed, err := u.clear(pfd, base, true)
		if err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
		if !existed {
			if err := u.addFile(rel); err != nil {
				return err
			}
			if err := unix.Mkdirat(pfd, base, 0o755); err != nil {
				return fmt.Errorf("%s: mkdir: %w", hdr.Name, err)
			}
		}
		u.layer[rel] = true
		u.dirs[rel] = hdr
		return nil
	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 || len(hdr.Linkname) >= unix.PathMax {
			return fmt.Errorf("%w: %s: bad symlink target %q", ErrUnsafe, hdr.Name, hdr.Linkname)
		}
		if err := u.addFile(rel); err != nil {
			return err
		}
		if _, err := u.clear(pfd, base, false); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
		// The target is stored as is: it is only ever resolved inside a
		// guest, never while unpacking.
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("%s: symlink: %w", hdr.Name, err)
		}
		return u.meta(pfd, base, hdr, -1)
	case tar.TypeLink:
		return u.hardlink(pfd, rel, base, hdr)
	default: // regular file
		return u.regular(ctx, tr, pfd, rel, base, hdr)
	}
}

func hasXattr(pax map[string]string) bool {
	for k := range pax {
		if strings.HasPrefix(k, "SCHILY.xattr.") || strings.HasPrefix(k, "LIBARCHIVE.xattr.") {
			return true
		}
	}
	return false
}

func (u *Unpacker) regular(ctx context.Context, tr *tar.Reader, pfd int, rel, base string, hdr *tar.Header) error {
	if hdr.Size < 0 {
		return fmt.Errorf("%w: %s: negative size", ErrUnsafe, hdr.Name)
	}
	// The limit is checked on the header, before a byte is written.
	if hdr.Size > u.lim.MaxBytes-u.stats.Bytes {
		return u.limitErr("file %s is %d bytes; with the %d bytes unpacked before it that is over the %d-byte limit (raise --max-bytes)", hdr.Name, hdr.Size, u.stats.Bytes, u.lim.MaxBytes)
	}
	if err := u.addFile(rel); err != nil {
		return err
	}
	u.stats.Bytes += hdr.Size
	if _, err := u.clear(pfd, base, false); err != nil {
		return fmt.Errorf("%s: %w", hdr.Name, err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("%s: create: %w", hdr.Name, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if err := u.copySparse(ctx, f, tr, hdr.Size); err != nil {
		return fmt.Errorf("%s: %w", hdr.Name, err)
	}
	return u.meta(pfd, base, hdr, fd)
}

// copySparse writes size bytes from r to f, leaving holes where whole
// chunks are zero (a sparse file in a layer stays sparse on disk).
func (u *Unpacker) copySparse(ctx context.Context, f *os.File, r io.Reader, size int64) error {
	var off int64
	for i := 0; off < size; i++ {
		if i%64 == 63 {
			if err := ctx.Err(); err != nil {
				return context.Cause(ctx)
			}
		}
		n := int64(len(u.buf))
		if size-off < n {
			n = size - off
		}
		b := u.buf[:n]
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if !allZero(b) {
			if _, err := f.WriteAt(b, off); err != nil {
				return fmt.Errorf("write: %w", err)
			}
		}
		off += n
	}
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func (u *Unpacker) hardlink(pfd int, rel, base string, hdr *tar.Header) error {
	trel, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("%s: hard link target: %w", hdr.Name, err)
	}
	if trel == "" || trel == rel {
		return fmt.Errorf("%w: %s: hard link to %q", ErrUnsafe, hdr.Name, hdr.Linkname)
	}
	tdir, tbase := path.Split(trel)
	tfd, err := u.openDir(strings.TrimSuffix(tdir, "/"), false)
	if err != nil {
		return fmt.Errorf("%w: %s: hard link target %s is not a file unpacked earlier in the image: %v", ErrUnsafe, hdr.Name, hdr.Linkname, err)
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		why := "not a regular file"
		if err != nil {
			why = err.Error()
		}
		return fmt.Errorf("%w: %s: hard link target %s is not a file unpacked earlier in the image (%s)", ErrUnsafe, hdr.Name, hdr.Linkname, why)
	}
	if err := u.addFile(rel); err != nil {
		return err
	}
	if _, err := u.clear(pfd, base, false); err != nil {
		return fmt.Errorf("%s: %w", hdr.Name, err)
	}
	// No AT_SYMLINK_FOLLOW: the link is to the file found above, inside the
	// root.
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		return fmt.Errorf("%s: link: %w", hdr.Name, err)
	}
	return nil
}

// meta sets owner, mode and times of base in pfd (fd: the open file, or -1).
// Symlinks get owner and times only.
func (u *Unpacker) meta(pfd int, base string, hdr *tar.Header, fd int) error {
	if u.chown {
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s: chown: %w", hdr.Name, err)
		}
	}
	// After chown; never setuid or setgid (the package doc says why).
	if fd >= 0 {
		if err := unix.Fchmod(fd, uint32(hdr.Mode&0o1777)); err != nil {
			return fmt.Errorf("%s: chmod: %w", hdr.Name, err)
		}
	}
	return setTimes(pfd, base, hdr)
}

func setTimes(pfd int, base string, hdr *tar.Header) error {
	mt := hdr.ModTime
	at := hdr.AccessTime
	if at.IsZero() {
		at = mt
	}
	ts := []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}
	if mt.IsZero() {
		return nil
	}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: set times: %w", hdr.Name, err)
	}
	return nil
}

// whiteout applies a .wh. marker found in dir.
func (u *Unpacker) whiteout(dir, base, name string) error {
	u.stats.Whiteouts++
	pfd, err := u.openDir(dir, false)
	if errors.Is(err, unix.ENOENT) {
		return nil // nothing below to hide
	}
	if err != nil {
		return fmt.Errorf("whiteout %s: %w", name, err)
	}
	defer unix.Close(pfd)
	if base == whOpaque {
		return u.opaque(pfd, dir, name)
	}
	if strings.HasPrefix(base, whMeta) {
		return nil
	}
	target := strings.TrimPrefix(base, whPrefix)
	if target == "" || target == "." || target == ".." || strings.IndexByte(target, 0) >= 0 {
		return fmt.Errorf("%w: whiteout %q names no file", ErrUnsafe, name)
	}
	// A whiteout hides what the layers below made, never what its own
	// layer made (image spec: "Files that are present in the same layer as
	// a whiteout file can only be hidden by whiteout files in subsequent
	// layers").
	if u.layer[path.Join(dir, target)] {
		return nil
	}
	if err := removeAllAt(pfd, target); err != nil {
		return fmt.Errorf("whiteout %s: %w", name, err)
	}
	return nil
}

// opaque hides everything in dir that the current layer did not make: a
// child made by an earlier layer is removed; a directory the current layer
// declared again is kept but cleared the same way below.
func (u *Unpacker) opaque(pfd int, dir, name string) error {
	fd, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opaque %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), dir)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("opaque %s: %w", name, err)
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if !u.layer[p] {
			if err := removeAllAt(pfd, n); err != nil {
				return fmt.Errorf("opaque %s: %w", name, err)
			}
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		cfd, err := unix.Openat(pfd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opaque %s: %w", name, err)
		}
		err = u.opaque(cfd, p, name)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// clear makes room for a new entry base in pfd: nothing there is fine; a
// directory stays when a directory is wanted (existed = true); anything
// else is removed (a directory with all below it).
func (u *Unpacker) clear(pfd int, base string, wantDir bool) (existed bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR && wantDir {
		return true, nil
	}
	return false, removeAllAt(pfd, base)
}

// removeAllAt removes name in dirfd and, for a directory, everything below
// it, never following a symlink.
func removeAllAt(dirfd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.Unlinkat(dirfd, name, 0)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	for {
		names, err := f.Readdirnames(1024)
		for _, n := range names {
			if err := removeAllAt(fd, n); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) || len(names) == 0 {
			break
		}
		if err != nil {
			return err
		}
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// openDir returns an O_PATH fd of dir (relative to the root, "" = the root),
// never following a symlink on the way; with create, missing directories are
// made (0755, root-owned: a layer may omit its parents' entries).
func (u *Unpacker) openDir(dir string, create bool) (int, error) {
	cur, err := unix.Dup(u.rootfd)
	if err != nil {
		return -1, err
	}
	if dir == "" {
		return cur, nil
	}
	done := ""
	for _, part := range strings.Split(dir, "/") {
		done = path.Join(done, part)
		next, err := unix.Openat2(cur, part, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if errors.Is(err, unix.ENOENT) && create {
			if err := u.addFile(done); err != nil {
				unix.Close(cur)
				return -1, err
			}
			if err := unix.Mkdirat(cur, part, 0o755); err != nil {
				unix.Close(cur)
				return -1, fmt.Errorf("mkdir %s: %w", done, err)
			}
			next, err = unix.Openat2(cur, part, &unix.OpenHow{
				Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
				Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
			})
		}
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			var st unix.Stat_t
			if unix.Fstatat(cur, part, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = unix.ELOOP
			}
		}
		unix.Close(cur)
		if err != nil {
			switch {
			case errors.Is(err, unix.ELOOP):
				return -1, fmt.Errorf("%w: %s is a symbolic link: a layer may not write through a link (it is kept as a link, never followed while unpacking)", ErrUnsafe, done)
			case errors.Is(err, unix.ENOTDIR):
				return -1, fmt.Errorf("%w: %s is not a directory", ErrUnsafe, done)
			}
			return -1, fmt.Errorf("open %s: %w", done, err)
		}
		cur = next
	}
	return cur, nil
}

// Finish sets the modes, owners and times of the directories the layers
// named (deepest first), now that nothing more is made in them.
func (u *Unpacker) Finish() error {
	paths := make([]string, 0, len(u.dirs))
	for p := range u.dirs {
		paths = append(paths, p)
	}
	sort.Slice(paths, func(i, j int) bool {
		return strings.Count(paths[i], "/") > strings.Count(paths[j], "/") || (strings.Count(paths[i], "/") == strings.Count(paths[j], "/") && paths[i] > paths[j])
	})
	for _, p := range paths {
		hdr := u.dirs[p]
		dir, base := path.Split(p)
		if p == "" {
			dir, base = "", "."
		}
		pfd, err := u.openDir(strings.TrimSuffix(dir, "/"), false)
		if err != nil {
			continue // removed by a later layer (or replaced by a link)
		}
		err = u.dirMeta(pfd, base, hdr)
		unix.Close(pfd)
		if err != nil {
			return err
		}
	}
	return nil
}

func (u *Unpacker) dirMeta(pfd int, base string, hdr *tar.Header) error {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil // no longer a directory
	}
	defer unix.Close(fd)
	if u.chown {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("%s: chown: %w", hdr.Name, err)
		}
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return fmt.Errorf("%s: chmod: %w", hdr.Name, err)
	}
	return setTimes(pfd, base, hdr)
}
