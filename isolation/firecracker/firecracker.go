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
package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	sdk "github.com/firecracker-microvm/firecracker-go-sdk"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	"github.com/sirupsen/logrus"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/cgroups"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/vmimage"
	"github.com/cagebox/cagebox/internal/vmnet"
	"github.com/cagebox/cagebox/isolation"
)

// Name is the runtime's registry name.
const Name = "firecracker"

// Options configure the runtime.
type Options struct {
	// Firecracker and Jailer are the binaries ("" = $CAGEBOX_FIRECRACKER_BIN
	// / $CAGEBOX_JAILER_BIN, else "firecracker" / "jailer" on PATH).
	Firecracker, Jailer string
	// Dir is the VM artifact cache shared with the qemu runtime
	// ($CAGEBOX_HOME/vm).
	Dir string
	// ChrootBase is the jailer's --chroot-base-dir ($CAGEBOX_HOME/jail).
	ChrootBase string
	// KVM is the KVM device (default /dev/kvm).
	KVM string
}

// uidBase..uidBase+uidCount are the uids given to jailed VMMs, one per
// sandbox (the qemu runtime uses the range below).
const (
	uidBase  = 0x6cc00000
	uidCount = 1 << 16
)

// Runtime starts Firecracker microVMs.
type Runtime struct {
	fc, jailer, chrootBase, kvm string
	cache                       *vmimage.Cache
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
	}
	if rt.chrootBase == "" {
		rt.chrootBase = "/srv/cagebox-jail"
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
	if os.Geteuid() != 0 {
		missing = append(missing, "the firecracker runtime needs root (jailer, network namespaces, cgroups)")
	}
	if len(missing) == 0 {
		if _, err := rt.cache.Kernel(); err != nil {
			missing = append(missing, err.Error())
		}
	}
	if len(missing) > 0 {
		return errors.New(strings.Join(missing, "; "))
	}
	return nil
}

// Detail implements the daemon's runtime description.
func (rt *Runtime) Detail() string {
	return "firecracker microvm via jailer, vsock agent, kernel " + vmimage.KernelRelease
}

// stateData is what Recover and Destroy need.
type stateData struct {
	ID       string      `json:"id"`
	Dir      string      `json:"dir"`       // the sandbox's state dir
	JailDir  string      `json:"jail_dir"`  // <base>/firecracker/<id>
	JailRoot string      `json:"jail_root"` // JailDir/root
	UID      int         `json:"uid"`
	Cgroup   string      `json:"cgroup"` // the jailer's cgroup, relative to each hierarchy
	Net      *vmnet.Link `json:"net,omitempty"`
	PID      int         `json:"pid,omitempty"`
}

// Sandbox is one microVM.
type Sandbox struct {
	rt *Runtime
	sd stateData

	// mu guards cfg and started.
	mu      sync.Mutex
	cfg     *vmConfig
	started bool
	jailCmd []string
}

var (
	_ isolation.Sandbox = (*Sandbox)(nil)
)

func pickUID(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return uidBase + int(h.Sum32()%uidCount)
}

