package qemu

// Templates: a booted VM saved once, restored for every sandbox of the same
// inputs instead of a cold boot.
//
// A template is built from the inputs of a sandbox (kernel, base
// initramfs and so the agent binary, image disk, size class, NIC or not,
// accelerator, kernel command line, QEMU binary): QEMU boots them with no
// sandbox's identity — a template token kept host-side, no environment,
// CA, hostname or address — and an agent that awaits its claim
// (VMConfig.AwaitClaim). Once the agent answers a health check (the
// quiescent point: it runs nothing and waits for the claim), QEMU is
// stopped and saved: guest RAM, in a memfd mapped shared
// (memory-backend-file,share=on), is written out as a sparse file, and the
// device state is migrated (with the x-ignore-shared capability, so RAM is
// not in it) to a state file whose descriptor QMP passes (getfd, migrate
// fd:NAME; -sandbox forbids the exec: URIs that QEMU 7.2 would otherwise
// need, having no file: URI yet). The template directory appears by
// rename, complete, with a template.json naming its inputs' digest.
//
// A restore starts QEMU with the same machine and devices, guest RAM
// mapped privately from a sealed memfd of the template's RAM (shared by
// all restores, copy-on-write, never written), the sandbox's own disk
// descriptor, sockets and TAP, and -incoming defer; then
// migrate-incoming fd:N with x-ignore-shared and cont. The guest resumes
// where the template stopped — the agent waiting for its claim — and the
// sandbox implements isolation.Claimable: the host claims it with the
// sandbox's token, environment, guest files, network, fresh entropy and
// the time (see cmd/cagebox-agent/vmclaim_linux.go for the guest side).

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/cgroups"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/internal/vmimage"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/internal/runlog"
)

// templateFormat changes whenever what a template holds, or how one is
// built or restored, does: templates of another format are stale.
const templateFormat = "cagebox-qemu-template-2" // 2: the key leaves tsc_early_khz out

// templateMAC is the NIC address a template boots with; each restored
// sandbox's claim replaces it with the sandbox's own.
const templateMAC = "02:cb:7e:00:00:01"

// TemplatesEnv, set to 0, turns templates off (Options.DisableTemplates).
const TemplatesEnv = "CAGEBOX_QEMU_TEMPLATES"

// Bounds of a template's build.
var (
	templateBuildTimeout = 3 * time.Minute
	// templateRetryAfter is how long a failed build's inputs are not
	// built again in the background.
	templateRetryAfter = 10 * time.Minute
)

// templateKey is every input a template depends on; its digest names the
// template.
type templateKey struct {
	Format    string `json:"format"`
	QEMU      string `json:"qemu"`   // sha256 of the QEMU binary
	Kernel    string `json:"kernel"` // sha256 of vmlinuz
	Initrd    string `json:"initrd"` // the base initramfs's name: a digest of kernel, modules and agent
	Disk      string `json:"disk"`   // the image disk's name: the image's digest
	MemoryMiB int64  `json:"memory_mib"`
	CPUs      int    `json:"cpus"`
	PIDs      int64  `json:"pids"`
	DiskBytes int64  `json:"disk_bytes"`
	NIC       bool   `json:"nic"`
	KVM       bool   `json:"kvm"`
	// Cmdline is the kernel command line but for tsc_early_khz (the
	// host's TSC frequency as /proc/cpuinfo says it, which varies on
	// hosts that scale their clock; a restored guest never reads its
	// command line again).
	Cmdline string `json:"cmdline"`
}

