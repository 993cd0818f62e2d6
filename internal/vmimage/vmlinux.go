package vmimage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// ExtractVmlinux writes the uncompressed ELF kernel inside a bzImage to dst
// (Firecracker boots only ELF kernels on x86_64; QEMU boots the bzImage).
// Debian compresses its kernel payload with xz, found by its magic; the
// result must be an ELF file. The write is atomic.
//
// The kernel's xz payload uses the x86 BCJ filter, which no maintained
// pure-Go xz decoder implements (ulikunitz/xz has LZMA2 only), so this runs
// xz-utils (Priority: required on Debian) on each candidate stream.
func ExtractVmlinux(ctx context.Context, bzImage, dst string) error {
	b, err := os.ReadFile(bzImage)
	if err != nil {
		return fmt.Errorf("read kernel: %w", err)
	}
	elf, err := vmlinuxFrom(ctx, b)
	if err != nil {
		return fmt.Errorf("%s: %w", bzImage, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".vmlinux-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(elf); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

var (
	xzMagic  = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	elfMagic = []byte{0x7f, 'E', 'L', 'F'}
)

// vmlinuxFrom finds the first xz stream in a bzImage that decompresses to
// an ELF image.
func vmlinuxFrom(ctx context.Context, b []byte) ([]byte, error) {
	if _, err := exec.LookPath("xz"); err != nil {
		return nil, errors.New("xz is not installed (apt-get install xz-utils)")
	}
	for off := 0; ; {
		i := bytes.Index(b[off:], xzMagic)
		if i < 0 {
			return nil, errors.New("no xz-compressed ELF kernel found in the image (only xz payloads are supported)")
		}
		off += i
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		// --single-stream stops at the stream's end and ignores the rest
		// of the bzImage; -q -q keeps the trailing-garbage warning quiet.
		cmd := exec.CommandContext(cctx, "xz", "--decompress", "--stdout", "--single-stream", "-q", "-q")
		cmd.Stdin = bytes.NewReader(b[off:])
		var out bytes.Buffer
		cmd.Stdout = &out
		err := cmd.Run()
		cancel()
		if err == nil && bytes.HasPrefix(out.Bytes(), elfMagic) {
			return out.Bytes(), nil
		}
		off += len(xzMagic)
	}
}
