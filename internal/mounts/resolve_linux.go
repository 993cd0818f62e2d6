package mounts

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Roots are the host directories bind mounts may come from (the daemon's
// --mount-root flags). The zero value allows no bind mounts at all.
type Roots struct {
	dirs []root
}

type root struct {
	given string // as the operator wrote it (cleaned)
	canon string // with every symlink resolved
}

// NewRoots checks the operator's mount roots: each must be an existing
// directory given as an absolute path, not / , and must neither hold nor
// lie inside any of private (the daemon's home: its vault, database and
// the sandboxes' state must never be reachable through a bind mount).
func NewRoots(dirs []string, private ...string) (*Roots, error) {
	r := &Roots{}
	var privs []string
	for _, p := range private {
		if p == "" {
			continue
		}
		c, err := filepath.EvalSymlinks(p)
		if err != nil {
			c = filepath.Clean(p)
		}
		privs = append(privs, c)
	}
	for _, d := range dirs {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("--mount-root %q: give an absolute path", d)
		}
		canon, err := filepath.EvalSymlinks(d)
		if err != nil {
			return nil, fmt.Errorf("--mount-root %s: %w", d, err)
		}
		fi, err := os.Stat(canon)
		if err != nil {
			return nil, fmt.Errorf("--mount-root %s: %w", d, err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("--mount-root %s: not a directory", d)
		}
		if canon == "/" {
			return nil, fmt.Errorf("--mount-root %s: the host's root would expose everything (the daemon's own keys included): give the directories that hold code and data", d)
		}
		for _, p := range privs {
			if within(p, canon) || within(canon, p) {
				return nil, fmt.Errorf("--mount-root %s overlaps the daemon's home %s (its vault, database and sandboxes): give a directory outside it", d, p)
			}
		}
		r.dirs = append(r.dirs, root{given: filepath.Clean(d), canon: canon})
	}
	return r, nil
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// Dirs are the roots as given.
func (r *Roots) Dirs() []string {
	if r == nil {
		return nil
	}
	out := make([]string, len(r.dirs))
	for i, d := range r.dirs {
		out[i] = d.given
	}
	return out
}

// Source is a bind source resolved beneath a root: an O_PATH descriptor of
// exactly the object that was checked. Mounting goes through the
// descriptor (/proc/self/fd/N), so renaming or swapping a path component
// for a symlink after Resolve changes nothing: the object checked is the
// object mounted. Close releases it.
type Source struct {
	// Path is the host path as resolved (for messages and records).
	Path string
	// Dir: a directory (else a regular file).
	Dir  bool
	File *os.File
}

// Close releases the descriptor.
func (s *Source) Close() error {
	if s == nil || s.File == nil {
		return nil
	}
	return s.File.Close()
}

// Resolve checks a bind source (an absolute host path, Spec.Check'd) and
// opens it: it must lie below one of the roots after every symlink is
// resolved — openat2(RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS) from the
// root's descriptor refuses `..`, absolute symlinks and relative ones that
// climb out — and be a directory or a regular file (never a device,
// socket or fifo).
func (r *Roots) Resolve(src string) (*Source, error) {
	if r == nil || len(r.dirs) == 0 {
		return nil, invalidf("bind mount of %s: this daemon allows no host paths; an operator allows them with `cagebox daemon --mount-root DIR` (repeatable), or use a volume (type=volume)", src)
	}
	clean := filepath.Clean(src)
	var rt *root
	var rel string
	for i := range r.dirs {
		d := &r.dirs[i]
		for _, base := range []string{d.given, d.canon} {
			if within(clean, base) {
				rt, rel = d, strings.TrimPrefix(strings.TrimPrefix(clean, base), "/")
				break
			}
		}
		if rt != nil {
			break
		}
	}
	if rt == nil {
		return nil, invalidf("bind mount of %s: not below a mount root of this daemon (%s): move the files there or ask the operator to add a --mount-root", src, strings.Join(r.Dirs(), ", "))
	}
	if rel == "" {
		rel = "."
	}
	rfd, err := unix.Open(rt.canon, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open mount root %s: %w", rt.canon, err)
	}
	defer unix.Close(rfd)
	how := &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	}
	var fd int
	for i := 0; ; i++ {
		fd, err = unix.Openat2(rfd, rel, how)
		// EAGAIN: a rename raced the lookup; the kernel asks to retry.
		if errors.Is(err, unix.EAGAIN) && i < 8 {
			continue
		}
		break
	}
	switch {
	case err == nil:
	case errors.Is(err, unix.EXDEV):
		return nil, invalidf("bind mount of %s: the path leads out of the mount root %s (a symlink or \"..\"): give the real path below the root", src, rt.given)
	case errors.Is(err, unix.ELOOP):
		return nil, invalidf("bind mount of %s: too many levels of symlinks (a loop?): give the real path", src)
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return nil, invalidf("bind mount of %s: no such file or directory below %s", src, rt.given)
	case errors.Is(err, unix.EACCES):
		return nil, invalidf("bind mount of %s: permission denied", src)
	default:
		return nil, fmt.Errorf("resolve bind source %s: %w", src, err)
	}
	f := os.NewFile(uintptr(fd), src)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat bind source %s: %w", src, err)
	}
	s := &Source{Path: clean, File: f}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		s.Dir = true
	case unix.S_IFREG:
	default:
		f.Close()
		return nil, invalidf("bind mount of %s: a %s: only directories and regular files can be mounted", src, kindOf(st.Mode))
	}
	return s, nil
}

func kindOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "special file"
}
