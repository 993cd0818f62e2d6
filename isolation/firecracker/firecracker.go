// Package firecracker is a hypervisor-class runtime: each sandbox is a
// Firecracker microVM started by Firecracker's jailer (chroot, its own
// uid/gid, cgroup, the sandbox's network namespace, a new PID namespace),
// booting the same Debian kernel (as an ELF vmlinux), initramfs and ext4
// image disk as the qemu runtime (package vmimage), with cagebox-agent over
// vsock (Firecracker's hybrid vsock: a unix socket on the host and a
// "CONNECT <port>" handshake) and a TAP redirected to the sandbox's routed
// link (package vmnet). It needs /dev/kvm and the firecracker and jailer
// binaries; docs/operator.md says how to install them and run the
// conformance suite on a KVM host.
//
// firecracker-go-sdk (v1.0.0) provides the API client and its models; the
// jailer's command line and the VMM's lifecycle are this package's (see
// jailerArgs for why).
package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/internal/vmproc"

	sdk "github.com/firecracker-microvm/firecracker-go-sdk"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/cgroups"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/kvm"
	"github.com/cagebox/cagebox/internal/vmimage"
	"github.com/cagebox/cagebox/internal/vmnet"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/internal/runlog"
)

// Name is the runtime's registry name.
const Name = "firecracker"

// DefaultUIDBase and DefaultUIDCount are the uids jailed VMMs run as, one
// per sandbox (no user owns them; the qemu runtime uses the range below).
const (
	DefaultUIDBase  = 0x6cc00000
	DefaultUIDCount = 1 << 16
)

