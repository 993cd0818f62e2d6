package qemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/isolation"
)

// Mounts in a microVM. Every mount is a virtio-blk disk holding ext4, the
// format volumes have on the host anyway:
//
//   - a volume is its image file, attached read-write or read-only;
//   - a host directory is copied into a read-only ext4 image in the
//     sandbox's state dir (mkfs.ext4 -d from the directory, bound through
//     its checked descriptor: symlinks are copied as symlinks, never
//     followed), built at create and removed with the sandbox.
//
// virtiofs was the other candidate; Debian's virtiofsd here is QEMU's C
// daemon, which serves a host directory to the guest live from a root
// process on the host — more host attack surface for an untrusted guest
// than a disk image the guest's own kernel parses, and it needs the guest
// RAM shared (memory-backend-memfd,share=on), which the template and
// hibernation paths do not use. The figures are in docs/operator.md.
//
// The guest's init finds each disk by its serial (agentproto.VMMount).

// MaxDirDiskBytes bounds a host directory copied into a disk.
const MaxDirDiskBytes = 4 << 30

// diskRecord is one extra disk (boot.json: Resume after Hibernate
// attaches the same disks again).
type diskRecord struct {
	Path   string `json:"path"`
	RW     bool   `json:"rw,omitempty"`
	Serial string `json:"serial"`
}

// vmDisk is a disk on QEMU's command line.
type vmDisk struct {
	FD     int
	RW     bool
	Serial string
}

// prepareDisks makes the disks of spec.Mounts below dir and says how the
// guest mounts them.
func prepareDisks(ctx context.Context, spec *isolation.Spec, dir string) ([]diskRecord, []agentproto.VMMount, error) {
	var disks []diskRecord
	var vms []agentproto.VMMount
	for i, m := range spec.Mounts {
		serial := "cbxmnt" + strconv.Itoa(i)
		d := diskRecord{Serial: serial, RW: m.RW}
		switch m.Type {
		case mounts.Volume:
			// Not while the host kernel still has it mounted somewhere
			// (two writers of one image).
			if err := mounts.CheckDetached(m.Image, m.RW); err != nil {
				return nil, nil, fmt.Errorf("qemu: mount volume %s: %w", m.Name, err)
			}
			d.Path = m.Image
		case mounts.Bind:
			if m.Bind == nil || !m.Bind.Dir || m.RW {
				return nil, nil, fmt.Errorf("qemu: mount %s at %s: a microVM gets a read-only copy of a host directory: bind a directory, read-only (use a volume for data the sandbox writes)", m.Name, m.Target)
			}
			p, err := dirDisk(ctx, m, filepath.Join(dir, "mnt", strconv.Itoa(i)), filepath.Join(dir, "disks", strconv.Itoa(i)+".ext4"))
			if err != nil {
				return nil, nil, err
			}
			d.Path = p
		default:
			return nil, nil, fmt.Errorf("qemu: mount at %s: unknown type %q", m.Target, m.Type)
		}
		disks = append(disks, d)
		vms = append(vms, agentproto.VMMount{Serial: serial, Target: m.Target, RW: m.RW, Exec: m.Exec})
	}
	return disks, vms, nil
}

// dirDisk copies the bind source of m into a new ext4 image at img,
// through a read-only bind of it staged at stage (unmounted again).
func dirDisk(ctx context.Context, m isolation.Mount, stage, img string) (string, error) {
	if err := mounts.StageBind(m.Bind, stage, false, false); err != nil {
		return "", fmt.Errorf("qemu: mount %s: %w", m.Name, err)
	}
	defer func() {
		mounts.Unmount(stage)
		_ = os.Remove(stage)
	}()
	size, err := treeBytes(stage)
	if err != nil {
		return "", fmt.Errorf("qemu: mount %s: %w", m.Name, err)
	}
	if size > MaxDirDiskBytes {
		return "", fmt.Errorf("qemu: mount %s: %d MiB is too much to copy into a microVM (at most %d MiB): use a volume", m.Name, size>>20, MaxDirDiskBytes>>20)
	}
	if err := statedir.Make(filepath.Dir(img)); err != nil {
		return "", err
	}
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("qemu: disk of %s: %w", m.Name, err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = mounts.MkfsExt4(ctx, img, stage, "")
	}
	if err != nil {
		_ = os.Remove(img)
		return "", fmt.Errorf("qemu: disk of %s: %w", m.Name, err)
	}
	return img, nil
}

// treeBytes is the size of an ext4 filesystem that holds the tree at dir:
// its data in 4 KiB blocks, an inode and a block for each entry, a fifth
// more, and room for the journal and metadata.
func treeBytes(dir string) (int64, error) {
	var data, n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n++
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			data += (fi.Size() + 4095) &^ 4095
		}
		if data > MaxDirDiskBytes {
			return errors.New("too large")
		}
		return nil
	})
	if err != nil && err.Error() == "too large" {
		return data, nil
	}
	if err != nil {
		return 0, err
	}
	size := (data+n*(256+4096))*6/5 + 32<<20
	return (size + 1<<20 - 1) &^ (1<<20 - 1), nil
}

// openDisks opens the disks for QEMU (which never opens a host path).
func openDisks(disks []diskRecord) ([]*os.File, error) {
	var out []*os.File
	for _, d := range disks {
		mode := os.O_RDONLY
		if d.RW {
			mode = os.O_RDWR
		}
		f, err := os.OpenFile(d.Path, mode, 0)
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, fmt.Errorf("qemu: open disk %s: %w", d.Serial, err)
		}
		out = append(out, f)
	}
	return out, nil
}

// hasWritableDisks reports whether the sandbox has a writable disk
// attached (its boot record says).
func (s *Sandbox) hasWritableDisks() bool {
	var rec bootRecord
	if readJSON(s.sd.path(bootFile), &rec) != nil {
		return false
	}
	for _, d := range rec.Disks {
		if d.RW {
			return true
		}
	}
	return false
}
