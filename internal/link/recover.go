package link

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
)

// Recover reconciles the host with the allocations loaded by NewManager
// after a daemon restart: links of sandboxes that are gone (keep(id) is
// false) are destroyed, and host interfaces and namespace files that look
// like ours (IfPrefix + 12 hex digits, IfPrefix-<12 hex digits>) but belong
// to no allocation are removed. Kept links whose veth or namespace vanished
// (a host reboot) are logged and stay allocated until Destroy. It may run
// before or after Init.
func (m *Manager) Recover(ctx context.Context, keep func(id string) bool) error {
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

	// Strays. Names in use include links being created right now.
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

	all, err := netlink.LinkList()
	if err != nil {
		errs = append(errs, fmt.Errorf("list links: %w", err))
	}
	for _, l := range all {
		name := l.Attrs().Name
		if l.Type() != "veth" || !m.hostRE.MatchString(name) || inUseIf[name] {
			continue
		}
		m.log.Info("removing stray veth", "if", name)
		if err := deleteVeth(name); err != nil {
			errs = append(errs, err)
		}
	}
	ents, err := os.ReadDir(m.cfg.NetNSDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("read %s: %w", m.cfg.NetNSDir, err))
	}
	for _, e := range ents {
		if !m.nsRE.MatchString(e.Name()) || inUseNS[e.Name()] {
			continue
		}
		p := filepath.Join(m.cfg.NetNSDir, e.Name())
		m.log.Info("removing stray netns", "path", p)
		if err := deleteNetNS(p); err != nil {
			errs = append(errs, err)
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
