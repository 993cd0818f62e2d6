package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/oci"
)

// agentWait bounds how long Start waits for the agent to answer when its
// context has no earlier deadline.
const agentWait = 30 * time.Second

// guestSockName is where the agent binds its socket, in the run dir (which
// the guest sees at oci.GuestRunDir); Start gives it the host-only name
// oci.AgentSocket.
const guestSockName = "agent.sock"

// Sandbox is one gVisor sandbox (one runsc container): an oci.Sandbox
// whose agent binds its own socket, which Start takes out of the guest's
// view.
type Sandbox struct {
	*oci.Sandbox

	// mu guards token and started.
	mu sync.Mutex
	// token is the agent's token between Create and Start (Start checks
	// the agent answers before it returns); never stored.
	token   string
	started bool
	// audit is the strace reader of an audited sandbox (nil otherwise,
	// and after a daemon restart).
	audit *straceReader
	// auditFlags are runsc flags only `runsc run` gets (strace).
	auditFlags []string
}

var (
	_ isolation.Sandbox     = (*Sandbox)(nil)
	_ isolation.OOMCounter  = (*Sandbox)(nil)
	_ isolation.OOMScope    = (*Sandbox)(nil)
	_ isolation.LeakChecker = (*Sandbox)(nil)
	_ isolation.Snapshotter = (*Sandbox)(nil)
)

// hooks are what gVisor sandboxes add to oci.Sandbox.
var hooks = oci.Hooks{
	AfterDelete: afterDelete,
	Leftovers:   leftovers,
	Recovered:   recoverAgentSocket,
}

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
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	st := oci.NewState(spec, rt.binary, rt.stateRoot, rt.globalFlags(spec.ID, network))
	// RootTmp: without a /tmp mount in the spec runsc mounts a tmpfs in
	// the sentry's memory there, which snapshots cannot see and the
	// sandbox's disk limit does not bound.
	base, err := oci.Create(Name, spec, st, oci.BundleOptions{AgentListen: "unix:" + oci.GuestRunDir + "/" + guestSockName, RootTmp: true}, adjustSpec, hooks, &undo)
	if err != nil {
		return nil, err
	}
	if err := statedir.Make(rt.stateRoot); err != nil {
		return nil, fmt.Errorf("create runsc state root: %w", err)
	}
	sb := &Sandbox{Sandbox: base, token: spec.AgentToken}
	if !spec.Audit.Classes.Empty() {
		if spec.Audit.Sink == nil {
			return nil, errors.New("gvisor: audit needs a sink")
		}
		fifo := auditPath(spec.StateDir)
		if sb.audit, err = startStrace(fifo, spec.Audit, rt.log.With("sandbox", spec.ID)); err != nil {
			return nil, err
		}
		undo.Add(func() { sb.audit.Close(fifo) })
		sb.auditFlags = straceFlags(spec.Audit.Classes, fifo)
	}
	return sb, nil
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
	var run func(*exec.Cmd) error
	if netns := s.Data().NetNS; netns != "" {
		run = func(cmd *exec.Cmd) error { return runWithNetNSCheckMasked(netns, cmd) }
	}
	if len(s.auditFlags) > 0 {
		run = withFlags(run, s.auditFlags)
	}
	t0 := time.Now()
	if err := s.Run(ctx, nil, nil, run); err != nil {
		return err
	}
	t1 := time.Now()
	err := s.adoptAgentSocket(ctx, token)
	slog.Debug("gvisor started", "sandbox", s.ID(), "runsc_run", t1.Sub(t0), "agent", time.Since(t1))
	return err
}

