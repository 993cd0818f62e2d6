package vmimage

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"

	"github.com/cavaliergopher/cpio"

	"github.com/cagebox/cagebox/agentproto"
)

// Layout of the base initramfs (see cmd/cagebox-agent's VM init).
const (
	// InitrdModuleDir holds the modules, named NN-name.ko so that loading
	// them in lexical order loads dependencies first.
	InitrdModuleDir = "/lib/modules"
)

// cpioWriter adds entries with fixed owners (root) and times, so that the
// same inputs give the same archive.
type cpioWriter struct {
	w *cpio.Writer
}

func (c *cpioWriter) dir(name string, mode cpio.FileMode) error {
	return c.w.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeDir | mode, Links: 2})
}

func (c *cpioWriter) file(name string, mode cpio.FileMode, data []byte) error {
	if err := c.w.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeReg | mode, Size: int64(len(data))}); err != nil {
		return err
	}
	_, err := c.w.Write(data)
	return err
}

func (c *cpioWriter) copyFile(name string, mode cpio.FileMode, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := c.w.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeReg | mode, Size: fi.Size()}); err != nil {
		return err
	}
	if n, err := io.Copy(c.w, f); err != nil || n != fi.Size() {
		return fmt.Errorf("copy %s into initramfs: %d of %d bytes: %w", src, n, fi.Size(), err)
	}
	return nil
}

// WriteInitrd writes the base initramfs, a gzip-compressed newc cpio
// archive: the agent binary as /init, the modules (in load order) under
// InitrdModuleDir, and the mount points the init uses. It is the same for
// every sandbox; per-sandbox configuration is appended as a second archive
// (WriteConfigArchive).
func WriteInitrd(w io.Writer, agentPath string, mods []Module) error {
	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	cw := &cpioWriter{w: cpio.NewWriter(zw)}
	for _, d := range []string{"dev", "proc", "sys", "mnt", "lib", "lib/modules", "cagebox"} {
		if err := cw.dir(d, 0o755); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
	}
	if err := cw.copyFile("init", 0o755, agentPath); err != nil {
		return fmt.Errorf("initramfs: agent: %w", err)
	}
	for i, m := range mods {
		name := path.Join(InitrdModuleDir[1:], fmt.Sprintf("%02d-%s.ko", i, m.Name))
		b, err := os.ReadFile(m.Path)
		if err != nil {
			return fmt.Errorf("initramfs: module %s: %w", m.Name, err)
		}
		if err := cw.file(name, 0o644, stripModuleSignature(b)); err != nil {
			return fmt.Errorf("initramfs: module %s: %w", m.Name, err)
		}
	}
	if err := cw.w.Close(); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return zw.Close()
}

// moduleSigMagic ends a signed kernel module (scripts/sign-file).
var moduleSigMagic = []byte("~Module signature appended~\n")

// stripModuleSignature drops a module's appended signature. The guest
// kernel does not enforce signatures (Debian enforces them only under
// Secure Boot lockdown) but checks one that is present: an RSA verify per
// module, tens of milliseconds each under TCG at every boot. The initramfs
// is built on the host from the pinned package, whose sha256 is recorded,
// so the check in the guest adds nothing. The trailer is: signature,
// signer, key id, a 12-byte struct module_signature whose last 4 bytes are
// the big-endian signature length, then the magic.
func stripModuleSignature(b []byte) []byte {
	if !bytes.HasSuffix(b, moduleSigMagic) {
		return b
	}
	end := len(b) - len(moduleSigMagic)
	if end < 12 {
		return b
	}
	info := b[end-12 : end]
	signerLen, keyIDLen := int(info[3]), int(info[4])
	sigLen := int(binary.BigEndian.Uint32(info[8:12]))
	total := sigLen + signerLen + keyIDLen + 12
	if total > end {
		return b
	}
	return b[:end-total]
}

// WriteConfigArchive writes an uncompressed newc cpio archive holding cfg at
// agentproto.VMConfigPath (mode 0400). The kernel unpacks concatenated
// archives in order, so appending this to the base initramfs gives the
// guest its configuration without rebuilding the base.
func WriteConfigArchive(w io.Writer, cfg *agentproto.VMConfig) error {
	b, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encode vm config: %w", err)
	}
	cw := &cpioWriter{w: cpio.NewWriter(w)}
	dir := path.Dir(agentproto.VMConfigPath)[1:]
	if err := cw.dir(dir, 0o700); err != nil {
		return err
	}
	if err := cw.file(agentproto.VMConfigPath[1:], 0o400, b); err != nil {
		return err
	}
	return cw.w.Close()
}

// WriteSandboxInitrd writes base (a WriteInitrd archive) followed by the
// sandbox's configuration archive to out, created with mode 0400. The base
// is padded to a 4-byte boundary as the kernel's unpacker expects.
func WriteSandboxInitrd(out, base string, cfg *agentproto.VMConfig) (err error) {
	src, err := os.Open(base)
	if err != nil {
		return fmt.Errorf("open base initramfs: %w", err)
	}
	defer src.Close()
	dst, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return fmt.Errorf("create sandbox initramfs: %w", err)
	}
	defer func() {
		if cerr := dst.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			os.Remove(out)
		}
	}()
	n, err := io.Copy(dst, src)
	if err != nil {
		return fmt.Errorf("copy base initramfs: %w", err)
	}
	if pad := (4 - n%4) % 4; pad > 0 {
		if _, err := dst.Write(make([]byte, pad)); err != nil {
			return err
		}
	}
	if err := WriteConfigArchive(dst, cfg); err != nil {
		return fmt.Errorf("write sandbox config into initramfs: %w", err)
	}
	return nil
}
