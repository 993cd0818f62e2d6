package qemu

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/cagebox/cagebox/agentproto"
)

// The file descriptors QEMU inherits (exec.Cmd.ExtraFiles order). QEMU
// never opens a host path of ours: it runs as an unprivileged uid that can
// traverse none of the daemon's directories.
const (
	fdKernel = 3 + iota
	fdInitrd
	fdRootDisk
	fdAgentSock // listening unix socket: the agent's virtio-serial port
	fdQMPSock   // listening unix socket: QMP
	fdTap       // only with a network
)

// Fdset numbers for -add-fd (block devices open /dev/fdset/N).
const fdsetRootDisk = 1

// vmConfig is everything the QEMU command line depends on.
type vmConfig struct {
	KVM       bool
	MemoryMiB int64
	CPUs      int
	// Append is the kernel command line.
	Append string
	// Net attaches a virtio-net NIC on the TAP at TapFD (0: fdTap) with
	// this MAC.
	Net   bool
	MAC   string
	TapFD int
	// RAMFD, if not 0, backs guest RAM with the file at that descriptor
	// (a memfd): mapped shared with RAMShared (a template's build: guest
	// RAM lands in the file, and migration with x-ignore-shared skips it),
	// else private (a restore: copy-on-write over the template's RAM,
	// which the guest's writes never reach).
	RAMFD     int
	RAMShared bool
	// RAMAnon backs guest RAM with anonymous memory named like a
	// template's backend (memory-backend-ram,id=ram0): a restored
	// sandbox resumed after hibernation, whose RAM is all in its state.
	RAMAnon bool
	// Incoming starts QEMU waiting for migrate-incoming (a restore).
	Incoming bool
	// Disks are extra virtio-blk disks (mounts, disks.go).
	Disks []vmDisk
}

// args builds QEMU's arguments (without the binary).
func (c *vmConfig) args() []string {
	machine := "microvm,x-option-roms=off,isa-serial=on,rtc=on,acpi=on,auto-kernel-cmdline=off"
	accel := "tcg,tb-size=64"
	cpu := "qemu64" // TCG's "max" model makes this kernel's boot far slower
	if c.KVM {
		// The in-kernel LAPIC timer and kvmclock replace the PIT and PIC.
		machine += ",pit=off,pic=off"
		accel = "kvm"
		cpu = "host"
	} else {
		// Under TCG the guest needs the legacy timer and interrupt
		// controller to calibrate and boot.
		machine += ",pit=on,pic=on"
	}
	fd := func(n int) string { return "/proc/self/fd/" + strconv.Itoa(n) }
	var ram []string
	if c.RAMFD > 0 {
		// QEMU 7.2's memory-backend-file opens mem-path itself (no
		// /dev/fdset): /proc/self/fd/N reopens the inherited memfd, which
		// allows any uid to open it. A restore's memfd is sealed against
		// writes (F_SEAL_WRITE), so only a private mapping works on it.
		machine += ",memory-backend=ram0"
		ram = []string{"-object", fmt.Sprintf("memory-backend-file,id=ram0,size=%dM,mem-path=%s,share=%s,prealloc=off",
			c.MemoryMiB, fd(c.RAMFD), map[bool]string{true: "on", false: "off"}[c.RAMShared])}
	} else if c.RAMAnon {
		machine += ",memory-backend=ram0"
		ram = []string{"-object", fmt.Sprintf("memory-backend-ram,id=ram0,size=%dM", c.MemoryMiB)}
	}
	a := []string{
		"-M", machine,
		"-accel", accel,
		"-cpu", cpu,
		"-smp", strconv.Itoa(max(c.CPUs, 1)),
		"-m", strconv.FormatInt(c.MemoryMiB, 10) + "M",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-msg", "timestamp=on",
		"-kernel", fd(fdKernel),
		"-initrd", fd(fdInitrd),
		"-append", c.Append,
		// The serial console (kernel and init messages) and QEMU's own
		// messages go to QEMU's stdout/stderr: the sandbox's console log.
		"-chardev", "stdio,id=console,signal=off",
		"-serial", "chardev:console",
		// The image, read-only, through a descriptor the daemon opened.
		"-add-fd", fmt.Sprintf("fd=%d,set=%d,opaque=rootdisk", fdRootDisk, fdsetRootDisk),
		"-blockdev", fmt.Sprintf("driver=file,node-name=rootfile,filename=/dev/fdset/%d,read-only=on,locking=off", fdsetRootDisk),
		"-blockdev", "driver=raw,node-name=rootdisk,file=rootfile,read-only=on",
		"-device", "virtio-blk-device,drive=rootdisk",
		// The agent's port, served by QEMU on a listening socket the
		// daemon made; one connection at a time.
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", fmt.Sprintf("socket,id=agent,fd=%d,server=on,wait=off", fdAgentSock),
		"-device", "virtserialport,chardev=agent,name=" + agentproto.VMSerialPort,
		// QMP, for pause, resume and power-down.
		"-chardev", fmt.Sprintf("socket,id=qmp,fd=%d,server=on,wait=off", fdQMPSock),
		"-mon", "chardev=qmp,mode=control",
	}
	for i, d := range c.Disks {
		set := fdsetRootDisk + 1 + i
		ro := map[bool]string{true: "off", false: "on"}[d.RW]
		a = append(a,
			"-add-fd", fmt.Sprintf("fd=%d,set=%d,opaque=%s", d.FD, set, d.Serial),
			"-blockdev", fmt.Sprintf("driver=file,node-name=%sfile,filename=/dev/fdset/%d,read-only=%s,locking=off", d.Serial, set, ro),
			"-blockdev", fmt.Sprintf("driver=raw,node-name=%s,file=%sfile,read-only=%s", d.Serial, d.Serial, ro),
			"-device", fmt.Sprintf("virtio-blk-device,drive=%s,serial=%s", d.Serial, d.Serial))
	}
	a = append(a, ram...)
	if c.Incoming {
		a = append(a, "-incoming", "defer")
	}
	if c.Net {
		tap := c.TapFD
		if tap == 0 {
			tap = fdTap
		}
		a = append(a,
			"-netdev", fmt.Sprintf("tap,id=net0,fd=%d", tap),
			"-device", "virtio-net-device,netdev=net0,mac="+c.MAC)
	}
	return a
}

