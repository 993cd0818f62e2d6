package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/cagebox/cagebox/internal/statedir"
)

// DefaultPackages are added to the debootstrap minbase set for the default
// image. dash and coreutils are essential (always present); they are listed
// so that the metadata says what the image promises.
var DefaultPackages = []string{"dash", "coreutils", "curl", "python3", "ca-certificates", "procps"}

// BuildOptions configure Cache.Build.
type BuildOptions struct {
	Name     string
	Suite    string    // "" = the host's suite (DetectSuite)
	Mirror   string    // "" = the host's apt mirror (DetectMirror)
	Packages []string  // nil = DefaultPackages
	Progress io.Writer // concise human progress lines; may be nil
	Force    bool      // rebuild even if the image exists
}

var pkgRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

// Build makes the image opts.Name with debootstrap (variant minbase) and
// returns it. If the image exists and opts.Force is false it is returned
// unchanged. The build happens in a temporary directory beside the target and
// is renamed into place only on success; on failure or cancellation nothing
// is left behind. Build needs root.
func (c *Cache) Build(ctx context.Context, opts BuildOptions) (*Image, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if err := ValidateName(opts.Name); err != nil {
		return nil, err
	}
	if !opts.Force {
		if img, err := c.load(opts.Name); err == nil {
			return img, nil
		}
	}
	pkgs := opts.Packages
	if pkgs == nil {
		pkgs = DefaultPackages
	}
	for _, p := range pkgs {
		if !pkgRE.MatchString(p) {
			return nil, fmt.Errorf("build image %q: package name %q is invalid: %w", opts.Name, p, ErrInvalid)
		}
	}
	suite := opts.Suite
	if suite == "" {
		s, err := DetectSuite()
		if err != nil {
			return nil, fmt.Errorf("build image %q: %w", opts.Name, err)
		}
		suite = s
	}
	if !pkgRE.MatchString(suite) {
		return nil, fmt.Errorf("build image %q: suite %q is invalid: %w", opts.Name, suite, ErrInvalid)
	}
	mirror := opts.Mirror
	if mirror == "" {
		mirror = DetectMirror(suite)
	}
	if !usableURI(mirror) {
		return nil, fmt.Errorf("build image %q: mirror %q is not an http(s) or file URI: %w", opts.Name, mirror, ErrInvalid)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("build image %q: %w", opts.Name, errNoRoot)
	}
	debootstrap, err := exec.LookPath("debootstrap")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/debootstrap"); serr != nil {
			return nil, fmt.Errorf("build image %q: debootstrap not found (apt-get install debootstrap): %w", opts.Name, err)
		}
		debootstrap = "/usr/sbin/debootstrap"
	}

	unlock, err := c.lock(ctx, opts.Name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !opts.Force { // someone else may have built it while we waited
		if img, err := c.load(opts.Name); err == nil {
			return img, nil
		}
	}

	p := newProgress(opts.Progress)
	source := fmt.Sprintf("debootstrap %s %s", suite, mirror)
	p.stage(1, "resolving packages (%s, variant minbase)", source)

	var img *Image
	err = c.buildInto(ctx, opts.Name, func(tmp, rootfs string) error {
		if err := runDebootstrap(ctx, debootstrap, suite, mirror, rootfs, pkgs, p); err != nil {
			return err
		}
		p.stage(3, "cleaning")
		if err := cleanRootfs(rootfs); err != nil {
			return fmt.Errorf("clean rootfs: %w", err)
		}
		p.stage(4, "digest")
		img = &Image{
			Name:      opts.Name,
			CreatedAt: time.Now().UTC().Truncate(time.Second),
			Packages:  append([]string(nil), pkgs...),
			Source:    source,
		}
		img.Digest, img.SizeBytes, err = digestTree(ctx, rootfs)
		if err != nil {
			return err
		}
		return writeMetadata(tmp, img)
	})
	if err != nil {
		return nil, err
	}
	img.Path = filepath.Join(c.dir(opts.Name), rootfsDir)
	p.linef("image %s ready: %.1f MB, %s, %ds", img.Name, float64(img.SizeBytes)/1e6, shortDigest(img.Digest), p.elapsed())
	return img, nil
}

// buildInto runs fill on a fresh temporary directory beside the target (with
// an empty rootfs inside it) and, if fill succeeds, renames it into place.
// On any failure the temporary directory is unmounted and deleted. The
// caller holds the name's lock.
func (c *Cache) buildInto(ctx context.Context, name string, fill func(tmp, rootfs string) error) (err error) {
	if err := statedir.Make(c.Dir); err != nil {
		return fmt.Errorf("create image cache: %w", err)
	}
	tmp, err := os.MkdirTemp(c.Dir, ".build-"+name+"-")
	if err != nil {
		return fmt.Errorf("build image %q: %w", name, err)
	}
	defer func() {
		if err != nil {
			if rerr := removeTree(tmp); rerr != nil {
				err = errors.Join(err, fmt.Errorf("clean up failed build: %w", rerr))
			}
		}
	}()
	if err := os.Chmod(tmp, 0o700); err != nil {
		return fmt.Errorf("build image %q: %w", name, err)
	}
	rootfs := filepath.Join(tmp, rootfsDir)
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return fmt.Errorf("build image %q: %w", name, err)
	}
	if err := fill(tmp, rootfs); err != nil {
		return fmt.Errorf("build image %q: %w", name, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("build image %q: %w", name, context.Cause(ctx))
	}
	if err := c.install(tmp, c.dir(name)); err != nil {
		return fmt.Errorf("build image %q: %w", name, err)
	}
	return nil
}

