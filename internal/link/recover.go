package link

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/cagebox/cagebox/internal/cleanup"
)

// Recover reconciles the host with the allocations loaded by NewManager
// after a daemon restart: links of sandboxes that are gone (keep(id) is
// false) are destroyed, and so are the interface and namespace named for
// any sandbox in ours (the ids the daemon's store records, whatever their
// state) that is not kept and has no allocation (a crash between plumbing
// and recording a link). Host interfaces and namespaces that merely look
// like ours (IfPrefix + 12 hex digits, IfPrefix-<12 hex digits>) but belong
// to no sandbox of this daemon are left alone and logged: only the host
// lock (LockHost) makes the prefix ours, and what another process made
// under it is not ours to remove. Kept links whose veth or namespace
// vanished (a host reboot) are made again with the same names and
// addresses. It may run before or after Init.
func (m *Manager) Recover(ctx context.Context, keep func(id string) bool, ours []string) error {
	m.mu.Lock()
	ids := make([]string, 0, len(m.links))
	for id := range m.links {
		ids = append(ids, id)
	}
	m.mu.Unlock()

	var errs []error
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("link: recover: %w", err)
		}
		if keep(id) {
			continue
		}
		m.log.Info("destroying link of a sandbox that is gone", "sandbox", id)
		if err := m.Destroy(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	// Sandboxes of ours that never got an allocation recorded: Destroy
	// removes the interface and namespace derived from the id, if any.
	for _, id := range ours {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("link: recover: %w", err)
		}
		m.mu.Lock()
		_, allocated := m.links[id]
		m.mu.Unlock()
		if allocated || keep(id) {
			continue
		}
		hostIf, nsPath := m.names(id)
		_, lerr := netlink.LinkByName(hostIf)
		_, serr := os.Stat(nsPath)
		if lerr != nil && serr != nil {
			continue
		}
		m.log.Info("removing the unrecorded link of a sandbox of ours", "sandbox", id, "if", hostIf)
		if err := m.Destroy(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}

	// Look-alikes: reported, never removed.
	m.mu.Lock()
	inUseIf := map[string]bool{}
	inUseNS := map[string]bool{}
	for name, id := range m.ifs {
		inUseIf[name] = true
		_, ns := m.names(id)
		inUseNS[filepath.Base(ns)] = true
	}
	for _, l := range m.links {
		inUseNS[filepath.Base(l.NetNSPath)] = true
	}
	m.mu.Unlock()
	if all, err := netlink.LinkList(); err == nil {
		for _, l := range all {
			name := l.Attrs().Name
			if l.Type() == "veth" && m.hostRE.MatchString(name) && !inUseIf[name] {
				m.log.Warn("a veth with this daemon's prefix belongs to no sandbox of its store; left alone", "if", name)
			}
		}
	}
	if ents, err := os.ReadDir(m.cfg.NetNSDir); err == nil {
		for _, e := range ents {
			if m.nsRE.MatchString(e.Name()) && !inUseNS[e.Name()] {
				m.log.Warn("a netns with this daemon's prefix belongs to no sandbox of its store; left alone", "path", filepath.Join(m.cfg.NetNSDir, e.Name()))
			}
		}
	}

	// What is kept but vanished — a host reboot takes every veth and
	// namespace — is made again with its allocation (same names, same
	// addresses): a sandbox saved to disk (a hibernated microVM) wakes on
	// the link it had. Kept sandboxes that cannot come back are destroyed
	// by their owner's recovery, which destroys their link too.
	for _, l := range m.List() {
		_, lerr := netlink.LinkByName(l.HostIf)
		_, serr := os.Stat(l.NetNSPath)
		if lerr == nil && serr == nil {
			continue
		}
		if err := m.replumb(ctx, l); err != nil {
			m.log.Warn("kept sandbox's link vanished and could not be made again", "sandbox", l.ID, "if", l.HostIf, "err", err)
			continue
		}
		m.log.Info("kept sandbox's link vanished (a host reboot?): made again", "sandbox", l.ID, "if", l.HostIf, "guest", l.GuestAddr)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("link: recover: %w", err)
	}
	return nil
}

// replumb makes the kernel objects of the allocated link l again, after
// whatever was left of them is removed.
func (m *Manager) replumb(ctx context.Context, l *Link) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := netlink.LinkByName(l.HostIf); err == nil {
		if err := deleteVeth(l.HostIf); err != nil {
			return err
		}
	}
	if _, err := os.Stat(l.NetNSPath); err == nil {
		if err := deleteNetNS(l.NetNSPath); err != nil {
			return err
		}
	}
	var undo cleanup.Stack
	if err := m.plumb(l, &undo); err != nil {
		undo.Run()
		return err
	}
	return nil
}
