package oci

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/isolation"
)

func TestMountRootAndGuestFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting the overlay root needs root")
	}
	image := t.TempDir()
	if err := os.MkdirAll(filepath.Join(image, "etc/ssl/certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(image, "etc/ssl/certs/ca-certificates.crt"), []byte("IMAGE ROOTS"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A link that would point the write at the host if followed there.
	outside := filepath.Join(t.TempDir(), "host-file")
	if err := os.Symlink(outside, filepath.Join(image, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Cleanup(func() { UnmountRoot(dir) })
	root, err := MountRoot(dir, image, "", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	ca := "-----BEGIN CERTIFICATE-----\nTEST\n-----END CERTIFICATE-----\n"
	spec := &isolation.Spec{Hostname: "h", Nameserver: "10.0.0.1", TrustedCAPEM: []byte(ca)}
	if err := WriteGuestFiles(root, spec); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read("etc/resolv.conf"); !strings.HasPrefix(got, "nameserver 10.0.0.1\n") {
		t.Errorf("resolv.conf %q", got)
	}
	if _, err := os.Stat(outside); err == nil {
		t.Error("a link in the image sent the write to the host")
	}
	if got := read(isolation.GuestCAPath); got != ca {
		t.Errorf("ca.crt %q", got)
	}
	if got := read(isolation.GuestSystemBundle); got != "IMAGE ROOTS\n"+ca {
		t.Errorf("system bundle %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(image, "etc/ssl/certs/ca-certificates.crt")); string(got) != "IMAGE ROOTS" {
		t.Errorf("the image was written: %q", got)
	}
	if len(MountsBelow(dir)) != 2 {
		t.Errorf("mounts below %s: %q, want the tmpfs and the overlay", dir, MountsBelow(dir))
	}
	UnmountRoot(dir)
	UnmountRoot(dir)
	if left := MountsBelow(dir); len(left) > 0 {
		t.Errorf("left mounted: %q", left)
	}
}
