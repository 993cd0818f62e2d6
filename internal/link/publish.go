package link

import (
	"fmt"
	"slices"
)

// SetPublished makes ports the published ports of sandbox id's link: the
// daemon's ingress connections (IngressMark) may open TCP connections to
// the guest's address on exactly these ports. The change is one nftables
// transaction per direction and is persisted with the link.
func (m *Manager) SetPublished(id string, ports []uint16) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.links[id]
	if !ok {
		return fmt.Errorf("link: publish ports of %q: no link", id)
	}
	want := slices.Clone(ports)
	slices.Sort(want)
	want = slices.Compact(want)
	var add, del []uint16
	for _, p := range want {
		if !slices.Contains(l.Published, p) {
			add = append(add, p)
		}
	}
	for _, p := range l.Published {
		if !slices.Contains(want, p) {
			del = append(del, p)
		}
	}
	if m.ready {
		if err := m.publishElements(false, l, del); err != nil && !isNotExist(err) {
			return fmt.Errorf("link: unpublish ports of %q: %w", id, err)
		}
		if err := m.publishElements(true, l, add); err != nil {
			return fmt.Errorf("link: publish ports of %q: %w", id, err)
		}
	}
	l.Published = want
	if err := m.saveLocked(); err != nil {
		return fmt.Errorf("link: publish ports of %q: %w", id, err)
	}
	return nil
}

// IngressMark is the socket mark the rules admit into links.
func (m *Manager) IngressMark() uint32 { return m.cfg.IngressMark }
