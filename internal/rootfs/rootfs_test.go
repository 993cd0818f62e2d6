package rootfs

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSymlinksStayInsideRoot(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(outside, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	// A hostile image: absolute and relative links pointing out.
	os.Symlink(outside, filepath.Join(root, "etc", "resolv.conf"))
	os.Symlink("../../../../../../"+outside, filepath.Join(root, "etc", "hosts"))
	os.Symlink(filepath.Dir(outside), filepath.Join(root, "ssl"))

	if b, err := ReadFile(root, "/etc/resolv.conf", 100); err == nil && string(b) == "host" {
		t.Fatal("read followed a link out of the root")
	}
	if b, err := ReadFile(root, "/etc/hosts", 100); err == nil && string(b) == "host" {
		t.Fatal("read followed a relative link out of the root")
	}
	for _, rel := range []string{"etc/resolv.conf", "etc/hosts"} {
		if err := WriteFile(root, rel, []byte("guest"), 0o644); err != nil {
			t.Fatalf("write %s: %v", rel, err)
		}
	}
	// Through a directory link: resolved inside the root (where the target
	// does not exist) — an error is fine, an escape is not.
	for _, rel := range []string{"ssl/host-secret", "ssl/certs/bundle"} {
		_ = WriteFile(root, rel, []byte("guest"), 0o644)
	}
	if b, _ := os.ReadFile(outside); string(b) != "host" {
		t.Fatalf("a write escaped the root: host file now %q", b)
	}
	if b, err := ReadFile(root, "etc/resolv.conf", 100); err != nil || string(b) != "guest" {
		t.Fatalf("read back %q %v", b, err)
	}
}