func (k *templateKey) digest() string {
	b, _ := json.Marshal(k)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// templateMeta is a template's template.json.
type templateMeta struct {
	Digest      string        `json:"digest"`
	Key         templateKey   `json:"key"`
	Image       string        `json:"image"`
	Created     time.Time     `json:"created"`
	BuildTime   time.Duration `json:"build_time"`
	RAMBytes    int64         `json:"ram_bytes"`    // guest RAM size
	RAMData     int64         `json:"ram_data"`     // bytes of it not zero (the rest are holes)
	StateBytes  int64         `json:"state_bytes"`  // device state
	TemplateMAC string        `json:"template_mac"` // the NIC's address in the template
	Cmdline     string        `json:"cmdline"`      // the kernel command line it booted with
}

// Template describes a saved template (Runtime.Templates).
type Template struct {
	// Name is a label: image, memory, CPUs and NIC ("busybox 256M 1cpu net").
	Name string `json:"name"`
	// Digest names the template: the digest of every input.
	Digest      string    `json:"digest"`
	Image       string    `json:"image"`
	MemoryBytes int64     `json:"memory_bytes"`
	CPUs        int       `json:"cpus"`
	NIC         bool      `json:"nic"`
	SizeBytes   int64     `json:"size_bytes"` // disk space used
	Created     time.Time `json:"created"`
	// BuildTime is how long the build took (boot to saved).
	BuildTime time.Duration `json:"build_time"`
	// Stale: an input is gone or changed (kernel, agent, image, QEMU),
	// so no sandbox will restore from it; PruneTemplates removes it.
	Stale bool `json:"stale"`
}

// templates is the runtime's template store.
type templates struct {
	dir     string
	enabled bool
	// background (read and cleared under mu): creates that miss a
	// template start its build in the background.
	background bool
	// stop ends background builds and bg counts them (Runtime.Close).
	stop   context.Context
	cancel context.CancelFunc
	bg     sync.WaitGroup

	// mu guards the fields below.
	mu sync.Mutex
	// ram holds the sealed memfd of each template restored from since
	// this process started.
	ram map[string]*os.File
	// building: a background build runs.
	building bool
	// failed is when a background build of a digest last failed.
	failed map[string]time.Time
	// qemuSum caches the QEMU binary's sha256 by its size and mtime.
	qemuStat string
	qemuSum  string
}

func (t *templates) path(digest string, elem ...string) string {
	return filepath.Join(append([]string{t.dir, digest}, elem...)...)
}

// templateRequest is what a build needs.
type templateRequest struct {
	key    templateKey
	digest string
	arts   *vmimage.Artifacts
	image  string
	// cmdline is the kernel command line the template boots with.
	cmdline string
}

// templatesOn reports whether this runtime restores from templates.
func (rt *Runtime) templatesOn() bool { return rt.tpl.enabled }

// qemuDigest is the sha256 of the QEMU binary (cached while its size and
// mtime stay).
func (rt *Runtime) qemuDigest() (string, error) {
	fi, err := os.Stat(rt.binary)
	if err != nil {
		return "", fmt.Errorf("qemu binary: %w", err)
	}
	st := fmt.Sprintf("%d/%d", fi.Size(), fi.ModTime().UnixNano())
	rt.tpl.mu.Lock()
	defer rt.tpl.mu.Unlock()
	if rt.tpl.qemuStat == st {
		return rt.tpl.qemuSum, nil
	}
	f, err := os.Open(rt.binary)
	if err != nil {
		return "", fmt.Errorf("qemu binary: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("qemu binary: %w", err)
	}
	rt.tpl.qemuStat, rt.tpl.qemuSum = st, hex.EncodeToString(h.Sum(nil))
	return rt.tpl.qemuSum, nil
}

// templateFor returns the build request for a sandbox of these inputs.
func (rt *Runtime) templateFor(arts *vmimage.Artifacts, rootfs string, res isolation.Resources, memMiB int64, nic, kvm bool) (*templateRequest, error) {
	k, err := rt.cache.Kernel()
	if err != nil {
		return nil, err
	}
	qsum, err := rt.qemuDigest()
	if err != nil {
		return nil, err
	}
	key := templateKey{
		Format: templateFormat, QEMU: qsum, Kernel: k.VmlinuzSHA256,
		Initrd: filepath.Base(arts.Initrd), Disk: filepath.Base(arts.RootDisk),
		MemoryMiB: memMiB, CPUs: max(1, int(res.CPUs+0.999)), PIDs: res.PIDs, DiskBytes: res.DiskBytes,
		NIC: nic, KVM: kvm, Cmdline: templateCmdline(0, nic),
	}
	return &templateRequest{key: key, digest: key.digest(), arts: arts, image: imageName(rootfs), cmdline: templateCmdline(tscFor(kvm), nic)}, nil
}

// imageName is the name of the image whose root is rootfs (image.json
// beside it), or its directory's name.
func imageName(rootfs string) string {
	var img struct {
		Name string `json:"name"`
	}
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Clean(rootfs)), "image.json")); err == nil && json.Unmarshal(b, &img) == nil && img.Name != "" {
		return img.Name
	}
	return filepath.Base(filepath.Dir(filepath.Clean(rootfs)))
}

