package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/cgroups"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/internal/runlog"
	"github.com/cagebox/cagebox/isolation/oci"
)

// agentWait bounds how long Start waits for the agent to answer when its
// context has no earlier deadline.
const agentWait = 30 * time.Second

// Paths of the agent's socket: where the agent binds it (in the run dir,
// which the guest sees at oci.GuestRunDir) and the host-only name Start
// gives it.
const (
	guestSockName = "agent.sock"
	hostSockName  = "agent.sock"
)

// stateData is what Recover needs; stored as isolation.State.Data.
type stateData struct {
	Binary    string `json:"binary"`
	StateRoot string `json:"state_root"`
	// Flags are runsc's global flags (platform, network) for this sandbox.
	Flags       []string `json:"flags"`
	Dir         string   `json:"dir"`
	CgroupsPath string   `json:"cgroups_path"`
	// NetNS is the network namespace runsc's netstack takes over.
	NetNS string `json:"netns,omitempty"`
}

func (sd *stateData) path(elem ...string) string {
	return filepath.Join(append([]string{sd.Dir}, elem...)...)
}

func (sd *stateData) cli() oci.CLI {
	return oci.CLI{Binary: sd.Binary, Root: sd.StateRoot, Flags: sd.Flags}
}

// Sandbox is one gVisor sandbox (one runsc container).
type Sandbox struct {
	id string
	sd stateData

	// mu guards token and started.
	mu sync.Mutex
	// token is the agent's token between Create and Start (Start checks
	// the agent answers before it returns); never stored.
	token   string
	started bool
}

var (
	_ isolation.Sandbox     = (*Sandbox)(nil)
	_ isolation.OOMCounter  = (*Sandbox)(nil)
	_ isolation.OOMScope    = (*Sandbox)(nil)
	_ isolation.LeakChecker = (*Sandbox)(nil)
)