// Options configure the runtime.
type Options struct {
	// Firecracker and Jailer are the binaries ("" = $CAGEBOX_FIRECRACKER_BIN
	// / $CAGEBOX_JAILER_BIN, else "firecracker" / "jailer" on PATH). The
	// jailer requires the Firecracker binary's file name to contain
	// "firecracker".
	Firecracker, Jailer string
	// Dir is the VM artifact cache shared with the qemu runtime
	// ($CAGEBOX_HOME/vm).
	Dir string
	// ChrootBase is the jailer's --chroot-base-dir ($CAGEBOX_HOME/jail).
	ChrootBase string
	// KVM is the KVM device (default /dev/kvm).
	KVM string
	// Probe proves KVM can run the guest kernel here: the qemu runtime's
	// verdict (qemu.Runtime.KVM), shared so the host is probed once. A
	// /dev/kvm that opens is not enough (a paravirtual nested KVM opens
	// but boots only kernels built for it). Nil: KVM counts as unproven
	// and the runtime as unavailable.
	Probe func() kvm.Verdict
	// UIDBase and UIDCount: the range of VMM uids (0 = defaults).
	UIDBase, UIDCount uint32
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Runtime starts Firecracker microVMs.
type Runtime struct {
	fc, jailer, chrootBase, kvm string
	cache                       *vmimage.Cache
	log                         *slog.Logger
	probe                       func() kvm.Verdict
	// uids are the VMM uids of the sandboxes this process created or
	// recovered and has not destroyed.
	uids *vmproc.UIDPool
}

var _ isolation.Runtime = (*Runtime)(nil)

// New returns the runtime; Available says whether it can run here.
func New(o Options) *Runtime {
	pick := func(v, env, def string) string {
		if v != "" {
			return v
		}
		if e := os.Getenv(env); e != "" {
			return e
		}
		return def
	}
	rt := &Runtime{
		fc:         pick(o.Firecracker, "CAGEBOX_FIRECRACKER_BIN", "firecracker"),
		jailer:     pick(o.Jailer, "CAGEBOX_JAILER_BIN", "jailer"),
		chrootBase: o.ChrootBase,
		kvm:        pick(o.KVM, "", "/dev/kvm"),
		cache:      &vmimage.Cache{Dir: o.Dir},
		log:        o.Logger,
		probe:      o.Probe,
	}
	if rt.chrootBase == "" {
		rt.chrootBase = "/srv/cagebox-jail"
	}
	if o.UIDBase == 0 {
		o.UIDBase = DefaultUIDBase
	}
	if o.UIDCount == 0 {
		o.UIDCount = DefaultUIDCount
	}
	rt.uids = vmproc.NewUIDPool(o.UIDBase, o.UIDCount)
	if rt.log == nil {
		rt.log = slog.Default()
	}
	for _, p := range []*string{&rt.fc, &rt.jailer} {
		if abs, err := exec.LookPath(*p); err == nil {
			*p = abs
		}
	}
	return rt
}

// Name implements isolation.Runtime.
func (rt *Runtime) Name() string { return Name }

// Class implements isolation.Runtime.
func (rt *Runtime) Class() isolation.Class { return isolation.Hypervisor }

// Available implements isolation.Runtime: it names everything missing.
func (rt *Runtime) Available() error {
	var missing []string
	if f, err := os.OpenFile(rt.kvm, os.O_RDWR, 0); err != nil {
		missing = append(missing, fmt.Sprintf("%s cannot be opened read-write (%v): Firecracker needs KVM (a bare-metal host or nested virtualisation)", rt.kvm, errors.Unwrap(err)))
	} else {
		f.Close()
	}
	for _, b := range []struct{ name, path, env string }{{"firecracker", rt.fc, "CAGEBOX_FIRECRACKER_BIN"}, {"jailer", rt.jailer, "CAGEBOX_JAILER_BIN"}} {
		if _, err := exec.LookPath(b.path); err != nil {
			missing = append(missing, fmt.Sprintf("the %s binary (%s) is not installed: put firecracker and jailer from a Firecracker release on PATH or set %s (docs/operator.md)", b.name, b.path, b.env))
		}
	}
	if !strings.Contains(filepath.Base(rt.fc), "firecracker") {
		missing = append(missing, fmt.Sprintf("the jailer only runs a binary whose file name contains \"firecracker\": rename %s", rt.fc))
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "the firecracker runtime needs root (jailer, network namespaces, cgroups): run the daemon as root")
	}
	if len(missing) == 0 {
		if _, err := rt.cache.Kernel(); err != nil {
			missing = append(missing, err.Error())
		}
	}
	if kerr := kvm.Open(rt.kvm); kerr == nil {
		// The device opens: is KVM proven to run the guest? (Asked even
		// when something else is missing: it is cached and it is what an
		// operator needs to know next.)
		switch {
		case rt.probe == nil:
			missing = append(missing, "KVM is not proven here (no probe configured): Firecracker needs a KVM that boots the guest kernel")
		default:
			if v := rt.probe(); !v.Usable {
				missing = append(missing, "KVM cannot run the guest kernel here, so neither can Firecracker: "+v.String())
			}
		}
	}
	if len(missing) > 0 {
		return errors.New(strings.Join(missing, "; "))
	}
	return nil
}

// Detail implements the daemon's runtime description.
func (rt *Runtime) Detail() string {
	d := "firecracker microvm via jailer, vsock agent, kernel " + vmimage.KernelRelease
	if rt.probe != nil && kvm.Open(rt.kvm) == nil {
		d += ", " + rt.probe().String()
	}
	return d
}

// stateData is what Recover and Destroy need.
type stateData struct {
	ID       string      `json:"id"`
	Dir      string      `json:"dir"`       // the sandbox's state dir
	JailDir  string      `json:"jail_dir"`  // <base>/<exec file name>/<id>
	JailRoot string      `json:"jail_root"` // JailDir/root
	PIDFile  string      `json:"pid_file"`  // the jailer's pid file, in the jail
	UID      uint32      `json:"uid"`
	Cgroup   string      `json:"cgroup"` // the jailer's cgroup, relative to each hierarchy
	Net      *vmnet.Link `json:"net,omitempty"`
}

func (sd *stateData) vmmFile() string { return filepath.Join(sd.Dir, "vmm.pid") }
func (sd *stateData) logFile() string { return filepath.Join(sd.Dir, "vmm.log") }

