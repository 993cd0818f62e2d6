// Package image builds and caches guest images: root filesystem trees that a
// runtime uses as the read-only lower layer of a sandbox (or packs into an
// ext4 disk for a VM).
//
// The cache lives in one directory ($CAGEBOX_HOME/images). Each image is a
// directory named for the image, holding the tree and its metadata:
//
//	images/NAME/rootfs       the root filesystem
//	images/NAME/image.json   metadata (Image without Path)
//
// Builds happen in a hidden temporary directory beside the target
// (images/.build-NAME-*) and are renamed into place only when complete, so a
// reader never sees a half-built image and a failed or cancelled build leaves
// nothing behind.
//
// The default image is made with debootstrap from the host's Debian mirror
// (see Cache.Build); a tiny busybox image for fast tests comes from the host's
// static busybox (see Cache.BuildBusybox).
package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// DefaultName is the name of the default guest image.
const DefaultName = "default"

// ErrNotFound means the named image is not in the cache.
var ErrNotFound = errors.New("image not found")

// ErrInvalid means a request was malformed: a bad image or package name.
var ErrInvalid = errors.New("invalid image request")

// ErrBusy means another build or removal of the same image is under way.
var ErrBusy = errors.New("image busy")

const (
	rootfsDir    = "rootfs"
	metadataFile = "image.json"
)

// Image describes one cached guest image.
type Image struct {
	Name      string    `json:"name"`
	Path      string    `json:"-"`          // the rootfs directory; derived from the cache location
	SizeBytes int64     `json:"size_bytes"` // disk usage of the rootfs (allocated blocks, hard links once)
	CreatedAt time.Time `json:"created_at"`
	Packages  []string  `json:"packages,omitempty"`
	Source    string    `json:"source"` // e.g. "debootstrap bookworm http://deb.debian.org/debian"
	// Digest is "sha256:HEX" over a deterministic walk of the rootfs (paths,
	// types, modes, owners, sizes, symlink targets and file contents). Two
	// images with the same digest have the same tree.
	Digest string `json:"digest"`
	// ManifestDigest is, for an image pulled or imported from OCI, the
	// digest of the manifest its reference named (an index's, for a
	// multi-platform image); PlatformDigest is that of the linux/amd64
	// manifest chosen from such an index.
	ManifestDigest string `json:"manifest_digest,omitempty"`
	PlatformDigest string `json:"platform_digest,omitempty"`
	// Config is what an OCI image's config says about running it
	// (its Env, WorkingDir and User are used by sandboxes: internal/sandbox/imageconfig.go).
	Config *Config `json:"config,omitempty"`
}

