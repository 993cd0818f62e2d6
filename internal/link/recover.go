package link

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
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
// vanished (a host reboot) are logged and stay allocated until Destroy. It
// may run before or after Init.
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

	// Health of what is kept.
	for _, l := range m.List() {
		if _, err := netlink.LinkByName(l.HostIf); err != nil {
			m.log.Warn("kept sandbox has no veth", "sandbox", l.ID, "if", l.HostIf, "err", err)
		}
		if _, err := os.Stat(l.NetNSPath); err != nil {
			m.log.Warn("kept sandbox has no netns", "sandbox", l.ID, "path", l.NetNSPath, "err", err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("link: recover: %w", err)
	}
	return nil
}
