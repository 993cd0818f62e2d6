package firecracker

import (
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	sdk "github.com/firecracker-microvm/firecracker-go-sdk"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/vmnet"
	"github.com/cagebox/cagebox/isolation"
)

// Paths inside the jail (the chroot the jailer makes; Firecracker sees
// only these).
const (
	jailKernel = "/vmlinux"
	jailInitrd = "/initrd"
	jailRootfs = "/rootfs.ext4"
	jailVsock  = "/v.sock"
	// jailAPI is in the jail's root, the one directory the jailer gives
	// the VMM's uid (a /run there would be root's, and Firecracker does
	// not make the socket's directory).
	jailAPI  = "/api.sock"
	guestCID = 3
)

// Limits of the VMM process itself (the jailer's cgroup).
const (
	// vmmOverhead is the memory the VMM may use beyond the guest's RAM
	// (its own code and heap, virtio queues, I/O buffers).
	vmmOverhead = 128 << 20
	// vmmPIDs bounds the VMM's threads (API, VMM, one per vCPU, I/O).
	vmmPIDs = 256
	// cpuPeriod is the CFS period the CPU quota is a share of (µs).
	cpuPeriod = 100000
	// minGuestMiB is the least memory the guest kernel and init boot in.
	minGuestMiB = 128
	// maxVCPUs is Firecracker's limit.
	maxVCPUs = 32
	// vmmLogLimit bounds the VMM's log (its stdout and stderr:
	// Firecracker's messages and the guest's serial console) through the
	// jailer's fsize resource limit. A VMM that writes past it is ended
	// (Firecracker exits on SIGXFSZ), so a guest flooding its console
	// cannot fill the host's disk; Firecracker writes no other regular
	// file (the image disk is read-only, the writable layer is in guest
	// RAM).
	vmmLogLimit = 32 << 20
)

// vmConfig is what Start sends to Firecracker's API, built from a Spec.
type vmConfig struct {
	Machine models.MachineConfiguration
	Boot    models.BootSource
	Drives  []models.Drive
	Net     []models.NetworkInterface
	Vsock   models.Vsock
}

// machineSize is the guest's vCPUs and memory for res (whose zero fields
// the caller has already defaulted).
func machineSize(res isolation.Resources) (vcpus, memMiB int64, err error) {
	vcpus = int64(math.Ceil(res.CPUs))
	if vcpus < 1 {
		vcpus = 1
	}
	if vcpus > maxVCPUs {
		return 0, 0, fmt.Errorf("%g CPUs is more than Firecracker's %d vCPUs: ask for fewer", res.CPUs, maxVCPUs)
	}
	memMiB = (res.MemoryBytes + (1<<20 - 1)) >> 20
	if memMiB < minGuestMiB {
		return 0, 0, fmt.Errorf("%d MiB of memory is too little for a VM guest: give it at least %d MiB", memMiB, minGuestMiB)
	}
	return vcpus, memMiB, nil
}

// buildConfig makes the VM's configuration. mac is the routed link's guest
// MAC (empty: no network).
func buildConfig(spec *isolation.Spec, vcpus, memMiB int64, mac string) *vmConfig {
	c := &vmConfig{
		Machine: models.MachineConfiguration{VcpuCount: sdk.Int64(vcpus), MemSizeMib: sdk.Int64(memMiB), Smt: sdk.Bool(false)},
		Boot: models.BootSource{
			KernelImagePath: sdk.String(jailKernel),
			InitrdPath:      jailInitrd,
			BootArgs:        kernelArgs(spec, mac != ""),
		},
		Drives: []models.Drive{{
			DriveID: sdk.String("rootfs"), PathOnHost: sdk.String(jailRootfs),
			IsRootDevice: sdk.Bool(false), IsReadOnly: sdk.Bool(true),
		}},
		Vsock: models.Vsock{VsockID: "agent", GuestCid: sdk.Int64(guestCID), UdsPath: sdk.String(jailVsock)},
	}
	if mac != "" {
		c.Net = []models.NetworkInterface{{IfaceID: sdk.String("eth0"), HostDevName: sdk.String(vmnet.TapName), GuestMac: mac}}
	}
	return c
}

