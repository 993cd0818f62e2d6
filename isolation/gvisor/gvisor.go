// Package gvisor is the app-kernel runtime: it drives gVisor's runsc with the
// same OCI bundles as the container runtime (package oci), so guest system
// calls are served by gVisor's sentry rather than the host kernel.
//
// The guest root is the same overlay (image under a size-bounded tmpfs) as
// a container's, served to the sentry by runsc's gofer. The agent listens on
// a unix socket in a host directory mounted into the guest (runsc
// --host-uds); once it answers, Start hard-links the socket out of that
// directory and removes the guest's name for it, so no guest process can
// reach, replace or remove the agent's socket. With a network namespace the
// sentry's netstack takes over its eth0 (runsc --network=sandbox); without
// one the guest has loopback only (--network=none).
package gvisor

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/internal/cgroups"
	"github.com/cagebox/cagebox/internal/kvm"
	"github.com/cagebox/cagebox/isolation"
)

// Name is the runtime's registry name.
const Name = "gvisor"

// Options configure the runtime.
type Options struct {
	// Binary is runsc ("" = runsc from PATH).
	Binary string
	// StateRoot is passed as --root to runsc (its own state).
	StateRoot string
	// Platform is runsc's platform ("" = kvm when /dev/kvm is usable, else
	// systrap when this runsc has it, else ptrace). CAGEBOX_GVISOR_PLATFORM
	// overrides an empty Platform.
	Platform string
	// Logger receives the runtime's debug messages (nil = slog.Default()).
	Logger *slog.Logger
	// Device is the KVM device ("" = /dev/kvm).
	Device string
	// ProbeTimeout bounds the kvm platform probe (0 = kvm.DefaultTimeout).
	ProbeTimeout time.Duration
}

// Runtime runs sandboxes under gVisor.
type Runtime struct {
	binary    string
	stateRoot string
	platform  string
	log       *slog.Logger
	// device is the KVM device; probeTimeout bounds the kvm platform's
	// probe (see kvmVerdict).
	device       string
	probeTimeout time.Duration

	probeOnce sync.Once
	// Set by probe.
	version  string
	platWhy  string
	availErr error
}

var (
	_ isolation.Runtime             = (*Runtime)(nil)
	_ isolation.SnapshottingRuntime = (*Runtime)(nil)
)

// New returns the gvisor runtime; Available reports whether it can run.
// Nothing runs until the runtime is first used.
func New(o Options) *Runtime {
	rt := &Runtime{binary: o.Binary, stateRoot: o.StateRoot, platform: o.Platform, log: o.Logger,
		device: o.Device, probeTimeout: o.ProbeTimeout}
	if rt.device == "" {
		rt.device = kvm.DefaultDevice
	}
	if rt.probeTimeout <= 0 {
		rt.probeTimeout = kvm.DefaultTimeout
	}
	if rt.binary == "" {
		rt.binary = "runsc"
	}
	if rt.stateRoot == "" {
		rt.stateRoot = "/run/cagebox/runsc"
	}
	if rt.platform == "" {
		rt.platform = os.Getenv("CAGEBOX_GVISOR_PLATFORM")
	}
	if rt.log == nil {
		rt.log = slog.Default()
	}
	return rt
}

// Name implements isolation.Runtime.
func (rt *Runtime) Name() string { return Name }

// SupportsMounts implements isolation.MountingRuntime.
func (rt *Runtime) SupportsMounts() bool { return true }

// Snapshots implements isolation.SnapshottingRuntime: a filesystem
// snapshot (the writable layer, oci.Sandbox.Snapshot); processes are not
// kept.
func (rt *Runtime) Snapshots() (memory bool, err error) { return false, nil }

// Class implements isolation.Runtime.
func (rt *Runtime) Class() isolation.Class { return isolation.AppKernel }

// probe finds runsc, its version and platforms, and picks the platform.
func (rt *Runtime) probe() {
	rt.probeOnce.Do(func() {
		p, err := exec.LookPath(rt.binary)
		if err != nil {
			rt.availErr = fmt.Errorf("runsc is not installed (%v): run scripts/setup.sh (apt-get install runsc)", err)
			return
		}
		rt.binary = p
		out, err := exec.Command(p, "--version").CombinedOutput()
		if err != nil {
			rt.availErr = fmt.Errorf("%s --version failed: %w: %s: reinstall runsc (apt-get install --reinstall runsc)", p, err, bytes.TrimSpace(out))
			return
		}
		rt.version = parseVersion(string(out))
		flags, err := exec.Command(p, "flags").CombinedOutput()
		if err != nil {
			rt.availErr = fmt.Errorf("%s flags failed: %w: reinstall runsc (apt-get install --reinstall runsc)", p, err)
			return
		}
		known := platforms(string(flags))
		if rt.platform != "" {
			if !known[rt.platform] {
				rt.availErr = fmt.Errorf("runsc %s has no platform %q (it has %s): unset CAGEBOX_GVISOR_PLATFORM or pick one of those", rt.version, rt.platform, strings.Join(sortedKeys(known), ", "))
				return
			}
			rt.platWhy = "configured"
		} else {
			var v kvm.Verdict
			if known["kvm"] {
				v = rt.kvmVerdict()
				if !v.Usable {
					rt.log.Warn("runsc kvm platform probe failed; falling back", "reason", v.Reason, "probe", v.Evidence)
				}
			}
			rt.platform, rt.platWhy = choosePlatform(known, v)
		}
		if rt.platform == "ptrace" {
			if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(b)) == "3" {
				rt.availErr = errors.New("gVisor's ptrace platform cannot run: kernel.yama.ptrace_scope is 3 (ptrace disabled) and /dev/kvm is not usable: lower ptrace_scope or give the host /dev/kvm")
				return
			}
		}
		rt.log.Debug("gvisor runtime", "runsc", p, "version", rt.version, "platform", rt.platform, "why", rt.platWhy)
	})
}