// Sandbox is one microVM.
type Sandbox struct {
	rt  *Runtime
	sd  stateData
	log *slog.Logger

	// mu guards the fields below.
	mu sync.Mutex
	// cfg and jailArgs are set between Create and Start.
	cfg      *vmConfig
	jailArgs []string
	started  bool
	// proc is the VMM once it is known.
	proc *vmm
}

var (
	_ isolation.Sandbox     = (*Sandbox)(nil)
	_ isolation.LeakChecker = (*Sandbox)(nil)
)

// jailID is what the jailer accepts as --id.
var jailID = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)

// Create implements isolation.Runtime: the jail is populated (kernel,
// sandbox initramfs with the agent's token, image disk), the TAP joined to
// the routed link; nothing runs until Start.
func (rt *Runtime) Create(ctx context.Context, spec *isolation.Spec) (_ isolation.Sandbox, err error) {
	if err := rt.Available(); err != nil {
		return nil, fmt.Errorf("%w: %v", isolation.ErrUnavailable, err)
	}
	if spec.ID == "" || spec.StateDir == "" || spec.RootFS == "" || spec.AgentPath == "" || spec.AgentToken == "" {
		return nil, errors.New("firecracker: spec needs ID, StateDir, RootFS, AgentPath and AgentToken")
	}
	if !jailID.MatchString(spec.ID) {
		return nil, fmt.Errorf("firecracker: sandbox id %q is not a jailer id (letters, digits and '-', at most 64)", spec.ID)
	}
	res := spec.Resources.WithDefaults()
	vcpus, memMiB, err := machineSize(res)
	if err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	root := jailRoot(rt.chrootBase, rt.fc, spec.ID)
	s := &Sandbox{rt: rt, log: rt.log.With("sandbox", spec.ID), sd: stateData{
		ID: spec.ID, Dir: spec.StateDir,
		JailDir: filepath.Dir(root), JailRoot: root,
		PIDFile: filepath.Join(root, filepath.Base(rt.fc)+".pid"),
		Cgroup:  jailCgroup(rt.fc, spec.ID),
	}}
	if _, err := os.Stat(s.sd.JailDir); err == nil {
		return nil, fmt.Errorf("firecracker: a jail for %s already exists at %s: destroy that sandbox first", spec.ID, s.sd.JailDir)
	}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	// Destroy undoes every step below, in order, from whatever was made.
	undo.Add(func() { _ = s.Destroy(context.Background()) })

	uid, err := rt.uids.Pick(spec.ID)
	if err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	s.sd.UID = uid

	if err := statedir.Make(spec.StateDir); err != nil {
		return nil, fmt.Errorf("firecracker: state dir: %w", err)
	}
	arts, err := rt.cache.Artifacts(ctx, spec.RootFS, spec.AgentPath)
	if err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	vmlinux := filepath.Join(filepath.Dir(arts.Kernel), "vmlinux")
	if _, err := os.Stat(vmlinux); err != nil {
		if err := vmimage.ExtractVmlinux(ctx, arts.Kernel, vmlinux); err != nil {
			return nil, fmt.Errorf("firecracker: %w", err)
		}
	}
	if err := os.MkdirAll(s.sd.JailRoot, 0o755); err != nil {
		return nil, fmt.Errorf("firecracker: jail: %w", err)
	}
	for src, dst := range map[string]string{vmlinux: jailKernel, arts.RootDisk: jailRootfs} {
		if err := linkOrCopy(src, filepath.Join(s.sd.JailRoot, dst)); err != nil {
			return nil, fmt.Errorf("firecracker: jail %s: %w", dst, err)
		}
	}
	vc := &agentproto.VMConfig{
		Token: spec.AgentToken, Env: spec.Env, Hostname: spec.Hostname,
		Nameserver: spec.Nameserver, TrustedCAPEM: string(spec.TrustedCAPEM),
		PIDs: res.PIDs, DiskBytes: res.DiskBytes,
	}
	initrd := filepath.Join(s.sd.JailRoot, jailInitrd)
	if err := vmimage.WriteSandboxInitrd(initrd, arts.Initrd, vc); err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	if err := os.Chown(initrd, int(uid), int(uid)); err != nil {
		return nil, fmt.Errorf("firecracker: initramfs owner: %w", err)
	}
	mac := ""
	if spec.NetNS != "" {
		ln, tap, err := vmnet.Setup(guestOf(spec), int(uid))
		if err != nil {
			return nil, fmt.Errorf("firecracker: network: %w", err)
		}
		tap.Close() // persistent, owned by the VMM's uid: Firecracker opens it by name
		s.sd.Net, mac = ln, ln.MAC
	}
	s.cfg = buildConfig(spec, vcpus, memMiB, mac)
	s.jailArgs = jailerArgs(jailSpec{
		ID: spec.ID, Firecracker: rt.fc, ChrootBase: rt.chrootBase, NetNS: spec.NetNS, UID: uid,
		CgroupV2: cgroups.Detect() == cgroups.V2, MemoryBytes: memMiB<<20 + vmmOverhead, CPUs: res.CPUs,
	})
	return s, nil
}

