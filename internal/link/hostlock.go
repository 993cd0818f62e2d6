package link

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultLockDir holds the host-wide locks of daemons' network resources.
// It is on /run: host-wide (not per home), and emptied by a reboot, which
// also ends every daemon.
const DefaultLockDir = "/run/cagebox/locks"

// HostLock is a daemon's exclusive claim on the host resources a link
// manager owns: its nftables table and its interface prefix (host veths
// and namespace names). Two daemons sharing either would take each other's
// sandboxes' links for strays or replace each other's rules.
type HostLock struct {
	files []*os.File
}

// LockHost takes the host-wide locks for cfg's table and interface prefix
// (defaults applied) on behalf of owner (the daemon's home, for the
// message another daemon gets). It fails at once, naming the daemon that
// holds a lock, when another process has one. dir "" is DefaultLockDir.
func LockHost(dir string, cfg Config, owner string) (*HostLock, error) {
	if dir == "" {
		dir = DefaultLockDir
	}
	if cfg.TableName == "" {
		cfg.TableName = DefaultTableName
	}
	if cfg.IfPrefix == "" {
		cfg.IfPrefix = DefaultIfPrefix
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("link: host lock: %w", err)
	}
	h := &HostLock{}
	for _, k := range []struct{ what, name, flag string }{
		{"nftables table", cfg.TableName, "--net-table"},
		{"interface prefix", cfg.IfPrefix, "--net-ifprefix"},
	} {
		key := strings.ReplaceAll(k.what, " ", "-") + "-" + k.name
		f, err := lockFile(filepath.Join(dir, key+".lock"), owner)
		if err != nil {
			h.Release()
			var held *heldError
			if errors.As(err, &held) {
				return nil, fmt.Errorf("link: another cagebox daemon (%s) owns %s %q on this host: stop it, or give this daemon its own %s (and --net-table, --net-ifprefix, --link-pool)", held.holder, k.what, k.name, k.flag)
			}
			return nil, fmt.Errorf("link: host lock for %s %q: %w", k.what, k.name, err)
		}
		h.files = append(h.files, f)
	}
	return h, nil
}

// Release drops the locks (a process's exit drops them too).
func (h *HostLock) Release() {
	if h == nil {
		return
	}
	for _, f := range h.files {
		_ = f.Truncate(0)
		f.Close()
	}
	h.files = nil
}

type heldError struct{ holder string }

func (e *heldError) Error() string { return "held by " + e.holder }

// lockFile takes an exclusive flock on path and records this process's
// pid and owner in it; when another process holds it, the error says who.
func lockFile(path, owner string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := strings.TrimSpace(string(b))
			if holder == "" {
				holder = "pid unknown"
			}
			return nil, &heldError{holder: holder}
		}
		return nil, err
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(fmt.Sprintf("pid %d, home %s\n", os.Getpid(), owner)), 0)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