// lookupTemplate returns the complete template of digest, if there is one.
func (rt *Runtime) lookupTemplate(digest string) (*templateMeta, bool) {
	m, err := readTemplateMeta(rt.tpl.path(digest, "template.json"))
	if err != nil || m.Digest != digest {
		return nil, false
	}
	for _, f := range []string{"ram", "state", "token"} {
		if _, err := os.Stat(rt.tpl.path(digest, f)); err != nil {
			return nil, false
		}
	}
	return m, true
}

func readTemplateMeta(p string) (*templateMeta, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	m := &templateMeta{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return m, nil
}

// templateRAM returns the sealed memfd of the template's RAM, loading it
// on first use. The caller must not close it (dupFile it for a child).
func (rt *Runtime) templateRAM(m *templateMeta) (*os.File, error) {
	rt.tpl.mu.Lock()
	defer rt.tpl.mu.Unlock()
	if f, ok := rt.tpl.ram[m.Digest]; ok {
		return f, nil
	}
	f, err := loadSealed(rt.tpl.path(m.Digest, "ram"), m.RAMBytes)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", m.Digest, err)
	}
	rt.tpl.ram[m.Digest] = f
	return f, nil
}

// dropTemplate removes a template (a restore from it failed, or it was
// pruned). Sandboxes restored from it keep running: each QEMU maps its own
// reference to the RAM.
func (rt *Runtime) dropTemplate(digest string) error {
	rt.tpl.mu.Lock()
	if f, ok := rt.tpl.ram[digest]; ok {
		f.Close()
		delete(rt.tpl.ram, digest)
	}
	rt.tpl.mu.Unlock()
	// Rename first, so that no lookup sees a half-removed template.
	gone := filepath.Join(rt.tpl.dir, ".gone-"+digest+"-"+randHex(4))
	if err := os.Rename(rt.tpl.path(digest), gone); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove template %s: %w", digest, err)
	}
	return os.RemoveAll(gone)
}

// BuildTemplate makes sure the template a sandbox of spec would restore
// from exists, building it now if needed (waiting for a build running in
// the background first). Only ID, RootFS, AgentPath, Resources and NetNS
// (whether the VM has a NIC) of spec matter. `cagebox image build` and
// tests call it so that the first sandbox of an image restores too.
func (rt *Runtime) BuildTemplate(ctx context.Context, spec *isolation.Spec) (Template, error) {
	if err := rt.Available(); err != nil {
		return Template{}, fmt.Errorf("%w: %v", isolation.ErrUnavailable, err)
	}
	arts, err := rt.cache.Artifacts(ctx, spec.RootFS, spec.AgentPath)
	if err != nil {
		return Template{}, fmt.Errorf("qemu: vm artifacts: %w", err)
	}
	res := spec.Resources.WithDefaults()
	memMiB := (res.MemoryBytes + (1<<20 - 1)) >> 20
	req, err := rt.templateFor(arts, spec.RootFS, res, memMiB, spec.NetNS != "", rt.kvmState().Usable)
	if err != nil {
		return Template{}, fmt.Errorf("qemu: template: %w", err)
	}
	m, err := rt.buildTemplate(ctx, req, true)
	if err != nil {
		return Template{}, err
	}
	return rt.describe(m), nil
}

