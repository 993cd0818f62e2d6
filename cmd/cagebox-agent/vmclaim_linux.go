//go:build linux

package main

// What a VM guest's agent applies of its claim (claimPlatform, set by
// vmAgentStage): a microVM restored from a template wakes up with the
// template's RNG state, clock, hostname and NIC, shared with every other
// sandbox restored from it. Before the claim's guest files are written and
// before anything runs, the agent (still holding its capabilities):
//
//  1. mixes the claim's entropy into the kernel's input pool and forces
//     the CRNG to reseed from it, so /dev/urandom and getrandom(2) diverge
//     from every other restore of the template at once (rather than at
//     the next scheduled reseed);
//  2. sets the wall clock to the host's (it stood where the template's
//     stopped);
//  3. sets the hostname;
//  4. configures eth0 from the claim: its MAC (the virtio-net driver
//     passes it to the device, so QEMU filters on it), its one address
//     (any other removed), up, and the default route.
//
// QEMU's vmgenid device would make the kernel reseed by itself on restore
// (the guest kernel has the driver), but QEMU's microvm machine builds no
// ACPI table for it (hw/i386/acpi-microvm.c has only DSDT, FADT, MADT and
// XSDT), so the device is invisible to the guest; the explicit reseed does
// the job on every machine type.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/rootfs"
)

// vmClaim is a VM guest's claimPlatform.
func vmClaim(cl *agentproto.Claim) error {
	if err := reseedRandom(cl.Entropy); err != nil {
		return fmt.Errorf("reseed the guest kernel's random generator: %w", err)
	}
	if !cl.Time.IsZero() {
		ts := unix.NsecToTimespec(cl.Time.UnixNano())
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return fmt.Errorf("set the guest clock: %w", err)
		}
	}
	if err := unix.Sethostname([]byte(rootfs.Hostname(cl.Hostname))); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if cl.Net != nil {
		if err := claimNetwork(cl.Net); err != nil {
			return fmt.Errorf("configure eth0: %w", err)
		}
	}
	return nil
}

// reseedRandom credits entropy to the kernel's input pool (RNDADDENTROPY,
// struct rand_pool_info) and makes the CRNG reseed from the pool now
// (RNDRESEEDCRNG). Both need CAP_SYS_ADMIN.
func reseedRandom(entropy []byte) error {
	if len(entropy) < agentproto.MinClaimEntropy {
		return fmt.Errorf("%d bytes of entropy, want at least %d", len(entropy), agentproto.MinClaimEntropy)
	}
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	n := (len(entropy) + 3) / 4 * 4
	info := make([]byte, 8+n)
	binary.NativeEndian.PutUint32(info[0:], uint32(len(entropy)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(entropy)))
	copy(info[8:], entropy)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0])))
	clear(info)
	if errno != 0 {
		return fmt.Errorf("RNDADDENTROPY: %w", errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); errno != 0 {
		return fmt.Errorf("RNDRESEEDCRNG: %w", errno)
	}
	return nil
}

// claimNetwork gives eth0 the claim's MAC, address and default route.
func claimNetwork(cn *agentproto.ClaimNet) error {
	if !cn.Addr.Addr().Is4() || !cn.Gateway.Is4() {
		return fmt.Errorf("address %s via %s: want IPv4", cn.Addr, cn.Gateway)
	}
	if err := waitForPath("/sys/class/net/eth0", 5*time.Second); err != nil {
		return fmt.Errorf("no network interface (the VM has no NIC): %w", err)
	}
	eth, err := net.InterfaceByName("eth0")
	if err != nil {
		return fmt.Errorf("find eth0: %w", err)
	}
	nl, err := newRtnl()
	if err != nil {
		return err
	}
	defer nl.close()
	if cn.MAC != "" {
		hw, err := net.ParseMAC(cn.MAC)
		if err != nil || len(hw) != 6 {
			return fmt.Errorf("bad MAC %q", cn.MAC)
		}
		// Down while the address changes: the driver then only records
		// it (and tells the device) without a live-change path.
		if err := nl.setLink(eth.Index, 0, unix.IFF_UP, nil); err != nil {
			return fmt.Errorf("eth0 down: %w", err)
		}
		if err := nl.setLink(eth.Index, 0, 0, hw); err != nil {
			return fmt.Errorf("set MAC: %w", err)
		}
	}
	if err := nl.flushAddrs(eth.Index); err != nil {
		return fmt.Errorf("remove old addresses: %w", err)
	}
	if err := nl.addAddr(eth.Index, cn.Addr); err != nil {
		return fmt.Errorf("address %s: %w", cn.Addr, err)
	}
	if err := nl.linkUp(eth.Index); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	if err := nl.replaceDefaultRoute(eth.Index, cn.Gateway); err != nil {
		return fmt.Errorf("default route via %s: %w", cn.Gateway, err)
	}
	return nil
}

