package link

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h).
const ip6tSOOriginalDst = 80

// OriginalDst returns the destination a redirected TCP connection was
// originally addressed to, from conntrack (SO_ORIGINAL_DST for IPv4,
// IP6T_SO_ORIGINAL_DST for IPv6). It fails for a connection that was not
// NATed.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	la, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok || la == nil {
		return netip.AddrPort{}, errors.New("link: original destination: no local address")
	}
	local := la.AddrPort()
	v4 := local.Addr().Unmap().Is4()
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("link: original destination: %w", err)
	}
	var (
		res  netip.AddrPort
		serr error
	)
	err = rc.Control(func(fd uintptr) {
		if v4 {
			var sa unix.RawSockaddrInet4
			n := uint32(unsafe.Sizeof(sa))
			if serr = getsockopt(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), &n); serr == nil {
				res = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), ntohs(sa.Port))
			}
			return
		}
		var sa unix.RawSockaddrInet6
		n := uint32(unsafe.Sizeof(sa))
		if serr = getsockopt(int(fd), unix.SOL_IPV6, ip6tSOOriginalDst, unsafe.Pointer(&sa), &n); serr == nil {
			res = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), ntohs(sa.Port))
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("link: original destination: %w", err)
	}
	return res, nil
}

func getsockopt(fd, level, opt int, p unsafe.Pointer, n *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(p), uintptr(unsafe.Pointer(n)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// ntohs converts a port stored in network byte order.
func ntohs(p uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&p))
	return uint16(b[0])<<8 | uint16(b[1])
}
