package agentproto

import (
	"fmt"
	"strings"
)

// How a microVM guest (QEMU, Firecracker) boots into cagebox-agent: the
// initramfs holds the agent as /init, the guest's kernel modules, and, in a
// second cpio archive the host appends per sandbox, a VMConfig at
// VMConfigPath. Everything secret (the token) is in that file, never on the
// kernel command line (which guest processes read in /proc/cmdline); the
// command line carries only the kernel parameters named VMParam*.

// VMConfigPath is the boot configuration's path inside the initramfs. The
// init reads and deletes it before any guest process runs.
const VMConfigPath = "/cagebox/config.json"

// Kernel command line parameters the guest's init reads.
const (
	// VMParamAgent says where the agent serves the host:
	// "serial:NAME" (a virtio-serial port by name) or "vsock:PORT".
	VMParamAgent = "cagebox.agent"
	// VMParamAddr is the guest's address with prefix length (10.0.0.2/30)
	// on eth0; absent means no network.
	VMParamAddr = "cagebox.ip"
	// VMParamGateway is the default route's gateway.
	VMParamGateway = "cagebox.gw"
	// VMParamNIC says the VM has a network interface that the boot does
	// not configure (a template's: the claim configures it), so the init
	// loads the NIC's driver all the same.
	VMParamNIC = "cagebox.nic"
	// VMParamBare makes the init power the VM off at once (boot-time
	// baseline measurements).
	VMParamBare = "cagebox.bare"
	// VMParamDebug makes the agent log at debug level on the console.
	VMParamDebug = "cagebox.debug"
)

// Agent transports in a VM.
const (
	// VMSerialPort is the name of the agent's virtio-serial port.
	VMSerialPort = "cagebox.agent"
	// VMVsockPort is the agent's vsock port.
	VMVsockPort = 1024
)

// VMConfig is the per-sandbox boot configuration of a VM guest.
type VMConfig struct {
	// Token authenticates the host's connections to the agent.
	Token string `json:"token"`
	// Env is the base environment of guest processes.
	Env      []string `json:"env,omitempty"`
	Hostname string   `json:"hostname,omitempty"`
	// Nameserver, if set, becomes /etc/resolv.conf.
	Nameserver string `json:"nameserver,omitempty"`
	// TrustedCAPEM is added to the system bundle and written to the
	// cagebox CA paths.
	TrustedCAPEM string `json:"trusted_ca_pem,omitempty"`
	// PIDs bounds the processes (and threads) of the agent and everything
	// it starts, through a pids cgroup inside the guest.
	PIDs int64 `json:"pids,omitempty"`
	// DiskBytes bounds the writable layer (a tmpfs) over the image.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// AwaitClaim starts the agent waiting for the host's Claim (a VM
	// template: booted with no sandbox's identity, saved once the agent
	// waits, restored for each sandbox and claimed).
	AwaitClaim bool `json:"await_claim,omitempty"`
	// Mounts are extra virtio-blk disks (ext4) the init mounts in the
	// guest: volumes and read-only copies of host directories.
	Mounts []VMMount `json:"mounts,omitempty"`
	// ReadOnlyRoot makes the root read-only; /tmp becomes a tmpfs of
	// DiskBytes.
	ReadOnlyRoot bool `json:"read_only_root,omitempty"`
	// AuditSyscalls, when not empty, are the x86_64 syscall numbers the
	// guest kernel audits (`--audit`): the init enables audit, adds an
	// exit rule for them and hands the audit socket to the agent.
	AuditSyscalls []int `json:"audit_syscalls,omitempty"`
}

// VMMount is a disk the guest mounts: the virtio-blk device whose serial
// is Serial, at Target; always nosuid and nodev, read-only unless RW,
// noexec unless Exec.
type VMMount struct {
	Serial string `json:"serial"`
	Target string `json:"target"`
	RW     bool   `json:"rw,omitempty"`
	Exec   bool   `json:"exec,omitempty"`
}

// String never shows the token (it may end up in logs and errors).
func (c VMConfig) String() string {
	return fmt.Sprintf("VMConfig{hostname %q, %d env, pids %d, disk %d, ca %t, await claim %t}", c.Hostname, len(c.Env), c.PIDs, c.DiskBytes, c.TrustedCAPEM != "", c.AwaitClaim)
}

// ParseKernelCmdline returns the key=value words of a kernel command line
// (a bare word maps to "").
func ParseKernelCmdline(s string) map[string]string {
	out := map[string]string{}
	for _, w := range strings.Fields(s) {
		k, v, _ := strings.Cut(w, "=")
		out[k] = v
	}
	return out
}