// setLink sets the flags in change to those in flags and, if hw is set,
// the hardware address.
func (n *rtnl) setLink(index int, flags, change uint32, hw net.HardwareAddr) error {
	ifi := unix.IfInfomsg{Family: unix.AF_UNSPEC, Index: int32(index), Flags: flags, Change: change}
	body := append([]byte(nil), (*[unix.SizeofIfInfomsg]byte)(unsafe.Pointer(&ifi))[:]...)
	if hw != nil {
		body = rtattr(body, unix.IFLA_ADDRESS, hw)
	}
	return n.request(unix.RTM_NEWLINK, 0, body)
}

// flushAddrs removes every IPv4 address of the link.
func (n *rtnl) flushAddrs(index int) error {
	ifa := unix.IfAddrmsg{Family: unix.AF_INET}
	body := append([]byte(nil), (*[unix.SizeofIfAddrmsg]byte)(unsafe.Pointer(&ifa))[:]...)
	msgs, err := n.dump(unix.RTM_GETADDR, body)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWADDR || len(m.Data) < unix.SizeofIfAddrmsg {
			continue
		}
		got := (*unix.IfAddrmsg)(unsafe.Pointer(&m.Data[0]))
		if int(got.Index) != index || got.Family != unix.AF_INET {
			continue
		}
		if err := n.request(unix.RTM_DELADDR, 0, append([]byte(nil), m.Data...)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return err
		}
	}
	return nil
}

// replaceDefaultRoute sets the main table's default route (whatever was
// there is replaced).
func (n *rtnl) replaceDefaultRoute(index int, gw netip.Addr) error {
	rt := unix.RtMsg{Family: unix.AF_INET, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_BOOT,
		Scope: unix.RT_SCOPE_UNIVERSE, Type: unix.RTN_UNICAST}
	body := append([]byte(nil), (*[unix.SizeofRtMsg]byte)(unsafe.Pointer(&rt))[:]...)
	g := gw.As4()
	body = rtattr(body, unix.RTA_GATEWAY, g[:])
	body = rtattr(body, unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, uint32(index)))
	return n.request(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, body)
}

// dump sends a dump request and returns every message of the answer.
func (n *rtnl) dump(typ uint16, body []byte) ([]syscall.NetlinkMessage, error) {
	n.seq++
	msg := make([]byte, 0, unix.SizeofNlMsghdr+len(body))
	msg = binary.NativeEndian.AppendUint32(msg, uint32(unix.SizeofNlMsghdr+len(body)))
	msg = binary.NativeEndian.AppendUint16(msg, typ)
	msg = binary.NativeEndian.AppendUint16(msg, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	msg = binary.NativeEndian.AppendUint32(msg, n.seq)
	msg = binary.NativeEndian.AppendUint32(msg, 0)
	msg = append(msg, body...)
	if err := unix.Sendto(n.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out []syscall.NetlinkMessage
	buf := make([]byte, 32<<10)
	for {
		nr, _, err := unix.Recvfrom(n.fd, buf, 0)
		if err != nil {
			return nil, err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:nr])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Seq != n.seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := int32(binary.NativeEndian.Uint32(m.Data[:4])); e != 0 {
						return nil, unix.Errno(-e)
					}
				}
				return out, nil
			}
			out = append(out, m)
		}
	}
}