// Cache is a directory of images. The zero value is not usable: set Dir
// ($CAGEBOX_HOME/images). Methods are safe for concurrent use, also across
// processes: builds and removals of one name are serialised with a lock file.
type Cache struct {
	Dir string
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidateName reports whether name is a valid image name: lowercase
// [a-z0-9][a-z0-9._-]{0,62}, and not "." or ".." or anything with a slash.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("image name is empty: %w", ErrInvalid)
	case strings.ContainsAny(name, `/\`) || strings.Contains(name, ".."):
		return fmt.Errorf("image name %q must not contain slashes or \"..\": %w", name, ErrInvalid)
	case !nameRE.MatchString(name):
		return fmt.Errorf("image name %q is invalid (use 1-63 characters of lowercase a-z, 0-9, '.', '_', '-', starting with a letter or digit): %w", name, ErrInvalid)
	}
	return nil
}

func (c *Cache) dir(name string) string { return filepath.Join(c.Dir, name) }

func (c *Cache) check() error {
	if c == nil || c.Dir == "" {
		return errors.New("image cache: no directory configured")
	}
	return nil
}

// Get returns the named image, or an error wrapping ErrNotFound that says how
// to build it.
//
// ref may pin the image: NAME@sha256:HEX is NAME only if HEX is its
// manifest digest (the one its reference named when it was pulled or
// imported, an index's for a multi-platform image), its linux/amd64
// manifest digest, or its tree digest (Image.Digest; this pins images built
// locally too). Otherwise the error wraps ErrNotFound and says which digest
// the cached image has. A malformed pin wraps ErrInvalid.
func (c *Cache) Get(ref string) (*Image, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	name, pin, pinned := strings.Cut(ref, "@")
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if pinned && !digestRE.MatchString(pin) {
		return nil, fmt.Errorf("image %q: pin %q is not a digest (want NAME@sha256: and 64 lowercase hex digits): %w", ref, pin, ErrInvalid)
	}
	img, err := c.load(name)
	if err != nil || !pinned {
		return img, err
	}
	if pin != img.ManifestDigest && pin != img.PlatformDigest && pin != img.Digest {
		has := img.ManifestDigest
		if has == "" {
			has = img.Digest
		}
		return nil, fmt.Errorf("image %s@%s: %w: the cached image %s is %s (%s); pull the pinned one under another name, e.g. `cagebox image pull REPO@%s --name %s-pinned`, or drop the pin", name, pin, ErrNotFound, name, has, img.Source, pin, name)
	}
	return img, nil
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func (c *Cache) load(name string) (*Image, error) {
	dir := c.dir(name)
	b, err := os.ReadFile(filepath.Join(dir, metadataFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("image %q: %w (run `cagebox image build %s`)", name, ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("read image %q: %w", name, err)
	}
	img := new(Image)
	if err := json.Unmarshal(b, img); err != nil {
		return nil, fmt.Errorf("read image %q metadata: %w", name, err)
	}
	if img.Name != name {
		return nil, fmt.Errorf("image %q: metadata names %q", name, img.Name)
	}
	img.Path = filepath.Join(dir, rootfsDir)
	if _, err := os.Stat(img.Path); err != nil {
		return nil, fmt.Errorf("image %q: rootfs missing: %w (run `cagebox image build --force %s`)", name, err, name)
	}
	return img, nil
}

// List returns the cached images sorted by name. A missing cache directory is
// an empty list. Directories without metadata are skipped.
func (c *Cache) List() ([]*Image, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(c.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var out []*Image
	for _, e := range ents {
		if !e.IsDir() || ValidateName(e.Name()) != nil {
			continue // temp dirs and lock files start with '.'
		}
		img, err := c.load(e.Name())
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove deletes the named image. It fails with ErrBusy while the image is
// being built, with ErrInUse while sandboxes use it (naming them), and
// wraps ErrNotFound if there is no such image.
func (c *Cache) Remove(name string) error {
	if err := c.check(); err != nil {
		return err
	}
	if err := ValidateName(name); err != nil {
		return err
	}
	unlock, err := c.tryLock(name)
	if err != nil {
		return err
	}
	defer unlock()
	dir := c.dir(name)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove image %q: %w", name, ErrNotFound)
	}
	// Checked and moved out of the way under the reference lock: no
	// sandbox takes the tree between the check and the move, and readers
	// never see half a tree.
	unlockRefs, err := c.lockRefs()
	if err != nil {
		return err
	}
	if holders, err := readHolders(dir); err != nil || len(holders) > 0 {
		unlockRefs()
		if err != nil {
			return fmt.Errorf("remove image %q: %w", name, err)
		}
		return inUse(name, holders)
	}
	trash, err := os.MkdirTemp(c.Dir, ".rm-"+name+"-")
	if err != nil {
		unlockRefs()
		return fmt.Errorf("remove image %q: %w", name, err)
	}
	if err := os.Rename(dir, filepath.Join(trash, name)); err != nil {
		unlockRefs()
		os.Remove(trash)
		return fmt.Errorf("remove image %q: %w", name, err)
	}
	unlockRefs()
	if err := removeTree(trash); err != nil {
		return fmt.Errorf("remove image %q: %w", name, err)
	}
	return nil
}

func writeMetadata(dir string, img *Image) error {
	b, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, metadataFile), append(b, '\n'), 0o644)
}