// parseVersion takes "runsc version X\nspec: Y" to X.
func parseVersion(out string) string {
	line, _, _ := strings.Cut(out, "\n")
	line = strings.TrimSpace(line)
	if v, ok := strings.CutPrefix(line, "runsc version "); ok {
		return v
	}
	return line
}

// platforms reads the platform names out of the -platform flag's usage in
// `runsc flags` ("specifies which platform to use: ptrace (default), kvm.").
func platforms(flagsOut string) map[string]bool {
	known := map[string]bool{}
	lines := strings.Split(flagsOut, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "-platform string" || i+1 >= len(lines) {
			continue
		}
		_, list, ok := strings.Cut(lines[i+1], "platform to use:")
		if !ok {
			break
		}
		for _, name := range []string{"ptrace", "kvm", "systrap"} {
			if strings.Contains(list, name) {
				known[name] = true
			}
		}
	}
	if len(known) == 0 {
		known["ptrace"] = true // every runsc has it
	}
	return known
}

// choosePlatform prefers hardware virtualisation when its probe (v)
// proved it, then systrap (seccomp traps, much faster than ptrace), then
// ptrace; why says which and, for a fallback, quotes the probe.
func choosePlatform(known map[string]bool, v kvm.Verdict) (name, why string) {
	if v.Usable && known["kvm"] {
		return "kvm", v.Reason
	}
	noKVM := "this runsc has no kvm platform"
	if known["kvm"] {
		noKVM = v.String()
	}
	if known["systrap"] {
		return "systrap", noKVM
	}
	return "ptrace", noKVM + "; this runsc has no systrap"
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for _, k := range []string{"kvm", "systrap", "ptrace"} {
		if m[k] {
			out = append(out, k)
		}
	}
	return out
}

// Available implements isolation.Runtime.
func (rt *Runtime) Available() error {
	rt.probe()
	if rt.availErr != nil {
		return rt.availErr
	}
	if os.Geteuid() != 0 {
		return errors.New("the gvisor runtime needs root (runsc makes namespaces, mounts and cgroups): run the daemon as root")
	}
	return nil
}

// StateRoot is runsc's --root.
func (rt *Runtime) StateRoot() string { return rt.stateRoot }

// Platform is the runsc platform sandboxes run on ("" when runsc is missing).
func (rt *Runtime) Platform() string {
	rt.probe()
	if rt.availErr != nil {
		return ""
	}
	return rt.platform
}

// Detail names runsc's version and platform (shown by `cagebox runtimes`).
func (rt *Runtime) Detail() string {
	rt.probe()
	if rt.version == "" {
		return ""
	}
	if rt.availErr != nil {
		return "runsc " + rt.version
	}
	return fmt.Sprintf("runsc %s, platform %s (%s), cgroups %s", rt.version, rt.platform, rt.platWhy, cgroups.Detect())
}

// globalFlags are runsc's flags for every command on sandbox id.
func (rt *Runtime) globalFlags(id, network string) []string {
	flags := []string{
		"--platform=" + rt.platform,
		"--network=" + network,
		// The guest root is the host overlay (its writable layer is the
		// size-bounded tmpfs), not a sentry memory overlay.
		"--overlay2=none",
		// The agent binds its socket in a gofer-served host directory. The
		// gofer serves only the root overlay, the agent binary and the run
		// dir, none of which holds a host listener but the agent's own.
		"--host-uds=all",
		// The sentry applies the bundle's seccomp profile to guest calls.
		"--oci-seccomp",
		"--cpu-num-from-quota",
	}
	// CAGEBOX_GVISOR_DEBUG=DIR keeps runsc's debug logs in DIR/ID/.
	if dir := os.Getenv("CAGEBOX_GVISOR_DEBUG"); dir != "" {
		flags = append(flags, "--debug", "--debug-log="+filepath.Join(dir, id)+"/")
	}
	return flags
}
