package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cagebox/cagebox/internal/cgroups"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/internal/runlog"
)

// Names below a sandbox's state dir.
const (
	// AgentSocket is the host's name of the agent's socket, which
	// DialAgent dials.
	AgentSocket = "agent.sock"
	// AgentLog receives what the OCI runtime and the agent write. It
	// lives in the sandbox's size-bounded writable-layer tmpfs (outside
	// the overlay's upper dir, so the guest does not see it): the agent's
	// stdout and stderr are this file, and a guest that reaches them
	// (runsc 20221219 lets guest processes open /proc/1/fd, see
	// docs/security.md) fills only its own disk quota, not the host's.
	AgentLog  = rwDir + "/agent.log"
	bundleDir = "bundle"
	runDir    = "run"
)

// State is what Recover needs of an OCI sandbox; stored as
// isolation.State.Data.
type State struct {
	Binary    string `json:"binary"`
	StateRoot string `json:"state_root"`
	// Flags are the OCI runtime's global flags for this sandbox (runsc's
	// platform and network).
	Flags       []string `json:"flags,omitempty"`
	Dir         string   `json:"dir"`
	CgroupsPath string   `json:"cgroups_path"`
	// NetNS is the network namespace the sandbox joined.
	NetNS string `json:"netns,omitempty"`
	// Images are the volume images the sandbox mounts (for leak checks:
	// no loop device may stay on them after Destroy).
	Images []string `json:"images,omitempty"`
}

// Hooks are what one OCI runtime does beyond what Sandbox does for all of
// them. Any may be nil.
type Hooks struct {
	// AfterDelete runs in Destroy once the OCI runtime has deleted the
	// container, before its root is unmounted and its cgroups removed
	// (gVisor: kill what outlived `runsc delete`, remove runsc's record).
	AfterDelete func(ctx context.Context, s *Sandbox) error
	// Leftovers lists what else of the sandbox may remain on the host.
	Leftovers func(ctx context.Context, s *Sandbox) []string
	// Recovered runs when Recover finds the container running or paused.
	Recovered func(s *Sandbox) error
}

// Sandbox is one OCI container, driven through the OCI runtime's command
// line: what the container and gVisor runtimes share (state, pause,
// resume, stop, the agent's socket, OOM counting, destroy, leftovers and
// recovery). Each runtime embeds it and adds Start.
type Sandbox struct {
	id      string
	runtime string
	st      State
	hooks   Hooks
}

var (
	_ isolation.OOMCounter  = (*Sandbox)(nil)
	_ isolation.LeakChecker = (*Sandbox)(nil)
)

// NewState is the state of a new sandbox of spec run by binary (its own
// state under stateRoot, with global flags).
func NewState(spec *isolation.Spec, binary, stateRoot string, flags []string) State {
	return State{
		Binary:      binary,
		StateRoot:   stateRoot,
		Flags:       flags,
		Dir:         spec.StateDir,
		CgroupsPath: "/" + CgroupParent + "/" + spec.ID,
		NetNS:       spec.NetNS,
		Images:      volumeImages(spec),
	}
}

func volumeImages(spec *isolation.Spec) []string {
	var out []string
	for _, m := range spec.Mounts {
		if m.Image != "" {
			out = append(out, m.Image)
		}
	}
	return out
}