// Create implements isolation.Runtime: the jail is populated (kernel,
// sandbox initramfs with the agent's token, image disk), the TAP joined to
// the routed link; nothing runs until Start.
func (rt *Runtime) Create(ctx context.Context, spec *isolation.Spec) (_ isolation.Sandbox, err error) {
	if err := rt.Available(); err != nil {
		return nil, fmt.Errorf("%w: %v", isolation.ErrUnavailable, err)
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
	s := &Sandbox{rt: rt, sd: stateData{
		ID: spec.ID, Dir: spec.StateDir, UID: pickUID(spec.ID),
		JailDir: filepath.Dir(jailRoot(rt.chrootBase, rt.fc, spec.ID)), JailRoot: jailRoot(rt.chrootBase, rt.fc, spec.ID),
		Cgroup: "firecracker/" + spec.ID,
	}}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	undo.Add(func() { _ = s.Destroy(context.Background()) })
	if err := os.MkdirAll(s.sd.JailRoot, 0o755); err != nil {
		return nil, fmt.Errorf("firecracker: jail: %w", err)
	}
	for src, dst := range map[string]string{vmlinux: jailKernel, arts.RootDisk: jailRootfs} {
		if err := linkOrCopy(src, filepath.Join(s.sd.JailRoot, dst)); err != nil {
			return nil, fmt.Errorf("firecracker: jail %s: %w", dst, err)
		}
	}
	res := spec.Resources
	vc := &agentproto.VMConfig{
		Token: spec.AgentToken, Env: spec.Env, Hostname: spec.Hostname,
		Nameserver: spec.Nameserver, TrustedCAPEM: string(spec.TrustedCAPEM),
		PIDs: res.PIDs, DiskBytes: res.DiskBytes,
	}
	initrd := filepath.Join(s.sd.JailRoot, jailInitrd)
	if err := vmimage.WriteSandboxInitrd(initrd, arts.Initrd, vc); err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	if err := os.Chown(initrd, s.sd.UID, s.sd.UID); err != nil {
		return nil, fmt.Errorf("firecracker: initramfs owner: %w", err)
	}
	mac := ""
	if spec.NetNS != "" {
		ln, tap, err := vmnet.Setup(spec, s.sd.UID)
		if err != nil {
			return nil, fmt.Errorf("firecracker: network: %w", err)
		}
		tap.Close() // persistent, owned by the VMM's uid: Firecracker opens it by name
		s.sd.Net, mac = ln, ln.MAC
	}
	s.cfg = buildConfig(spec, res, mac)
	s.jailCmd = jailerArgs(spec.ID, rt.fc, rt.chrootBase, spec.NetNS, s.sd.UID, cgroups.Detect() == cgroups.V2, res.MemoryBytes)
	if err := s.saveConfig(); err != nil {
		return nil, err
	}
	return s, nil
}

// saveConfig keeps the VM configuration beside the state (Start after a
// daemon restart between Create and Start rebuilds nothing).
func (s *Sandbox) saveConfig() error {
	b, err := json.Marshal(struct {
		Cfg  *vmConfig `json:"cfg"`
		Jail []string  `json:"jail"`
	}{s.cfg, s.jailCmd})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.sd.Dir, "firecracker.json"), b, 0o600)
}

func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o444)
}

// ID implements isolation.Sandbox.
func (s *Sandbox) ID() string { return s.sd.ID }

// State implements isolation.Sandbox.
func (s *Sandbox) State() isolation.State {
	b, _ := json.Marshal(s.sd)
	return isolation.State{ID: s.sd.ID, Runtime: Name, Data: b}
}

func (s *Sandbox) client() *sdk.Client {
	l := logrus.New()
	l.SetOutput(nopWriter{})
	return sdk.NewClient(filepath.Join(s.sd.JailRoot, jailAPI), logrus.NewEntry(l), false)
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

// Start implements isolation.Sandbox: the jailer starts Firecracker (which
// it leaves in a new PID namespace, writing its pid in the jail), then the
// VM is configured over the API socket and booted.
func (s *Sandbox) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("firecracker: sandbox already started")
	}
	s.started = true
	logf, err := os.OpenFile(filepath.Join(s.sd.Dir, "vmm.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.rt.jailer, s.jailCmd...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("firecracker: jailer: %w", err)
	}
	// With --new-pid-ns the jailer forks Firecracker into the new
	// namespace and records its pid in the jail; whether the jailer itself
	// exits or waits, it is reaped here and an early failure is reported.
	jailerDone := make(chan error, 1)
	go func() { jailerDone <- cmd.Wait() }()
	pid, err := readPID(ctx, filepath.Join(s.sd.JailRoot, filepath.Base(s.rt.fc)+".pid"), jailerDone)
	if err != nil {
		return fmt.Errorf("firecracker: %w (log: %s)", err, tailFile(filepath.Join(s.sd.Dir, "vmm.log"), 512))
	}
	s.sd.PID = pid
	c := s.client()
	api := filepath.Join(s.sd.JailRoot, jailAPI)
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := os.Stat(api); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("firecracker: no API socket at %s", api)
		}
		time.Sleep(5 * time.Millisecond)
	}
	steps := []func() error{
		func() error { _, err := c.PutMachineConfiguration(ctx, &s.cfg.Machine); return err },
		func() error { _, err := c.PutGuestBootSource(ctx, &s.cfg.Boot); return err },
		func() error { _, err := c.PutGuestVsock(ctx, &s.cfg.Vsock); return err },
	}
	for i := range s.cfg.Drives {
		d := &s.cfg.Drives[i]
		steps = append(steps, func() error { _, err := c.PutGuestDriveByID(ctx, *d.DriveID, d); return err })
	}
	for i := range s.cfg.Net {
		n := &s.cfg.Net[i]
		steps = append(steps, func() error { _, err := c.PutGuestNetworkInterfaceByID(ctx, *n.IfaceID, n); return err })
	}
	steps = append(steps, func() error {
		_, err := c.CreateSyncAction(ctx, &models.InstanceActionInfo{ActionType: sdk.String(models.InstanceActionInfoActionTypeInstanceStart)})
		return err
	})
	for _, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("firecracker: configure VM (%s): %w", s.cfg, err)
		}
	}
	return nil
}

