// Package qemu is the hypervisor-class runtime: each sandbox is a QEMU
// microvm (KVM when a probe boot proves it works here, TCG otherwise) booting the pinned
// Debian kernel and an initramfs whose /init is cagebox-agent (see package
// vmimage for the artifacts and cmd/cagebox-agent for the guest side).
//
// Devices: a read-only virtio-blk disk (the image as ext4), a virtio-serial
// port for the agent (QEMU serves it on a unix socket the daemon created),
// a virtio-net NIC on a TAP joined to the sandbox's veth (only with a
// network), the serial console into a log file, and QMP on a second private
// socket for pause, resume and power-down.
//
// QEMU is confined: it runs as a uid of its own (from a range no user
// owns), with no capabilities, -sandbox (seccomp), in its own cgroup
// (memory = guest RAM + bounded overhead, pids), in the sandbox's network
// namespace (or a new empty one), and it opens no host path of ours: the
// kernel, initramfs, disk, sockets and TAP are descriptors it inherits.
//
// Templates (template.go, restore.go): a sandbox whose inputs (kernel,
// agent, image, size, NIC) have a saved template is restored from it —
// guest RAM shared copy-on-write from a sealed memfd, device state
// migrated in — instead of cold-booted, and must then be claimed
// (isolation.Claimable) to become itself. A cold boot builds its inputs'
// template in the background. Sandboxes can also be hibernated whole
// (hibernate.go, isolation.Hibernator).
package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/cgroups"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/kvm"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/internal/vmimage"
	"github.com/cagebox/cagebox/internal/vmnet"
	"github.com/cagebox/cagebox/internal/vmproc"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/internal/runlog"
)

// Name is the runtime's registry name.
const Name = "qemu"

// Defaults.
const (
	// DefaultUIDBase and DefaultUIDCount are the uids QEMU processes run
	// as, one per sandbox (no user owns them).
	DefaultUIDBase  = 0x6cb00000
	DefaultUIDCount = 1 << 16
	// vmmOverheadBytes is what QEMU may use beyond guest RAM (its own
	// code and heap, the TCG translation cache of 64 MiB, I/O buffers).
	vmmOverheadBytes = 256 << 20
	// vmmPIDs bounds QEMU's threads (vCPUs, I/O workers, RCU).
	vmmPIDs = 256
	// CgroupParent holds every VM's cgroup (beside the containers').
	CgroupParent = "cagebox"
)

// Options configure the runtime.
type Options struct {
	// Dir is the VM artifact cache ($CAGEBOX_HOME/vm).
	Dir string
	// Binary is qemu-system-x86_64 ("" = from PATH).
	Binary string
	// UIDBase and UIDCount: the range of uids for QEMU processes
	// (0 = defaults).
	UIDBase, UIDCount uint32
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Device is the KVM device ("" = /dev/kvm).
	Device string
	// ProbeTimeout bounds the KVM probe boot (0 = kvm.DefaultTimeout).
	ProbeTimeout time.Duration
	// DisableTemplates turns VM templates off: every sandbox cold-boots
	// and no template is built. Templates are on unless this is set or
	// the environment has CAGEBOX_QEMU_TEMPLATES=0 (TemplatesEnv).
	DisableTemplates bool
	// NoBackgroundTemplates: a cold boot does not build its inputs'
	// template in the background (BuildTemplate still does).
	NoBackgroundTemplates bool
	// TemplateDir holds the templates ("" = Dir/templates).
	TemplateDir string
}

// Runtime runs sandboxes as QEMU microVMs.
type Runtime struct {
	cache  *vmimage.Cache
	binary string
	// uids are the VMM uids of the sandboxes this process created or
	// recovered and has not destroyed.
	uids *vmproc.UIDPool
	log  *slog.Logger
	// device is the KVM device; probeTimeout bounds its probe (see KVM).
	device       string
	probeTimeout time.Duration
	// tpl is the template store (template.go).
	tpl templates
}

