package qemu

// Hibernation (isolation.Hibernator): the whole VM — RAM and device state —
// is migrated into a file in the sandbox's state dir and QEMU ends, freeing
// the sandbox's memory; Resume starts QEMU again with the same machine,
// the sandbox's disk, new sockets at the same paths and a new TAP joined
// to the same link (same MAC and address), and migrates the file back in.
// The guest continues where it stopped: same agent, same token, same
// identity; agent connections are redialled.
//
// What Resume needs is on disk, so a daemon restart in between is fine:
// boot.json (written at Create: the machine's parameters and boot
// files), hibernated.json (written once the state is saved, before QEMU
// is told to quit: its presence means the saved state is complete),
// hibernate.state, and links (or copies) of the kernel and initramfs,
// which the VM artifact cache may replace meanwhile.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cagebox/cagebox/internal/vmnet"
	"github.com/cagebox/cagebox/isolation"
)

var _ isolation.Hibernator = (*Sandbox)(nil)

// bootRecord is how the sandbox's QEMU was started (boot.json).
type bootRecord struct {
	Kernel    string `json:"kernel"`
	Initrd    string `json:"initrd"`
	Disk      string `json:"disk"`
	MemoryMiB int64  `json:"memory_mib"`
	CPUs      int    `json:"cpus"`
	Append    string `json:"append"`
	// MAC is the NIC's device address on QEMU's command line (a
	// restored sandbox's is the template's; its guest uses its own).
	MAC string `json:"mac,omitempty"`
	// RAMBackend: guest RAM is the memory-backend object ram0 (a
	// restored sandbox), not the machine's default RAM.
	RAMBackend bool `json:"ram_backend,omitempty"`
	KVM        bool `json:"kvm"`
	// Disks are the extra disks (mounts).
	Disks []diskRecord `json:"disks,omitempty"`
}

// hibernation is hibernated.json.
type hibernation struct {
	At     time.Time `json:"at"`
	Kernel string    `json:"kernel"`
	Initrd string    `json:"initrd"`
}

const (
	bootFile      = "boot.json"
	hibernateFile = "hibernated.json"
	hibStateFile  = "hibernate.state"
)

func writeJSON(p string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeSynced(p, b)
}

func readJSON(p string, v any) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// hibernated reports whether the sandbox is saved with no QEMU running.
func (s *Sandbox) hibernated() bool {
	_, err := os.Stat(s.sd.path(hibernateFile))
	return err == nil
}

// Hibernate implements isolation.Hibernator: it stops the vCPUs, saves RAM
// and device state to the state dir, and ends QEMU.
func (s *Sandbox) Hibernate(ctx context.Context) error {
	if s.hibernated() {
		return nil
	}
	proc := s.running()
	if proc == nil {
		return fmt.Errorf("qemu: hibernate: %w", isolation.ErrGone)
	}
	var rec bootRecord
	if err := readJSON(s.sd.path(bootFile), &rec); err != nil {
		return fmt.Errorf("qemu: hibernate: boot record: %w (a sandbox created by an older cagebox cannot hibernate)", err)
	}
	// The boot files, kept beside the state: the artifact cache may
	// replace them before Resume.
	hib := hibernation{Kernel: s.sd.path("hibernate.kernel"), Initrd: s.sd.path("hibernate.initrd")}
	for src, dst := range map[string]string{rec.Kernel: hib.Kernel, rec.Initrd: hib.Initrd} {
		if err := linkOrCopy(src, dst); err != nil {
			return fmt.Errorf("qemu: hibernate: keep %s: %w", filepath.Base(src), err)
		}
	}
	f, err := os.OpenFile(s.sd.path(hibStateFile), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("qemu: hibernate: %w", err)
	}
	defer f.Close()
	t0 := time.Now()
	// The agent sees a connection that just ended before its vCPUs stop
	// (as DialAgent waits for it to), so that the saved agent waits for
	// a new connection rather than sitting in the old session.
	if d := s.link.waitGap(); d > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: hibernate: %w", ctx.Err())
		case <-time.After(d):
		}
	}
	if err := s.qmp(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("qemu: hibernate: stop: %w", err)
	}
	// Undo on failure: the guest runs on.
	ok := false
	defer func() {
		if !ok {
			_ = os.Remove(s.sd.path(hibStateFile))
			_ = s.qmp(context.Background(), "cont", nil, nil)
		}
	}()
	// A stopped VM migrates as fast as the disk takes it (the default
	// limit, 128 MiB/s, is for live migration).
	if err := s.qmp(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return fmt.Errorf("qemu: hibernate: %w", err)
	}
	// The whole RAM goes into the state (a restored sandbox's QEMU still
	// has the capability its restore set).
	noIgnore := map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": false}}}
	if err := s.qmp(ctx, "migrate-set-capabilities", noIgnore, nil); err != nil {
		return fmt.Errorf("qemu: hibernate: %w", err)
	}
	if err := s.qmpFD(ctx, "hibernate", f, "migrate", map[string]any{"uri": "fd:hibernate"}); err != nil {
		return fmt.Errorf("qemu: hibernate: save: %w", err)
	}
	if err := waitMigration(ctx, s); err != nil {
		return fmt.Errorf("qemu: hibernate: save: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("qemu: hibernate: save: %w", err)
	}
	hib.At = time.Now().UTC()
	if err := writeJSON(s.sd.path(hibernateFile), hib); err != nil {
		return fmt.Errorf("qemu: hibernate: %w", err)
	}
	ok = true
	size, _ := f.Seek(0, io.SeekEnd)
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_ = s.qmp(qctx, "quit", nil, nil)
	cancel()
	if !s.waitExit(ctx, proc, 5*time.Second) {
		if err := proc.Kill(); err != nil {
			return fmt.Errorf("qemu: hibernate: end qemu: %w", err)
		}
		s.waitExit(ctx, proc, 5*time.Second)
	}
	s.link.closedNow()
	s.log.Info("hibernated", "took", time.Since(t0).Round(time.Millisecond), "state_mib", size>>20)
	return nil
}

