package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Limits are what Create sets on a cgroup; zero leaves a limit unset.
type Limits struct {
	MemoryBytes int64
	PIDs        int64
}

// Create makes the cgroup path (relative to each hierarchy's root) for
// runtimes that start their own processes (a VMM) rather than an OCI
// runtime, with the memory and pids controllers limited. On v1 and hybrid
// hosts it uses the v1 memory and pids hierarchies; on v2 it enables both
// controllers down the path. On failure nothing it made is left.
func Create(path string, l Limits) (err error) {
	path = strings.Trim(path, "/")
	if path == "" || strings.Contains(path, "..") {
		return fmt.Errorf("cgroup path %q is invalid", path)
	}
	defer func() {
		if err != nil {
			_ = Remove(path)
		}
	}()
	if Detect() == V2 {
		return createV2(path, l)
	}
	for _, c := range []struct {
		ctrl, file string
		val        int64
	}{
		{"memory", "memory.limit_in_bytes", l.MemoryBytes},
		{"pids", "pids.max", l.PIDs},
	} {
		d := filepath.Join(Root, c.ctrl, path)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", d, err)
		}
		if c.val > 0 {
			if err := writeFile(filepath.Join(d, c.file), strconv.FormatInt(c.val, 10)); err != nil {
				return err
			}
		}
	}
	return nil
}

func createV2(path string, l Limits) error {
	cur := Root
	for _, elem := range strings.Split(path, "/") {
		// Enable the controllers for the children of every ancestor.
		if err := writeFile(filepath.Join(cur, "cgroup.subtree_control"), "+memory +pids"); err != nil {
			return err
		}
		cur = filepath.Join(cur, elem)
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create cgroup %s: %w", cur, err)
		}
	}
	if l.MemoryBytes > 0 {
		if err := writeFile(filepath.Join(cur, "memory.max"), strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(cur, "memory.swap.max"), "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if l.PIDs > 0 {
		if err := writeFile(filepath.Join(cur, "pids.max"), strconv.FormatInt(l.PIDs, 10)); err != nil {
			return err
		}
	}
	return nil
}

// Add moves process pid into every hierarchy's directory of path.
func Add(path string, pid int) error {
	var errs []error
	for _, d := range dirs(path) {
		if _, err := os.Stat(d); err != nil {
			continue // a v1 controller this cgroup does not use
		}
		if err := writeFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func writeFile(p, val string) error {
	if err := os.WriteFile(p, []byte(val), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}