// Create prepares the sandbox of spec for runtime (its registry name):
// its state dir, writable root with the guest's files, run dir and bundle.
// o's RootFS, RunDir and CgroupsPath are filled in; adjust (if not nil)
// may change the spec before it is written. Undo steps go on undo.
func Create(runtime string, spec *isolation.Spec, st State, o BundleOptions, adjust func(*specs.Spec), h Hooks, undo *cleanup.Stack) (*Sandbox, error) {
	s := &Sandbox{id: spec.ID, runtime: runtime, st: st, hooks: h}
	rootfs, err := PrepareRoot(spec, s.Path(runDir), undo)
	if err != nil {
		return nil, err
	}
	o.RootFS, o.RunDir, o.CgroupsPath = rootfs, s.Path(runDir), st.CgroupsPath
	if o.Mounts, err = StageMounts(spec, undo); err != nil {
		return nil, err
	}
	o.ReadonlyRoot = o.ReadonlyRoot || spec.ReadOnlyRoot
	if o.RootTmp && !o.ReadonlyRoot {
		if o.RootTmp, err = rootTmp(rootfs); err != nil {
			return nil, err
		}
	}
	sp := Spec(spec, o)
	if adjust != nil {
		adjust(sp)
	}
	if err := WriteBundle(s.Path(bundleDir), sp); err != nil {
		return nil, err
	}
	return s, nil
}

// rootTmp makes sure root/tmp is a directory of the root's own (made 1777
// when the image has none), so that BundleOptions.RootTmp can bind it; it
// reports false for anything else there (a symlink would be resolved on
// the host), which keeps the runtime's own /tmp.
func rootTmp(root string) (bool, error) {
	p := filepath.Join(root, "tmp")
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.Mkdir(p, 0o755); err != nil {
			return false, fmt.Errorf("create /tmp in the guest root: %w", err)
		}
		if err := os.Chmod(p, 0o777|fs.ModeSticky); err != nil {
			return false, fmt.Errorf("chmod /tmp in the guest root: %w", err)
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("inspect /tmp in the guest root: %w", err)
	}
	return fi.Mode().Type() == fs.ModeDir, nil
}

// Recover re-attaches to the sandbox of runtime (its registry name) that
// st records, when the OCI runtime still has it running or paused;
// otherwise it destroys what is left and returns an error wrapping
// isolation.ErrGone.
func Recover(ctx context.Context, runtime string, st isolation.State, h Hooks) (*Sandbox, error) {
	s := &Sandbox{id: st.ID, runtime: runtime, hooks: h}
	if err := json.Unmarshal(st.Data, &s.st); err != nil {
		return nil, fmt.Errorf("%s: decode state of %s: %w", runtime, st.ID, err)
	}
	switch s.CLI().Status(ctx, s.id) {
	case "running", "paused":
		if h.Recovered != nil {
			if err := h.Recovered(s); err != nil {
				return nil, fmt.Errorf("%s sandbox %s: %w", runtime, st.ID, err)
			}
		}
		return s, nil
	}
	_ = s.Destroy(ctx)
	return nil, fmt.Errorf("%s sandbox %s: %w", runtime, st.ID, isolation.ErrGone)
}

// ID implements isolation.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// State implements isolation.Sandbox.
func (s *Sandbox) State() isolation.State {
	b, _ := json.Marshal(s.st)
	return isolation.State{ID: s.id, Runtime: s.runtime, Data: b}
}

// Data is the sandbox's recorded state.
func (s *Sandbox) Data() State { return s.st }

// Path is a path below the sandbox's state dir.
func (s *Sandbox) Path(elem ...string) string {
	return filepath.Join(append([]string{s.st.Dir}, elem...)...)
}

// RunDirPath is the host directory the guest sees at GuestRunDir.
func (s *Sandbox) RunDirPath() string { return s.Path(runDir) }

// BundlePath is the sandbox's OCI bundle directory.
func (s *Sandbox) BundlePath() string { return s.Path(bundleDir) }

// CLI is the OCI runtime's command line for this sandbox.
func (s *Sandbox) CLI() CLI {
	return CLI{Binary: s.st.Binary, Root: s.st.StateRoot, Flags: s.st.Flags}
}

// LogTail is the end of the agent's log, for error messages.
func (s *Sandbox) LogTail() string { return runlog.Tail(s.Path(AgentLog), 512) }

