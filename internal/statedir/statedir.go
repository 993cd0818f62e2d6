// Package statedir makes the directories cagebox keeps state in — the home
// ($CAGEBOX_HOME), its images, VM artifacts, volumes, sandbox and runtime
// state — 0700 and never wider, and narrows ones an older release or
// another tool left wider. Image trees hold root-owned (and, in images
// built before, setuid) files: a local user must not be able to reach them
// through the cache, so every directory above them is the daemon user's
// alone. The runtimes still work: runc and runsc run as root, and a QEMU
// VMM (its own uid) opens nothing under the home by path — the daemon
// passes it every file as a descriptor.
package statedir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Mode is the mode of every state directory.
const Mode fs.FileMode = 0o700

// Make creates dir and any missing parents with Mode, and narrows dir to
// Mode if it exists wider (following a symlink: a state directory may be
// a link to a shared cache).
func Make(dir string) error {
	if err := os.MkdirAll(dir, Mode); err != nil {
		return err // a *PathError: it names the directory
	}
	_, err := narrow(dir)
	return err
}

// narrow chmods dir to Mode when group or others have any access, keeping
// nothing else; it says whether it changed anything.
func narrow(dir string) (bool, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return false, fmt.Errorf("%s is not a directory", dir)
	}
	if fi.Mode().Perm()&^Mode == 0 && fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) == 0 {
		return false, nil
	}
	if err := os.Chmod(dir, Mode); err != nil {
		return false, fmt.Errorf("narrow %s to %v: %w", dir, Mode, err)
	}
	return true, nil
}

// HomeDirs are the directories directly under the home that hold state
// (those that exist are narrowed by Repair).
var HomeDirs = []string{"images", "vm", "volumes", "sandboxes", "oci", "runsc", "jail", "net", "ingress", "kube"}

// A Repair is one directory Repair narrowed and the mode it had.
type Repair struct {
	Dir string
	Was fs.FileMode
}

// RepairHome makes home (Make) and narrows the state directories in it
// that exist to Mode, returning what it changed so that the caller can log
// it. A missing directory is not an error (it is made when first needed).
func RepairHome(home string) ([]Repair, error) {
	var out []Repair
	var errs []error
	for i, d := range append([]string{""}, HomeDirs...) {
		p := filepath.Join(home, d)
		fi, err := os.Stat(p)
		switch {
		case i == 0 && errors.Is(err, fs.ErrNotExist):
			if err := Make(p); err != nil {
				return nil, err
			}
			continue
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("stat %s: %w", p, err))
			continue
		}
		changed, err := narrow(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if changed {
			out = append(out, Repair{Dir: p, Was: fi.Mode()})
		}
	}
	return out, errors.Join(errs...)
}
