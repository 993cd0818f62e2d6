package kvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// bootIDFile names this boot of the host; a variable so tests can change
// boots.
var bootIDFile = "/proc/sys/kernel/random/boot_id"

// verdictFile is what a Cache with a Dir keeps, per key, for one boot.
type verdictFile struct {
	BootID   string             `json:"boot_id"`
	Verdicts map[string]Verdict `json:"verdicts"`
}

func bootID() (string, error) {
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", errors.New("boot id: empty")
	}
	return id, nil
}

// BinaryID names a binary's build for a probe key: its path, size,
// modification time and inode, so an upgraded QEMU or runsc is probed
// again within one boot.
func BinaryID(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return path
	}
	return fmt.Sprintf("%s@%d-%d.%d-%d", path, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ino)
}

// lockVerdicts takes the host-wide lock of dir's verdict file.
func lockVerdicts(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "verdicts.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

func readVerdicts(dir string) (verdictFile, error) {
	var vf verdictFile
	b, err := os.ReadFile(filepath.Join(dir, "verdicts.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return vf, nil
	}
	if err != nil {
		return vf, err
	}
	if err := json.Unmarshal(b, &vf); err != nil {
		return verdictFile{}, nil // a torn or foreign file: probe again
	}
	return vf, nil
}

// loadBoot returns the verdict recorded for key in this boot.
func loadBoot(dir, key string) (Verdict, bool) {
	boot, err := bootID()
	if err != nil {
		return Verdict{}, false
	}
	unlock, err := lockVerdicts(dir)
	if err != nil {
		return Verdict{}, false
	}
	defer unlock()
	vf, err := readVerdicts(dir)
	if err != nil || vf.BootID != boot {
		return Verdict{}, false
	}
	v, ok := vf.Verdicts[key]
	return v, ok
}

// storeBoot records v for key in this boot (dropping other boots').
func storeBoot(dir, key string, v Verdict) error {
	boot, err := bootID()
	if err != nil {
		return err
	}
	unlock, err := lockVerdicts(dir)
	if err != nil {
		return fmt.Errorf("lock verdicts: %w", err)
	}
	defer unlock()
	vf, err := readVerdicts(dir)
	if err != nil {
		return fmt.Errorf("read verdicts: %w", err)
	}
	if vf.BootID != boot || vf.Verdicts == nil {
		vf = verdictFile{BootID: boot, Verdicts: map[string]Verdict{}}
	}
	v.Cached = false
	vf.Verdicts[key] = v
	b, err := json.MarshalIndent(vf, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, "verdicts.json"), b)
}
