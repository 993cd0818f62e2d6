//go:build linux

package main

// The VM init: when the agent binary runs as /init (PID 1) from a microVM's
// initramfs, it boots the guest and then starts itself as the agent:
//
//  1. mounts devtmpfs, proc and sysfs; loads the kernel modules shipped in
//     the initramfs (in their NN-name.ko order, dependencies first);
//  2. reads the sandbox's configuration (agentproto.VMConfigPath, appended
//     to the initramfs by the host; it holds the agent token) and deletes it;
//  3. brings lo up and configures eth0 from the kernel command line
//     (agentproto.VMParamAddr / VMParamGateway);
//  4. mounts the image disk (/dev/vda, ext4) read-only under a tmpfs
//     writable layer (overlay), writes hostname, hosts, resolv.conf, the CA
//     files and the agent's token and environment files into it;
//  5. finds the agent's transport (a virtio-serial port by name, opened
//     here and inherited, so that the agent's /dev needs no node; or vsock);
//  6. makes a pids cgroup (cgroup2) for the agent and everything it starts,
//     closes user namespaces, deletes the initramfs and switches root;
//  7. starts the agent (itself, re-executed) as PID 1 of a new PID and mount
//     namespace, in that cgroup: the agent mounts its own /proc, a minimal
//     /dev and a read-only /sys, masks /proc like a container, drops its
//     capabilities and serves the host;
//  8. stays PID 1 of the VM: turns the ACPI power button into SIGTERM for
//     the agent, and powers the VM off when the agent exits.
//
// Guest processes therefore see only the agent's PID namespace (no kernel
// threads, no init), no block, serial or kmsg devices, and a read-only
// /proc/sys and /sys.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/rootfs"
)

// vmAgentArg, as the first argument, tells the agent that the VM init
// started it as PID 1 of a fresh PID and mount namespace.
const vmAgentArg = "--vm-agent-stage"

// Paths inside the guest (the files cagebox writes in every guest are
// rootfs.Guest's).
const (
	vmModuleDir   = "/lib/modules"
	vmRootDisk    = "/dev/vda"
	vmDefaultPIDs = 512
	vmDefaultDisk = 1 << 30
)

// isVMInit reports whether this process is the init of a VM's initramfs.
func isVMInit() bool { return os.Getpid() == 1 && len(os.Args) > 0 && os.Args[0] == "/init" }

// vmInit runs the VM init; it never returns while the VM runs.
func vmInit() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", "init")
	if err := mountEarly(); err != nil {
		log.Error("early mounts", "err", err)
		powerOff(log)
	}
	cmdline, _ := os.ReadFile("/proc/cmdline")
	params := agentproto.ParseKernelCmdline(string(cmdline))
	if _, ok := params[agentproto.VMParamBare]; ok {
		powerOff(log)
	}
	start := time.Now()
	agent, err := vmBoot(log, params)
	if err != nil {
		log.Error("boot failed; powering off", "err", err)
		powerOff(log)
	}
	log.Info("agent started", "pid", agent, "setup", time.Since(start).Round(time.Millisecond))
	go watchPowerButton(log, agent)
	go watchCtrlAltDel(log, agent)
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			log.Error("wait", "err", err)
			powerOff(log)
		}
		if pid == agent {
			log.Info("agent exited; powering off", "status", waitStatusString(ws))
			powerOff(log)
		}
	}
}

func waitStatusString(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "signal " + ws.Signal().String()
	}
	return "exit " + strconv.Itoa(ws.ExitStatus())
}

func powerOff(log *slog.Logger) {
	// Writable disks are unmounted first, so a volume is left clean (a
	// reader mounts it without replaying its journal).
	unmountVMDisks(log)
	unix.Sync()
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// No ACPI: a reset ends the VM too (QEMU runs with -no-reboot).
	log.Error("power off failed; resetting", "err", err)
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	select {}
}