// runDebootstrap runs debootstrap in its own process group and its own mount
// namespace, so that cancelling kills all of it and the proc/sys/dev mounts
// it makes inside the target never appear in (or outlive it in) ours. Its
// machine-readable progress (--debian-installer protocol on fd 3) is turned
// into concise lines; its full log is kept only to explain a failure.
func runDebootstrap(ctx context.Context, bin, suite, mirror, rootfs string, pkgs []string, p *progress) error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	args := []string{
		"--debian-installer", // progress protocol on fd 3
		"--variant=minbase",
		"--components=main",
		"--include=" + strings.Join(pkgs, ","),
		suite, rootfs, mirror,
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(),
		"LC_ALL=C", "DEBIAN_FRONTEND=noninteractive",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	log := &tailBuffer{max: 16 << 10}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{pw}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:      true,
		Unshareflags: syscall.CLONE_NEWNS, // Go also makes / MS_PRIVATE in the child
		Pdeathsig:    syscall.SIGKILL,
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		pw.Close()
		return fmt.Errorf("start debootstrap: %w", err)
	}
	pw.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.parseDebootstrap(pr)
	}()
	werr := cmd.Wait()
	// Anything left in the group (a daemon started by a maintainer script)
	// would keep the pipe open; it is killed either way.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		pr.Close()
		<-done
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("debootstrap: %w", context.Cause(ctx))
	}
	if werr != nil {
		msg := p.lastError
		if msg == "" {
			msg = "see log below"
		}
		return fmt.Errorf("debootstrap %s %s: %s: %w\n%s", suite, mirror, msg, werr, log.tail(20))
	}
	return nil
}

// cleanRootfs trims a freshly bootstrapped tree: package caches and lists,
// logs, docs and man pages; resets machine identity; and makes sure the files
// the runtime bind-mounts over exist as regular files.
func cleanRootfs(root string) error {
	at := func(p string) string { return filepath.Join(root, p) }
	// Caches and lists: apt recreates them; debconf's database is state.
	for _, d := range []string{"var/cache", "var/lib/apt/lists", "var/log", "tmp", "var/tmp", "usr/share/man", "usr/share/info", "usr/share/groff", "usr/share/lintian"} {
		if err := removeContents(at(d), func(rel string, isDir bool) (keep, descend bool) {
			return d == "var/cache" && rel == "debconf", false
		}); err != nil {
			return err
		}
	}
	// Translations: messages stay in English (-34 MB on bookworm).
	if err := removeContents(at("usr/share/locale"), func(rel string, isDir bool) (keep, descend bool) {
		return !isDir, false // keep locale.alias
	}); err != nil {
		return err
	}
	// Docs: keep only copyright notices.
	if err := removeContents(at("usr/share/doc"), func(rel string, isDir bool) (keep, descend bool) {
		return isDir || filepath.Base(rel) == "copyright", isDir
	}); err != nil {
		return err
	}
	pruneEmptyDirs(at("usr/share/doc"))
	for _, d := range []string{"var/cache/apt/archives/partial", "var/lib/apt/lists/partial", "var/log/apt"} {
		if err := os.MkdirAll(at(d), 0o755); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(at("debootstrap")); err != nil {
		return err
	}
	for _, f := range []string{"var/cache/debconf/config.dat-old", "var/cache/debconf/templates.dat-old", "var/lib/dbus/machine-id", "var/lib/dpkg/status-old"} {
		if err := os.Remove(at(f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := os.Chmod(at("tmp"), 0o777|fs.ModeSticky); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	files := []struct {
		path, content string
		mode          fs.FileMode
	}{
		// Empty machine-id: systemd-less guests keep it empty; the runtime
		// may write one per sandbox.
		{"etc/machine-id", "", 0o444},
		// Bind-mount targets; the runtime mounts the real ones over these.
		{"etc/resolv.conf", "# replaced by cagebox at sandbox start\n", 0o644},
		{"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n", 0o644},
		{"etc/hostname", "cagebox\n", 0o644},
		// Later package installs inside a sandbox stay small too.
		{"etc/dpkg/dpkg.cfg.d/cagebox-nodoc", "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\npath-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\npath-exclude /usr/share/groff/*\npath-exclude /usr/share/lintian/*\npath-exclude /usr/share/locale/*/LC_MESSAGES/*.mo\n", 0o644},
		{"etc/apt/apt.conf.d/cagebox-clean", "APT::Install-Recommends \"false\";\nAPT::Install-Suggests \"false\";\n", 0o644},
	}
	for _, f := range files {
		if err := writeRegular(at(f.path), f.content, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// writeRegular replaces whatever is at p (a symlink, say) with a regular file.
func writeRegular(p, content string, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		return err
	}
	return os.Chmod(p, mode)
}

// keepFunc decides about one entry below a directory being emptied (rel is
// relative to that directory): keep it, and for a kept directory whether to
// apply the same rule to its contents.
type keepFunc func(rel string, isDir bool) (keep, descend bool)

// removeContents deletes everything below dir except what keep keeps. A
// missing dir is not an error.
func removeContents(dir string, keep keepFunc) error {
	return removeContentsRel(dir, "", keep)
}

func removeContentsRel(dir, rel string, keep keepFunc) error {
	ents, err := os.ReadDir(filepath.Join(dir, rel))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		r := filepath.Join(rel, e.Name())
		isDir := e.IsDir()
		if k, descend := keep(r, isDir); k {
			if isDir && descend {
				if err := removeContentsRel(dir, r, keep); err != nil {
					return err
				}
			}
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, r)); err != nil {
			return err
		}
	}
	return nil
}

func pruneEmptyDirs(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.IsDir() {
			p := filepath.Join(dir, e.Name())
			pruneEmptyDirs(p)
			os.Remove(p) // fails unless empty
		}
	}
}

func shortDigest(d string) string {
	if len(d) > len("sha256:")+12 {
		return d[:len("sha256:")+12]
	}
	return d
}