// wake is Resume of a hibernated sandbox.
func (s *Sandbox) wake(ctx context.Context) (err error) {
	var rec bootRecord
	var hib hibernation
	if err := readJSON(s.sd.path(bootFile), &rec); err != nil {
		return fmt.Errorf("qemu: resume: boot record: %w", err)
	}
	if err := readJSON(s.sd.path(hibernateFile), &hib); err != nil {
		return fmt.Errorf("qemu: resume: %w", err)
	}
	t0 := time.Now()
	ks := s.rt.kvmState()
	p := &pending{binary: s.rt.binary, kvm: rec.KVM, kvmGID: ks.gid}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	for _, f := range []string{hib.Kernel, hib.Initrd, rec.Disk} {
		fh, err := os.Open(f)
		if err != nil {
			return fmt.Errorf("qemu: resume: open %s: %w", f, err)
		}
		p.files = append(p.files, fh)
	}
	for _, name := range []string{"agent.sock", "qmp.sock"} {
		_ = os.Remove(s.sd.path(name))
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.sd.path(name), Net: "unix"})
		if err != nil {
			return fmt.Errorf("qemu: resume: listen on %s: %w", name, err)
		}
		ln.SetUnlinkOnClose(false)
		p.lns = append(p.lns, ln)
		lf, err := ln.File()
		if err != nil {
			return fmt.Errorf("qemu: resume: socket descriptor: %w", err)
		}
		p.files = append(p.files, lf)
	}
	vc := &vmConfig{KVM: rec.KVM, MemoryMiB: rec.MemoryMiB, CPUs: rec.CPUs, Append: rec.Append, Incoming: true}
	dfs, err := openDisks(rec.Disks)
	if err != nil {
		return fmt.Errorf("qemu: resume: %w", err)
	}
	for i, f := range dfs {
		vc.Disks = append(vc.Disks, vmDisk{FD: 3 + len(p.files), RW: rec.Disks[i].RW, Serial: rec.Disks[i].Serial})
		p.files = append(p.files, f)
	}
	if gn := s.sd.Net; gn != nil {
		// The TAP went with QEMU: a new one, joined to the same link.
		g, err := linkGuest(gn)
		if err != nil {
			return fmt.Errorf("qemu: resume: %w", err)
		}
		if err := gn.Teardown(); err != nil {
			return fmt.Errorf("qemu: resume: network: %w", err)
		}
		ngn, tap, err := vmnet.Setup(g, -1)
		if err != nil {
			return fmt.Errorf("qemu: resume: network: %w", err)
		}
		s.sd.Net = ngn
		vc.Net, vc.MAC, vc.TapFD = true, rec.MAC, 3+len(p.files)
		p.files = append(p.files, tap)
	}
	// The machine's RAM is the backend ram0, as when it was saved, but
	// anonymous: its contents all come from the state.
	vc.RAMAnon = rec.RAMBackend
	st, err := os.Open(s.sd.path(hibStateFile))
	if err != nil {
		return fmt.Errorf("qemu: resume: %w", err)
	}
	p.restore = &restorePlan{stateFD: 3 + len(p.files)}
	p.files = append(p.files, st)
	p.args = vc.args()
	if err := s.launch(ctx, p); err != nil {
		return err
	}
	// A connection open when it was saved ends for the guest only now:
	// the first dial gives it the reconnect gap to notice.
	s.link.closedNow()
	for _, f := range []string{hibernateFile, hibStateFile, "hibernate.kernel", "hibernate.initrd"} {
		_ = os.Remove(s.sd.path(f))
	}
	s.log.Info("woke from hibernation", "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// linkGuest is the link that made gn (for vmnet.Setup).
func linkGuest(gn *vmnet.Link) (vmnet.Guest, error) {
	pfx, err := netip.ParsePrefix(gn.Addr)
	if err != nil {
		return vmnet.Guest{}, fmt.Errorf("link record: %w", err)
	}
	gw, err := netip.ParseAddr(gn.Gateway)
	if err != nil {
		return vmnet.Guest{}, fmt.Errorf("link record: %w", err)
	}
	return vmnet.Guest{NetNS: gn.NetNS, GuestIf: gn.GuestIf, Addr: pfx.Addr(), Gateway: gw, Prefix: pfx.Masked()}, nil
}

// linkOrCopy makes dst the same file as src: a hard link, or a copy
// across filesystems.
func linkOrCopy(src, dst string) error {
	_ = os.Remove(dst)
	if err := os.Link(src, dst); err == nil {
		return nil
	} else if !errors.Is(err, syscall.EXDEV) {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
