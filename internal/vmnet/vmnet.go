// Package vmnet moves a sandbox's routed link into a microVM: a TAP in the
// sandbox's network namespace joined to the link's guest end by tc mirred
// redirects, so the gateway design (host end, nftables) is unchanged for
// QEMU and Firecracker alike.
package vmnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/cleanup"
)

// TapName is the TAP device's name inside the sandbox's namespace.
const TapName = "cbtap0"

// Link records what the runtime changed in the sandbox's network
// namespace, so that Destroy can undo it (also after a daemon restart).
//
// The link package made a veth whose guest end (GuestIf, holding GuestAddr,
// default route via Gateway) is in the namespace. A VM moves that link into
// its guest: a TAP is created in the namespace and joined to GuestIf by tc
// mirred redirects both ways (ingress of GuestIf → egress of the TAP and
// back), GuestIf's address is removed, and the VM's NIC gets GuestIf's MAC
// so the host's neighbour entry for GuestAddr stays right. The host side
// (gateway address, nftables) is unchanged.
type Link struct {
	NetNS   string `json:"netns"`
	GuestIf string `json:"guest_if"`
	MAC     string `json:"mac"`
	// Addr (GuestAddr/prefix) and Gateway are restored on GuestIf on
	// teardown.
	Addr    string `json:"addr"`
	Gateway string `json:"gateway"`
}

// InNetNS runs fn on an OS thread inside the namespace at path. If the
// thread cannot return to the daemon's namespace it stays locked, and the
// Go runtime retires it.
func InNetNS(path string, fn func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
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
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("return to the daemon's netns: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// openTap creates the TAP in the calling thread's namespace and returns its
// queue. Without persistence the device lives as long as the descriptor,
// which QEMU inherits. With owner >= 0 it is made persistent and owned by
// that uid, for a VMM that opens it by name (Firecracker); the descriptor
// is then only the creator's handle.
func openTap(owner int) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(TapName)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create tap %s: %w", TapName, err)
	}
	if owner >= 0 {
		if err := unix.IoctlSetInt(fd, unix.TUNSETOWNER, owner); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("tap %s owner: %w", TapName, err)
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("tap %s persist: %w", TapName, err)
		}
	}
	return os.NewFile(uintptr(fd), "tap"), nil
}

// Guest is the routed link a VM's TAP is joined to: the sandbox's network
// namespace, its guest interface and the link's addresses (an
// isolation.Spec's network fields; this package sits below isolation and
// does not import it).
type Guest struct {
	NetNS, GuestIf string
	Addr, Gateway  netip.Addr
	Prefix         netip.Prefix
}

// Setup joins a new TAP (TapName) to g's guest interface. It returns the
// record for Teardown and the TAP's descriptor (for QEMU to inherit; see
// openTap for owner). On failure it undoes what it did.
func Setup(g Guest, owner int) (_ *Link, _ *os.File, err error) {
	if !g.Addr.Is4() || !g.Gateway.Is4() || !g.Prefix.IsValid() {
		return nil, nil, fmt.Errorf("vmnet: spec has a network namespace but no IPv4 guest address, gateway and prefix")
	}
	gn := &Link{
		NetNS:   g.NetNS,
		GuestIf: g.GuestIf,
		Addr:    netip.PrefixFrom(g.Addr, g.Prefix.Bits()).String(),
		Gateway: g.Gateway.String(),
	}
	if gn.GuestIf == "" {
		gn.GuestIf = "eth0"
	}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
		}
	}()
	var tap *os.File
	if err := InNetNS(g.NetNS, func() (err error) { tap, err = openTap(owner); return err }); err != nil {
		return nil, nil, err
	}
	undo.Add(func() { tap.Close() })

	ns, err := netns.GetFromPath(g.NetNS)
	if err != nil {
		return nil, nil, fmt.Errorf("open netns %s: %w", g.NetNS, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, nil, fmt.Errorf("netlink in %s: %w", g.NetNS, err)
	}
	defer h.Close()
	veth, err := h.LinkByName(gn.GuestIf)
	if err != nil {
		return nil, nil, fmt.Errorf("find %s in %s: %w", gn.GuestIf, g.NetNS, err)
	}
	tl, err := h.LinkByName(TapName)
	if err != nil {
		return nil, nil, fmt.Errorf("find %s: %w", TapName, err)
	}
	gn.MAC = veth.Attrs().HardwareAddr.String()
	if mtu := veth.Attrs().MTU; mtu > 0 {
		if err := h.LinkSetMTU(tl, mtu); err != nil {
			return nil, nil, fmt.Errorf("tap mtu: %w", err)
		}
	}
	if err := h.LinkSetUp(tl); err != nil {
		return nil, nil, fmt.Errorf("tap up: %w", err)
	}
	// (teardown opens its own handle: this one is closed before undo runs.)
	undo.Add(func() { _ = gn.Teardown() })
	for _, p := range [][2]netlink.Link{{veth, tl}, {tl, veth}} {
		if err := redirect(h, p[0], p[1]); err != nil {
			return nil, nil, err
		}
	}
	// The namespace's own stack no longer owns the guest address: the VM
	// does, behind the redirect.
	addrs, err := h.AddrList(veth, netlink.FAMILY_V4)
	if err != nil {
		return nil, nil, fmt.Errorf("addresses of %s: %w", gn.GuestIf, err)
	}
	for _, a := range addrs {
		if err := h.AddrDel(veth, &a); err != nil {
			return nil, nil, fmt.Errorf("remove %s from %s: %w", a.IPNet, gn.GuestIf, err)
		}
	}
	return gn, tap, nil
}

