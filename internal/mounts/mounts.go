// Package mounts is the mount language of sandboxes — host directories
// bound in from operator-allowed roots and named per-tenant volumes — and
// the host side of making them: parsing and checking `--mount` specs,
// resolving a bind source beneath an allowed root without following a
// symlink or `..` out of it, building and loop-mounting volume images, and
// staging every mount nosuid,nodev (and noexec unless asked) below a
// sandbox's state dir for a runtime to pass on.
//
// Everything a tenant names is refused with an error wrapping ErrInvalid
// that says what to do; nothing is ever mounted from a path that was not
// checked, and a checked path is mounted through the descriptor that was
// checked, never looked up again.
package mounts

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
)

// ErrInvalid marks a mount a tenant asked for that cannot be made; the
// daemon maps it to 400.
var ErrInvalid = errors.New("invalid mount")

// Mount types.
const (
	Bind   = "bind"
	Volume = "volume"
)

// MaxMounts bounds the mounts of one sandbox.
const MaxMounts = 16

// Spec is one mount as a tenant asks for it: `type=bind,src=HOST_PATH,
// dst=/code[,ro|rw][,exec]` or `type=volume,src=NAME,dst=/data[,ro|rw]`.
// Read-only, nosuid, nodev and noexec unless RW or Exec says otherwise.
type Spec struct {
	Type string `json:"type"`
	// Source is a host path (bind) or a volume name (volume).
	Source string `json:"src"`
	// Target is the absolute path in the guest.
	Target string `json:"dst"`
	// RW makes the mount writable (default read-only).
	RW bool `json:"rw,omitempty"`
	// Exec allows executing files from the mount (default noexec).
	Exec bool `json:"exec,omitempty"`
}

