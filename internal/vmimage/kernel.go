package vmimage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The guest kernel, pinned: Debian bookworm's linux-image ABI package and
// its exact version. This is the one place to change it. When the Debian
// mirror drops this version (security updates replace it), FetchKernel fails
// and says how to move the pin: `apt-cache show linux-image-amd64` names the
// current ABI package (Depends:) and `apt-cache policy PACKAGE` its version.
const (
	KernelPackage = "linux-image-6.1.0-56-amd64"
	KernelVersion = "6.1.192-2"
)

// KernelRelease is the pinned kernel's `uname -r` (its module directory).
var KernelRelease = strings.TrimPrefix(KernelPackage, "linux-image-")

// KernelInfo is the record of a fetched kernel (kernel.json).
type KernelInfo struct {
	Package       string    `json:"package"`
	Version       string    `json:"version"`
	Release       string    `json:"release"`
	DebSHA256     string    `json:"deb_sha256"`
	VmlinuzSHA256 string    `json:"vmlinuz_sha256"`
	Modules       []string  `json:"modules"` // load order
	FetchedAt     time.Time `json:"fetched_at"`

	Dir     string `json:"-"`
	Vmlinuz string `json:"-"`
}

func (c *Cache) kernelDir() string { return filepath.Join(c.Dir, "kernel", KernelRelease) }

// Kernel returns the fetched pinned kernel, or an error saying how to fetch it.
func (c *Cache) Kernel() (*KernelInfo, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	dir := c.kernelDir()
	b, err := os.ReadFile(filepath.Join(dir, "kernel.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("guest kernel %s %s is not in %s: run `cagebox image build` (or scripts/setup.sh) to fetch it", KernelPackage, KernelVersion, c.Dir)
	}
	if err != nil {
		return nil, fmt.Errorf("read guest kernel record: %w", err)
	}
	k := &KernelInfo{}
	if err := json.Unmarshal(b, k); err != nil {
		return nil, fmt.Errorf("read guest kernel record %s: %w", dir, err)
	}
	if k.Package != KernelPackage || k.Version != KernelVersion {
		return nil, fmt.Errorf("guest kernel in %s is %s %s, but the pin is %s %s: run `cagebox image build` to fetch the pinned one", dir, k.Package, k.Version, KernelPackage, KernelVersion)
	}
	k.Dir = dir
	k.Vmlinuz = filepath.Join(dir, "vmlinuz")
	return k, nil
}

// FetchKernel makes sure the pinned kernel is in the cache: it downloads
// KernelPackage=KernelVersion with `apt-get download`, unpacks it with
// `dpkg-deb -x`, and keeps vmlinuz, the guest modules (GuestModules and
// their dependencies) and a record with the package's and kernel's sha256.
// It does nothing if the kernel is already there.
func (c *Cache) FetchKernel(ctx context.Context) (*KernelInfo, error) {
	if k, err := c.Kernel(); err == nil {
		return k, nil
	}
	unlock, err := c.lock(ctx, "kernel")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if k, err := c.Kernel(); err == nil {
		return k, nil
	}
	for _, tool := range []string{"apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("fetch guest kernel: %s not found: the guest kernel comes from Debian's archive, fetch it on a Debian host: %w", tool, err)
		}
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(c.Dir, ".fetch-kernel-")
	if err != nil {
		return nil, fmt.Errorf("fetch guest kernel: %w", err)
	}
	defer os.RemoveAll(tmp)
	// apt-get downloads as _apt when it can write the directory.
	_ = os.Chmod(tmp, 0o777)

	c.progressf("vm: downloading %s=%s", KernelPackage, KernelVersion)
	if err := run(ctx, tmp, "apt-get", "download", "-q", KernelPackage+"="+KernelVersion); err != nil {
		if strings.Contains(err.Error(), "not found") || strings.Contains(err.Error(), "Unable to locate") {
			return nil, fmt.Errorf("guest kernel %s=%s is not in the apt mirror any more (run `apt-get update` first; if it is still missing, "+
				"a security update replaced it: `apt-cache show linux-image-amd64 | grep Depends` names the current package and `apt-cache policy PACKAGE` its version; "+
				"put both in KernelPackage/KernelVersion in internal/vmimage/kernel.go, rebuild, and run `cagebox image build` again): %w", KernelPackage, KernelVersion, err)
		}
		return nil, fmt.Errorf("download guest kernel: %w", err)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("download guest kernel: expected one .deb in %s, found %d", tmp, len(debs))
	}
	debSum, err := fileSHA256(debs[0])
	if err != nil {
		return nil, err
	}
	c.progressf("vm: unpacking %s (sha256 %s)", filepath.Base(debs[0]), debSum[:16])
	x := filepath.Join(tmp, "x")
	if err := run(ctx, "", "dpkg-deb", "-x", debs[0], x); err != nil {
		return nil, fmt.Errorf("unpack guest kernel: %w", err)
	}
	mods, err := ResolveModules(filepath.Join(x, "lib", "modules", KernelRelease), GuestModules)
	if err != nil {
		return nil, fmt.Errorf("guest kernel %s: %w", KernelPackage, err)
	}
	out := filepath.Join(tmp, "out")
	if err := os.MkdirAll(filepath.Join(out, "modules"), 0o755); err != nil {
		return nil, err
	}
	if err := copyFile(filepath.Join(x, "boot", "vmlinuz-"+KernelRelease), filepath.Join(out, "vmlinuz")); err != nil {
		return nil, fmt.Errorf("guest kernel: %w", err)
	}
	k := &KernelInfo{Package: KernelPackage, Version: KernelVersion, Release: KernelRelease, DebSHA256: debSum, FetchedAt: time.Now().UTC().Truncate(time.Second)}
	for _, m := range mods {
		if err := copyFile(m.Path, filepath.Join(out, "modules", m.Name+".ko")); err != nil {
			return nil, fmt.Errorf("guest kernel: %w", err)
		}
		k.Modules = append(k.Modules, m.Name)
	}
	if k.VmlinuzSHA256, err = fileSHA256(filepath.Join(out, "vmlinuz")); err != nil {
		return nil, err
	}
	b, _ := json.MarshalIndent(k, "", "  ")
	if err := os.WriteFile(filepath.Join(out, "kernel.json"), append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	dst := c.kernelDir()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(dst); err != nil { // an older fetch of another version
		return nil, err
	}
	if err := os.Rename(out, dst); err != nil {
		return nil, fmt.Errorf("install guest kernel: %w", err)
	}
	c.progressf("vm: kernel %s %s ready (%d modules) in %s", KernelRelease, KernelVersion, len(mods), time.Since(start).Round(time.Millisecond))
	return c.Kernel()
}

func run(ctx context.Context, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
