// Package kvm decides whether this host's KVM can run what the runtimes need
// it for, by proving it: a bounded boot (the microVM runtimes' guest kernel
// under QEMU; a trivial sandbox on runsc's kvm platform), never the
// existence or openability of /dev/kvm alone. Some hosts offer a /dev/kvm
// that opens but cannot run a standard guest (a paravirtual nested KVM that
// boots only kernels built for it: QEMU's `-cpu host` aborts on an MSR,
// other CPU models hang early in boot). A failed probe makes its caller
// fall back (TCG; runsc's systrap or ptrace) and say why, quoting the probe.
//
// It also gives the VMMs, which run as uids of their own, the use of the
// device without widening access for anyone else (VMMAccess).
//
// The probes themselves belong to the runtimes, which hand them to a Cache
// so each runs once per host boot and per key (the kernel's digest, the
// binary), and start their VMMs with StartProbe so none outlives its
// daemon (SweepProbes kills one that did). It imports only vmproc.
package kvm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultDevice is the KVM device.
const DefaultDevice = "/dev/kvm"

// DefaultTimeout bounds a probe. A guest kernel reaches the end of its boot
// in ~0.1–0.3 s under working KVM; a probe that has not proven KVM in this
// time counts as a failure (a paravirtual KVM that cannot run the guest
// hangs rather than failing).
const DefaultTimeout = 5 * time.Second

// Verdict is what a probe found.
type Verdict struct {
	// Usable is true when the probe proved KVM works for its purpose.
	Usable bool `json:"usable"`
	// Reason is one line for `cagebox runtimes`: what was proven, or why
	// KVM is not used.
	Reason string `json:"reason"`
	// Evidence quotes the probe (QEMU's or runsc's own last words) when it
	// failed; empty otherwise.
	Evidence string `json:"evidence,omitempty"`
	// Took is how long the probe ran.
	Took time.Duration `json:"took"`
	// Probed is set by a probe that ran to a verdict (proof or failure),
	// not one that could not run; only those are kept for the boot.
	Probed bool `json:"probed,omitempty"`
	// Cached: the verdict is an earlier probe's of this host boot.
	Cached bool `json:"cached,omitempty"`
}

// String is Reason with the evidence quoted.
func (v Verdict) String() string {
	if v.Evidence == "" {
		return v.Reason
	}
	return v.Reason + ": " + Quote(v.Evidence)
}

// Quote makes probe output fit one line: whitespace runs collapse, and the
// text is cut to its last 300 bytes (the end of a console says most).
func Quote(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	const max = 300
	if len(s) > max {
		s = "…" + s[len(s)-max:]
	}
	return `"` + s + `"`
}

// Unusable is a failed verdict without a probe having run.
func Unusable(reason string) Verdict { return Verdict{Reason: reason} }

// Open checks that dev opens for reading and writing (as the daemon, root).
// It is a precondition of every probe, not a proof.
func Open(dev string) error {
	fd, err := syscall.Open(dev, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s cannot be opened: %w", dev, err)
	}
	syscall.Close(fd)
	return nil
}

// Cache runs each probe once per key for the life of the process, and —
// with a Dir — once per key and host boot: a probe's verdict (Probed) is
// kept in Dir/verdicts.json under the boot's id, so a restarted daemon
// does not probe again (a failing probe on a paravirtual KVM costs its
// whole timeout). Concurrent callers of the same key wait for the one
// probe. The key names what the verdict depends on besides the boot (the
// device, the VMM binary's build: BinaryID, the guest kernel's digest).
type Cache struct {
	// Dir is where verdicts of this boot are kept and probe VMMs are
	// recorded ("" = neither: verdicts last the process).
	Dir string

	// mu guards m.
	mu sync.Mutex
	m  map[string]*call
}

type call struct {
	done chan struct{}
	v    Verdict
}

// Do returns the verdict for key, running probe (bounded by timeout) the
// first time.
func (c *Cache) Do(key string, timeout time.Duration, probe func(ctx context.Context) Verdict) Verdict {
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]*call{}
	}
	if cl, ok := c.m[key]; ok {
		c.mu.Unlock()
		<-cl.done
		return cl.v
	}
	cl := &call{done: make(chan struct{})}
	c.m[key] = cl
	c.mu.Unlock()

	defer close(cl.done)
	if c.Dir != "" {
		SweepProbes(c.Dir, nil)
		if v, ok := loadBoot(c.Dir, key); ok {
			v.Cached = true
			v.Reason += " (kept from this boot's probe)"
			cl.v = v
			return cl.v
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	start := time.Now()
	cl.v = probe(ctx)
	cancel()
	if cl.v.Took == 0 {
		cl.v.Took = time.Since(start)
	}
	if c.Dir != "" && cl.v.Probed {
		if err := storeBoot(c.Dir, key, cl.v); err != nil {
			slog.Warn("kvm: cannot keep the probe's verdict for this boot", "err", err)
		}
	}
	return cl.v
}

// Forget drops every verdict held in memory (tests); those kept in Dir
// for the boot stay.
func (c *Cache) Forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, cl := range c.m {
		select {
		case <-cl.done:
			delete(c.m, k)
		default: // a probe in flight keeps its entry
		}
	}
}