// readPID waits for the jailer's pid file; a jailer that fails first ends
// the wait with its error.
func readPID(ctx context.Context, p string, jailerDone <-chan error) (int, error) {
	deadline := time.After(10 * time.Second)
	for {
		if b, err := os.ReadFile(p); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				return pid, nil
			}
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
			return 0, fmt.Errorf("no pid in %s after 10s", p)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// tailFile is the last n bytes of a log, for error messages.
func tailFile(p string, n int64) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(fi.Size()-n, 0)
	}
	b := make([]byte, n)
	k, _ := f.Read(b)
	return strings.TrimSpace(string(b[:k]))
}

// DialAgent implements isolation.Sandbox over Firecracker's hybrid vsock.
func (s *Sandbox) DialAgent(ctx context.Context) (net.Conn, error) {
	return dialVsock(ctx, filepath.Join(s.sd.JailRoot, jailVsock), agentproto.VMVsockPort)
}

// Pause implements isolation.Sandbox.
func (s *Sandbox) Pause(ctx context.Context) error {
	_, err := s.client().PatchVM(ctx, &models.VM{State: sdk.String(models.VMStatePaused)})
	return err
}

// Resume implements isolation.Sandbox.
func (s *Sandbox) Resume(ctx context.Context) error {
	_, err := s.client().PatchVM(ctx, &models.VM{State: sdk.String(models.VMStateResumed)})
	return err
}

// Stop implements isolation.Sandbox: Ctrl-Alt-Del (the guest init turns it
// into the agent's SIGTERM), then SIGKILL after grace.
func (s *Sandbox) Stop(ctx context.Context, grace time.Duration) error {
	if !s.alive() {
		return nil
	}
	_, _ = s.client().CreateSyncAction(ctx, &models.InstanceActionInfo{ActionType: sdk.String(models.InstanceActionInfoActionTypeSendCtrlAltDel)})
	for deadline := time.Now().Add(grace); time.Now().Before(deadline) && s.alive(); {
		time.Sleep(20 * time.Millisecond)
	}
	return s.kill()
}

// alive reports whether this sandbox's Firecracker still runs (the pid's
// command line names the sandbox, so a reused pid is not mistaken for it).
func (s *Sandbox) alive() bool {
	if s.sd.PID <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.sd.PID))
	return err == nil && strings.Contains(string(b), s.sd.ID)
}

func (s *Sandbox) kill() error {
	if !s.alive() {
		return nil
	}
	if err := syscall.Kill(s.sd.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("firecracker: kill %d: %w", s.sd.PID, err)
	}
	for i := 0; i < 250 && s.alive(); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// Destroy implements isolation.Sandbox; it is idempotent and works on a
// half-made sandbox.
func (s *Sandbox) Destroy(ctx context.Context) error {
	var errs []error
	if err := s.kill(); err != nil {
		errs = append(errs, err)
	}
	if s.sd.Net != nil {
		if err := s.sd.Net.Teardown(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.sd.JailDir != "" {
		if err := os.RemoveAll(s.sd.JailDir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := cgroups.Remove(s.sd.Cgroup); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Leftovers lists what of the sandbox remains on the host.
func (s *Sandbox) Leftovers(ctx context.Context) []string {
	var out []string
	if s.alive() {
		out = append(out, fmt.Sprintf("firecracker process %d", s.sd.PID))
	}
	if _, err := os.Stat(s.sd.JailDir); err == nil {
		out = append(out, "jail "+s.sd.JailDir)
	}
	out = append(out, cgroups.Existing(s.sd.Cgroup)...)
	if s.sd.Net != nil {
		out = append(out, s.sd.Net.Leftovers()...)
	}
	return out
}

// Recover implements isolation.Runtime.
func (rt *Runtime) Recover(ctx context.Context, st isolation.State) (isolation.Sandbox, error) {
	s := &Sandbox{rt: rt, started: true}
	if err := json.Unmarshal(st.Data, &s.sd); err != nil {
		return nil, fmt.Errorf("firecracker: state of %s: %w", st.ID, err)
	}
	if s.sd.PID == 0 {
		if pid, err := readPIDOnce(filepath.Join(s.sd.JailRoot, filepath.Base(rt.fc)+".pid")); err == nil {
			s.sd.PID = pid
		}
	}
	if !s.alive() {
		return s, fmt.Errorf("firecracker %s: %w", st.ID, isolation.ErrGone)
	}
	return s, nil
}

func readPIDOnce(p string) (int, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
