package link

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/cleanup"
)

// plumb makes the kernel objects of l, registering their undo steps.
func (m *Manager) plumb(l *Link, undo *cleanup.Stack) error {
	if err := m.prepareNSDir(); err != nil {
		return err
	}
	if err := createNetNS(l.NetNSPath); err != nil {
		return err
	}
	undo.Add(func() {
		if err := deleteNetNS(l.NetNSPath); err != nil {
			m.log.Error("undo: delete netns", "path", l.NetNSPath, "err", err)
		}
	})
	ns, err := netns.GetFromPath(l.NetNSPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", l.NetNSPath, err)
	}
	defer ns.Close()

	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: l.HostIf},
		PeerName:      l.GuestIf,
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", l.HostIf, err)
	}
	undo.Add(func() {
		if err := deleteVeth(l.HostIf); err != nil {
			m.log.Error("undo: delete veth", "if", l.HostIf, "err", err)
		}
	})

	// Host end: no IPv6 (before it is up, so no link-local address appears),
	// the gateway address, up.
	if err := disableIPv6(l.HostIf); err != nil {
		return err
	}
	host, err := netlink.LinkByName(l.HostIf)
	if err != nil {
		return fmt.Errorf("find %s: %w", l.HostIf, err)
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(l.HostAddr, l.Prefix.Bits())}); err != nil {
		return fmt.Errorf("address %s: %w", l.HostIf, err)
	}

	// Guest end, through a netlink socket opened inside the namespace.
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", l.NetNSPath, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in netns: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up in netns: %w", err)
	}
	guest, err := h.LinkByName(l.GuestIf)
	if err != nil {
		return fmt.Errorf("find %s in netns: %w", l.GuestIf, err)
	}
	if err := h.AddrAdd(guest, &netlink.Addr{IPNet: ipNet(l.GuestAddr, l.Prefix.Bits())}); err != nil {
		return fmt.Errorf("address %s in netns: %w", l.GuestIf, err)
	}
	if err := h.LinkSetUp(guest); err != nil {
		return fmt.Errorf("%s up in netns: %w", l.GuestIf, err)
	}
	if err := h.RouteAdd(&netlink.Route{
		LinkIndex: guest.Attrs().Index,
		Gw:        net.IP(l.HostAddr.AsSlice()),
		Scope:     netlink.SCOPE_UNIVERSE,
	}); err != nil {
		return fmt.Errorf("default route in netns: %w", err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("%s up: %w", l.HostIf, err)
	}
	return nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

// prepareNSDir makes NetNSDir a shared mount point, as `ip netns add` does,
// so that unmounting a namespace file here also unmounts the copies other
// mount namespaces (created after it was mounted) hold; otherwise those
// copies would keep a destroyed sandbox's namespace alive.
func (m *Manager) prepareNSDir() error {
	m.nsDirMu.Lock()
	defer m.nsDirMu.Unlock()
	if m.nsDirReady {
		return nil
	}
	dir := m.cfg.NetNSDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("netns dir: %w", err)
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err = unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mount netns dir %s: %w", dir, err)
		}
		err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make netns dir %s shared: %w", dir, err)
	}
	m.nsDirReady = true
	return nil
}

// createNetNS makes a new network namespace, disables IPv6 in it and
// bind-mounts it at path. The work runs on a dedicated, locked OS thread;
// if that thread cannot return to the original namespace it is left locked
// so the Go runtime retires it with the goroutine.
func createNetNS(path string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare netns: %w", err)
			return
		}
		err = inNewNS(path)
		if serr := netns.Set(orig); serr != nil {
			// Thread stays locked and dies; never reuse it.
			errc <- errors.Join(err, fmt.Errorf("return to host netns: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	err := <-errc
	if err != nil {
		_ = deleteNetNS(path)
	}
	return err
}

// inNewNS runs on the thread that has just unshared its network namespace.
func inNewNS(path string) error {
	// /proc/sys/net resolves to the calling thread's namespace.
	for _, f := range []string{"all", "default"} {
		if err := writeSysctl("net/ipv6/conf/"+f+"/disable_ipv6", "1"); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file: %w", err)
	}
	f.Close()
	src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
	if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount netns at %s: %w", path, err)
	}
	return nil
}

// writeSysctl writes /proc/sys/<key>. A missing IPv6 tree (IPv6 disabled at
// boot) is fine for disable_ipv6 keys.
func writeSysctl(key, val string) error {
	p := filepath.Join("/proc/sys", key)
	err := os.WriteFile(p, []byte(val), 0o644)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat("/proc/sys/net/ipv6"); errors.Is(serr, fs.ErrNotExist) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("sysctl %s: %w", key, err)
	}
	return nil
}

func disableIPv6(ifname string) error {
	return writeSysctl("net/ipv6/conf/"+ifname+"/disable_ipv6", "1")
}

// deleteNetNS unmounts and removes a namespace file; missing is fine.
func deleteNetNS(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns file: %w", err)
	}
	return nil
}

// deleteVeth deletes a host veth (its peer goes with it); missing is fine.
func deleteVeth(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// setHostUp sets the host end of a link up or down.
func setHostUp(name string, up bool) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if up {
		err = netlink.LinkSetUp(l)
	} else {
		err = netlink.LinkSetDown(l)
	}
	if err != nil {
		return fmt.Errorf("set %s up=%v: %w", name, up, err)
	}
	return nil
}