var _ isolation.Runtime = (*Runtime)(nil)

// New returns the QEMU runtime; Available reports whether it can run.
func New(o Options) *Runtime {
	rt := &Runtime{
		cache:  &vmimage.Cache{Dir: o.Dir},
		binary: o.Binary,
		log:    o.Logger,
		device: o.Device,

		probeTimeout: o.ProbeTimeout,
	}
	if rt.device == "" {
		rt.device = kvm.DefaultDevice
	}
	if rt.probeTimeout <= 0 {
		rt.probeTimeout = kvm.DefaultTimeout
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
	rt.log = rt.log.With("runtime", Name)
	if rt.binary == "" {
		rt.binary = "qemu-system-x86_64"
	}
	rt.tpl = templates{
		dir:        o.TemplateDir,
		enabled:    !o.DisableTemplates && os.Getenv(TemplatesEnv) != "0",
		background: !o.NoBackgroundTemplates,
		ram:        map[string]*os.File{},
		failed:     map[string]time.Time{},
	}
	rt.tpl.stop, rt.tpl.cancel = context.WithCancel(context.Background())
	if rt.tpl.dir == "" {
		rt.tpl.dir = filepath.Join(o.Dir, "templates")
	}
	if p, err := exec.LookPath(rt.binary); err == nil {
		rt.binary = p
	}
	return rt
}

// Name implements isolation.Runtime.
func (rt *Runtime) Name() string { return Name }

// SupportsMounts implements isolation.MountingRuntime.
func (rt *Runtime) SupportsMounts() bool { return true }

// Hibernates implements isolation.HibernatingRuntime: every qemu sandbox
// can be saved to disk (hibernate.go).
func (rt *Runtime) Hibernates() bool { return true }

// Class implements isolation.Runtime.
func (rt *Runtime) Class() isolation.Class { return isolation.Hypervisor }

// Available implements isolation.Runtime.
func (rt *Runtime) Available() error {
	if _, err := exec.LookPath(rt.binary); err != nil {
		return fmt.Errorf("%s not found: run scripts/setup.sh (apt-get install --no-install-recommends qemu-system-x86)", rt.binary)
	}
	if os.Geteuid() != 0 {
		return errors.New("the qemu runtime needs root (network namespaces, cgroups, a uid per VM)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("/dev/net/tun is missing (load the tun module): %w", err)
	}
	if _, err := rt.cache.Kernel(); err != nil {
		return err
	}
	return nil
}

// Detail says how VMs run here and why (shown by `cagebox runtimes`),
// quoting the KVM probe when it failed.
func (rt *Runtime) Detail() string {
	v := rt.KVM()
	accel := "kvm: " + v.Reason
	if !v.Usable {
		accel = "tcg, boots take seconds (" + v.String() + ")"
	}
	return "qemu microvm, kernel " + vmimage.KernelRelease + ", " + accel
}

// Cache is the runtime's artifact cache.
func (rt *Runtime) Cache() *vmimage.Cache { return rt.cache }

// stateData is what Recover needs; stored as isolation.State.Data. The
// QEMU process itself is recorded in Dir/vmm.pid at Start (State is stored
// before Start).
type stateData struct {
	Dir    string      `json:"dir"`
	UID    uint32      `json:"uid"`
	Cgroup string      `json:"cgroup"`
	Net    *vmnet.Link `json:"net,omitempty"`
	// Restored is set when the VM was restored from a template (its
	// template token is in Dir/template.token).
	Restored *restoredState `json:"restored,omitempty"`
}

// restoredState is what a sandbox restored from a template records.
type restoredState struct {
	// Template is the template's digest.
	Template string `json:"template"`
	// MAC is the sandbox's own NIC address, which its claim gives the
	// guest (the template's is templateMAC).
	MAC string `json:"mac,omitempty"`
}

// templateTokenFile holds, in a restored sandbox's state dir, the token
// its agent answers to until it is claimed.
const templateTokenFile = "template.token"

func (sd *stateData) path(elem ...string) string {
	return filepath.Join(append([]string{sd.Dir}, elem...)...)
}

// pending is what Create prepared for Start.
type pending struct {
	binary string
	args   []string
	kvm    bool
	kvmGID int        // the VMM's supplementary group under KVM (-1: none)
	files  []*os.File // kernel, initrd, disk, agent socket, qmp socket[, tap][, ram, state]
	lns    []*net.UnixListener
	// restore, if set, restores the VM from a template.
	restore *restorePlan
}

// restorePlan is how Start restores a VM: QEMU waits for its incoming
// migration, read from the template's state file at descriptor stateFD.
type restorePlan struct {
	template string
	stateFD  int
	// ignoreShared: the state was saved with x-ignore-shared (a
	// template's; RAM is mapped from the template). A hibernated
	// sandbox's state holds its RAM.
	ignoreShared bool
}

func (p *pending) close() {
	for _, f := range p.files {
		if f != nil {
			f.Close()
		}
	}
	for _, l := range p.lns {
		l.Close()
	}
}

// Sandbox is one QEMU microVM.
type Sandbox struct {
	id  string
	rt  *Runtime
	log *slog.Logger
	sd  stateData

	// qmpMu serialises QMP connections (QEMU serves one at a time).
	qmpMu sync.Mutex
	// link tracks agent connections (see agentconn.go).
	link agentLink

	// mu guards the fields below.
	mu sync.Mutex
	// pend is set between Create and Start.
	pend *pending
	// proc is the running QEMU (nil before Start or once gone).
	proc *vmmProc
	// exited is closed when QEMU (our child) exits; nil after Recover.
	exited chan struct{}
	// oomOff and oomKills cache the console scan of OOMKills.
	oomOff   int64
	oomKills uint64
}

var (
	_ isolation.Sandbox     = (*Sandbox)(nil)
	_ isolation.LeakChecker = (*Sandbox)(nil)
	_ isolation.OOMCounter  = (*Sandbox)(nil)
	_ isolation.Claimable   = (*Sandbox)(nil)
)

// Create implements isolation.Runtime: it makes the VM's artifacts (the
// image disk on first use), its initramfs with the sandbox's configuration,
// sockets, cgroup and network plumbing, and the QEMU command line.
func (rt *Runtime) Create(ctx context.Context, spec *isolation.Spec) (_ isolation.Sandbox, err error) {
	if err := rt.Available(); err != nil {
		return nil, fmt.Errorf("%w: %v", isolation.ErrUnavailable, err)
	}
	if spec.ID == "" || spec.StateDir == "" || spec.RootFS == "" || spec.AgentPath == "" || spec.AgentToken == "" {
		return nil, errors.New("qemu: spec needs ID, StateDir, RootFS, AgentPath and AgentToken")
	}
	s := &Sandbox{id: spec.ID, rt: rt, log: rt.log.With("sandbox", spec.ID), sd: stateData{
		Dir:    spec.StateDir,
		Cgroup: CgroupParent + "/vm-" + spec.ID,
	}}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	if err := statedir.Make(spec.StateDir); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	undo.Add(func() { _ = os.RemoveAll(spec.StateDir) })

	arts, err := rt.cache.Artifacts(ctx, spec.RootFS, spec.AgentPath)
	if err != nil {
		return nil, fmt.Errorf("qemu: vm artifacts: %w", err)
	}

	uid, err := rt.uids.Pick(spec.ID)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	s.sd.UID = uid
	undo.Add(func() { rt.uids.Release(uid) })

	res := spec.Resources.WithDefaults()
	memMiB := (res.MemoryBytes + (1<<20 - 1)) >> 20
	if memMiB < 128 {
		return nil, fmt.Errorf("qemu: %d MiB of memory is too little for a VM guest: give it at least 128 MiB", memMiB)
	}

	ks := rt.kvmState()
	tsc := 0
	if !ks.Usable {
		tsc = hostTSCkHz()
	}
	// A template of these inputs, if templates are on and one is saved;
	// else a cold boot (which builds the template in the background).
	var tmpl *templateMeta
	var treq *templateRequest
	// A sandbox with mounts, a read-only root or audit boots cold: a
	// template's guest has none of them, and a claim cannot add them.
	if rt.templatesOn() && len(spec.Mounts) == 0 && !spec.ReadOnlyRoot && spec.Audit.Classes.Empty() {
		treq, err = rt.templateFor(arts, spec.RootFS, res, memMiB, spec.NetNS != "", ks.Usable)
		if err != nil {
			s.log.Warn("no qemu template: cold boot", "err", err)
			treq = nil
		} else if m, ok := rt.lookupTemplate(treq.digest); ok {
			tmpl = m
		}
	}
	var tfiles *restoreFiles
	if tmpl != nil {
		if tfiles, err = rt.openTemplate(tmpl); err != nil {
			// A template that cannot be used is removed; this sandbox
			// cold-boots (and builds a new one).
			s.log.Warn("unusable qemu template removed: cold boot", "template", tmpl.Digest, "err", err)
			if derr := rt.dropTemplate(tmpl.Digest); derr != nil {
				s.log.Warn("remove qemu template", "template", tmpl.Digest, "err", derr)
			}
			tmpl = nil
		} else {
			undo.Add(tfiles.close)
		}
	}

	p := &pending{binary: rt.binary, kvm: ks.Usable, kvmGID: ks.gid}
	undo.Add(p.close)
	disks, vmMounts, err := prepareDisks(ctx, spec, spec.StateDir)
	if err != nil {
		return nil, err
	}
	initrd := arts.Initrd
	if tmpl == nil {
		// The initramfs: the base plus this sandbox's configuration (with
		// the token), readable only by this VM's uid.
		initrd = s.sd.path("initrd.img")
		cfg := &agentproto.VMConfig{
			Token: spec.AgentToken, Env: spec.Env, Hostname: spec.Hostname,
			Nameserver: spec.Nameserver, TrustedCAPEM: string(spec.TrustedCAPEM),
			PIDs: res.PIDs, DiskBytes: res.DiskBytes, AwaitClaim: spec.AwaitClaim,
			Mounts: vmMounts, ReadOnlyRoot: spec.ReadOnlyRoot,
			AuditSyscalls: auditSyscalls(spec.Audit.Classes),
		}
		if err := vmimage.WriteSandboxInitrd(initrd, arts.Initrd, cfg); err != nil {
			return nil, fmt.Errorf("qemu: %w", err)
		}
		if err := os.Chown(initrd, int(uid), int(uid)); err != nil {
			return nil, fmt.Errorf("qemu: initramfs owner: %w", err)
		}
	} else {
		// A restore boots nothing: the base initramfs (no configuration,
		// no token) only makes the machine the template's. The agent
		// answers the template's token until its claim.
		tok, err := os.ReadFile(rt.tpl.path(tmpl.Digest, "token"))
		if err != nil {
			return nil, fmt.Errorf("qemu: template token: %w", err)
		}
		if err := os.WriteFile(s.sd.path(templateTokenFile), tok, 0o600); err != nil {
			return nil, fmt.Errorf("qemu: template token: %w", err)
		}
	}

	for _, f := range []string{arts.Kernel, initrd, arts.RootDisk} {
		fh, err := os.Open(f)
		if err != nil {
			return nil, fmt.Errorf("qemu: open %s: %w", f, err)
		}
		p.files = append(p.files, fh)
	}
	for _, name := range []string{"agent.sock", "qmp.sock"} {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.sd.path(name), Net: "unix"})
		if err != nil {
			return nil, fmt.Errorf("qemu: listen on %s: %w", name, err)
		}
		ln.SetUnlinkOnClose(false)
		p.lns = append(p.lns, ln)
		lf, err := ln.File()
		if err != nil {
			return nil, fmt.Errorf("qemu: socket descriptor: %w", err)
		}
		p.files = append(p.files, lf)
	}

	if err := cgroups.Create(s.sd.Cgroup, cgroups.Limits{MemoryBytes: memMiB<<20 + vmmOverheadBytes, PIDs: vmmPIDs}); err != nil {
		return nil, fmt.Errorf("qemu: cgroup: %w", err)
	}
	undo.Add(func() { _ = cgroups.Remove(s.sd.Cgroup) })

	vc := &vmConfig{KVM: p.kvm, MemoryMiB: memMiB, CPUs: int(math.Ceil(res.CPUs))}
	var np *netParams
	if spec.NetNS != "" {
		gn, tap, err := vmnet.Setup(guestOf(spec), -1)
		if err != nil {
			return nil, fmt.Errorf("qemu: network: %w", err)
		}
		s.sd.Net = gn
		undo.Add(func() { _ = gn.Teardown() })
		vc.TapFD = 3 + len(p.files)
		p.files = append(p.files, tap)
		vc.Net, vc.MAC = true, gn.MAC
		np = &netParams{Addr: netip.PrefixFrom(spec.GuestAddr, spec.Prefix.Bits()), Gateway: spec.Gateway}
	}
	dfs, err := openDisks(disks)
	if err != nil {
		return nil, err
	}
	for i, f := range dfs {
		vc.Disks = append(vc.Disks, vmDisk{FD: 3 + len(p.files), RW: disks[i].RW, Serial: disks[i].Serial})
		p.files = append(p.files, f)
	}
	vc.Append = kernelCmdline(tsc, np)
	if tmpl != nil {
		rt.planRestore(s, p, vc, tmpl, tfiles)
	} else if treq != nil {
		defer func() {
			if err == nil {
				rt.maybeBuildTemplate(treq)
			}
		}()
	}
	// How QEMU starts, for Resume after Hibernate.
	if err := writeJSON(s.sd.path(bootFile), &bootRecord{
		Kernel: arts.Kernel, Initrd: initrd, Disk: arts.RootDisk, MemoryMiB: memMiB, CPUs: vc.CPUs,
		Append: vc.Append, MAC: vc.MAC, RAMBackend: vc.RAMFD > 0, KVM: p.kvm, Disks: disks,
	}); err != nil {
		return nil, fmt.Errorf("qemu: boot record: %w", err)
	}
	p.args = vc.args()
	s.pend = p
	undo.Release()
	return s, nil
}

