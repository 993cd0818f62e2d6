// Package oci is what the container (runc/crun) and gVisor (runsc) runtimes
// share: the OCI runtime bundle (namespaces, capabilities, seccomp, masked
// paths, cgroup limits and the mounts that put cagebox-agent in the guest as
// PID 1), the guest's writable overlay root and the files written into it,
// the OCI runtime command line (state, stop, delete), and Sandbox: one
// container's state, pause, resume, stop, agent socket, OOM count, destroy,
// leftovers and recovery, which each runtime embeds, adding its Start and
// small hooks for what it does differently.
package oci

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/rootfs"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/isolation"
)

// Paths inside the guest.
const (
	GuestAgentPath = "/.cagebox/agent"
	GuestRunDir    = rootfs.RunDir
	// GuestListenFD is the file descriptor the agent's listening socket is
	// passed on (runc --preserve-fds 1 puts the first extra file at fd 3).
	GuestListenFD = 3
)

// agentCaps are the only capabilities the agent starts with. It uses them to
// lock securebits (so no process it starts ever regains a capability), to
// empty the bounding set, and to run commands as other users; everything it
// execs ends up with no capabilities at all.
var agentCaps = []string{"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"}

// BundleOptions are the host paths a bundle refers to.
type BundleOptions struct {
	// RootFS is the directory used as the guest root (a writable overlay over
	// the image for the container runtime).
	RootFS string
	// RunDir is the host directory mounted at GuestRunDir (token, env).
	RunDir string
	// CgroupsPath is passed to the OCI runtime as linux.cgroupsPath.
	CgroupsPath string
	// ReadonlyRoot mounts the root read-only.
	ReadonlyRoot bool
	// AgentListen is the agent's --listen argument; empty means the
	// listening socket passed on GuestListenFD ("fd:3").
	AgentListen string
	// Mounts are the tenant's mounts, staged on the host (StageMounts);
	// with ReadonlyRoot a size-bounded tmpfs /tmp comes before them.
	Mounts []specs.Mount
	// RootTmp binds the root's own /tmp over itself (writable roots only),
	// for an OCI runtime that otherwise mounts a tmpfs of its own there
	// (runsc does when the spec mounts nothing at /tmp): /tmp then stays
	// in the writable layer, bounded by its size and kept by snapshots,
	// as with runc. Create sets it back to false when the root's /tmp is
	// not a plain directory.
	RootTmp bool
}

// Spec returns the OCI runtime spec of a sandbox.
func Spec(s *isolation.Spec, o BundleOptions) *specs.Spec {
	res := s.Resources.WithDefaults()
	mem, pids, cpus := res.MemoryBytes, res.PIDs, res.CPUs
	period := uint64(100000)
	quota := int64(cpus * float64(period))
	swappiness := uint64(0)
	hostname := rootfs.Hostname(s.Hostname)

	namespaces := []specs.LinuxNamespace{
		{Type: specs.PIDNamespace},
		{Type: specs.MountNamespace},
		{Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace},
		{Type: specs.CgroupNamespace},
		{Type: specs.NetworkNamespace, Path: s.NetNS},
	}

	listen := o.AgentListen
	if listen == "" {
		listen = fmt.Sprintf("fd:%d", GuestListenFD)
	}
	args := []string{GuestAgentPath,
		"--listen", listen,
		"--token-file", rootfs.TokenFile,
		"--env-file", rootfs.EnvFile,
	}
	if s.AwaitClaim {
		args = append(args, "--await-claim")
	}
	noFile := nofileLimit()
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: args,
			Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  agentCaps,
				Effective: agentCaps,
				Permitted: agentCaps,
			},
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: noFile, Soft: noFile},
				{Type: "RLIMIT_CORE", Hard: 0, Soft: 0},
			},
			NoNewPrivileges: true,
			OOMScoreAdj:     intPtr(500),
		},
		Root:     &specs.Root{Path: o.RootFS, Readonly: o.ReadonlyRoot},
		Hostname: hostname,
		Mounts:   bundleMounts(s, o),
		Linux: &specs.Linux{
			Namespaces:  namespaces,
			CgroupsPath: o.CgroupsPath,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory: &specs.LinuxMemory{
					Limit:      &mem,
					Swap:       &mem, // memory+swap = memory: no swap
					Swappiness: &swappiness,
				},
				Pids: &specs.LinuxPids{Limit: &pids},
				CPU:  &specs.LinuxCPU{Quota: &quota, Period: &period},
			},
			Seccomp: Seccomp(),
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
				"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
				"/proc/sched_debug", "/proc/scsi", "/sys/firmware",
				"/sys/devices/virtual/powercap", "/proc/interrupts",
			},
			ReadonlyPaths: []string{
				"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
			},
		},
	}
}

func bundleMounts(s *isolation.Spec, o BundleOptions) []specs.Mount {
	ms := baseMounts(s, o)
	switch {
	case o.ReadonlyRoot:
		ms = append(ms, TmpMount(s.Resources.WithDefaults().DiskBytes))
	case o.RootTmp:
		ms = append(ms, specs.Mount{Destination: "/tmp", Type: "bind", Source: filepath.Join(o.RootFS, "tmp"), Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	return append(ms, o.Mounts...)
}

// TmpMount is the writable /tmp of a guest whose root is read-only: a
// tmpfs bounded like the writable layer it stands in for.
func TmpMount(size int64) specs.Mount {
	return specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%d", size)}}
}

func baseMounts(s *isolation.Spec, o BundleOptions) []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		{Destination: GuestAgentPath, Type: "bind", Source: s.AgentPath, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		{Destination: GuestRunDir, Type: "bind", Source: o.RunDir, Options: []string{"bind", "nosuid", "nodev", "noexec"}},
	}
}

func intPtr(i int) *int { return &i }

// WriteBundle writes config.json into dir (created 0700).
func WriteBundle(dir string, sp *specs.Spec) error {
	if err := statedir.Make(dir); err != nil {
		return fmt.Errorf("create bundle dir: %w", err)
	}
	b, err := json.MarshalIndent(sp, "", "  ")
	if err != nil {
		return fmt.Errorf("encode oci spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return fmt.Errorf("write oci spec: %w", err)
	}
	return nil
}

// WriteRunDir fills the directory mounted at GuestRunDir: the agent's token
// (which the agent unlinks after reading) and its base environment.
func WriteRunDir(dir string, s *isolation.Spec) error {
	if err := statedir.Make(dir); err != nil {
		return fmt.Errorf("create run dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, path.Base(rootfs.TokenFile)), []byte(s.AgentToken), 0o400); err != nil {
		return fmt.Errorf("write agent token: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, path.Base(rootfs.EnvFile)), rootfs.EnvData(s.Env), 0o400); err != nil {
		return fmt.Errorf("write agent env: %w", err)
	}
	return nil
}

// nofileLimit is 65536 open files, or the daemon's own hard limit if that
// is lower (raising it would need CAP_SYS_RESOURCE and fails the start).
func nofileLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Max < 65536 {
		return rl.Max
	}
	return 65536
}
