package image

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrInUse means an image is the root filesystem of sandboxes that still
// exist: it cannot be removed under them.
var ErrInUse = errors.New("image in use")

// References. A sandbox whose root filesystem is an image's tree holds a
// reference to that tree from its create to its destroy: an empty file
//
//	images/NAME/refs/HOLDER
//
// beside the tree, HOLDER being "ID.OWNER": the sandbox's ID and a key of
// the daemon that made it (several daemons, each with its own home, may
// share one image cache — the tests do). The file moves with the tree, so:
//
//   - Remove refuses an image that has references (ErrInUse, naming them);
//   - a rebuild, import or pull with --force installs the new tree for new
//     sandboxes and, if the old tree has references, retires it to
//     images/.retired-NAME-*/ instead of deleting it under the sandboxes
//     that use it (their root filesystems are overlays on it, or gVisor's
//     gofer serves it); the last Release of a retired tree deletes it;
//   - PruneRefs (daemon start) drops the references of an owner's holders
//     that no longer exist (a killed daemon cannot release) and deletes
//     retired trees nobody holds.
//
// Reference operations and the swap that installs a tree are serialised
// with one lock file (.refs.lock, flock): they are short, and they work
// across processes (`cagebox image build` runs in the CLI, sandboxes in the
// daemon).
const (
	refsDir       = "refs"
	retiredPrefix = ".retired-"
	refsLockFile  = ".refs.lock"
)

// idRE and ownerRE are what a holder's ID and owner may be: they become
// a file name "ID.OWNER".
var (
	idRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
	ownerRE = regexp.MustCompile(`^[a-z0-9]{1,32}$`)
)

func holderName(owner, id string) (string, error) {
	if !ownerRE.MatchString(owner) || !idRE.MatchString(id) {
		return "", fmt.Errorf("image reference: holder %q of %q is not a valid name: %w", id, owner, ErrInvalid)
	}
	return id + "." + owner, nil
}

// splitHolder returns a reference file's ID and owner (ok false for
// files that are not references).
func splitHolder(name string) (id, owner string, ok bool) {
	id, owner, ok = strings.Cut(name, ".")
	return id, owner, ok && idRE.MatchString(id) && ownerRE.MatchString(owner)
}

// lockRefs takes the cache's reference lock, waiting for it (holders keep
// it for a few file operations only).
func (c *Cache) lockRefs() (unlock func(), err error) {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create image cache: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(c.Dir, refsLockFile), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock image references: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock image references: %w", err)
	}
	return func() { f.Close() }, nil
}

// Acquire records that sandbox id, made by owner (a key of the daemon's
// home), uses img's tree. It fails wrapping ErrBusy if the image was
// replaced or removed since img was read: the caller should read it again.
func (c *Cache) Acquire(img *Image, owner, id string) error {
	return c.AcquireFor(img, owner, "", id)
}

// AcquireFor is Acquire recording where the holder lives: home (an
// absolute path: the daemon's state directory of sandboxes) is written
// into the reference, so any process can later tell a reference of a
// sandbox that is gone from one of a sandbox that runs (PruneOrphans).
func (c *Cache) AcquireFor(img *Image, owner, home, id string) error {
	if home != "" && (!filepath.IsAbs(home) || strings.ContainsAny(home, "\n\x00")) {
		return fmt.Errorf("image reference: home %q is not an absolute path: %w", home, ErrInvalid)
	}
	if err := c.check(); err != nil {
		return err
	}
	holder, err := holderName(owner, id)
	if err != nil {
		return err
	}
	unlock, err := c.lockRefs()
	if err != nil {
		return err
	}
	defer unlock()
	cur, err := c.load(img.Name)
	if err != nil {
		return err
	}
	if cur.Digest != img.Digest || !cur.CreatedAt.Equal(img.CreatedAt) {
		return fmt.Errorf("image %s was replaced while a sandbox was being made from it (now %s): %w; create the sandbox again", img.Name, shortDigest(cur.Digest), ErrBusy)
	}
	dir := filepath.Join(c.dir(img.Name), refsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("image %s: reference: %w", img.Name, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, holder), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return fmt.Errorf("image %s: reference: %w", img.Name, err)
	}
	if home != "" {
		if _, err := f.WriteString(home + "\n"); err != nil {
			f.Close()
			return fmt.Errorf("image %s: reference: %w", img.Name, err)
		}
	}
	return f.Close()
}

// RefAlive answers whether the sandbox id of the daemon whose state
// directory is home still exists (PruneOrphans). It must say true when it
// cannot tell.
type RefAlive func(home, id string) bool

// PruneOrphans drops, across every owner, the references whose holder is
// gone: a reference that names its home (AcquireFor) is kept while alive
// says its sandbox exists; one that names none (made before homes were
// recorded) is kept. Retired trees left with no references are deleted.
// It returns how many references it dropped. The cache is shared by many
// homes (the tests' temporary ones among them): this is how references of
// homes that were removed, or of sandboxes a killed daemon never
// released, stop holding images that nothing uses.
func (c *Cache) PruneOrphans(alive RefAlive) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	dropped := 0
	err := c.pruneRefsAt(func(dir, h string) bool {
		home := readRefHome(filepath.Join(dir, refsDir, h))
		if home == "" {
			return true
		}
		id, _, _ := splitHolder(h)
		if alive(home, id) {
			return true
		}
		dropped++
		return false
	})
	return dropped, err
}

// readRefHome is the home a reference file records ("" for none).
func readRefHome(path string) string {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 4097)
	n, _ := f.Read(b)
	home := strings.TrimSuffix(string(b[:n]), "\n")
	if n > 4096 || !filepath.IsAbs(home) || strings.ContainsAny(home, "\n\x00") {
		return ""
	}
	return home
}