// machineArgs is the part of args that every QEMU run shares (the
// sandboxes', the KVM probe's, the bare-boot baseline's): machine,
// accelerator, CPU model, size and hardening.
func machineArgs(c *vmConfig) []string {
	full := c.args()
	var out []string
	for i := 0; i+1 < len(full); i++ {
		switch full[i] {
		case "-M", "-accel", "-cpu", "-smp", "-m", "-sandbox":
			out = append(out, full[i], full[i+1])
			i++
		}
	}
	return out
}

// netParams is the guest side of a routed link.
type netParams struct {
	Addr    netip.Prefix // the guest's address with the link's prefix length (10.0.0.2/30)
	Gateway netip.Addr
}

// kernelCmdline is the guest kernel's command line. It is readable by
// guest processes (/proc/cmdline): nothing secret goes here.
//
// tscKHz, if not 0, is the TSC frequency to trust (tsc_early_khz). Under
// TCG the guest's TSC is the host's, and calibrating it against the
// emulated PIT fails now and then on a busy host; the kernel then marks
// the TSC unstable and spins for ever calibrating its delay loop. So TCG
// guests are told the host's TSC frequency.
func kernelCmdline(tscKHz int, n *netParams) string {
	p := []string{
		"console=ttyS0", "quiet", "loglevel=4", "panic=-1", "reboot=t",
		"rdinit=/init", "nomodeset",
		"random.trust_cpu=on", "i8042.noaux", "i8042.nomux", "i8042.nopnp", "i8042.dumbkbd",
		"cryptomgr.notests", "8250.nr_uarts=1", "pci=off",
		agentproto.VMParamAgent + "=serial:" + agentproto.VMSerialPort,
	}
	if os.Getenv("CAGEBOX_QEMU_DEBUG") != "" {
		p = append(p, agentproto.VMParamDebug)
	}
	if tscKHz > 0 {
		p = append(p, "tsc_early_khz="+strconv.Itoa(tscKHz))
	}
	if n != nil {
		p = append(p,
			agentproto.VMParamAddr+"="+n.Addr.String(),
			agentproto.VMParamGateway+"="+n.Gateway.String())
	}
	return strings.Join(p, " ")
}

// templateCmdline is a template's kernel command line: no address; with a
// NIC, the parameter that makes the init load its driver all the same.
func templateCmdline(tscKHz int, nic bool) string {
	c := kernelCmdline(tscKHz, nil)
	if nic {
		c += " " + agentproto.VMParamNIC
	}
	return c
}

// hostTSCkHz is the host's TSC frequency in kHz (what a TCG guest's TSC
// runs at), from /proc/cpuinfo's first "cpu MHz"; 0 if unknown.
func hostTSCkHz() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || mhz <= 0 {
				return 0
			}
			return int(mhz*1000 + 0.5)
		}
	}
	return 0
}
