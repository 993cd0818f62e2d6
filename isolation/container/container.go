// Package container is the namespaces-class runtime: it drives an OCI
// runtime binary (crun, or runc where crun cannot run on this host's cgroup
// layout) with bundles from package oci, an overlay of the image under a
// size-bounded tmpfs writable layer, and cagebox-agent as PID 1.
package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/cagebox/cagebox/internal/cgroups"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/internal/runlog"
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

var _ isolation.Runtime = (*Runtime)(nil)

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

// stateData is what Recover needs; stored as isolation.State.Data.
type stateData struct {
	Binary      string `json:"binary"`
	StateRoot   string `json:"state_root"`
	Dir         string `json:"dir"`
	CgroupsPath string `json:"cgroups_path"`
}

// Sandbox is one container.
type Sandbox struct {
	id string
	sd stateData

	// mu guards listener.
	mu sync.Mutex
	// listener is the agent's listening socket between Create and Start;
	// its file is handed to the container and our copy closed.
	listener *net.UnixListener
}

var (
	_ isolation.Sandbox    = (*Sandbox)(nil)
	_ isolation.OOMCounter = (*Sandbox)(nil)
)

func (sd *stateData) path(elem ...string) string {
	return filepath.Join(append([]string{sd.Dir}, elem...)...)
}

func (sd *stateData) cli() oci.CLI { return oci.CLI{Binary: sd.Binary, Root: sd.StateRoot} }

// Create implements isolation.Runtime.
func (rt *Runtime) Create(ctx context.Context, spec *isolation.Spec) (_ isolation.Sandbox, err error) {
	if err := rt.Available(); err != nil {
		return nil, fmt.Errorf("%w: %v", isolation.ErrUnavailable, err)
	}
	if spec.ID == "" || spec.StateDir == "" || spec.RootFS == "" || spec.AgentPath == "" {
		return nil, errors.New("container: spec needs ID, StateDir, RootFS and AgentPath")
	}
	s := &Sandbox{id: spec.ID, sd: stateData{
		Binary:      rt.binary,
		StateRoot:   rt.stateRoot,
		Dir:         spec.StateDir,
		CgroupsPath: "/" + CgroupParent + "/" + spec.ID,
	}}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	rootfs, err := oci.PrepareRoot(spec, s.sd.path("run"), &undo)
	if err != nil {
		return nil, err
	}
	sp := oci.Spec(spec, oci.BundleOptions{RootFS: rootfs, RunDir: s.sd.path("run"), CgroupsPath: s.sd.CgroupsPath})
	if err := oci.WriteBundle(s.sd.path("bundle"), sp); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.sd.path("agent.sock"), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen for agent: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	s.listener = ln
	undo.Add(func() { ln.Close() })
	return s, nil
}

// ID implements isolation.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// State implements isolation.Sandbox.
func (s *Sandbox) State() isolation.State {
	b, _ := json.Marshal(s.sd)
	return isolation.State{ID: s.id, Runtime: Name, Data: b}
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
	logf, err := runlog.Open(s.sd.path("agent.log"))
	if err != nil {
		return fmt.Errorf("open agent log: %w", err)
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	cmd := s.sd.cli().Command(ctx, "run", "--detach", "--preserve-fds", "1", "--bundle", s.sd.path("bundle"), s.id)
	cmd.Stdin = devnull
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.ExtraFiles = []*os.File{lf}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s run: %w: %s", filepath.Base(s.sd.Binary), err, runlog.Tail(s.sd.path("agent.log"), 512))
	}
	return nil
}

// Pause implements isolation.Sandbox (cgroup freezer).
func (s *Sandbox) Pause(ctx context.Context) error {
	_, err := s.sd.cli().Run(ctx, "pause", s.id)
	return err
}

// Resume implements isolation.Sandbox.
func (s *Sandbox) Resume(ctx context.Context) error {
	_, err := s.sd.cli().Run(ctx, "resume", s.id)
	return err
}

// Stop implements isolation.Sandbox: SIGTERM to the agent (which forwards
// it), then SIGKILL to everything after grace.
func (s *Sandbox) Stop(ctx context.Context, grace time.Duration) error {
	return s.sd.cli().Stop(ctx, s.id, grace)
}

// DialAgent implements isolation.Sandbox.
func (s *Sandbox) DialAgent(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", s.sd.path("agent.sock"))
	if err != nil {
		return nil, fmt.Errorf("dial agent: %w", err)
	}
	return c, nil
}

// OOMKills implements isolation.OOMCounter.
func (s *Sandbox) OOMKills() (uint64, error) {
	return cgroups.OOMKills(s.sd.CgroupsPath)
}

// Destroy implements isolation.Sandbox: kill and delete the container,
// unmount its layers, remove its cgroups and state. Idempotent.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	if s.listener != nil {
		s.listener.Close()
		s.listener = nil
	}
	s.mu.Unlock()
	var errs []error
	if err := s.sd.cli().Delete(ctx, s.id); err != nil {
		errs = append(errs, err)
	}
	oci.UnmountRoot(s.sd.Dir)
	if err := cgroups.Remove(s.sd.CgroupsPath); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(s.sd.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove state dir: %w", err))
	}
	return errors.Join(errs...)
}

// Leftovers lists what of the sandbox remains on the host (for tests and
// `cagebox doctor`): cgroups, mounts, the state dir, the OCI runtime's record.
func (s *Sandbox) Leftovers(ctx context.Context) []string {
	var out []string
	out = append(out, cgroups.Existing(s.sd.CgroupsPath)...)
	if _, err := os.Stat(s.sd.Dir); err == nil {
		out = append(out, "state dir "+s.sd.Dir)
	}
	out = append(out, oci.MountsBelow(s.sd.Dir)...)
	if st := s.sd.cli().Status(ctx, s.id); st != "" {
		out = append(out, "oci container in state "+st)
	}
	return out
}

// Recover implements isolation.Runtime.
func (rt *Runtime) Recover(ctx context.Context, st isolation.State) (isolation.Sandbox, error) {
	var sd stateData
	if err := json.Unmarshal(st.Data, &sd); err != nil {
		return nil, fmt.Errorf("container: decode state of %s: %w", st.ID, err)
	}
	s := &Sandbox{id: st.ID, sd: sd}
	switch s.sd.cli().Status(ctx, s.id) {
	case "running", "paused":
		return s, nil
	}
	_ = s.Destroy(ctx)
	return nil, fmt.Errorf("container %s: %w", st.ID, isolation.ErrGone)
}

// Detail names the OCI runtime binary in use (shown by `cagebox runtimes`).
func (rt *Runtime) Detail() string {
	if rt.binary == "" {
		return ""
	}
	return "oci runtime " + filepath.Base(rt.binary) + ", cgroups " + cgroups.Detect().String()
}
