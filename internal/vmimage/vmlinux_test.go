package vmimage

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"context"
	"os/exec"
)

func TestVmlinuxFromSynthetic(t *testing.T) {
	elf := append([]byte("\x7fELF"), bytes.Repeat([]byte("kernel text "), 1000)...)
	xzOf := func(b []byte) []byte {
		cmd := exec.Command("xz", "--stdout", "--check=crc32")
		cmd.Stdin = bytes.NewReader(b)
		out, err := cmd.Output()
		if err != nil {
			t.Skipf("xz: %v", err)
		}
		return out
	}
	// A decoy xz stream that is not ELF, then the payload, then trailing
	// bytes (a bzImage's tail).
	img := append(append(append([]byte("MZ setup code"), xzOf([]byte("not a kernel"))...), xzOf(elf)...), []byte("trailer")...)
	got, err := vmlinuxFrom(context.Background(), img)
	if err != nil || !bytes.Equal(got, elf) {
		t.Fatalf("vmlinuxFrom: %v (%d bytes)", err, len(got))
	}
	if _, err := vmlinuxFrom(context.Background(), []byte("MZ nothing here")); err == nil {
		t.Fatal("an image with no payload was accepted")
	}
}

// The pinned Debian kernel, when this machine has fetched it.
func TestExtractVmlinuxDebian(t *testing.T) {
	k, err := (&Cache{Dir: TestCacheDir()}).Kernel()
	if err != nil {
		t.Skipf("no fetched kernel: %v", err)
	}
	dst := filepath.Join(t.TempDir(), "vmlinux")
	if err := ExtractVmlinux(context.Background(), k.Vmlinuz, dst); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(dst)
	if err != nil || !bytes.HasPrefix(b, []byte("\x7fELF\x02")) {
		t.Fatalf("not a 64-bit ELF: %v", err)
	}
}