func mountEarly() error {
	for _, m := range []struct{ src, dst, fstype, data string }{
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, unix.MS_NOSUID|unix.MS_NOEXEC, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	return nil
}

// vmBoot does steps 1-7 and returns the agent's pid.
func vmBoot(log *slog.Logger, params map[string]string) (int, error) {
	if err := loadModules(log, vmModuleDir, unneededModules(params)); err != nil {
		return 0, err
	}
	cfg, err := readVMConfig()
	if err != nil {
		return 0, err
	}
	token := cfg.Token
	cfg.Token = ""
	cfg.Hostname = rootfs.Hostname(cfg.Hostname)
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return 0, fmt.Errorf("set hostname: %w", err)
	}
	if err := configureNetwork(params); err != nil {
		return 0, err
	}
	if err := mountRoot(cfg); err != nil {
		return 0, err
	}
	const root = "/mnt/root"
	if cfg.ReadOnlyRoot {
		if err := vmRunDirMount(root); err != nil {
			return 0, err
		}
	}
	if err := writeVMGuestFiles(root, cfg, token); err != nil {
		return 0, err
	}
	if err := vmMountDisks(root, cfg); err != nil {
		return 0, err
	}
	listen, port, err := agentTransport(params[agentproto.VMParamAgent])
	if err != nil {
		return 0, err
	}
	// Audit is enabled before the agent starts (tasks get an audit
	// context at fork), and fails the boot if the kernel cannot: the host
	// asked for it.
	auditFD := -1
	if len(cfg.AuditSyscalls) > 0 {
		if auditFD, err = openAudit(); err != nil {
			return 0, err
		}
	}
	for key, val := range map[string]string{
		// Guest processes are root without capabilities; unprivileged
		// user namespaces would give them capabilities back.
		"user/max_user_namespaces":           "0",
		"kernel/dmesg_restrict":              "1",
		"kernel/kptr_restrict":               "2",
		"kernel/unprivileged_bpf_disabled":   "1",
		"net/ipv6/conf/all/disable_ipv6":     "1",
		"net/ipv6/conf/default/disable_ipv6": "1",
	} {
		if err := os.WriteFile("/proc/sys/"+key, []byte(val), 0o644); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("sysctl %s: %w", key, err)
		}
	}
	cg, err := sandboxCgroup(cfg.PIDs)
	if err != nil {
		return 0, err
	}
	if err := switchRoot(root); err != nil {
		return 0, err
	}
	if cfg.ReadOnlyRoot {
		if err := remountRootReadOnly(); err != nil {
			return 0, err
		}
	}
	cmd := exec.Command("/proc/self/exe", vmAgentArg,
		"--listen", listen, "--token-file", rootfs.TokenFile, "--env-file", rootfs.EnvFile)
	cmd.Args[0] = "cagebox-agent"
	if _, ok := params[agentproto.VMParamDebug]; ok {
		cmd.Args = append(cmd.Args, "--log-level", "debug")
	}
	if cfg.AwaitClaim {
		// A template's agent: it keeps its capabilities until the claim
		// (vmClaim applies the claim's entropy, clock, hostname and
		// network with them) and runs nothing before it.
		cmd.Args = append(cmd.Args, "--await-claim")
	}
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Dir = "/"
	if port != nil {
		cmd.ExtraFiles = []*os.File{port}
	}
	var auditFile *os.File
	if auditFD >= 0 {
		auditFile = os.NewFile(uintptr(auditFD), "audit")
		cmd.Args = append(cmd.Args, "--audit-fd", strconv.Itoa(3+len(cmd.ExtraFiles)))
		cmd.ExtraFiles = append(cmd.ExtraFiles, auditFile)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWIPC,
		UseCgroupFD: true,
		CgroupFD:    int(cg.Fd()),
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start agent: %w", err)
	}
	cg.Close()
	if port != nil {
		port.Close()
	}
	if auditFile != nil {
		err := addAuditRules(auditFD, cfg.AuditSyscalls)
		auditFile.Close()
		if err != nil {
			_ = cmd.Process.Kill()
			return 0, err
		}
	}
	return cmd.Process.Pid, nil
}