// Release drops the references of owner's sandbox id (to a current or a
// retired tree) and deletes retired trees that nobody holds any more.
// Releasing what is not held is not an error.
func (c *Cache) Release(owner, id string) error {
	if err := c.check(); err != nil {
		return err
	}
	holder, err := holderName(owner, id)
	if err != nil {
		return nil // never acquired
	}
	return c.pruneRefs(func(h string) bool { return h != holder })
}

// PruneRefs drops every reference of owner whose sandbox alive says no
// longer exists, and deletes retired trees left with none. Other owners'
// references are left alone.
func (c *Cache) PruneRefs(owner string, alive func(id string) bool) error {
	if err := c.check(); err != nil {
		return err
	}
	return c.pruneRefs(func(h string) bool {
		id, o, _ := splitHolder(h)
		return o != owner || alive(id)
	})
}

func (c *Cache) pruneRefs(keep func(holder string) bool) error {
	return c.pruneRefsAt(func(_, h string) bool { return keep(h) })
}

// pruneRefsAt drops the references keep refuses; keep is given the image
// (or retired tree) directory and the holder.
func (c *Cache) pruneRefsAt(keep func(dir, holder string) bool) error {
	unlock, err := c.lockRefs()
	if err != nil {
		return err
	}
	var errs []error
	var dead []string // retired trees with no references left
	ents, err := os.ReadDir(c.Dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		unlock()
		return fmt.Errorf("image references: %w", err)
	}
	for _, e := range ents {
		retired := strings.HasPrefix(e.Name(), retiredPrefix)
		if !e.IsDir() || (!retired && ValidateName(e.Name()) != nil) {
			continue
		}
		dir := filepath.Join(c.Dir, e.Name())
		holders, err := readHolders(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		left := 0
		for _, h := range holders {
			if keep(dir, h) {
				left++
				continue
			}
			if err := os.Remove(filepath.Join(dir, refsDir, h)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("drop image reference %s: %w", h, err))
				left++
			}
		}
		if retired && left == 0 {
			// Out of the way while the lock is held, deleted after.
			dead = append(dead, dir)
		}
	}
	unlock()
	for _, d := range dead {
		if err := removeTree(d); err != nil {
			errs = append(errs, fmt.Errorf("delete retired image tree: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Holders returns who holds references to the named image's current tree,
// as "ID.OWNER".
func (c *Cache) Holders(name string) ([]string, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	return readHolders(c.dir(name))
}

// Retired returns how many retired trees (replaced while in use) remain.
func (c *Cache) Retired() (int, error) {
	m, err := filepath.Glob(filepath.Join(c.Dir, retiredPrefix+"*"))
	return len(m), err
}

func readHolders(imageDir string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(imageDir, refsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image references: %w", err)
	}
	var out []string
	for _, e := range ents {
		if _, _, ok := splitHolder(e.Name()); ok {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// inUse is the error for removing an image that holders use.
func inUse(name string, holders []string) error {
	var shown []string
	for i, h := range holders {
		if i == 5 {
			shown = append(shown, fmt.Sprintf("and %d more", len(holders)-5))
			break
		}
		id, _, _ := splitHolder(h)
		shown = append(shown, id)
	}
	return fmt.Errorf("image %s is the root filesystem of %d sandbox(es) (%s): %w; remove them first (`cagebox rm ID`; sandboxes of a daemon's --pool go when that daemon stops), or build under another name", name, len(holders), strings.Join(shown, ", "), ErrInUse)
}

// install moves the finished build directory tmp to dst. If dst exists the
// two are swapped atomically (renameat2 RENAME_EXCHANGE) under the
// reference lock; the old tree, now at tmp, is retired if sandboxes hold
// it and deleted otherwise.
func (c *Cache) install(tmp, dst string) error {
	unlock, err := c.lockRefs()
	if err != nil {
		return err
	}
	err = os.Rename(tmp, dst)
	if err == nil {
		unlock()
		return nil
	}
	if _, serr := os.Lstat(dst); serr != nil {
		unlock()
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); err != nil {
		unlock()
		return fmt.Errorf("replace %s: %w", dst, err)
	}
	holders, herr := readHolders(tmp)
	if herr == nil && len(holders) > 0 {
		// The new tree has no references: they stay with the old one,
		// which moves aside under a fresh name.
		var err error
		for i := 0; i < 5; i++ {
			var b [8]byte
			_, _ = rand.Read(b[:])
			ret := filepath.Join(c.Dir, retiredPrefix+filepath.Base(dst)+"-"+hex.EncodeToString(b[:]))
			if err = unix.Rename(tmp, ret); !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.ENOTEMPTY) {
				break
			}
		}
		if err != nil {
			// Swap back: the old tree stays the image, the caller
			// deletes the new build (now at tmp again).
			if xerr := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); xerr != nil {
				err = errors.Join(err, fmt.Errorf("restore %s: %w", dst, xerr))
			}
			unlock()
			return fmt.Errorf("retire replaced image (used by %s): %w", strings.Join(holders, ", "), err)
		}
		unlock()
		return nil
	}
	unlock()
	if herr != nil {
		return herr
	}
	if err := removeTree(tmp); err != nil {
		return fmt.Errorf("remove replaced image: %w", err)
	}
	return nil
}

// IsLockFile reports whether an entry of the cache directory is one of its
// lock files (per-name build locks and the references' lock), which stay
// when nothing else does.
func IsLockFile(name string) bool {
	return strings.HasPrefix(name, ".lock-") || name == refsLockFile
}