// GroupName is the group that may use /dev/kvm; VMMs join it as their only
// supplementary group. scripts/setup.sh creates it (without members).
const GroupName = "kvm"

// Files VMMAccess reads; variables so tests can point them elsewhere.
var (
	groupFile  = "/etc/group"
	passwdFile = "/etc/passwd"
)

// ErrNoAccess is wrapped by VMMAccess when no VMM uid can be given the
// device without widening access for someone else.
var ErrNoAccess = errors.New("VMMs cannot be given /dev/kvm")

// VMMAccess makes dev usable by VMM processes that run as uids of their own
// and returns the gid they must hold as their only supplementary group (-1:
// none needed, the device is open to everyone). It never gives the device
// to anyone who could not use it before, except the members of an empty
// kvm group — that is, only to VMMs:
//
//   - a device the world may read and write needs nothing;
//   - a device whose group (not root's) may read and write: that group;
//   - otherwise (e.g. root:root 0600) the kvm group, if it exists and has no
//     members (no user lists it or has it as primary group): the device
//     becomes root:kvm with group read/write. Anything else is refused with
//     a message saying what to do.
//
// note says what was changed ("" for nothing).
func VMMAccess(dev string) (gid int, note string, err error) {
	fi, err := os.Stat(dev)
	if err != nil {
		return -1, "", fmt.Errorf("%w: %v", ErrNoAccess, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || fi.Mode()&fs.ModeCharDevice == 0 {
		return -1, "", fmt.Errorf("%w: %s is not a character device", ErrNoAccess, dev)
	}
	perm := uint32(fi.Mode().Perm())
	if perm&0o006 == 0o006 {
		return -1, "", nil
	}
	if st.Gid != 0 && perm&0o060 == 0o060 {
		return int(st.Gid), "", nil
	}
	g, members, err := lookupGroup(GroupName)
	if err != nil {
		return -1, "", fmt.Errorf("%w: %s is %04o owned by group %d, and %v: run scripts/setup.sh (it creates an empty %q group) or make the device usable by a group of its own", ErrNoAccess, dev, perm, st.Gid, err, GroupName)
	}
	if len(members) > 0 {
		return -1, "", fmt.Errorf("%w: %s is %04o owned by group %d, and giving it to group %q would widen access to its members (%s): make it root:%s 0660 yourself if that is intended", ErrNoAccess, dev, perm, st.Gid, GroupName, strings.Join(members, ", "), GroupName)
	}
	if st.Gid != uint32(g) {
		if err := os.Chown(dev, -1, g); err != nil {
			return -1, "", fmt.Errorf("%w: give %s to group %s: %v", ErrNoAccess, dev, GroupName, err)
		}
	}
	if err := os.Chmod(dev, fs.FileMode(perm|0o060)); err != nil {
		return -1, "", fmt.Errorf("%w: chmod %s: %v", ErrNoAccess, dev, err)
	}
	return g, fmt.Sprintf("%s was %04o owned by group %d; made it group %s (gid %d, no members) %04o so VMMs can use it", dev, perm, st.Gid, GroupName, g, perm|0o060), nil
}

// lookupGroup reads name's gid and members from the group file, adding the
// users whose primary group it is. Hand-parsed: os/user does not list a
// group's members, and a cgo-free build has no NSS anyway (groups only in
// LDAP are not seen; setup creates a local group).
func lookupGroup(name string) (gid int, members []string, err error) {
	b, err := os.ReadFile(groupFile)
	if err != nil {
		return -1, nil, fmt.Errorf("read %s: %w", groupFile, err)
	}
	gid = -1
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 4 || f[0] != name {
			continue
		}
		if _, err := fmt.Sscan(f[2], &gid); err != nil {
			return -1, nil, fmt.Errorf("%s: bad gid for group %s", groupFile, name)
		}
		for _, m := range strings.Split(f[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				members = append(members, m)
			}
		}
		break
	}
	if gid < 0 {
		return -1, nil, fmt.Errorf("there is no group %q", name)
	}
	if gid == 0 {
		return -1, nil, fmt.Errorf("group %q has gid 0", name)
	}
	if pb, err := os.ReadFile(passwdFile); err == nil {
		for _, line := range strings.Split(string(pb), "\n") {
			f := strings.Split(line, ":")
			if len(f) < 4 {
				continue
			}
			var pg int
			if _, err := fmt.Sscan(f[3], &pg); err == nil && pg == gid {
				members = append(members, f[0])
			}
		}
	}
	return gid, members, nil
}
