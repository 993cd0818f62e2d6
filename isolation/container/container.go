// Package container is the namespaces-class runtime: it drives an OCI
// runtime binary (crun, or runc where crun cannot run on this host's cgroup
// layout) with bundles from package oci, an overlay of the image under a
// size-bounded tmpfs writable layer, and cagebox-agent as PID 1.
package container

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cagebox/cagebox/internal/cgroups"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/internal/syscallaudit"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/oci"
)

// Name is the runtime's registry name.
const Name = "container"

// CgroupParent is the cgroup (relative to each hierarchy's root) that holds
// every sandbox's cgroup.
const CgroupParent = oci.CgroupParent

// Options configure the runtime.
type Options struct {
	// Binary is the OCI runtime to drive ("" = detect: crun, or runc when the
	// host's cgroup layout is one crun refuses).
	Binary string
	// StateRoot is passed as --root to the OCI runtime (its own state).
	StateRoot string
}

// Runtime runs sandboxes as OCI containers.
type Runtime struct {
	binary    string
	stateRoot string
	availErr  error
}

var (
	_ isolation.Runtime             = (*Runtime)(nil)
	_ isolation.SnapshottingRuntime = (*Runtime)(nil)
)

// New returns the container runtime; Available reports whether it can run.
func New(o Options) *Runtime {
	rt := &Runtime{binary: o.Binary, stateRoot: o.StateRoot}
	if rt.stateRoot == "" {
		rt.stateRoot = "/run/cagebox/oci"
	}
	if rt.binary == "" {
		rt.binary, rt.availErr = DetectBinary()
	} else if _, err := exec.LookPath(rt.binary); err != nil {
		rt.availErr = fmt.Errorf("oci runtime %q not found: %w", rt.binary, err)
	}
	return rt
}