// ID implements isolation.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// State implements isolation.Sandbox.
func (s *Sandbox) State() isolation.State {
	b, _ := json.Marshal(s.sd)
	return isolation.State{ID: s.id, Runtime: Name, Data: b}
}

// Start implements isolation.Sandbox: it starts QEMU (confined; see the
// package comment) and returns once QMP answers. The agent answers seconds
// later under TCG; DialAgent connections made meanwhile wait in the
// socket's backlog.
func (s *Sandbox) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	p := s.pend
	s.pend = nil
	s.mu.Unlock()
	if p == nil {
		return errors.New("qemu: sandbox already started")
	}
	return s.launch(ctx, p)
}

// launch starts QEMU as p says and returns once QMP answers (and, for a
// restore, once the guest runs again).
func (s *Sandbox) launch(ctx context.Context, p *pending) (err error) {
	defer p.close() // our copies; QEMU holds its own
	console, err := runlog.Open(s.sd.path("console.log"))
	if err != nil {
		return fmt.Errorf("qemu: console log: %w", err)
	}
	defer console.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()

	gid := -1
	if p.kvm {
		gid = p.kvmGID
	}
	cmd := vmmCommand(p.binary, p.args, s.sd.UID, gid, s.sd.Net == nil)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, console, console
	cmd.ExtraFiles = p.files
	if s.sd.Net != nil {
		err = vmnet.InNetNS(s.sd.Net.NetNS, cmd.Start)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return fmt.Errorf("qemu: start %s: %w", p.binary, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	proc := &vmmProc{PID: cmd.Process.Pid}
	defer func() {
		if err != nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	if proc.StartTime, err = vmproc.StartTime(proc.PID); err != nil {
		return fmt.Errorf("qemu: %w: %s", err, runlog.Tail(s.sd.path("console.log"), 1024))
	}
	// QEMU joins its cgroup before the guest runs a single instruction
	// (QMP, below, answers only after machine setup; the RAM it has
	// mapped by then is untouched).
	if err := cgroups.Add(s.sd.Cgroup, proc.PID); err != nil {
		return fmt.Errorf("qemu: join cgroup: %w", err)
	}
	if err := vmproc.WriteFile(s.sd.path("vmm.pid"), proc); err != nil {
		return fmt.Errorf("qemu: pid file: %w", err)
	}
	s.mu.Lock()
	s.proc, s.exited = proc, exited
	s.mu.Unlock()
	qctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var st qmpStatus
	if err := s.qmp(qctx, "query-status", nil, &st); err != nil {
		select {
		case <-exited:
			return fmt.Errorf("qemu exited at start: %s", runlog.Tail(s.sd.path("console.log"), 2048))
		default:
		}
		return fmt.Errorf("qemu: %w: %s", err, runlog.Tail(s.sd.path("console.log"), 1024))
	}
	if p.restore != nil {
		if err := s.restore(ctx, p.restore, exited); err != nil {
			return err
		}
	}
	s.log.Debug("qemu started", "pid", proc.PID, "uid", s.sd.UID, "status", st.Status, "kvm", p.kvm, "restored", p.restore != nil)
	return nil
}

// qmp runs one QMP command, decoding its result into out (if not nil).
func (s *Sandbox) qmp(ctx context.Context, command string, args, out any) error {
	s.qmpMu.Lock()
	defer s.qmpMu.Unlock()
	res, err := qmpCall(ctx, s.sd.path("qmp.sock"), command, args)
	if err != nil {
		return err
	}
	if out != nil {
		return json.Unmarshal(res, out)
	}
	return nil
}

// qmpFD is qmp after passing f to QEMU as fdname (qmpCallFD).
func (s *Sandbox) qmpFD(ctx context.Context, fdname string, f *os.File, command string, args any) error {
	s.qmpMu.Lock()
	defer s.qmpMu.Unlock()
	_, err := qmpCallFD(ctx, s.sd.path("qmp.sock"), fdname, f, command, args)
	return err
}

func (s *Sandbox) running() *vmmProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc.Alive() {
		return s.proc
	}
	return nil
}

// Pause implements isolation.Sandbox (QMP stop: the vCPUs halt). A
// hibernated sandbox stays so.
func (s *Sandbox) Pause(ctx context.Context) error {
	if s.running() == nil && s.hibernated() {
		return nil
	}
	if s.running() == nil {
		return fmt.Errorf("qemu: pause: %w", isolation.ErrGone)
	}
	return s.qmp(ctx, "stop", nil, nil)
}

// Resume implements isolation.Sandbox (QMP cont; a hibernated sandbox is
// restored from its state dir first).
func (s *Sandbox) Resume(ctx context.Context) error {
	if s.running() == nil && s.hibernated() {
		return s.wake(ctx)
	}
	if s.running() == nil {
		return fmt.Errorf("qemu: resume: %w", isolation.ErrGone)
	}
	return s.qmp(ctx, "cont", nil, nil)
}

// Stop implements isolation.Sandbox: an ACPI power-button press (the guest
// init turns it into SIGTERM for the agent, which stops its processes and
// exits, and the init powers off), then QMP quit, then SIGKILL.
func (s *Sandbox) Stop(ctx context.Context, grace time.Duration) error {
	proc := s.running()
	if proc == nil {
		return nil
	}
	var st qmpStatus
	if err := s.qmp(ctx, "query-status", nil, &st); err == nil && !st.Running {
		_ = s.qmp(ctx, "cont", nil, nil)
	}
	if err := s.qmp(ctx, "system_powerdown", nil, nil); err == nil && s.waitExit(ctx, proc, grace) {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	_ = s.qmp(qctx, "quit", nil, nil)
	cancel()
	if s.waitExit(ctx, proc, time.Second) {
		return nil
	}
	if err := proc.Kill(); err != nil {
		return err
	}
	if !s.waitExit(ctx, proc, 5*time.Second) {
		return fmt.Errorf("qemu %d did not exit after SIGKILL", proc.PID)
	}
	return nil
}

// waitExit waits up to d (and ctx) for QEMU to exit.
func (s *Sandbox) waitExit(ctx context.Context, proc *vmmProc, d time.Duration) bool {
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	if exited != nil {
		select {
		case <-exited:
			return true
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	for proc.Alive() {
		select {
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	return true
}

// DialAgent implements isolation.Sandbox: a connection to the agent's
// virtio-serial port. QEMU serves one connection at a time (the daemon
// keeps one); after it ends, the agent serves the next (see agentconn.go
// for how redials stay reliable).
func (s *Sandbox) DialAgent(ctx context.Context) (net.Conn, error) {
	if d := s.link.waitGap(); d > 0 {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial agent: %w", ctx.Err())
		case <-time.After(d):
		}
	}
	serving := s.agentPortOpen(ctx)
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", s.sd.path("agent.sock"))
	if err != nil {
		return nil, fmt.Errorf("dial agent: %w", err)
	}
	return newAgentConn(c, &s.link, serving), nil
}

// agentPortOpen reports whether the guest has the agent's port open (the
// agent is up: it opens the port once, for good).
func (s *Sandbox) agentPortOpen(ctx context.Context) bool {
	var devs []struct {
		Label string `json:"label"`
		Open  bool   `json:"frontend-open"`
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.qmp(qctx, "query-chardev", nil, &devs); err != nil {
		return false
	}
	for _, d := range devs {
		if d.Label == "agent" {
			return d.Open
		}
	}
	return false
}

// oomLine matches the guest kernel's report of an OOM kill on the serial
// console. Guest processes cannot write to the console (their /dev has no
// console, tty or kmsg device), so only the guest kernel produces it.
var oomLine = regexp.MustCompile(`(?m)^\[\s*\d+\.\d+\] (?:Memory cgroup )?[Oo]ut of memory: Killed process`)

// OOMKills implements isolation.OOMCounter from the guest kernel's console
// messages.
func (s *Sandbox) OOMKills() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := os.Open(s.sd.path("console.log"))
	if err != nil {
		return 0, fmt.Errorf("read guest console: %w", err)
	}
	defer f.Close()
	// Scan whole lines from where the last scan stopped.
	buf := make([]byte, 256<<10)
	for {
		n, err := f.ReadAt(buf, s.oomOff)
		chunk := buf[:n]
		last := strings.LastIndexByte(string(chunk), '\n')
		if last < 0 {
			if n == len(buf) { // one huge line: skip it
				s.oomOff += int64(n)
				continue
			}
			break
		}
		chunk = chunk[:last+1]
		s.oomKills += uint64(len(oomLine.FindAllIndex(chunk, -1)))
		s.oomOff += int64(len(chunk))
		if err != nil || n < len(buf) {
			break
		}
	}
	return s.oomKills, nil
}

// Destroy implements isolation.Sandbox: kill QEMU, undo the network
// plumbing, remove the cgroup and the state directory. Idempotent.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	if s.pend != nil {
		s.pend.close()
		s.pend = nil
	}
	proc := s.proc
	s.mu.Unlock()
	if !proc.Alive() {
		// Another Sandbox value over the same state (a recovered one)
		// may have started QEMU again (Resume after Hibernate).
		if p, err := vmproc.ReadFile(s.sd.path("vmm.pid")); err == nil {
			proc = p
		}
	}
	var errs []error
	if proc.Alive() && s.hasWritableDisks() {
		// A writable volume is left clean: the guest unmounts it when it
		// powers off (Stop), before QEMU is killed.
		_ = s.Stop(ctx, 10*time.Second)
	}
	if proc.Alive() {
		if err := proc.Kill(); err != nil {
			errs = append(errs, err)
		}
		if !s.waitExit(ctx, proc, 5*time.Second) {
			errs = append(errs, fmt.Errorf("qemu %d did not exit after SIGKILL", proc.PID))
		}
	}
	if s.sd.Net != nil {
		if err := s.sd.Net.Teardown(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := cgroups.Remove(s.sd.Cgroup); err != nil {
		errs = append(errs, err)
	}
	// A directory bound for a disk's copy is staged only while the copy
	// is made; one left by a crash is unmounted before RemoveAll.
	mounts.UnmountBelow(s.sd.Dir)
	if err := os.RemoveAll(s.sd.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove state dir: %w", err))
	}
	if len(errs) == 0 {
		s.rt.uids.Release(s.sd.UID)
	}
	return errors.Join(errs...)
}

// Leftovers lists what of the sandbox remains on the host.
func (s *Sandbox) Leftovers(ctx context.Context) []string {
	var out []string
	s.mu.Lock()
	proc := s.proc
	s.mu.Unlock()
	if !proc.Alive() {
		proc, _ = vmproc.ReadFile(s.sd.path("vmm.pid"))
	}
	if proc.Alive() {
		out = append(out, fmt.Sprintf("qemu process %d", proc.PID))
	}
	out = append(out, cgroups.Existing(s.sd.Cgroup)...)
	if _, err := os.Stat(s.sd.Dir); err == nil {
		out = append(out, "state dir "+s.sd.Dir)
	}
	for _, p := range mounts.MountPointsBelow(s.sd.Dir) {
		out = append(out, "mount "+p)
	}
	if s.sd.Net != nil {
		out = append(out, s.sd.Net.Leftovers()...)
	}
	return out
}

// Recover implements isolation.Runtime: it finds QEMU by its pid file
// (checking the pid's start time) and reconnects to nothing else: QMP and
// the agent socket are reached by path.
func (rt *Runtime) Recover(ctx context.Context, st isolation.State) (isolation.Sandbox, error) {
	var sd stateData
	if err := json.Unmarshal(st.Data, &sd); err != nil {
		return nil, fmt.Errorf("qemu: decode state of %s: %w", st.ID, err)
	}
	s := &Sandbox{id: st.ID, rt: rt, log: rt.log.With("sandbox", st.ID), sd: sd}
	proc, err := vmproc.ReadFile(sd.path("vmm.pid"))
	if s.hibernated() {
		// Saved whole; a QEMU still there (the daemon died between the
		// save and QEMU's end) is the saved one, stopped.
		if err == nil && proc.Alive() {
			_ = proc.Kill()
		}
		rt.uids.Reserve(sd.UID)
		return s, nil
	}
	if err == nil && proc.Alive() {
		s.proc = proc
		// The previous daemon's connection may have closed just now.
		s.link.closedNow()
		rt.uids.Reserve(sd.UID)
		return s, nil
	}
	_ = s.Destroy(ctx)
	return nil, fmt.Errorf("qemu vm %s: %w", st.ID, isolation.ErrGone)
}

// guestOf is the spec's routed link, for vmnet.Setup.
func guestOf(spec *isolation.Spec) vmnet.Guest {
	return vmnet.Guest{NetNS: spec.NetNS, GuestIf: spec.GuestIf, Addr: spec.GuestAddr, Gateway: spec.Gateway, Prefix: spec.Prefix}
}