// maybeBuildTemplate starts a background build of req's template unless
// one runs, or this one failed recently. It never blocks.
func (rt *Runtime) maybeBuildTemplate(req *templateRequest) {
	rt.tpl.mu.Lock()
	if !rt.tpl.background {
		rt.tpl.mu.Unlock()
		return
	}
	if rt.tpl.building || time.Since(rt.tpl.failed[req.digest]) < templateRetryAfter {
		rt.tpl.mu.Unlock()
		return
	}
	rt.tpl.building = true
	rt.tpl.bg.Add(1)
	rt.tpl.mu.Unlock()
	go func() {
		defer rt.tpl.bg.Done()
		ctx, cancel := context.WithTimeout(rt.tpl.stop, templateBuildTimeout)
		defer cancel()
		_, err := rt.buildTemplate(ctx, req, false)
		rt.tpl.mu.Lock()
		rt.tpl.building = false
		if err != nil && !errors.Is(err, errBuildBusy) {
			rt.tpl.failed[req.digest] = time.Now()
		}
		rt.tpl.mu.Unlock()
		if err != nil && !errors.Is(err, errBuildBusy) {
			rt.log.Warn("qemu template build failed; sandboxes of these inputs cold-boot", "template", req.digest, "image", req.image, "err", err)
		}
	}()
}

// Close ends a background template build and waits for it to remove what
// it made (its VMM, run directory and build directory), at most closeWait:
// the daemon calls it as it stops (isolation.Closer), so no build outlives
// it. Later creates cold-boot.
func (rt *Runtime) Close() {
	rt.tpl.mu.Lock()
	rt.tpl.background = false
	rt.tpl.mu.Unlock()
	rt.tpl.cancel()
	done := make(chan struct{})
	go func() { rt.tpl.bg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(closeWait):
		rt.log.Warn("a template build did not end in time; the next build removes what it left")
	}
}

// closeWait bounds Close's wait for a background build to clean up.
const closeWait = 15 * time.Second

// errBuildBusy: another build holds the lock (a background build skips).
var errBuildBusy = errors.New("another template build is running")

// lockBuild takes the store's build lock (one build at a time, across
// processes sharing the directory); with wait, it waits for ctx.
func (rt *Runtime) lockBuild(ctx context.Context, wait bool) (func(), error) {
	if err := statedir.Make(rt.tpl.dir); err != nil {
		return nil, fmt.Errorf("create template dir %s: %w", rt.tpl.dir, err)
	}
	f, err := os.OpenFile(filepath.Join(rt.tpl.dir, ".build.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("template build lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("template build lock: %w", err)
		}
		if !wait {
			f.Close()
			return nil, errBuildBusy
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another template build: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// removeStaleBuilds removes what builds that died left (their QEMU died
// with them: Pdeathsig); the caller holds the build lock.
func (rt *Runtime) removeStaleBuilds() {
	sweepRunDirs(os.TempDir(), time.Now())
	ents, _ := os.ReadDir(rt.tpl.dir)
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, ".build-"):
			_ = cgroups.Remove(buildCgroup(name))
			_ = os.RemoveAll(filepath.Join(rt.tpl.dir, name))
		case strings.HasPrefix(name, ".gone-"):
			_ = os.RemoveAll(filepath.Join(rt.tpl.dir, name))
		}
	}
}

// runDirPrefix starts a template build's run directory in the temporary
// directory (its sockets need a short path), followed by the building
// process's pid: a build is removed by its own deferred cleanup, but one
// cut short with its process (a daemon or test binary that exits, or is
// killed, while a background build runs) would leave it behind, so every
// build first removes those of processes that are gone (sweepRunDirs).
const runDirPrefix = "cbxtpl-"