// linkOrCopy puts src into the jail: a hard link where it can (same
// filesystem), else a read-only copy streamed through a temporary file.
// The artifacts are root's and world-readable, so the VMM can read them
// and not change them.
func linkOrCopy(src, dst string) (err error) {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o444)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// ID implements isolation.Sandbox.
func (s *Sandbox) ID() string { return s.sd.ID }

// State implements isolation.Sandbox.
func (s *Sandbox) State() isolation.State {
	b, _ := json.Marshal(s.sd)
	return isolation.State{ID: s.sd.ID, Runtime: Name, Data: b}
}

func (s *Sandbox) client() *sdk.Client {
	return newAPIClient(filepath.Join(s.sd.JailRoot, jailAPI))
}

// Start implements isolation.Sandbox: the jailer starts Firecracker (which
// it leaves in a new PID namespace, writing its pid in the jail), then the
// VM is configured over the API socket and booted. ctx bounds the start
// only: the VMM is not the daemon's child and outlives it.
func (s *Sandbox) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.cfg == nil {
		return errors.New("firecracker: sandbox already started")
	}
	s.started = true
	logf, err := runlog.Open(s.sd.logFile())
	if err != nil {
		return fmt.Errorf("firecracker: open vmm log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(s.rt.jailer, s.jailArgs...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: a signal to the daemon's process group (^C on a
	// foreground daemon) does not reach the VMM.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("firecracker: start jailer %s: %w", s.rt.jailer, err)
	}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	undo.Add(func() { killCgroup(s.sd.Cgroup) })
	// With --new-pid-ns the jailer forks Firecracker into the new
	// namespace and records its pid in the jail; the jailer itself is
	// reaped here and an early failure of it reported.
	jailerDone := make(chan error, 1)
	go func() { jailerDone <- cmd.Wait() }()
	pid, err := waitJailPID(ctx, s.sd.PIDFile, jailerDone)
	if err != nil {
		return fmt.Errorf("firecracker: %w (log: %s)", err, runlog.Tail(s.sd.logFile(), 512))
	}
	p, err := waitIdentify(ctx, pid, s.sd.ID, s.sd.UID)
	if err != nil {
		return fmt.Errorf("firecracker: %w (log: %s)", err, runlog.Tail(s.sd.logFile(), 512))
	}
	undo.Add(func() { _ = p.Kill() })
	if err := vmproc.WriteFile(s.sd.vmmFile(), p); err != nil {
		return fmt.Errorf("firecracker: %w", err)
	}
	s.proc = p
	c := s.client()
	if err := s.waitAPI(ctx, p); err != nil {
		return err
	}
	if err := configure(ctx, c, s.cfg); err != nil {
		return fmt.Errorf("firecracker: configure VM (%s): %w (log: %s)", s.cfg, err, runlog.Tail(s.sd.logFile(), 512))
	}
	s.log.Debug("firecracker started", "pid", p.PID, "uid", s.sd.UID, "vm", s.cfg.String())
	s.cfg, s.jailArgs = nil, nil
	return nil
}

