// Package isolation defines the interface every sandbox runtime implements
// (containers, gVisor, microVMs), a registry of runtimes by name, and the
// rubric that orders them by isolation strength.
package isolation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/internal/rootfs"
	"github.com/cagebox/cagebox/internal/syscallaudit"
)

// Class is the strength of the isolation boundary a runtime offers.
type Class int

// Isolation classes, weakest first.
const (
	Namespaces Class = iota + 1 // shared kernel: namespaces, cgroups, seccomp
	AppKernel                   // an application kernel (gVisor) between guest and host
	Hypervisor                  // hardware virtualisation
)

func (c Class) String() string {
	switch c {
	case Namespaces:
		return "namespaces"
	case AppKernel:
		return "app-kernel"
	case Hypervisor:
		return "hypervisor"
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// ParseClass parses the names String returns.
func ParseClass(s string) (Class, error) {
	for _, c := range []Class{Namespaces, AppKernel, Hypervisor} {
		if c.String() == s {
			return c, nil
		}
	}
	return 0, fmt.Errorf("unknown isolation class %q: use namespaces, app-kernel or hypervisor", s)
}

// Resources are the limits a sandbox is created with. Zero means the
// default (WithDefaults).
type Resources struct {
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	PIDs        int64   `json:"pids,omitempty"`
	// DiskBytes bounds the per-sandbox writable layer.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// The limits of a sandbox whose request leaves them at zero, the same for
// every runtime.
const (
	DefaultMemoryBytes = 512 << 20
	DefaultCPUs        = 1.0
	DefaultPIDs        = 512
	DefaultDiskBytes   = 1 << 30
)

// WithDefaults returns r with every limit at zero (or below) set to its
// default.
func (r Resources) WithDefaults() Resources {
	if r.MemoryBytes <= 0 {
		r.MemoryBytes = DefaultMemoryBytes
	}
	if r.CPUs <= 0 {
		r.CPUs = DefaultCPUs
	}
	if r.PIDs <= 0 {
		r.PIDs = DefaultPIDs
	}
	if r.DiskBytes <= 0 {
		r.DiskBytes = DefaultDiskBytes
	}
	return r
}

// Spec is what a runtime needs to create a sandbox.
type Spec struct {
	ID string
	// StateDir is an empty directory owned by this sandbox; the runtime keeps
	// everything it creates on the host below it (or records it in State).
	StateDir string
	// RootFS is the image's root filesystem directory. It is never written.
	RootFS string
	// AgentPath is the host path of the static cagebox-agent binary.
	AgentPath string
	// AgentToken authenticates every connection to the agent.
	AgentToken string
	// Env is the base environment of processes in the guest.
	Env       []string
	Hostname  string
	Resources Resources
	// NetNS is the path of a network namespace for the sandbox to join. Empty
	// means a new namespace with loopback only (no network at all).
	NetNS string
	// GuestIf, GuestAddr, Gateway and Prefix describe the routed link inside
	// NetNS (interface "eth0" holding GuestAddr, default route via Gateway).
	// Containers inherit them with the namespace; a VM runtime moves the
	// link into its guest (TAP + redirect) and configures the guest's
	// interface from them. Zero when NetNS is empty.
	GuestIf   string
	GuestAddr netip.Addr
	Gateway   netip.Addr
	Prefix    netip.Prefix
	// Nameserver is the guest's DNS server (its gateway's synthetic
	// resolver); empty leaves the image's resolv.conf.
	Nameserver string
	// TrustedCAPEM is a CA certificate the guest must trust (the egress
	// gateway's per-sandbox interception CA). It is added to the guest's
	// system bundle and written to GuestCAPath and GuestCABundlePath.
	TrustedCAPEM []byte
	// AwaitClaim starts the agent waiting for the host's claim
	// (agentproto.Claim): it answers to AgentToken, runs nothing, and
	// takes the sandbox's token, environment and guest files when claimed.
	// A pool fills with such sandboxes before it knows whose they will be.
	AwaitClaim bool
	// Mounts are host directories, files and volumes to mount in the
	// guest, checked and resolved by the daemon (package mounts), ordered
	// by Target. Each is nosuid and nodev, read-only unless RW, noexec
	// unless Exec.
	Mounts []Mount
	// ReadOnlyRoot makes the image root read-only: only Mounts and a
	// size-bounded /tmp (Resources.DiskBytes) are writable.
	ReadOnlyRoot bool
	// FromSnapshot is a directory a sandbox of this runtime wrote with
	// Snapshotter.Snapshot (the daemon keeps it unchanged and checks its
	// digest): Create starts the sandbox from it instead of from RootFS
	// alone. Resources and RootFS are the snapshotted sandbox's. A
	// filesystem snapshot gives the new sandbox the writable layer as it
	// was, and its agent starts afresh as Spec says. A memory snapshot
	// resumes the guest as it was, processes and all: its agent answers
	// to AgentToken (the snapshotted sandbox's token; AwaitClaim is set)
	// and the sandbox is Claimable — its claim re-keys the guest (token,
	// entropy, clock, address, hostname, CA, environment) before it runs
	// anything new. Only runtimes that are SnapshottingRuntimes see it.
	FromSnapshot string
	// FromSnapshotDigest is the digest Snapshot returned for FromSnapshot
	// (the daemon's record of it): Create refuses a snapshot whose content
	// no longer matches it.
	FromSnapshotDigest string
	// Audit, when its Classes are not empty, streams the guest's audited
	// system calls (`cagebox create --audit`) to its Sink. A runtime that
	// cannot audit does not implement AuditGaps, and the sandbox manager
	// refuses such a request.
	Audit Audit
}

// MountingRuntime is implemented by runtimes that honour Spec.Mounts and
// Spec.ReadOnlyRoot; the daemon refuses both for any other runtime.
type MountingRuntime interface {
	SupportsMounts() bool
}

// Mount is one resolved mount of a Spec.
type Mount struct {
	// Type is mounts.Bind or mounts.Volume.
	Type string
	// Name is what the tenant named: a host path or a volume name.
	Name string
	// Target is the guest path (absolute, cleaned).
	Target   string
	RW, Exec bool
	// Bind is a bind mount's checked source; the runtime mounts through
	// its descriptor (never by path) and does not close it.
	Bind *mounts.Source
	// Image is a volume's ext4 image on the host.
	Image string
}

// Audit is what a sandbox's syscall audit records and where to.
type Audit struct {
	Classes syscallaudit.Set
	// Sink receives each record; it must not block (the sandbox
	// manager's rate-limits and queues). Records arrive from one
	// goroutine per sandbox.
	Sink func(syscallaudit.Record)
}

// AuditGaps is implemented by runtimes that cannot record some audit
// classes: Unrecorded returns those of set they cannot record, and why.
type AuditGaps interface {
	Unrecorded(set syscallaudit.Set) (syscallaudit.Set, string)
}

// AgentAudit is implemented by runtimes whose guest agent streams the
// audit records (VMs: agentproto's audit operation) rather than the
// runtime's Sink: the holder of the agent session subscribes
// (agentproto.Client.Audit) and converts them (syscallaudit.FromAgent).
type AgentAudit interface {
	AuditsThroughAgent() bool
}

// Guest paths of the trusted CA files (every runtime writes them as
// rootfs.Guest describes; the daemon points SSL_CERT_FILE and friends at
// them).
const (
	GuestCAPath       = rootfs.CAPath
	GuestCABundlePath = rootfs.CABundlePath
	GuestSystemBundle = rootfs.SystemBundle
)

// CAEnv is the environment that makes common clients (OpenSSL, curl,
// Python requests, Node) trust the guest's CA bundle.
func CAEnv() []string {
	return []string{
		"SSL_CERT_FILE=" + GuestCABundlePath,
		"REQUESTS_CA_BUNDLE=" + GuestCABundlePath,
		"CURL_CA_BUNDLE=" + GuestCABundlePath,
		"NODE_EXTRA_CA_CERTS=" + GuestCAPath,
		"GIT_SSL_CAINFO=" + GuestCABundlePath,
	}
}

// State is the serialisable record of a sandbox that a runtime needs to
// recover it after a daemon restart.
type State struct {
	ID      string          `json:"id"`
	Runtime string          `json:"runtime"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// Runtime creates sandboxes of one kind.
type Runtime interface {
	Name() string
	Class() Class
	// Available is nil, or says why this runtime cannot run here.
	Available() error
	// Create prepares a sandbox; ctx bounds setup only, never the sandbox's life.
	Create(ctx context.Context, spec *Spec) (Sandbox, error)
	// Recover re-attaches to a sandbox after a daemon restart. It returns an
	// error wrapping ErrGone when the sandbox no longer runs.
	Recover(ctx context.Context, st State) (Sandbox, error)
}

// Sandbox is one isolated guest.
type Sandbox interface {
	ID() string
	// State is stored by the caller before Start returns.
	State() State
	Start(ctx context.Context) error
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	Stop(ctx context.Context, grace time.Duration) error
	// DialAgent returns a byte stream to cagebox-agent in the guest.
	DialAgent(ctx context.Context) (net.Conn, error)
	// Destroy is idempotent and leaves nothing behind on the host.
	Destroy(ctx context.Context) error
}

// Claimable is implemented by sandboxes whose agent may start as
// something other than the sandbox the spec describes — a microVM restored
// from a template boots as the template — and must be claimed
// (agentproto.Claim) before it runs anything.
type Claimable interface {
	// ClaimInfo says how to claim the agent; a zero Token means there is
	// nothing to claim beyond what the spec asked for.
	ClaimInfo() ClaimInfo
}

// ClaimInfo is how the host claims a sandbox's agent.
type ClaimInfo struct {
	// Token is the token the agent answers to until it is claimed.
	Token string
	// GuestNet: the guest configures its own network from the claim (a VM
	// guest restored without the sandbox's address).
	GuestNet bool
	// MAC is the hardware address the guest's NIC takes, if it changes.
	MAC string
}

// Snapshotter is implemented by sandboxes that can be saved while they
// run, for new sandboxes to start from (cagebox snapshot, fork). Snapshot
// writes the snapshot into dir (an empty directory the caller made and
// removes on error) and leaves the sandbox running as it was; it may be
// paused (frozen) while the snapshot is taken, never longer. What it
// writes must be complete when Snapshot returns nil, and is never written
// again: restores only read it.
type Snapshotter interface {
	Snapshot(ctx context.Context, dir string) (SnapshotInfo, error)
}

// SnapshotInfo says what a snapshot holds.
type SnapshotInfo struct {
	// Memory: the guest's memory and device state as well as its disks —
	// processes go on in every restore, each re-keyed by its claim. Without
	// it, the writable filesystem layer only: a restore boots afresh on it.
	Memory bool `json:"memory"`
	// Bytes is the host disk space the snapshot takes.
	Bytes int64 `json:"bytes"`
	// Digest ("sha256:…") covers everything in dir a restore reads; a
	// restore refuses a snapshot whose content no longer matches it.
	Digest string `json:"digest"`
}

// SnapshottingRuntime is implemented by runtimes whose sandboxes are
// Snapshotters and whose Create honours Spec.FromSnapshot.
type SnapshottingRuntime interface {
	// Snapshots says what kind of snapshot its sandboxes take here
	// (memory true: processes are kept), or an error saying why this host
	// cannot take them.
	Snapshots() (memory bool, err error)
}

// Hibernator is implemented by sandboxes that can be saved whole — memory
// and device state, in the sandbox's state dir — with their VMM ended,
// freeing its memory. Resume brings a hibernated sandbox back as it was,
// with the same network identity and agent token: it is the same sandbox,
// nothing is claimed again (agent connections must be redialled). A
// hibernated sandbox survives a daemon restart: Recover returns it
// hibernated, and Resume wakes it. Stop of a hibernated sandbox does
// nothing; Destroy removes it.
type Hibernator interface {
	Hibernate(ctx context.Context) error
}

// HibernatingRuntime is implemented by runtimes whose sandboxes are
// Hibernators (checked before a sandbox exists: an idle action).
type HibernatingRuntime interface {
	Hibernates() bool
}

// OOMCounter is implemented by sandboxes that can tell how many processes
// the kernel has killed for running out of the sandbox's memory.
type OOMCounter interface {
	OOMKills() (uint64, error)
}

// OOMScope is implemented by sandboxes that can say what running out of
// memory kills. A runtime with an OOM killer in the guest (a container's
// memory cgroup, a VM's kernel) kills the process that ran over the limit
// and the sandbox lives on: it reports false, or does not implement
// OOMScope at all. A runtime without a guest OOM killer (gVisor: the host
// kills the sandbox's kernel process) reports true: when the sandbox's
// memory limit is reached, the whole sandbox dies, agent and all. Such a
// sandbox must implement OOMCounter, so its death can be told apart from
// a crash.
type OOMScope interface {
	OOMKillsSandbox() bool
}

// Errors runtimes wrap.
var (
	ErrGone        = errors.New("sandbox is gone")
	ErrUnavailable = errors.New("runtime unavailable")
)

var (
	// mu guards registry.
	mu       sync.RWMutex
	registry = map[string]Runtime{}
)

// Register adds a runtime; it panics on a duplicate name (a programming error).
func Register(rt Runtime) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := registry[rt.Name()]; dup {
		panic("isolation: runtime registered twice: " + rt.Name())
	}
	registry[rt.Name()] = rt
}

// Lookup finds a registered runtime by name.
func Lookup(name string) (Runtime, bool) {
	mu.RLock()
	defer mu.RUnlock()
	rt, ok := registry[name]
	return rt, ok
}

// All returns every registered runtime, strongest class first, then by name.
func All() []Runtime {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]Runtime, 0, len(registry))
	for _, rt := range registry {
		out = append(out, rt)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Class() != out[j].Class() {
			return out[i].Class() > out[j].Class()
		}
		return out[i].Name() < out[j].Name()
	})
	return out
}

// Pick chooses a runtime. name "auto" (or empty) picks the strongest
// available runtime whose class is at least floor.
func Pick(name string, floor Class) (Runtime, error) {
	if name == "" || name == "auto" {
		var reasons []string
		for _, rt := range All() {
			if rt.Class() < floor {
				reasons = append(reasons, fmt.Sprintf("%s is %s, below the floor", rt.Name(), rt.Class()))
				continue
			}
			if err := rt.Available(); err != nil {
				reasons = append(reasons, fmt.Sprintf("%s: %v", rt.Name(), err))
				continue
			}
			return rt, nil
		}
		return nil, fmt.Errorf("%w: no runtime of class %s or stronger is available here (%s)", ErrUnavailable, floor, strings.Join(reasons, "; "))
	}
	rt, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown runtime %q: `cagebox runtimes` lists them", name)
	}
	if rt.Class() < floor {
		return nil, fmt.Errorf("runtime %q (%s) is below the isolation floor %s: pick a runtime of class %s or stronger", name, rt.Class(), floor, floor)
	}
	if err := rt.Available(); err != nil {
		return nil, fmt.Errorf("%w: runtime %q: %v", ErrUnavailable, name, err)
	}
	return rt, nil
}

// Describer is implemented by runtimes that say how they run here (binary
// and version, platform or accelerator), shown by `cagebox runtimes` and
// logged at daemon start.
type Describer interface {
	Detail() string
}

// LogTailer is implemented by sandboxes whose guest log can be quoted in
// an error (the end of the agent's log when its claim fails).
type LogTailer interface {
	LogTail() string
}

// Closer is implemented by runtimes that do work in the background (the
// qemu runtime's template builds): Close ends it and waits for its
// cleanup, so nothing outlives the daemon that stops. Sandboxes keep
// running.
type Closer interface {
	Close()
}

// LeakChecker is implemented by sandboxes that can list what of them is
// left on the host (cgroups, mounts, state, processes); after Destroy the
// list must be empty.
type LeakChecker interface {
	Leftovers(ctx context.Context) []string
}