// sweepRunDirs removes build run directories in dir whose process is gone
// (no /proc/PID), and those of releases before the pid was in the name
// (cbxtplNNN) untouched for an hour. A live pid that is not a builder
// keeps its directory: conservative, and a few megabytes at most.
func sweepRunDirs(dir string, now time.Time) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, "cbxtpl") {
			continue
		}
		p := filepath.Join(dir, name)
		if rest, ok := strings.CutPrefix(name, runDirPrefix); ok {
			pid, _, _ := strings.Cut(rest, "-")
			n, err := strconv.Atoi(pid)
			if err != nil || n <= 0 || n == os.Getpid() {
				continue
			}
			if _, err := os.Stat("/proc/" + pid); errors.Is(err, fs.ErrNotExist) {
				_ = os.RemoveAll(p)
			}
			continue
		}
		if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > time.Hour {
			_ = os.RemoveAll(p)
		}
	}
}

func buildCgroup(buildDir string) string {
	return CgroupParent + "/tpl-" + strings.TrimPrefix(filepath.Base(buildDir), ".build-")
}

// buildTemplate builds req's template unless it exists (see the file
// comment). Without wait it gives up (errBuildBusy) if another build runs.
func (rt *Runtime) buildTemplate(ctx context.Context, req *templateRequest, wait bool) (_ *templateMeta, err error) {
	unlock, err := rt.lockBuild(ctx, wait)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if m, ok := rt.lookupTemplate(req.digest); ok {
		return m, nil
	}
	rt.removeStaleBuilds()
	start := time.Now()
	log := rt.log.With("template", req.digest, "image", req.image)
	log.Info("building qemu template", "memory_mib", req.key.MemoryMiB, "cpus", req.key.CPUs, "nic", req.key.NIC)

	tmp, err := os.MkdirTemp(rt.tpl.dir, ".build-")
	if err != nil {
		return nil, fmt.Errorf("template build dir: %w", err)
	}
	defer os.RemoveAll(tmp) // gone once renamed
	// Sockets, console and initramfs in a short directory of their own
	// (unix socket paths are limited to 108 bytes).
	run, err := os.MkdirTemp("", runDirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return nil, fmt.Errorf("template run dir: %w", err)
	}
	defer os.RemoveAll(run)

	token := randHex(32)
	if err := os.WriteFile(filepath.Join(tmp, "token"), []byte(token), 0o600); err != nil {
		return nil, fmt.Errorf("template token: %w", err)
	}
	uid, err := rt.uids.Pick("template-" + filepath.Base(tmp))
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	defer rt.uids.Release(uid)
	cg := buildCgroup(tmp)
	if err := cgroups.Create(cg, cgroups.Limits{MemoryBytes: req.key.MemoryMiB<<20 + vmmOverheadBytes, PIDs: vmmPIDs}); err != nil {
		return nil, fmt.Errorf("template cgroup: %w", err)
	}
	defer func() { _ = cgroups.Remove(cg) }()

	initrd := filepath.Join(run, "initrd.img")
	cfg := &agentproto.VMConfig{Token: token, AwaitClaim: true, PIDs: req.key.PIDs, DiskBytes: req.key.DiskBytes}
	if err := vmimage.WriteSandboxInitrd(initrd, req.arts.Initrd, cfg); err != nil {
		return nil, fmt.Errorf("template initramfs: %w", err)
	}
	if err := os.Chown(initrd, int(uid), int(uid)); err != nil {
		return nil, fmt.Errorf("template initramfs owner: %w", err)
	}
	memBytes := req.key.MemoryMiB << 20
	ram, err := newMemfd("cagebox-template-build", memBytes)
	if err != nil {
		return nil, err
	}
	defer ram.Close()
	state, err := os.OpenFile(filepath.Join(tmp, "state"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("template state file: %w", err)
	}
	defer state.Close()

	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, p := range []string{req.arts.Kernel, initrd, req.arts.RootDisk} {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("template: open %s: %w", p, err)
		}
		files = append(files, f)
	}
	for _, name := range []string{"agent.sock", "qmp.sock"} {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(run, name), Net: "unix"})
		if err != nil {
			return nil, fmt.Errorf("template: listen on %s: %w", name, err)
		}
		ln.SetUnlinkOnClose(false)
		lf, err := ln.File()
		ln.Close()
		if err != nil {
			return nil, fmt.Errorf("template: socket descriptor: %w", err)
		}
		files = append(files, lf)
	}
	vc := &vmConfig{KVM: req.key.KVM, MemoryMiB: req.key.MemoryMiB, CPUs: req.key.CPUs, Append: req.cmdline, RAMShared: true}
	next := 3 + len(files)
	if req.key.NIC {
		vc.Net, vc.MAC, vc.TapFD = true, templateMAC, next
		next++
	}
	vc.RAMFD = next
	ks := rt.kvmState()
	gid := -1
	if req.key.KVM {
		gid = ks.gid
	}
	console, err := runlog.Open(filepath.Join(run, "console.log"))
	if err != nil {
		return nil, fmt.Errorf("template console log: %w", err)
	}
	defer console.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()

	release := make(chan struct{})
	defer close(release)
	cmd, err := startVMMThread(req.key.NIC, release, func(tap *os.File) *exec.Cmd {
		cmd := vmmCommand(rt.binary, vc.args(), uid, gid, !req.key.NIC)
		// The build's QEMU dies with the thread that started it, which
		// lives until the build ends: a daemon that dies mid-build leaves
		// no VM behind.
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
		cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, console, console
		cmd.ExtraFiles = append([]*os.File(nil), files...)
		if tap != nil {
			cmd.ExtraFiles = append(cmd.ExtraFiles, tap)
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, ram)
		return cmd
	})
	if err != nil {
		return nil, fmt.Errorf("template: start %s: %w", rt.binary, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	defer func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	for _, f := range files {
		f.Close()
	}
	files = nil
	tail := func() string { return runlog.Tail(filepath.Join(run, "console.log"), 2048) }
	// The build is background work: it yields the CPU to sandboxes.
	_ = unix.Setpriority(unix.PRIO_PROCESS, cmd.Process.Pid, 10)
	if err := cgroups.Add(cg, cmd.Process.Pid); err != nil {
		return nil, fmt.Errorf("template: join cgroup: %w", err)
	}
	// A Sandbox value over the run directory gives the build the same QMP
	// and agent dialling as sandboxes.
	vm := &Sandbox{id: "template", rt: rt, log: log, sd: stateData{Dir: run}}
	if err := waitQMP(ctx, vm, exited); err != nil {
		return nil, fmt.Errorf("template: %w: %s", err, tail())
	}
	if err := waitAgent(ctx, vm, token, exited); err != nil {
		return nil, fmt.Errorf("template: the agent never answered: %w: %s", err, tail())
	}
	booted := time.Since(start)
	// The agent saw its connection end (it waits for the next one, and
	// for its claim) before the vCPUs stop.
	time.Sleep(4 * reconnectGap)
	if err := vm.qmp(ctx, "stop", nil, nil); err != nil {
		return nil, fmt.Errorf("template: stop: %w", err)
	}
	if err := vm.qmp(ctx, "migrate-set-capabilities", ignoreShared, nil); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	// The state file reaches QEMU over QMP (getfd): QEMU 7.2 migrates out
	// only to a descriptor named so; exec: URIs are what -sandbox forbids.
	if err := vm.qmpFD(ctx, "state", state, "migrate", map[string]any{"uri": "fd:state"}); err != nil {
		return nil, fmt.Errorf("template: save device state: %w", err)
	}
	if err := waitMigration(ctx, vm); err != nil {
		return nil, fmt.Errorf("template: save device state: %w: %s", err, tail())
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_ = vm.qmp(qctx, "quit", nil, nil)
	cancel()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}

	// Guest RAM, sparse; then the record; then the rename makes it whole.
	rf, err := os.OpenFile(filepath.Join(tmp, "ram"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("template ram file: %w", err)
	}
	defer rf.Close()
	if err := rf.Truncate(memBytes); err != nil {
		return nil, fmt.Errorf("template ram file: %w", err)
	}
	data, err := copySparse(rf, ram, memBytes)
	if err == nil {
		err = rf.Sync()
	}
	if err != nil {
		return nil, fmt.Errorf("template: save guest RAM: %w", err)
	}
	if err := state.Sync(); err != nil {
		return nil, fmt.Errorf("template: save device state: %w", err)
	}
	sfi, err := state.Stat()
	if err != nil {
		return nil, err
	}
	if sfi.Size() == 0 {
		return nil, fmt.Errorf("template: QEMU saved no device state: %s", tail())
	}
	m := &templateMeta{
		Digest: req.digest, Key: req.key, Image: req.image, Created: time.Now().UTC(),
		BuildTime: time.Since(start), RAMBytes: memBytes, RAMData: data, StateBytes: sfi.Size(),
		TemplateMAC: templateMAC, Cmdline: req.cmdline,
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := writeSynced(filepath.Join(tmp, "template.json"), b); err != nil {
		return nil, fmt.Errorf("template record: %w", err)
	}
	syncDir(tmp)
	if err := os.Rename(tmp, rt.tpl.path(req.digest)); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	syncDir(rt.tpl.dir)
	log.Info("qemu template built", "booted_in", booted.Round(time.Millisecond), "took", m.BuildTime.Round(time.Millisecond),
		"ram_data_mib", data>>20, "state_kib", sfi.Size()>>10)
	if removed, err := rt.PruneTemplates(nil); err != nil {
		log.Warn("prune templates", "err", err)
	} else if len(removed) > 0 {
		log.Info("removed stale qemu templates", "count", len(removed))
	}
	return m, nil
}

// ignoreShared is the migration capability that leaves shared RAM out of
// the stream (a template's RAM is saved as a file of its own).
var ignoreShared = map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}

// startVMMThread starts mk's command from an OS thread of its own, which
// lives until release is closed (the command's Pdeathsig is tied to it).
// With nic, the thread first enters a new network namespace and makes a
// TAP there for the command to inherit (mk's tap), so the template's NIC
// has the backend a sandbox's has (the same offloads are negotiated); the
// namespace ends with QEMU.
func startVMMThread(nic bool, release <-chan struct{}, mk func(tap *os.File) *exec.Cmd) (*exec.Cmd, error) {
	type result struct {
		cmd *exec.Cmd
		err error
	}
	res := make(chan result, 1)
	go func() {
		// Never unlocked: the thread may be in a namespace of its own, so
		// it ends with this goroutine.
		runtime.LockOSThread()
		var tap *os.File
		if nic {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				res <- result{err: fmt.Errorf("new network namespace: %w", err)}
				return
			}
			t, err := openTap()
			if err != nil {
				res <- result{err: err}
				return
			}
			tap = t
		}
		cmd := mk(tap)
		err := cmd.Start()
		if tap != nil {
			tap.Close()
		}
		res <- result{cmd, err}
		if err == nil {
			<-release
		}
	}()
	r := <-res
	return r.cmd, r.err
}

// openTap makes a TAP (named like a sandbox's) in the calling thread's
// network namespace and returns its queue; it lives as long as the
// descriptor. (vmnet.Setup makes a sandbox's, joined to its link; a
// template's is joined to nothing.)
func openTap() (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq("cbtap0")
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	// The flags of a sandbox's TAP (vmnet): QEMU offers the guest the
	// offloads its backend supports, and a restore must offer what the
	// template's guest negotiated.
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create tap: %w", err)
	}
	return os.NewFile(uintptr(fd), "tap"), nil
}