// Create implements isolation.Runtime.
func (rt *Runtime) Create(ctx context.Context, spec *isolation.Spec) (_ isolation.Sandbox, err error) {
	if err := rt.Available(); err != nil {
		return nil, fmt.Errorf("%w: %v", isolation.ErrUnavailable, err)
	}
	if spec.ID == "" || spec.StateDir == "" || spec.RootFS == "" || spec.AgentPath == "" || spec.AgentToken == "" {
		return nil, errors.New("gvisor: spec needs ID, StateDir, RootFS, AgentPath and AgentToken")
	}
	network := "none"
	if spec.NetNS != "" {
		if err := checkNetNS(spec.NetNS); err != nil {
			return nil, err
		}
		network = "sandbox"
	}
	s := &Sandbox{id: spec.ID, token: spec.AgentToken, sd: stateData{
		Binary:      rt.binary,
		StateRoot:   rt.stateRoot,
		Flags:       rt.globalFlags(spec.ID, network),
		Dir:         spec.StateDir,
		CgroupsPath: "/" + oci.CgroupParent + "/" + spec.ID,
		NetNS:       spec.NetNS,
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
	sp := oci.Spec(spec, oci.BundleOptions{
		RootFS:      rootfs,
		RunDir:      s.sd.path("run"),
		CgroupsPath: s.sd.CgroupsPath,
		AgentListen: "unix:" + oci.GuestRunDir + "/" + guestSockName,
	})
	adjustSpec(sp)
	if err := oci.WriteBundle(s.sd.path("bundle"), sp); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(rt.stateRoot, 0o700); err != nil {
		return nil, fmt.Errorf("create runsc state root: %w", err)
	}
	return s, nil
}

// adjustSpec fits the shared bundle to gVisor's pids accounting. The host
// cgroup holds the sentry, the gofer and (on ptrace) a stub process per
// guest address space and a host thread per guest thread that runs, so the
// guest's pids limit there would crash the sentry long before the guest
// reached it. The guest's limit becomes RLIMIT_NPROC, which the sentry
// enforces per user inside the sandbox; the host cgroup keeps a backstop
// scaled from it.
func adjustSpec(sp *specs.Spec) {
	dropClone3Rule(sp)
	// Every guest syscall is a round trip to the sentry (ptrace: ~80 µs
	// here); one P keeps the agent's Go runtime from starting threads it
	// does not need. Guest processes get their environment from the env
	// file, not from the agent's own.
	sp.Process.Env = append(sp.Process.Env, "GOMAXPROCS=1")
	r := sp.Linux.Resources
	if r == nil || r.Pids == nil || r.Pids.Limit == nil {
		return
	}
	guest := *r.Pids.Limit
	host := hostPIDs(guest)
	r.Pids.Limit = &host
	sp.Process.Rlimits = append(sp.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(guest), Soft: uint64(guest)})
}

// dropClone3Rule removes the profile's clone3 rule. The container profile
// makes clone3 fail with ENOSYS (its flags are in memory a filter cannot
// read) so that libc falls back to clone, whose flags are filtered. This
// runsc (20221219) applies --oci-seccomp errno rules as EPERM whatever
// errno they name, and glibc does not fall back on EPERM: every
// pthread_create in the guest failed. The sentry itself answers clone3
// with ENOSYS, so without the rule libc falls back to the filtered clone
// just the same (the gateway e2e tests on gvisor run curl, whose resolver
// starts a thread).
func dropClone3Rule(sp *specs.Spec) {
	if sp.Linux == nil || sp.Linux.Seccomp == nil {
		return
	}
	rules := sp.Linux.Seccomp.Syscalls[:0]
	for _, r := range sp.Linux.Seccomp.Syscalls {
		if len(r.Names) == 1 && r.Names[0] == "clone3" {
			continue
		}
		rules = append(rules, r)
	}
	sp.Linux.Seccomp.Syscalls = rules
}

// hostPIDs is the host cgroup's pids limit for a guest limit of guest.
func hostPIDs(guest int64) int64 { return 16*guest + 512 }

// ID implements isolation.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// State implements isolation.Sandbox.
func (s *Sandbox) State() isolation.State {
	b, _ := json.Marshal(s.sd)
	return isolation.State{ID: s.id, Runtime: Name, Data: b}
}

// Start implements isolation.Sandbox: runsc runs the agent as PID 1; Start
// returns once the agent answers on the host-only socket, so DialAgent
// works at once.
func (s *Sandbox) Start(ctx context.Context) error {
	s.mu.Lock()
	token, started := s.token, s.started
	s.started, s.token = true, ""
	s.mu.Unlock()
	if started {
		return errors.New("gvisor: sandbox already started")
	}
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
	cmd := s.sd.cli().Command(ctx, "run", "--detach", "--bundle", s.sd.path("bundle"), s.id)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	t0 := time.Now()
	if s.sd.NetNS != "" {
		err = runWithNetNSCheckMasked(s.sd.NetNS, cmd)
	} else {
		err = cmd.Run()
	}
	if err != nil {
		return fmt.Errorf("runsc run: %w: %s", err, runlog.Tail(s.sd.path("agent.log"), 512))
	}
	t1 := time.Now()
	err = s.adoptAgentSocket(ctx, token)
	slog.Debug("gvisor started", "sandbox", s.id, "runsc_run", t1.Sub(t0), "agent", time.Since(t1))
	return err
}

// adoptAgentSocket waits for the agent's socket in the run dir, links it to
// a host-only name, checks the agent answers there, and removes the name
// the guest sees: from then on no guest process can connect to the agent,
// replace its socket or remove it.
func (s *Sandbox) adoptAgentSocket(ctx context.Context, token string) error {
	ctx, cancel := context.WithTimeout(ctx, agentWait)
	defer cancel()
	guest, host := s.sd.path("run", guestSockName), s.sd.path(hostSockName)
	fail := func(what string, err error) error {
		return fmt.Errorf("gvisor: %s: %w (agent log: %s)", what, err, runlog.Tail(s.sd.path("agent.log"), 512))
	}
	for i := 0; ; i++ {
		fi, err := os.Lstat(guest)
		if err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		if i%25 == 24 {
			if st := s.sd.cli().Status(ctx, s.id); st != "running" && st != "created" {
				return fail("agent socket never appeared", fmt.Errorf("sandbox is %q", st))
			}
		}
		select {
		case <-ctx.Done():
			return fail("agent socket never appeared", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	_ = os.Remove(host)
	if err := os.Link(guest, host); err != nil {
		return fail("link agent socket", err)
	}
	// The agent accepts once it is serving; until then a connection may
	// be refused or wait in the backlog.
	var lastErr error
	for ctx.Err() == nil {
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", host)
		if err == nil {
			var c *agentproto.Client
			if c, err = agentproto.NewClient(ctx, conn, token); err == nil {
				c.Close()
				if err := os.Remove(guest); err != nil {
					return fail("hide agent socket from the guest", err)
				}
				return nil
			}
			conn.Close()
		}
		lastErr = err
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
	return fail("agent never answered", errors.Join(ctx.Err(), lastErr))
}

// DialAgent implements isolation.Sandbox.
func (s *Sandbox) DialAgent(ctx context.Context) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", s.sd.path(hostSockName))
	if err != nil {
		return nil, fmt.Errorf("dial agent: %w", err)
	}
	return c, nil
}

// Pause implements isolation.Sandbox: the sentry stops every guest task.
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

// OOMKills implements isolation.OOMCounter. gVisor has no OOM killer of its
// own: a guest over its memory limit makes the host kill the sandbox's
// sentry (and with it the whole guest), which this counts.
func (s *Sandbox) OOMKills() (uint64, error) {
	return cgroups.OOMKills(s.sd.CgroupsPath)
}

// OOMKillsSandbox implements isolation.OOMScope: true, as the sentry (this
// runsc) has no guest OOM killer; reaching the memory limit ends the whole
// sandbox.
func (s *Sandbox) OOMKillsSandbox() bool { return true }

// Destroy implements isolation.Sandbox: delete the runsc container (which
// kills the sandbox), kill any of its processes that outlived that, unmount
// its root, remove its cgroups and state. Idempotent.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	s.started, s.token = true, ""
	s.mu.Unlock()
	var errs []error
	if err := s.sd.cli().Delete(ctx, s.id); err != nil {
		errs = append(errs, err)
	}
	if err := s.killProcesses(ctx); err != nil {
		errs = append(errs, err)
	}
	// A container whose start failed before runsc saved its state is
	// unknown to `runsc delete`, which leaves its lock file behind.
	if err := s.removeRunscRecord(); err != nil {
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

// removeRunscRecord removes what runsc keeps of this container in its
// state root ("ID_sandbox:ID.state", ".lock"), once its processes are gone.
func (s *Sandbox) removeRunscRecord() error {
	ents, err := os.ReadDir(s.sd.StateRoot)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("gvisor: read runsc state root: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), s.id+"_sandbox:") {
			if err := os.RemoveAll(filepath.Join(s.sd.StateRoot, e.Name())); err != nil {
				errs = append(errs, fmt.Errorf("gvisor: remove runsc record: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// processes lists the host processes of this sandbox (runsc's sandbox and
// gofer processes and the sentry's stubs): every one has the sandbox's
// bundle directory in its command line.
func (s *Sandbox) processes() []int {
	bundle := []byte(s.sd.path("bundle"))
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, arg := range bytes.Split(cmdline, []byte{0}) {
			if bytes.Equal(arg, bundle) || bytes.HasSuffix(arg, append([]byte("="), bundle...)) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// killProcesses kills what runsc delete left running and waits for it.
func (s *Sandbox) killProcesses(ctx context.Context) error {
	pids := s.processes()
	if len(pids) == 0 {
		return nil
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if len(s.processes()) == 0 {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	if left := s.processes(); len(left) > 0 {
		return fmt.Errorf("gvisor: processes %v of sandbox %s survived SIGKILL", left, s.id)
	}
	return nil
}

// Leftovers implements isolation.LeakChecker: cgroups, mounts, the state
// dir, runsc's record and host processes of the sandbox.
func (s *Sandbox) Leftovers(ctx context.Context) []string {
	var out []string
	out = append(out, cgroups.Existing(s.sd.CgroupsPath)...)
	if _, err := os.Stat(s.sd.Dir); err == nil {
		out = append(out, "state dir "+s.sd.Dir)
	}
	out = append(out, oci.MountsBelow(s.sd.Dir)...)
	if st := s.sd.cli().Status(ctx, s.id); st != "" {
		out = append(out, "runsc container in state "+st)
	}
	if ents, err := os.ReadDir(s.sd.StateRoot); err == nil {
		for _, e := range ents {
			if strings.Contains(e.Name(), s.id) {
				out = append(out, "runsc state "+filepath.Join(s.sd.StateRoot, e.Name()))
			}
		}
	}
	for _, pid := range s.processes() {
		out = append(out, "process "+strconv.Itoa(pid))
	}
	return out
}

// Recover implements isolation.Runtime.
func (rt *Runtime) Recover(ctx context.Context, st isolation.State) (isolation.Sandbox, error) {
	var sd stateData
	if err := json.Unmarshal(st.Data, &sd); err != nil {
		return nil, fmt.Errorf("gvisor: decode state of %s: %w", st.ID, err)
	}
	s := &Sandbox{id: st.ID, sd: sd, started: true}
	switch sd.cli().Status(ctx, s.id) {
	case "running", "paused":
		// A daemon that died inside Start may not have moved the agent's
		// socket out of the guest's view yet.
		guest, host := sd.path("run", guestSockName), sd.path(hostSockName)
		if _, err := os.Lstat(host); errors.Is(err, os.ErrNotExist) {
			if err := os.Link(guest, host); err != nil {
				return nil, fmt.Errorf("gvisor sandbox %s: recover agent socket: %w", st.ID, err)
			}
			_ = os.Remove(guest)
		}
		return s, nil
	}
	_ = s.Destroy(ctx)
	return nil, fmt.Errorf("gvisor sandbox %s: %w", st.ID, isolation.ErrGone)
}