// DetectBinary picks the OCI runtime binary for this host: crun where it
// works, runc on hosts whose hybrid cgroup layout crun refuses
// ("cgroups in hybrid mode not supported"). CAGEBOX_OCI_RUNTIME overrides.
func DetectBinary() (string, error) {
	if b := os.Getenv("CAGEBOX_OCI_RUNTIME"); b != "" {
		p, err := exec.LookPath(b)
		if err != nil {
			return "", fmt.Errorf("CAGEBOX_OCI_RUNTIME=%s: %w", b, err)
		}
		return p, nil
	}
	order := []string{"crun", "runc"}
	if cgroups.Detect() == cgroups.Hybrid {
		order = []string{"runc", "crun"}
	}
	for _, b := range order {
		if p, err := exec.LookPath(b); err == nil {
			return p, nil
		}
	}
	return "", errors.New("neither crun nor runc is installed: run scripts/setup.sh (apt-get install crun runc)")
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
func (rt *Runtime) Class() isolation.Class { return isolation.Namespaces }

// Binary is the OCI runtime binary in use.
func (rt *Runtime) Binary() string { return rt.binary }

// Available implements isolation.Runtime.
func (rt *Runtime) Available() error {
	if rt.availErr != nil {
		return rt.availErr
	}
	if os.Geteuid() != 0 {
		return errors.New("the container runtime needs root (namespaces, mounts, cgroups)")
	}
	return nil
}

// Sandbox is one container: an oci.Sandbox whose agent listens on a
// socket the host made.
type Sandbox struct {
	*oci.Sandbox

	// mu guards listener.
	mu sync.Mutex
	// listener is the agent's listening socket between Create and Start;
	// its file is handed to the container and our copy closed.
	listener *net.UnixListener
	// notifier serves the seccomp notifications of an audited sandbox
	// (nil when audit is off, and after a daemon restart: see
	// oci.Notifier).
	notifier *oci.Notifier
}

var (
	_ isolation.Sandbox     = (*Sandbox)(nil)
	_ isolation.OOMCounter  = (*Sandbox)(nil)
	_ isolation.LeakChecker = (*Sandbox)(nil)
	_ isolation.Snapshotter = (*Sandbox)(nil)
)

// Create implements isolation.Runtime.
func (rt *Runtime) Create(ctx context.Context, spec *isolation.Spec) (_ isolation.Sandbox, err error) {
	if err := rt.Available(); err != nil {
		return nil, fmt.Errorf("%w: %v", isolation.ErrUnavailable, err)
	}
	if spec.ID == "" || spec.StateDir == "" || spec.RootFS == "" || spec.AgentPath == "" {
		return nil, errors.New("container: spec needs ID, StateDir, RootFS and AgentPath")
	}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	var adjust func(*specs.Spec)
	var notifier *oci.Notifier
	if !spec.Audit.Classes.Empty() {
		if spec.Audit.Sink == nil {
			return nil, errors.New("container: audit needs a sink")
		}
		if err := statedir.Make(spec.StateDir); err != nil {
			return nil, fmt.Errorf("create state dir: %w", err)
		}
		listener := filepath.Join(spec.StateDir, oci.AuditListener)
		adjust = func(sp *specs.Spec) { oci.AuditProfile(sp, spec.Audit.Classes, listener) }
		if notifier, err = oci.StartNotifier(listener, spec.Audit.Classes, spec.Audit.Sink, slog.Default().With("sandbox", spec.ID)); err != nil {
			return nil, err
		}
		undo.Add(notifier.Close)
	}
	base, err := oci.Create(Name, spec, oci.NewState(spec, rt.binary, rt.stateRoot, nil), oci.BundleOptions{}, adjust, oci.Hooks{}, &undo)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: base.Path(oci.AgentSocket), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen for agent: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	undo.Add(func() { ln.Close() })
	return &Sandbox{Sandbox: base, listener: ln, notifier: notifier}, nil
}

// Start implements isolation.Sandbox: the agent runs as PID 1 and its
// listening socket (created on the host in Create) is passed in as fd 3, so
// the host can dial it the moment Start returns.
func (s *Sandbox) Start(ctx context.Context) error {
	s.mu.Lock()
	ln := s.listener
	s.listener = nil
	s.mu.Unlock()
	if ln == nil {
		return errors.New("container: sandbox already started")
	}
	defer ln.Close()
	lf, err := ln.File()
	if err != nil {
		return fmt.Errorf("agent listener fd: %w", err)
	}
	defer lf.Close()
	return s.Run(ctx, []string{"--preserve-fds", "1"}, []*os.File{lf}, nil)
}

// Destroy implements isolation.Sandbox (oci.Sandbox.Destroy, and the
// listener of a sandbox never started closed). Idempotent.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	if s.listener != nil {
		s.listener.Close()
		s.listener = nil
	}
	s.mu.Unlock()
	err := s.Sandbox.Destroy(ctx)
	if s.notifier != nil {
		s.notifier.Close()
	}
	return err
}

// Unrecorded implements isolation.AuditGaps: containers record every
// class.
func (rt *Runtime) Unrecorded(syscallaudit.Set) (syscallaudit.Set, string) { return 0, "" }

// StopAudit stops serving the sandbox's seccomp notifications, as a
// daemon restart does: from then on its audited syscalls fail with ENOSYS
// (fail closed). For tests, and for a daemon that shuts down.
func (s *Sandbox) StopAudit() {
	if s.notifier != nil {
		s.notifier.Close()
	}
}

// Recover implements isolation.Runtime.
func (rt *Runtime) Recover(ctx context.Context, st isolation.State) (isolation.Sandbox, error) {
	base, err := oci.Recover(ctx, Name, st, oci.Hooks{})
	if err != nil {
		return nil, err
	}
	return &Sandbox{Sandbox: base}, nil
}

// Detail names the OCI runtime binary in use (shown by `cagebox runtimes`).
func (rt *Runtime) Detail() string {
	if rt.binary == "" {
		return ""
	}
	return "oci runtime " + filepath.Base(rt.binary) + ", cgroups " + cgroups.Detect().String()
}
