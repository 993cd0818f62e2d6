// Package cgroups reads and removes the cgroups the OCI runtimes create for
// sandboxes, on cgroup v1, hybrid (v1 controllers plus a cgroup2 mount) and
// pure v2 hosts. Limits themselves are set by the OCI runtime from the bundle.
package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Root is where cgroup hierarchies are mounted.
const Root = "/sys/fs/cgroup"

// Mode is the host's cgroup layout.
type Mode int

// Layouts.
const (
	V1 Mode = iota + 1
	Hybrid
	V2
)

func (m Mode) String() string {
	switch m {
	case V1:
		return "v1"
	case Hybrid:
		return "hybrid"
	case V2:
		return "v2"
	}
	return "unknown"
}

// Detect reports the host's cgroup layout.
func Detect() Mode {
	var st unix.Statfs_t
	if err := unix.Statfs(Root, &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return V2
	}
	if err := unix.Statfs(filepath.Join(Root, "unified"), &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return Hybrid
	}
	return V1
}

// dirs lists every directory that a cgroup path maps to on this host.
func dirs(path string) []string {
	if Detect() == V2 {
		return []string{filepath.Join(Root, path)}
	}
	entries, err := os.ReadDir(Root)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			continue // symlinks such as cpu,cpuacct point at a listed dir
		}
		out = append(out, filepath.Join(Root, e.Name(), path))
	}
	return out
}

// Existing lists the directories of path that still exist.
func Existing(path string) []string {
	var out []string
	for _, d := range dirs(path) {
		if _, err := os.Stat(d); err == nil {
			out = append(out, "cgroup "+d)
		}
	}
	return out
}

// Remove removes every directory of path (children first). A cgroup whose
// last processes are still exiting is retried for up to a second.
func Remove(path string) error {
	var errs []error
	for _, d := range dirs(path) {
		if err := removeTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func removeTree(d string) error {
	entries, err := os.ReadDir(d)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(filepath.Join(d, e.Name())); err != nil {
				return err
			}
		}
	}
	deadline := time.Now().Add(time.Second)
	for {
		err := unix.Rmdir(d)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// OOMKills returns how many processes the kernel killed in the cgroup for
// exceeding its memory limit.
func OOMKills(path string) (uint64, error) {
	file := filepath.Join(Root, "memory", path, "memory.oom_control")
	if Detect() == V2 {
		file = filepath.Join(Root, path, "memory.events")
	}
	return readKey(file, "oom_kill")
}

func readKey(file, key string) (uint64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, fmt.Errorf("read oom counter: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s in %s: %w", key, file, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("no %s in %s", key, file)
}