// Run starts the container: `run --detach ARGS --bundle BUNDLE ID`, with
// files passed on from fd 3 and output into the agent's log. run (nil:
// cmd.Run) runs the command.
func (s *Sandbox) Run(ctx context.Context, args []string, files []*os.File, run func(*exec.Cmd) error) error {
	logf, err := runlog.Open(s.Path(AgentLog))
	if err != nil {
		return fmt.Errorf("open agent log: %w", err)
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	argv := append([]string{"run", "--detach"}, args...)
	cmd := s.CLI().Command(ctx, append(argv, "--bundle", s.BundlePath(), s.id)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	cmd.ExtraFiles = files
	if run == nil {
		run = (*exec.Cmd).Run
	}
	if err := run(cmd); err != nil {
		return fmt.Errorf("%s run: %w: %s", filepath.Base(s.st.Binary), err, s.LogTail())
	}
	return nil
}

// Pause implements isolation.Sandbox (the OCI runtime freezes every guest
// task).
func (s *Sandbox) Pause(ctx context.Context) error {
	_, err := s.CLI().Run(ctx, "pause", s.id)
	return err
}

// Resume implements isolation.Sandbox.
func (s *Sandbox) Resume(ctx context.Context) error {
	_, err := s.CLI().Run(ctx, "resume", s.id)
	return err
}

// Stop implements isolation.Sandbox: SIGTERM to the agent (which forwards
// it), then SIGKILL to everything after grace.
func (s *Sandbox) Stop(ctx context.Context, grace time.Duration) error {
	return s.CLI().Stop(ctx, s.id, grace)
}

// DialAgent implements isolation.Sandbox.
func (s *Sandbox) DialAgent(ctx context.Context) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", s.Path(AgentSocket))
	if err != nil {
		return nil, fmt.Errorf("dial agent: %w", err)
	}
	return c, nil
}

// OOMKills implements isolation.OOMCounter from the sandbox's memory
// cgroup.
func (s *Sandbox) OOMKills() (uint64, error) {
	return cgroups.OOMKills(s.st.CgroupsPath)
}

// Destroy implements isolation.Sandbox: kill and delete the container,
// unmount its root, remove its cgroups and state. Idempotent.
func (s *Sandbox) Destroy(ctx context.Context) error {
	var errs []error
	if err := s.CLI().Delete(ctx, s.id); err != nil {
		errs = append(errs, err)
	}
	if s.hooks.AfterDelete != nil {
		if err := s.hooks.AfterDelete(ctx, s); err != nil {
			errs = append(errs, err)
		}
	}
	UnmountRoot(s.st.Dir)
	// Everything still mounted below the state dir (the tenant's staged
	// mounts) goes before RemoveAll, which would otherwise descend into a
	// volume or a bound host directory and delete what it holds.
	mounts.UnmountBelow(s.st.Dir)
	if len(mounts.MountPointsBelow(s.st.Dir)) > 0 {
		return errors.Join(append(errs, fmt.Errorf("mounts remain below %s: state dir kept", s.st.Dir))...)
	}
	if err := cgroups.Remove(s.st.CgroupsPath); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(s.st.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove state dir: %w", err))
	}
	return errors.Join(errs...)
}

// Leftovers implements isolation.LeakChecker: cgroups, mounts, the state
// dir, the OCI runtime's record of the container, and what the runtime's
// Leftovers hook finds.
func (s *Sandbox) Leftovers(ctx context.Context) []string {
	var out []string
	out = append(out, cgroups.Existing(s.st.CgroupsPath)...)
	if _, err := os.Stat(s.st.Dir); err == nil {
		out = append(out, "state dir "+s.st.Dir)
	}
	out = append(out, MountsBelow(s.st.Dir)...)
	for _, img := range s.st.Images {
		for _, l := range mounts.LoopsOf(img) {
			out = append(out, "loop device "+l+" on "+img)
		}
	}
	if st := s.CLI().Status(ctx, s.id); st != "" {
		out = append(out, filepath.Base(s.st.Binary)+" container in state "+st)
	}
	if s.hooks.Leftovers != nil {
		out = append(out, s.hooks.Leftovers(ctx, s)...)
	}
	return out
}
