package firecracker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cagebox/cagebox/internal/vmproc"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/cgroups"
)

// vmm is a jailed Firecracker process.
type vmm = vmproc.Proc

// procUID is the real uid of pid.
func procUID(pid int) (uint32, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				u, err := strconv.ParseUint(f[0], 10, 32)
				return uint32(u), err
			}
		}
	}
	return 0, fmt.Errorf("no Uid in /proc/%d/status", pid)
}

// isJailedVMM reports whether pid is the Firecracker the jailer started
// for jail id as uid: the jailer execs it with "--id=<id>" after dropping
// to uid, and no other process runs as that uid.
func isJailedVMM(pid int, id string, uid uint32) bool {
	if pid <= 0 {
		return false
	}
	if u, err := procUID(pid); err != nil || u != uid {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	for i, a := range args {
		if a == "--id="+id || (a == "--id" && i+1 < len(args) && args[i+1] == id) {
			return true
		}
	}
	return false
}

// identify checks that pid is the sandbox's VMM and records its start time.
func identify(pid int, id string, uid uint32) (*vmm, error) {
	if !isJailedVMM(pid, id, uid) {
		return nil, fmt.Errorf("process %d is not the firecracker of %s (uid %d)", pid, id, uid)
	}
	state, start, err := vmproc.Stat(pid)
	if err != nil {
		return nil, err
	}
	if state == "Z" || state == "X" {
		return nil, fmt.Errorf("firecracker %d has exited", pid)
	}
	return &vmm{PID: pid, StartTime: start}, nil
}

// waitIdentify is identify for a VMM just forked: the jailer writes the
// pid before its child has dropped to the sandbox's uid and exec'd
// Firecracker, so the check is retried for a moment.
func waitIdentify(ctx context.Context, pid int, id string, uid uint32) (*vmm, error) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		p, err := identify(pid, id, uid)
		if err == nil {
			return p, nil
		}
		if state, _, serr := vmproc.Stat(pid); serr != nil || state == "Z" || state == "X" {
			return nil, fmt.Errorf("firecracker %d exited at once", pid)
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// readJailPID reads the pid the jailer wrote in the jail (at most a few
// bytes, never through a symlink).
func readJailPID(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("%s is not a regular file", path)
	}
	b := make([]byte, 32)
	n, _ := f.Read(b)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("no pid in %s yet", path)
	}
	return pid, nil
}

// waitJailPID waits for the jailer's pid file; a jailer that fails first
// ends the wait with its error.
func waitJailPID(ctx context.Context, path string, jailerDone <-chan error) (int, error) {
	deadline := time.After(10 * time.Second)
	for {
		if pid, err := readJailPID(path); err == nil {
			return pid, nil
		}
		select {
		case err := <-jailerDone:
			if err != nil {
				return 0, fmt.Errorf("jailer failed: %w", err)
			}
			jailerDone = nil // exited cleanly after forking: keep reading
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-deadline:
			return 0, fmt.Errorf("no pid in %s after 10s", path)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// cgroupProcs lists the processes in the jail's cgroup, in every
// hierarchy the jailer made it in.
func cgroupProcs(path string) []int {
	files, _ := filepath.Glob(filepath.Join(cgroups.Root, "*", path, "cgroup.procs"))
	files = append(files, filepath.Join(cgroups.Root, path, "cgroup.procs"))
	seen := map[int]bool{}
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(s); err == nil && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

// killCgroup kills every process in the jail's cgroup (the VMM, or a
// jailer caught half-way). Only this sandbox's processes are ever in it.
func killCgroup(path string) {
	for _, pid := range cgroupProcs(path) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