// unneededModules says which modules this boot can skip: each takes tens
// of milliseconds to load under TCG (signature check, relocation), so the
// vsock modules are left out when the agent uses virtio-serial and the
// network driver when the sandbox has no network (a template with a NIC
// but no address yet, VMParamNIC, loads it: its claim configures eth0).
func unneededModules(params map[string]string) func(name string) bool {
	vsock := strings.HasPrefix(params[agentproto.VMParamAgent], "vsock:")
	_, net := params[agentproto.VMParamAddr]
	if _, nic := params[agentproto.VMParamNIC]; nic {
		net = true
	}
	return func(file string) bool {
		// Files are "NN-name.ko" (load order first).
		name := strings.TrimSuffix(file, ".ko")
		if _, rest, ok := strings.Cut(name, "-"); ok {
			name = rest
		}
		switch {
		case strings.Contains(name, "vsock"):
			return !vsock
		case name == "virtio_net", name == "net_failover", name == "failover":
			return !net
		}
		return false
	}
}

// loadModules loads every .ko in dir in name order, but those skip names;
// already loaded (or built-in) modules are fine.
func loadModules(log *slog.Logger, dir string, skip func(name string) bool) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("kernel modules: %w", err)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".ko") || skip(e.Name()) {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", e.Name(), err)
		}
		log.Debug("module loaded", "name", e.Name())
	}
	return nil
}

func readVMConfig() (*agentproto.VMConfig, error) {
	b, err := os.ReadFile(agentproto.VMConfigPath)
	if err != nil {
		return nil, fmt.Errorf("read sandbox configuration: %w", err)
	}
	os.Remove(agentproto.VMConfigPath)
	cfg := &agentproto.VMConfig{}
	if err := json.Unmarshal(b, cfg); err != nil {
		return nil, fmt.Errorf("decode sandbox configuration: %w", err)
	}
	for i := range b {
		b[i] = 0
	}
	if cfg.Token == "" {
		return nil, errors.New("sandbox configuration has no agent token")
	}
	return cfg, nil
}