// waitAPI waits until Firecracker accepts connections on its API socket.
func (s *Sandbox) waitAPI(ctx context.Context, p *vmm) error {
	api := filepath.Join(s.sd.JailRoot, jailAPI)
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := dialJailed(ctx, api)
		if err == nil {
			c.Close()
			return nil
		}
		if !p.Alive() {
			return fmt.Errorf("firecracker exited before serving its API (log: %s)", runlog.Tail(s.sd.logFile(), 512))
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("firecracker: no API socket at %s: %w", api, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// DialAgent implements isolation.Sandbox over Firecracker's hybrid vsock.
func (s *Sandbox) DialAgent(ctx context.Context) (net.Conn, error) {
	return dialVsock(ctx, filepath.Join(s.sd.JailRoot, jailVsock), agentproto.VMVsockPort)
}

// Pause implements isolation.Sandbox: the vCPUs stop (PATCH /vm Paused).
func (s *Sandbox) Pause(ctx context.Context) error {
	if _, err := s.client().PatchVM(ctx, &models.VM{State: sdk.String(models.VMStatePaused)}); err != nil {
		return apiError("pause", err)
	}
	return nil
}

// Resume implements isolation.Sandbox.
func (s *Sandbox) Resume(ctx context.Context) error {
	if _, err := s.client().PatchVM(ctx, &models.VM{State: sdk.String(models.VMStateResumed)}); err != nil {
		return apiError("resume", err)
	}
	return nil
}

// vmmProc is the sandbox's VMM if it runs: the one Start or Recover
// found, else the one its pid files name (checked to be this sandbox's).
func (s *Sandbox) vmmProc() *vmm {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p.Alive() {
		return p
	}
	if p, err := vmproc.ReadFile(s.sd.vmmFile()); err == nil && p.Alive() && isJailedVMM(p.PID, s.sd.ID, s.sd.UID) {
		return p
	}
	if pid, err := readJailPID(s.sd.PIDFile); err == nil {
		if p, err := identify(pid, s.sd.ID, s.sd.UID); err == nil {
			return p
		}
	}
	return nil
}

// Stop implements isolation.Sandbox: Ctrl-Alt-Del (the guest init turns it
// into the agent's SIGTERM; the agent stops its processes within its own
// grace and the init powers off, which ends Firecracker), then SIGKILL
// after grace. A paused VM is resumed first so that it can shut down.
func (s *Sandbox) Stop(ctx context.Context, grace time.Duration) error {
	p := s.vmmProc()
	if p == nil {
		return nil
	}
	c := s.client()
	if info, err := c.GetInstanceInfo(ctx); err == nil && info.Payload != nil && info.Payload.State != nil && *info.Payload.State == models.InstanceInfoStatePaused {
		if err := s.Resume(ctx); err != nil {
			s.log.Warn("stop: resume the paused VM", "err", err)
		}
	}
	if _, err := c.CreateSyncAction(ctx, &models.InstanceActionInfo{ActionType: sdk.String(models.InstanceActionInfoActionTypeSendCtrlAltDel)}); err != nil {
		// aarch64 has no Ctrl-Alt-Del; the kill below stops the VM.
		s.log.Debug("stop: ctrl-alt-del", "err", apiError("send ctrl-alt-del", err))
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	for p.Alive() {
		select {
		case <-ctx.Done():
			return p.Kill()
		case <-t.C:
			if err := p.Kill(); err != nil {
				return err
			}
			if !waitGone(ctx, p, "", 5*time.Second) {
				return fmt.Errorf("firecracker %d did not exit after SIGKILL", p.PID)
			}
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// waitGone waits until p has exited and the cgroup (if any) is empty.
func waitGone(ctx context.Context, p *vmm, cgroup string, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		if !p.Alive() && (cgroup == "" || len(cgroupProcs(cgroup)) == 0) {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Destroy implements isolation.Sandbox: it kills the VMM (and anything
// else in its cgroup), undoes the network plumbing, and removes the jail,
// the cgroup and the state dir. It is idempotent and works on a half-made
// sandbox.
func (s *Sandbox) Destroy(ctx context.Context) error {
	var errs []error
	p := s.vmmProc()
	if err := p.Kill(); err != nil {
		errs = append(errs, err)
	}
	killCgroup(s.sd.Cgroup)
	if !waitGone(ctx, p, s.sd.Cgroup, 5*time.Second) {
		errs = append(errs, fmt.Errorf("firecracker of %s did not exit after SIGKILL", s.sd.ID))
	}
	if s.sd.Net != nil {
		if err := s.sd.Net.Teardown(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.sd.JailDir != "" {
		if err := os.RemoveAll(s.sd.JailDir); err != nil {
			errs = append(errs, fmt.Errorf("remove jail: %w", err))
		}
	}
	if s.sd.Cgroup != "" {
		if err := cgroups.Remove(s.sd.Cgroup); err != nil {
			errs = append(errs, err)
		}
	}
	if s.sd.Dir != "" {
		if err := os.RemoveAll(s.sd.Dir); err != nil {
			errs = append(errs, fmt.Errorf("remove state dir: %w", err))
		}
	}
	s.mu.Lock()
	s.proc = nil
	s.mu.Unlock()
	if len(errs) == 0 && s.sd.UID != 0 {
		s.rt.uids.Release(s.sd.UID)
	}
	return errors.Join(errs...)
}

// Leftovers implements isolation.LeakChecker.
func (s *Sandbox) Leftovers(ctx context.Context) []string {
	var out []string
	if p := s.vmmProc(); p != nil {
		out = append(out, fmt.Sprintf("firecracker process %d", p.PID))
	}
	if s.sd.Cgroup != "" {
		for _, pid := range cgroupProcs(s.sd.Cgroup) {
			out = append(out, fmt.Sprintf("process %d in cgroup %s", pid, s.sd.Cgroup))
		}
		out = append(out, cgroups.Existing(s.sd.Cgroup)...)
	}
	for _, d := range []string{s.sd.JailDir, s.sd.Dir} {
		if _, err := os.Stat(d); d != "" && err == nil {
			out = append(out, "directory "+d)
		}
	}
	if s.sd.Net != nil {
		out = append(out, s.sd.Net.Leftovers()...)
	}
	return out
}

// Recover implements isolation.Runtime: a sandbox whose VMM still runs is
// re-attached; one whose VMM is gone is destroyed and reported gone.
func (rt *Runtime) Recover(ctx context.Context, st isolation.State) (isolation.Sandbox, error) {
	s := &Sandbox{rt: rt, log: rt.log.With("sandbox", st.ID), started: true}
	if err := json.Unmarshal(st.Data, &s.sd); err != nil {
		return nil, fmt.Errorf("firecracker: decode state of %s: %w", st.ID, err)
	}
	if s.sd.ID == "" || s.sd.ID != st.ID {
		return nil, fmt.Errorf("firecracker: state of %s names sandbox %q", st.ID, s.sd.ID)
	}
	if s.sd.PIDFile == "" && s.sd.JailRoot != "" {
		s.sd.PIDFile = filepath.Join(s.sd.JailRoot, filepath.Base(rt.fc)+".pid")
	}
	if s.sd.UID != 0 {
		rt.uids.Reserve(s.sd.UID)
	}
	if p := s.vmmProc(); p != nil {
		s.proc = p
		return s, nil
	}
	if err := s.Destroy(ctx); err != nil {
		s.log.Warn("recover: clean up a sandbox whose VMM is gone", "err", err)
	}
	return nil, fmt.Errorf("firecracker %s: %w", st.ID, isolation.ErrGone)
}

// guestOf is the spec's routed link, for vmnet.Setup (which sits below
// isolation and takes its fields, not the spec).
func guestOf(spec *isolation.Spec) vmnet.Guest {
	return vmnet.Guest{NetNS: spec.NetNS, GuestIf: spec.GuestIf, Addr: spec.GuestAddr, Gateway: spec.Gateway, Prefix: spec.Prefix}
}
