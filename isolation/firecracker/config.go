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
	jailAPI    = "/run/firecracker.socket"
	guestCID   = 3
)

// vmConfig is what Start sends to Firecracker's API, built from a Spec.
type vmConfig struct {
	Machine models.MachineConfiguration
	Boot    models.BootSource
	Drives  []models.Drive
	Net     []models.NetworkInterface
	Vsock   models.Vsock
}

// buildConfig makes the VM's configuration. mac is the routed link's guest
// MAC (empty: no network).
func buildConfig(spec *isolation.Spec, res isolation.Resources, mac string) *vmConfig {
	vcpus := int64(math.Ceil(res.CPUs))
	if vcpus < 1 {
		vcpus = 1
	}
	mem := res.MemoryBytes >> 20
	if mem < 128 {
		mem = 128
	}
	c := &vmConfig{
		Machine: models.MachineConfiguration{VcpuCount: sdk.Int64(vcpus), MemSizeMib: sdk.Int64(mem), Smt: sdk.Bool(false)},
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
// init (cagebox-agent) reads the cagebox.* parameters: the agent listens on
// vsock port agentproto.VMVsockPort, and the guest's address and gateway
// come from the routed link.
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

// jailerArgs is the jailer's command line: chroot under base, the
// sandbox's uid/gid, its network namespace, a new PID namespace, and a
// cgroup bounding memory (guest RAM + overhead) and processes.
//
// The SDK's JailerCommandBuilder (v1.0.0) makes the common part; it has no
// option for --new-pid-ns or for resource --cgroup values, which are added
// here before the Firecracker arguments.
func jailerArgs(id, fcBin, base, netns string, uid int, cgroupV2 bool, memBytes int64) []string {
	b := sdk.NewJailerCommandBuilder().
		WithID(id).WithUID(uid).WithGID(uid).
		WithExecFile(fcBin).WithChrootBaseDir(base)
	if netns != "" {
		b = b.WithNetNS(netns)
	}
	args := b.Args()
	limit := strconv.FormatInt(memBytes+vmmOverhead, 10)
	if cgroupV2 {
		args = append(args, "--cgroup-version", "2", "--cgroup", "memory.max="+limit, "--cgroup", "pids.max=256")
	} else {
		args = append(args, "--cgroup", "memory.limit_in_bytes="+limit, "--cgroup", "pids.max=256")
	}
	args = append(args, "--new-pid-ns", "--", "--api-sock", jailAPI)
	return args
}

// vmmOverhead is the memory the VMM may use beyond the guest's RAM.
const vmmOverhead = 128 << 20

// jailRoot is the jail's root directory for sandbox id: the jailer's
// layout is <base>/<exec file name>/<id>/root.
func jailRoot(base, fcBin, id string) string {
	return filepath.Join(base, filepath.Base(fcBin), id, "root")
}

func (c *vmConfig) String() string {
	return fmt.Sprintf("vcpus %d, %d MiB, %d drive(s), %d nic(s)", *c.Machine.VcpuCount, *c.Machine.MemSizeMib, len(c.Drives), len(c.Net))
}