// waitForPath waits for a device node or sysfs entry that a driver creates
// asynchronously.
func waitForPath(p string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		_, err := os.Stat(p)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v: %w", p, d, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mountRoot mounts the image read-only at /mnt/lower, a tmpfs writable
// layer at /mnt/rw and their overlay at /mnt/root.
func mountRoot(cfg *agentproto.VMConfig) error {
	if err := waitForPath(vmRootDisk, 10*time.Second); err != nil {
		return fmt.Errorf("image disk: %w", err)
	}
	dev, err := rootDisk(cfg)
	if err != nil {
		return err
	}
	for _, d := range []string{"/mnt/lower", "/mnt/rw", "/mnt/root"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(dev, "/mnt/lower", "ext4", unix.MS_RDONLY|unix.MS_NODEV, "noload"); err != nil {
		return fmt.Errorf("mount image disk %s: %w", dev, err)
	}
	disk := cfg.DiskBytes
	if disk <= 0 {
		disk = vmDefaultDisk
	}
	if err := unix.Mount("tmpfs", "/mnt/rw", "tmpfs", unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", disk)); err != nil {
		return fmt.Errorf("mount writable layer: %w", err)
	}
	for _, d := range []string{"/mnt/rw/upper", "/mnt/rw/work"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("overlay", "/mnt/root", "overlay", unix.MS_NODEV,
		"lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work"); err != nil {
		return fmt.Errorf("mount overlay root: %w", err)
	}
	return nil
}

// writeVMGuestFiles writes what every guest expects to find about itself
// (rootfs.Guest, as the container runtimes do from the host), and the
// agent's token and environment files. Paths resolve inside root, whatever
// symlinks the image holds.
func writeVMGuestFiles(root string, cfg *agentproto.VMConfig, token string) error {
	g := rootfs.Guest{Hostname: cfg.Hostname, Nameserver: cfg.Nameserver, TrustedCAPEM: []byte(cfg.TrustedCAPEM)}
	return rootfs.WriteGuest(root, g,
		rootfs.File{Path: rootfs.EnvFile, Data: rootfs.EnvData(cfg.Env), Mode: 0o400},
		rootfs.File{Path: rootfs.TokenFile, Data: []byte(token), Mode: 0o400})
}

// agentTransport returns the agent's --listen value and, for a
// virtio-serial port, the port opened once for good: the agent serves it
// connection after connection through the inherited descriptor (fd:3),
// never closing it. (Closing a virtio-serial port discards whatever the
// host sent meanwhile, which could swallow the next connection's hello;
// and the agent's own /dev has no node to reopen it by.)
func agentTransport(spec string) (string, *os.File, error) {
	if spec == "" {
		spec = "serial:" + agentproto.VMSerialPort
	}
	kind, arg, _ := strings.Cut(spec, ":")
	switch kind {
	case "vsock":
		if _, err := strconv.ParseUint(arg, 10, 32); err != nil {
			return "", nil, fmt.Errorf("%s=%s: bad vsock port", agentproto.VMParamAgent, spec)
		}
		return "vsock:" + arg, nil, nil
	case "serial":
		dev, err := findVirtioPort(arg, 10*time.Second)
		if err != nil {
			return "", nil, err
		}
		f, err := os.OpenFile(dev, os.O_RDWR|unix.O_NOCTTY, 0)
		if err != nil {
			return "", nil, fmt.Errorf("agent port: %w", err)
		}
		return "fd:3", f, nil
	}
	return "", nil, fmt.Errorf("%s=%s: want serial:NAME or vsock:PORT", agentproto.VMParamAgent, spec)
}

// findVirtioPort finds the device node of the virtio-serial port named name
// (/sys/class/virtio-ports/vportNpM/name).
func findVirtioPort(name string, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		ents, _ := os.ReadDir("/sys/class/virtio-ports")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/sys/class/virtio-ports", e.Name(), "name"))
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + e.Name()
				if err := waitForPath(dev, time.Until(deadline)); err != nil {
					return "", err
				}
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port named %q appeared within %v", name, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sandboxCgroup mounts cgroup2 at /sys/fs/cgroup (the agent's own /sys will
// not show it) and makes the cgroup the agent runs in, bounded to pids
// tasks. It returns the cgroup's directory, for CLONE_INTO_CGROUP.
func sandboxCgroup(pids int64) (*os.File, error) {
	const mnt = "/sys/fs/cgroup"
	if err := unix.Mount("cgroup2", mnt, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, fmt.Errorf("mount cgroup2: %w", err)
	}
	if err := os.WriteFile(mnt+"/cgroup.subtree_control", []byte("+pids +memory"), 0o644); err != nil {
		return nil, fmt.Errorf("enable pids controller: %w", err)
	}
	dir := mnt + "/sandbox"
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create sandbox cgroup: %w", err)
	}
	if pids <= 0 {
		pids = vmDefaultPIDs
	}
	if err := os.WriteFile(dir+"/pids.max", []byte(strconv.FormatInt(pids, 10)), 0o644); err != nil {
		return nil, fmt.Errorf("set pids limit: %w", err)
	}
	return os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
}

// switchRoot moves /dev, /proc and /sys into root, deletes the initramfs
// (freeing its memory) and makes root the root directory.
func switchRoot(root string) error {
	for _, m := range []string{"/dev", "/proc", "/sys"} {
		dst := root + m
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m, dst, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", m, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat("/", &st); err != nil {
		return err
	}
	removeSameDev("/", st.Dev)
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// removeSameDev deletes dir's contents that live on device dev (the
// initramfs), not descending into other mounts.
func removeSameDev(dir string, dev uint64) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil || st.Dev != dev {
			continue
		}
		if e.IsDir() {
			removeSameDev(p, dev)
		}
		_ = os.Remove(p)
	}
}

// vmAgentStage prepares the agent's namespaces (it runs as PID 1 of a new
// PID and mount namespace, still with every capability) and then runs the
// agent.
func vmAgentStage(args []string) int {
	// A claim (a VM restored from a template) also sets what only a VM
	// guest owns: its RNG, clock, hostname and network.
	claimPlatform = vmClaim
	if err := guestMounts(); err != nil {
		fmt.Fprintf(os.Stderr, "cagebox-agent: guest mounts: %v\n", err)
		return 1
	}
	return run(args, os.Stderr)
}

// guestMounts replaces the init's /proc, /dev and /sys with the agent's: a
// /proc of its PID namespace with the paths a container masks masked, a
// minimal /dev, and a read-only /sys.
func guestMounts() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	for _, m := range []string{"/proc", "/dev", "/sys"} {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount init's %s: %w", m, err)
		}
	}
	const nosx = unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV
	if err := unix.Mount("proc", "/proc", "proc", nosx, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := unix.Mount("sysfs", "/sys", "sysfs", nosx|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mount /sys: %w", err)
	}
	if err := unix.Mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, "mode=755,size=65536k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, n := range []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		p := "/dev/" + n.name
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		if err := unix.Chmod(p, 0o666); err != nil { // umask
			return err
		}
	}
	for _, d := range []string{"/dev/pts", "/dev/shm", "/dev/mqueue"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := unix.Mount("shm", "/dev/shm", "tmpfs", nosx, "mode=1777,size=65536k"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	if err := unix.Mount("mqueue", "/dev/mqueue", "mqueue", nosx, ""); err != nil {
		return fmt.Errorf("mount /dev/mqueue: %w", err)
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, "/dev/"+name); err != nil {
			return err
		}
	}
	for _, p := range []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
		"/sys/firmware", "/sys/devices/virtual/powercap", "/proc/interrupts",
	} {
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		if fi.IsDir() {
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY, "size=0")
		} else {
			err = unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"} {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", p, err)
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|nosx, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	return nil
}