// waitQMP waits until QEMU answers QMP.
func waitQMP(ctx context.Context, vm *Sandbox, exited <-chan struct{}) error {
	qctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var st qmpStatus
	if err := vm.qmp(qctx, "query-status", nil, &st); err != nil {
		select {
		case <-exited:
			return errors.New("qemu exited at start")
		default:
		}
		return err
	}
	return nil
}

// waitAgent waits until the agent answers a health check with token.
func waitAgent(ctx context.Context, vm *Sandbox, token string, exited <-chan struct{}) error {
	var last error
	for {
		select {
		case <-exited:
			return fmt.Errorf("qemu exited (%v)", last)
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		default:
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := vm.DialAgent(actx)
		if err == nil {
			var c *agentproto.Client
			c, err = agentproto.NewClient(actx, conn, token)
			if err == nil {
				_, err = c.Health(actx)
				c.Close()
				if err == nil {
					cancel()
					return nil
				}
			} else {
				conn.Close()
			}
		}
		cancel()
		last = err
		time.Sleep(50 * time.Millisecond)
	}
}

// waitMigration polls query-migrate until the migration completes.
func waitMigration(ctx context.Context, vm *Sandbox) error {
	for {
		var mi struct {
			Status string `json:"status"`
			Error  string `json:"error-desc"`
		}
		if err := vm.qmp(ctx, "query-migrate", nil, &mi); err != nil {
			return err
		}
		switch mi.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", mi.Status, mi.Error)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migration %s: %w", mi.Status, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func writeSynced(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(p string) {
	if d, err := os.Open(p); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// describe is a template's public record.
func (rt *Runtime) describe(m *templateMeta) Template {
	var size int64
	for _, f := range []string{"ram", "state", "token", "template.json"} {
		size += allocatedBytes(rt.tpl.path(m.Digest, f))
	}
	name := fmt.Sprintf("%s %dM %dcpu", m.Image, m.Key.MemoryMiB, m.Key.CPUs)
	if m.Key.NIC {
		name += " net"
	}
	return Template{
		Name: name, Digest: m.Digest, Image: m.Image, MemoryBytes: m.Key.MemoryMiB << 20, CPUs: m.Key.CPUs,
		NIC: m.Key.NIC, SizeBytes: size, Created: m.Created, BuildTime: m.BuildTime, Stale: rt.stale(m),
	}
}

// stale reports whether an input of the template is gone or changed: no
// sandbox created now would restore from it.
func (rt *Runtime) stale(m *templateMeta) bool {
	if m.Key.Format != templateFormat || m.Key.digest() != m.Digest {
		return true
	}
	if k, err := rt.cache.Kernel(); err != nil || k.VmlinuzSHA256 != m.Key.Kernel {
		return true
	}
	if q, err := rt.qemuDigest(); err != nil || q != m.Key.QEMU {
		return true
	}
	for _, p := range []string{filepath.Join(rt.cache.Dir, "initrd", m.Key.Initrd), filepath.Join(rt.cache.Dir, "disks", m.Key.Disk)} {
		if _, err := os.Stat(p); err != nil {
			return true
		}
	}
	return false
}

// Templates lists the saved templates, oldest first (`cagebox image ls`
// shows them).
func (rt *Runtime) Templates() ([]Template, error) {
	ents, err := os.ReadDir(rt.tpl.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []Template
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		m, ok := rt.lookupTemplate(e.Name())
		if !ok {
			continue
		}
		out = append(out, rt.describe(m))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// PruneTemplates removes the templates that are stale (an input is gone
// or changed) or that keep (if not nil) rejects, and returns them.
// Sandboxes restored from a removed template keep running.
func (rt *Runtime) PruneTemplates(keep func(Template) bool) ([]Template, error) {
	ts, err := rt.Templates()
	if err != nil {
		return nil, err
	}
	var removed []Template
	var errs []error
	for _, t := range ts {
		if !t.Stale && (keep == nil || keep(t)) {
			continue
		}
		if err := rt.dropTemplate(t.Digest); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, t)
	}
	// Directories no complete template owns (a build cut short, a
	// removal cut short) go too, unless a build is under way.
	if unlock, err := rt.lockBuild(context.Background(), false); err == nil {
		rt.removeStaleBuilds()
		unlock()
	}
	return removed, errors.Join(errs...)
}