// String is the spec in the --mount syntax.
func (s Spec) String() string {
	out := "type=" + s.Type + ",src=" + s.Source + ",dst=" + s.Target
	if s.RW {
		out += ",rw"
	} else {
		out += ",ro"
	}
	if s.Exec {
		out += ",exec"
	}
	return out
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Parse parses the --mount syntax. Keys: type, src (or source), dst (or
// target, destination); flags: ro, rw, exec, noexec. It checks the spec on
// its own (Check); where the source leads is checked by Roots.Resolve.
func Parse(s string) (Spec, error) {
	if strings.TrimSpace(s) == "" {
		return Spec{}, invalidf("empty --mount: give type=bind|volume,src=…,dst=…[,ro|rw][,exec]")
	}
	var sp Spec
	ro, rw := false, false
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		k, v, hasValue := strings.Cut(strings.TrimSpace(f), "=")
		switch k {
		case "source":
			k = "src"
		case "target", "destination":
			k = "dst"
		}
		if seen[k] {
			return Spec{}, invalidf("--mount %q: %s given twice", s, k)
		}
		seen[k] = true
		if hasValue != (k == "type" || k == "src" || k == "dst") {
			if hasValue {
				return Spec{}, invalidf("--mount %q: %s takes no value", s, k)
			}
			return Spec{}, invalidf("--mount %q: unknown option %q: use type=bind|volume,src=…,dst=…[,ro|rw][,exec]", s, k)
		}
		switch k {
		case "type":
			sp.Type = v
		case "src":
			sp.Source = v
		case "dst":
			sp.Target = v
		case "ro":
			ro = true
		case "rw":
			rw = true
		case "exec":
			sp.Exec = true
		case "noexec":
		default:
			return Spec{}, invalidf("--mount %q: unknown option %q: use type=bind|volume,src=…,dst=…[,ro|rw][,exec]", s, k)
		}
	}
	if ro && rw {
		return Spec{}, invalidf("--mount %q: ro and rw: give one (the default is ro)", s)
	}
	if seen["exec"] && seen["noexec"] {
		return Spec{}, invalidf("--mount %q: exec and noexec: give one", s)
	}
	sp.RW = rw
	if err := sp.Check(); err != nil {
		return Spec{}, err
	}
	return sp, nil
}

// reserved are guest paths a mount may not cover or sit below: the
// kernel's filesystems and the agent's own files (internal/rootfs).
var reserved = []string{"/proc", "/sys", "/dev", "/.cagebox", "/etc/cagebox"}

// Check checks one spec on its own: its type, source and destination.
func (s Spec) Check() error {
	switch s.Type {
	case Bind:
		if s.Source == "" {
			return invalidf("mount %s: src is empty: give an absolute host path below a --mount-root", s)
		}
		if !path.IsAbs(s.Source) {
			return invalidf("mount %s: src %q is not absolute: give the host path from /", s, s.Source)
		}
		for _, e := range strings.Split(s.Source, "/") {
			if e == ".." {
				return invalidf("mount %s: src %q contains \"..\": give the path without it", s, s.Source)
			}
		}
		if strings.ContainsRune(s.Source, 0) {
			return invalidf("mount %s: src contains a NUL byte", s)
		}
	case Volume:
		if err := ValidVolumeName(s.Source); err != nil {
			return invalidf("mount %s: %v", s, err)
		}
	case "":
		return invalidf("mount %s: type is missing: type=bind or type=volume", s)
	default:
		return invalidf("mount %s: type %q: use bind or volume", s, s.Type)
	}
	return checkTarget(s)
}

func checkTarget(s Spec) error {
	d := s.Target
	if d == "" {
		return invalidf("mount %s: dst is empty: give an absolute guest path, e.g. dst=/code", s)
	}
	if !path.IsAbs(d) {
		return invalidf("mount %s: dst %q is not absolute: e.g. dst=/code", s, d)
	}
	if strings.ContainsRune(d, 0) || strings.ContainsAny(d, ",\n") {
		return invalidf("mount %s: dst %q holds a character a path here cannot (NUL, comma, newline)", s, d)
	}
	for _, e := range strings.Split(d, "/") {
		if e == ".." || e == "." {
			return invalidf("mount %s: dst %q contains %q: give the path without it", s, d, e)
		}
	}
	c := path.Clean(d)
	if c == "/" {
		return invalidf("mount %s: dst / would replace the guest's root: mount at a directory such as /code", s)
	}
	for _, r := range reserved {
		if c == r || strings.HasPrefix(c, r+"/") {
			return invalidf("mount %s: dst %s is at or below %s, which the guest's kernel or agent owns: pick another directory", s, c, r)
		}
	}
	return nil
}

// CheckAll checks every spec, normalises targets (cleaned) and refuses
// duplicates and nested targets (a mount point inside another mount would
// be created in the other's source); it returns the specs ordered by
// target.
func CheckAll(specs []Spec) ([]Spec, error) {
	if len(specs) > MaxMounts {
		return nil, invalidf("%d mounts: at most %d per sandbox", len(specs), MaxMounts)
	}
	out := make([]Spec, len(specs))
	for i, s := range specs {
		if err := s.Check(); err != nil {
			return nil, err
		}
		s.Target = path.Clean(s.Target)
		out[i] = s
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Target < out[j].Target })
	vols := map[string]bool{}
	for i, s := range out {
		if i > 0 {
			p := out[i-1].Target
			if p == s.Target {
				return nil, invalidf("two mounts at %s: give each its own dst", s.Target)
			}
			if strings.HasPrefix(s.Target, p+"/") {
				return nil, invalidf("mount at %s is inside the mount at %s: mount them at sibling paths", s.Target, p)
			}
		}
		if s.Type == Volume {
			if vols[s.Source] {
				return nil, invalidf("volume %s is mounted twice: mount it once", s.Source)
			}
			vols[s.Source] = true
		}
	}
	return out, nil
}

var volumeName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// ValidVolumeName checks a volume's name: 1–63 of a-z 0-9 _ . -, starting
// with a letter or digit.
func ValidVolumeName(name string) error {
	if !volumeName.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("%w: volume name %q: use 1-63 characters a-z 0-9 _ . - starting with a letter or digit", ErrInvalid, name)
	}
	return nil
}

// Volume sizes.
const (
	DefaultVolumeBytes = 1 << 30
	MinVolumeBytes     = 16 << 20
	MaxVolumeBytes     = 64 << 30
)

// CheckVolumeSize returns the size of a new volume (0: the default).
func CheckVolumeSize(n int64) (int64, error) {
	if n == 0 {
		return DefaultVolumeBytes, nil
	}
	if n < MinVolumeBytes || n > MaxVolumeBytes {
		return 0, fmt.Errorf("%w: volume size %d bytes: give between %d MiB and %d GiB", ErrInvalid, n, MinVolumeBytes>>20, MaxVolumeBytes>>30)
	}
	return n, nil
}