// watchPowerButton turns ACPI power button presses (QMP system_powerdown)
// into SIGTERM for the agent, which stops its processes and exits; the init
// then powers off.
func watchPowerButton(log *slog.Logger, agent int) {
	ents, _ := filepath.Glob("/sys/class/input/event*")
	for _, e := range ents {
		name, _ := os.ReadFile(filepath.Join(e, "device", "name"))
		if !strings.Contains(string(name), "Power Button") {
			continue
		}
		f, err := os.Open("/dev/input/" + filepath.Base(e))
		if err != nil {
			log.Warn("power button", "err", err)
			return
		}
		defer f.Close()
		// struct input_event: struct timeval, u16 type, u16 code, s32 value.
		const evKey, keyPower = 1, 116
		var ev [24]byte
		for {
			if _, err := f.Read(ev[:]); err != nil {
				log.Warn("power button", "err", err)
				return
			}
			typ := binary.NativeEndian.Uint16(ev[16:])
			code := binary.NativeEndian.Uint16(ev[18:])
			val := int32(binary.NativeEndian.Uint32(ev[20:]))
			if typ == evKey && code == keyPower && val == 1 {
				log.Info("power button: stopping the agent")
				_ = unix.Kill(agent, unix.SIGTERM)
			}
		}
	}
	log.Debug("no power button")
}

// watchCtrlAltDel turns Ctrl-Alt-Del (Firecracker's SendCtrlAltDel, the
// way its runtime stops a VM) into SIGTERM for the agent, as the power
// button does under QEMU. The kernel's default is to restart at once on
// Ctrl-Alt-Del; with it turned off the kernel sends the init SIGINT
// instead. (Handling SIGINT also keeps a stray one from ending the init,
// which would panic the guest.)
func watchCtrlAltDel(log *slog.Logger, agent int) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGINT)
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF); err != nil {
		log.Warn("ctrl-alt-del", "err", err)
	}
	for range sigs {
		log.Info("ctrl-alt-del: stopping the agent")
		_ = unix.Kill(agent, unix.SIGTERM)
	}
}