// kernelArgs is the guest kernel's command line: readable by guest
// processes, so nothing secret (the token travels in the initramfs). The
// init (cagebox-agent as /init) reads the cagebox.* parameters
// (agentproto.VMParam*):
//
//	cagebox.agent=vsock:1024      where the agent serves the host
//	cagebox.ip=10.201.0.2/30      the guest's address on eth0 (with a link)
//	cagebox.gw=10.201.0.1         its default route (with a link)
//
// reboot=k makes a guest reboot or power-off end Firecracker; panic=-1
// reboots (so ends the VM) at once on a guest panic.
func kernelArgs(spec *isolation.Spec, withNet bool) string {
	p := []string{
		"console=ttyS0", "quiet", "loglevel=4", "reboot=k", "panic=-1", "pci=off",
		"rdinit=/init", "random.trust_cpu=on", "i8042.noaux", "i8042.nomux", "i8042.dumbkbd",
		agentproto.VMParamAgent + "=vsock:" + strconv.Itoa(agentproto.VMVsockPort),
	}
	if withNet && spec.GuestAddr.IsValid() {
		p = append(p,
			agentproto.VMParamAddr+"="+netip.PrefixFrom(spec.GuestAddr, spec.Prefix.Bits()).String(),
			agentproto.VMParamGateway+"="+spec.Gateway.String())
	}
	return strings.Join(p, " ")
}

// jailSpec is what the jailer's command line is made of.
type jailSpec struct {
	ID          string // the jail id (the sandbox id)
	Firecracker string // --exec-file
	ChrootBase  string
	NetNS       string // "" = none
	UID         uint32 // also the gid
	CgroupV2    bool
	MemoryBytes int64   // cgroup memory limit: guest RAM + VMM overhead
	CPUs        float64 // CPU quota in CPUs (0 = none)
}

// jailerArgs is the jailer's command line: chroot under ChrootBase, the
// sandbox's uid/gid, its network namespace, a new PID namespace, and a
// cgroup (named <exec file name>/<id>) bounding memory, CPU time and
// threads.
//
// Built here rather than with firecracker-go-sdk's JailerCommandBuilder
// (v1.0.0), which cannot express it: it has no --new-pid-ns, no resource
// --cgroup values and no --parent-cgroup, and it always pins the VM to
// NUMA node 0 (--cgroup cpuset.mems=0 and node 0's cpuset.cpus) whenever
// the host has NUMA information, which would put every VM of a
// multi-socket host on the first socket's CPUs. The SDK's Machine cannot
// run a jailed VMM this way either: it treats the jailer's exit after
// forking into the new PID namespace as the VMM's death, and ties the
// VMM's life to the context given to Start.
func jailerArgs(j jailSpec) []string {
	args := []string{
		"--id", j.ID,
		"--exec-file", j.Firecracker,
		"--uid", strconv.FormatUint(uint64(j.UID), 10),
		"--gid", strconv.FormatUint(uint64(j.UID), 10),
		"--chroot-base-dir", j.ChrootBase,
	}
	if j.NetNS != "" {
		args = append(args, "--netns", j.NetNS)
	}
	mem := strconv.FormatInt(j.MemoryBytes, 10)
	quota := int64(math.Ceil(j.CPUs * cpuPeriod))
	if j.CgroupV2 {
		args = append(args, "--cgroup-version", "2", "--cgroup", "memory.max="+mem, "--cgroup", "pids.max="+strconv.Itoa(vmmPIDs))
		if quota > 0 {
			args = append(args, "--cgroup", fmt.Sprintf("cpu.max=%d %d", quota, cpuPeriod))
		}
	} else {
		// v1 is the jailer's default (hybrid hosts too: their memory, cpu
		// and pids controllers are v1).
		args = append(args, "--cgroup", "memory.limit_in_bytes="+mem, "--cgroup", "pids.max="+strconv.Itoa(vmmPIDs))
		if quota > 0 {
			// The period is the kernel's default (100 ms).
			args = append(args, "--cgroup", "cpu.cfs_quota_us="+strconv.FormatInt(quota, 10))
		}
	}
	args = append(args, "--resource-limit", "fsize="+strconv.Itoa(vmmLogLimit))
	return append(args, "--new-pid-ns", "--", "--api-sock", jailAPI)
}

// jailRoot is the jail's root directory for sandbox id: the jailer's
// layout is <base>/<exec file name>/<id>/root.
func jailRoot(base, fcBin, id string) string {
	return filepath.Join(base, filepath.Base(fcBin), id, "root")
}

// jailCgroup is the cgroup the jailer makes for sandbox id, relative to
// each hierarchy: its default parent is the exec file's name.
func jailCgroup(fcBin, id string) string {
	return filepath.Base(fcBin) + "/" + id
}

func (c *vmConfig) String() string {
	return fmt.Sprintf("vcpus %d, %d MiB, %d drive(s), %d nic(s)", *c.Machine.VcpuCount, *c.Machine.MemSizeMib, len(c.Drives), len(c.Net))
}