// redirect sends every frame arriving on from out of to.
func redirect(h *netlink.Handle, from, to netlink.Link) error {
	q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: from.Attrs().Index,
		Handle:    netlink.MakeHandle(0xffff, 0),
		Parent:    netlink.HANDLE_INGRESS,
	}}
	if err := h.QdiscAdd(q); err != nil {
		return fmt.Errorf("ingress qdisc on %s: %w", from.Attrs().Name, err)
	}
	// u32 with no selector matches every frame (matchall is not built
	// into every host kernel; u32 is).
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: from.Attrs().Index,
			Parent:    netlink.MakeHandle(0xffff, 0),
			Priority:  1,
			Protocol:  unix.ETH_P_ALL,
		},
		Actions: []netlink.Action{netlink.NewMirredAction(to.Attrs().Index)},
	}
	if err := h.FilterAdd(f); err != nil {
		return fmt.Errorf("redirect %s to %s: %w", from.Attrs().Name, to.Attrs().Name, err)
	}
	return nil
}

// removeIngress deletes the ingress qdisc (and so its filters) of ifname.
func removeIngress(h *netlink.Handle, ifname string) error {
	l, err := h.LinkByName(ifname)
	if err != nil {
		return nil // gone with its namespace
	}
	qs, err := h.QdiscList(l)
	if err != nil {
		return fmt.Errorf("qdiscs of %s: %w", ifname, err)
	}
	for _, q := range qs {
		if _, ok := q.(*netlink.Ingress); ok {
			if err := h.QdiscDel(q); err != nil {
				return fmt.Errorf("remove ingress qdisc of %s: %w", ifname, err)
			}
		}
	}
	return nil
}

// restoreAddr puts the guest address and default route back on GuestIf.
func (g *Link) restoreAddr(h *netlink.Handle) error {
	l, err := h.LinkByName(g.GuestIf)
	if err != nil {
		return nil
	}
	pfx, err := netip.ParsePrefix(g.Addr)
	if err != nil {
		return err
	}
	gw, err := netip.ParseAddr(g.Gateway)
	if err != nil {
		return err
	}
	ipn := &net.IPNet{IP: net.IP(pfx.Addr().AsSlice()), Mask: net.CIDRMask(pfx.Bits(), 32)}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("restore %s on %s: %w", g.Addr, g.GuestIf, err)
	}
	err = h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(gw.AsSlice()), Scope: netlink.SCOPE_UNIVERSE})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("restore default route via %s: %w", g.Gateway, err)
	}
	return nil
}

// Teardown undoes Setup (the TAP itself went with QEMU's descriptor; a
// leftover one is deleted). A namespace that is gone has nothing to undo.
func (g *Link) Teardown() error {
	if _, err := os.Stat(g.NetNS); err != nil {
		return nil
	}
	ns, err := netns.GetFromPath(g.NetNS)
	if err != nil {
		return nil
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", g.NetNS, err)
	}
	defer h.Close()
	var errs []error
	if err := removeIngress(h, g.GuestIf); err != nil {
		errs = append(errs, err)
	}
	if l, err := h.LinkByName(TapName); err == nil {
		// The kernel removes the TAP once QEMU's descriptor is closed,
		// which can happen between the lookup and the delete: gone is
		// what we want.
		if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete %s: %w", TapName, err))
		}
	}
	if err := g.restoreAddr(h); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Leftovers lists what of Setup remains in the namespace.
func (g *Link) Leftovers() []string {
	if _, err := os.Stat(g.NetNS); err != nil {
		return nil
	}
	ns, err := netns.GetFromPath(g.NetNS)
	if err != nil {
		return nil
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil
	}
	defer h.Close()
	var out []string
	if _, err := h.LinkByName(TapName); err == nil {
		out = append(out, "tap "+TapName+" in "+g.NetNS)
	}
	if l, err := h.LinkByName(g.GuestIf); err == nil {
		if qs, err := h.QdiscList(l); err == nil {
			for _, q := range qs {
				if _, ok := q.(*netlink.Ingress); ok {
					out = append(out, "ingress qdisc on "+g.GuestIf+" in "+g.NetNS)
				}
			}
		}
	}
	return out
}