// configureNetwork brings lo up and, if the command line gives an address,
// eth0 with that address and a default route via the gateway.
func configureNetwork(params map[string]string) error {
	nl, err := newRtnl()
	if err != nil {
		return err
	}
	defer nl.close()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := nl.linkUp(lo.Index); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	addr := params[agentproto.VMParamAddr]
	if addr == "" {
		return nil
	}
	pfx, err := netip.ParsePrefix(addr)
	if err != nil || !pfx.Addr().Is4() {
		return fmt.Errorf("%s=%s: want an IPv4 address with prefix length", agentproto.VMParamAddr, addr)
	}
	gw, err := netip.ParseAddr(params[agentproto.VMParamGateway])
	if err != nil || !gw.Is4() {
		return fmt.Errorf("%s=%s: want an IPv4 address", agentproto.VMParamGateway, params[agentproto.VMParamGateway])
	}
	if err := waitForPath("/sys/class/net/eth0", 10*time.Second); err != nil {
		return fmt.Errorf("network interface: %w", err)
	}
	eth, err := net.InterfaceByName("eth0")
	if err != nil {
		return fmt.Errorf("find eth0: %w", err)
	}
	if err := nl.addAddr(eth.Index, pfx); err != nil {
		return fmt.Errorf("address eth0: %w", err)
	}
	if err := nl.linkUp(eth.Index); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	if err := nl.addDefaultRoute(eth.Index, gw); err != nil {
		return fmt.Errorf("default route via %s: %w", gw, err)
	}
	return nil
}

// rtnl is a minimal rtnetlink client: enough for one address, one route
// and link flags.
type rtnl struct {
	fd  int
	seq uint32
}

func newRtnl() (*rtnl, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return &rtnl{fd: fd}, nil
}

func (n *rtnl) close() { unix.Close(n.fd) }

// rtattr appends a route attribute (header plus payload, 4-byte aligned).
func rtattr(b []byte, typ uint16, payload []byte) []byte {
	l := unix.SizeofRtAttr + len(payload)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// request sends one message (typ, flags, body) and waits for its ack.
func (n *rtnl) request(typ uint16, flags uint16, body []byte) error {
	n.seq++
	msg := make([]byte, 0, unix.SizeofNlMsghdr+len(body))
	msg = binary.NativeEndian.AppendUint32(msg, uint32(unix.SizeofNlMsghdr+len(body)))
	msg = binary.NativeEndian.AppendUint16(msg, typ)
	msg = binary.NativeEndian.AppendUint16(msg, flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	msg = binary.NativeEndian.AppendUint32(msg, n.seq)
	msg = binary.NativeEndian.AppendUint32(msg, 0)
	msg = append(msg, body...)
	if err := unix.Sendto(n.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for {
		nr, _, err := unix.Recvfrom(n.fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:nr])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != n.seq || m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			if len(m.Data) < 4 {
				return errors.New("short netlink error")
			}
			if e := int32(binary.NativeEndian.Uint32(m.Data[:4])); e != 0 {
				return unix.Errno(-e)
			}
			return nil
		}
	}
}

func (n *rtnl) linkUp(index int) error {
	ifi := unix.IfInfomsg{Family: unix.AF_UNSPEC, Index: int32(index), Flags: unix.IFF_UP, Change: unix.IFF_UP}
	body := (*[unix.SizeofIfInfomsg]byte)(unsafe.Pointer(&ifi))[:]
	return n.request(unix.RTM_NEWLINK, 0, append([]byte(nil), body...))
}

func (n *rtnl) addAddr(index int, p netip.Prefix) error {
	ifa := unix.IfAddrmsg{Family: unix.AF_INET, Prefixlen: uint8(p.Bits()), Index: uint32(index)}
	body := append([]byte(nil), (*[unix.SizeofIfAddrmsg]byte)(unsafe.Pointer(&ifa))[:]...)
	a := p.Addr().As4()
	body = rtattr(body, unix.IFA_LOCAL, a[:])
	body = rtattr(body, unix.IFA_ADDRESS, a[:])
	return n.request(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body)
}

func (n *rtnl) addDefaultRoute(index int, gw netip.Addr) error {
	rt := unix.RtMsg{Family: unix.AF_INET, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_BOOT,
		Scope: unix.RT_SCOPE_UNIVERSE, Type: unix.RTN_UNICAST}
	body := append([]byte(nil), (*[unix.SizeofRtMsg]byte)(unsafe.Pointer(&rt))[:]...)
	g := gw.As4()
	body = rtattr(body, unix.RTA_GATEWAY, g[:])
	oif := binary.NativeEndian.AppendUint32(nil, uint32(index))
	body = rtattr(body, unix.RTA_OIF, oif)
	return n.request(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body)
}