// adoptAgentSocket waits for the agent's socket in the run dir, links it to
// a host-only name, checks the agent answers there, and removes the name
// the guest sees: from then on no guest process can connect to the agent,
// replace its socket or remove it.
func (s *Sandbox) adoptAgentSocket(ctx context.Context, token string) error {
	ctx, cancel := context.WithTimeout(ctx, agentWait)
	defer cancel()
	guest, host := filepath.Join(s.RunDirPath(), guestSockName), s.Path(oci.AgentSocket)
	fail := func(what string, err error) error {
		return fmt.Errorf("gvisor: %s: %w (agent log: %s)", what, err, s.LogTail())
	}
	for i := 0; ; i++ {
		fi, err := os.Lstat(guest)
		if err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		if i%25 == 24 {
			if st := s.CLI().Status(ctx, s.ID()); st != "running" && st != "created" {
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

// OOMKillsSandbox implements isolation.OOMScope: true, as the sentry (this
// runsc) has no guest OOM killer; reaching the memory limit makes the host
// kill the sentry, ending the whole sandbox (which OOMKills counts).
func (s *Sandbox) OOMKillsSandbox() bool { return true }

// Destroy implements isolation.Sandbox: delete the runsc container (which
// kills the sandbox), kill any of its processes that outlived that, remove
// runsc's record, unmount its root, remove its cgroups and state.
// Idempotent.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	s.started, s.token = true, ""
	s.mu.Unlock()
	err := s.Sandbox.Destroy(ctx)
	if s.audit != nil {
		s.audit.Close(auditPath(s.Data().Dir))
	}
	return err
}

// afterDelete kills what `runsc delete` left running and removes runsc's
// record: a container whose start failed before runsc saved its state is
// unknown to `runsc delete`, which leaves its lock file behind.
func afterDelete(ctx context.Context, s *oci.Sandbox) error {
	return errors.Join(killProcesses(ctx, s), removeRunscRecord(s))
}

// removeRunscRecord removes what runsc keeps of this container in its
// state root ("ID_sandbox:ID.state", ".lock"), once its processes are gone.
func removeRunscRecord(s *oci.Sandbox) error {
	root := s.Data().StateRoot
	ents, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("gvisor: read runsc state root: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), s.ID()+"_sandbox:") {
			if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
				errs = append(errs, fmt.Errorf("gvisor: remove runsc record: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// processes lists the host processes of this sandbox (runsc's sandbox and
// gofer processes and the sentry's stubs): every one has the sandbox's
// bundle directory in its command line.
func processes(s *oci.Sandbox) []int {
	bundle := []byte(s.BundlePath())
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
func killProcesses(ctx context.Context, s *oci.Sandbox) error {
	pids := processes(s)
	if len(pids) == 0 {
		return nil
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if len(processes(s)) == 0 {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	if left := processes(s); len(left) > 0 {
		return fmt.Errorf("gvisor: processes %v of sandbox %s survived SIGKILL", left, s.ID())
	}
	return nil
}

// leftovers lists runsc's record and the host processes of the sandbox.
func leftovers(ctx context.Context, s *oci.Sandbox) []string {
	var out []string
	root := s.Data().StateRoot
	if ents, err := os.ReadDir(root); err == nil {
		for _, e := range ents {
			if strings.Contains(e.Name(), s.ID()) {
				out = append(out, "runsc state "+filepath.Join(root, e.Name()))
			}
		}
	}
	for _, pid := range processes(s) {
		out = append(out, "process "+strconv.Itoa(pid))
	}
	return out
}

// Recover implements isolation.Runtime.
func (rt *Runtime) Recover(ctx context.Context, st isolation.State) (isolation.Sandbox, error) {
	base, err := oci.Recover(ctx, Name, st, hooks)
	if err != nil {
		return nil, err
	}
	return &Sandbox{Sandbox: base, started: true}, nil
}

// recoverAgentSocket moves the agent's socket out of the guest's view: a
// daemon that died inside Start may not have done it yet.
func recoverAgentSocket(s *oci.Sandbox) error {
	guest, host := filepath.Join(s.RunDirPath(), guestSockName), s.Path(oci.AgentSocket)
	if _, err := os.Lstat(host); errors.Is(err, os.ErrNotExist) {
		if err := os.Link(guest, host); err != nil {
			return fmt.Errorf("recover agent socket: %w", err)
		}
		_ = os.Remove(guest)
	}
	return nil
}
