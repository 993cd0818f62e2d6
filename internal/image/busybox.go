package image

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// BusyboxPath is the static busybox that BuildBusybox copies (Debian's
// busybox-static package).
var BusyboxPath = "/bin/busybox"

// BuildBusybox makes a tiny image from the host's static busybox: /bin/busybox
// with a symlink in /bin for every applet (/sbin, /usr/bin and /usr/sbin are
// symlinks to /bin), /etc/passwd, /etc/group, /etc/hosts, /etc/resolv.conf
// and a sticky /tmp. It is for fast tests and benchmarks and takes well under
// a second. If the image exists it is returned unchanged. It does not need
// root.
func (c *Cache) BuildBusybox(ctx context.Context, name string) (*Image, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if img, err := c.load(name); err == nil {
		return img, nil
	}
	unlock, err := c.lock(ctx, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if img, err := c.load(name); err == nil {
		return img, nil
	}

	var img *Image
	err = c.buildInto(ctx, name, func(tmp, rootfs string) error {
		version, err := populateBusybox(ctx, rootfs)
		if err != nil {
			return err
		}
		img = &Image{
			Name:      name,
			CreatedAt: time.Now().UTC().Truncate(time.Second),
			Packages:  []string{"busybox-static"},
			Source:    strings.TrimSpace("busybox " + BusyboxPath + " " + version),
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
	img.Path = filepath.Join(c.dir(name), rootfsDir)
	return img, nil
}

// populateBusybox fills rootfs and returns busybox's version banner
// ("v1.35.0").
func populateBusybox(ctx context.Context, rootfs string) (string, error) {
	out, err := exec.CommandContext(ctx, BusyboxPath, "--list").Output()
	if err != nil {
		return "", fmt.Errorf("list busybox applets (apt-get install busybox-static): %w", err)
	}
	applets := strings.Fields(string(out))
	if len(applets) == 0 {
		return "", fmt.Errorf("busybox %s lists no applets", BusyboxPath)
	}
	at := func(p string) string { return filepath.Join(rootfs, p) }
	dirs := []struct {
		path string
		mode fs.FileMode
	}{
		{"bin", 0o755}, {"etc", 0o755}, {"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555},
		{"run", 0o755}, {"root", 0o700}, {"home", 0o755}, {"usr", 0o755}, {"var", 0o755},
		{"tmp", 0o777 | fs.ModeSticky}, {"var/tmp", 0o777 | fs.ModeSticky},
	}
	for _, d := range dirs {
		if err := os.Mkdir(at(d.path), 0o755); err != nil {
			return "", err
		}
		if err := os.Chmod(at(d.path), d.mode); err != nil {
			return "", err
		}
	}
	for link, target := range map[string]string{"sbin": "bin", "usr/bin": "../bin", "usr/sbin": "../bin"} {
		if err := os.Symlink(target, at(link)); err != nil {
			return "", err
		}
	}
	if err := copyFile(BusyboxPath, at("bin/busybox"), 0o755); err != nil {
		return "", fmt.Errorf("copy busybox: %w", err)
	}
	for _, a := range applets {
		if a == "busybox" || strings.ContainsAny(a, "/") || a == "." || a == ".." {
			continue
		}
		if err := os.Symlink("busybox", at("bin/"+a)); err != nil && !os.IsExist(err) {
			return "", err
		}
	}
	files := []struct {
		path, content string
		mode          fs.FileMode
	}{
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n", 0o644},
		{"etc/group", "root:x:0:\nnogroup:x:65534:\n", 0o644},
		{"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n", 0o644},
		{"etc/resolv.conf", "# replaced by cagebox at sandbox start\n", 0o644},
		{"etc/hostname", "cagebox\n", 0o644},
		{"etc/machine-id", "", 0o444},
	}
	for _, f := range files {
		if err := writeRegular(at(f.path), f.content, f.mode); err != nil {
			return "", err
		}
	}
	// "BusyBox v1.35.0 (Debian 1:1.35.0-4+b3) multi-call binary."
	banner, _ := exec.CommandContext(ctx, BusyboxPath).CombinedOutput()
	first, _, _ := bytes.Cut(banner, []byte("\n"))
	version := ""
	if f := strings.Fields(string(first)); len(f) >= 2 && strings.HasPrefix(f[1], "v") {
		version = f[1]
	}
	return version, nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}
