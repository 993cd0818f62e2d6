package resolver

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync"
)

// DefaultV4Prefix is the IPv4 range synthetic addresses are drawn from by
// default: 198.18.0.0/15, reserved for benchmarking (RFC 2544) and therefore
// never a real destination.
var DefaultV4Prefix = netip.MustParsePrefix("198.18.0.0/15")

// DefaultV6Prefix is the IPv6 range synthetic addresses are drawn from when a
// sandbox link has IPv6: a /64 out of 2001:2::/48, the IPv6 benchmarking
// range (RFC 5180). IPv6 is optional; pass the zero prefix to NewPool to turn
// it off.
var DefaultV6Prefix = netip.MustParsePrefix("2001:2::/64")

// ErrPoolExhausted is returned by Pool.Assign when every synthetic address of
// the pool is taken. Addresses are never reused while the pool lives.
var ErrPoolExhausted = errors.New("synthetic address pool exhausted")

// ErrInvalidName is returned by Pool.Assign for a name that is not a valid
// host name (see Normalize).
var ErrInvalidName = errors.New("invalid host name")

// maxSlots caps the number of names a pool can hold, whatever its prefixes.
const maxSlots = math.MaxUint32

// Pool maps names to synthetic addresses for one sandbox. Each sandbox has
// its own network namespace, so distinct pools may use the same range.
//
// Slot i (1-based) of a pool is the i-th address after the start of the IPv4
// prefix and, when IPv6 is on, the i-th address after the start of the IPv6
// prefix; the first address of each prefix (network address) and the last
// IPv4 address (broadcast) are never handed out. A name keeps its slot for
// the life of the pool. A Pool is safe for concurrent use.
type Pool struct {
	v4, v6 netip.Prefix
	slots  uint64 // number of assignable slots

	mu     sync.Mutex
	next   uint64 // next free slot, 1-based
	byName map[string]slot
	byAddr map[netip.Addr]string
}

type slot struct{ v4, v6 netip.Addr }

// NewPool returns a pool drawing IPv4 addresses from v4 (required, at most
// /30) and IPv6 addresses from v6 (optional: the zero Prefix means no IPv6;
// at most /126). Host bits in the prefixes are ignored.
func NewPool(v4, v6 netip.Prefix) (*Pool, error) {
	if !v4.IsValid() || !v4.Addr().Is4() {
		return nil, fmt.Errorf("new pool: ipv4 prefix %v is not a valid IPv4 prefix", v4)
	}
	if v4.Bits() > 30 {
		return nil, fmt.Errorf("new pool: ipv4 prefix %v is too small (need at most /30)", v4)
	}
	v4 = v4.Masked()
	slots := uint64(1)<<(32-v4.Bits()) - 2 // minus network and broadcast
	if v6 != (netip.Prefix{}) {
		if !v6.IsValid() || !v6.Addr().Is6() || v6.Addr().Is4In6() {
			return nil, fmt.Errorf("new pool: ipv6 prefix %v is not a valid IPv6 prefix", v6)
		}
		if v6.Bits() > 126 {
			return nil, fmt.Errorf("new pool: ipv6 prefix %v is too small (need at most /126)", v6)
		}
		v6 = v6.Masked()
		if hostBits := 128 - v6.Bits(); hostBits < 64 {
			slots = min(slots, uint64(1)<<hostBits-1) // minus the subnet-router address
		}
	}
	return &Pool{
		v4:     v4,
		v6:     v6,
		slots:  min(slots, maxSlots),
		next:   1,
		byName: make(map[string]slot),
		byAddr: make(map[netip.Addr]string),
	}, nil
}

// V4 returns the pool's IPv4 prefix.
func (p *Pool) V4() netip.Prefix { return p.v4 }

// V6 returns the pool's IPv6 prefix, the zero Prefix when IPv6 is off.
func (p *Pool) V6() netip.Prefix { return p.v6 }

// HasV6 reports whether the pool hands out IPv6 addresses.
func (p *Pool) HasV6() bool { return p.v6.IsValid() }

// Cap returns how many names the pool can hold.
func (p *Pool) Cap() int { return int(p.slots) }

// Assign returns the synthetic addresses of name, allocating them on first
// use. The name is lower-cased and a trailing dot is stripped, so
// "Example.COM." and "example.com" share addresses. v6 is the zero Addr when
// the pool has no IPv6. Assign fails with ErrInvalidName for a name Normalize
// rejects and with ErrPoolExhausted when no slot is left; it never wraps
// around.
func (p *Pool) Assign(name string) (v4, v6 netip.Addr, err error) {
	name, ok := Normalize(name)
	if !ok {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("assign %q: %w", name, ErrInvalidName)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.byName[name]; ok {
		return s.v4, s.v6, nil
	}
	if p.next > p.slots {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("assign %q: %w (%d names)", name, ErrPoolExhausted, len(p.byName))
	}
	i := p.next
	p.next++
	s := slot{v4: addV4(p.v4.Addr(), uint32(i))}
	p.byAddr[s.v4] = name
	if p.v6.IsValid() {
		s.v6 = addV6(p.v6.Addr(), i)
		p.byAddr[s.v6] = name
	}
	p.byName[name] = s
	return s.v4, s.v6, nil
}

// Lookup returns the name a synthetic address was assigned to. IPv4-mapped
// IPv6 forms (::ffff:198.18.0.1) and zones are accepted.
func (p *Pool) Lookup(a netip.Addr) (name string, ok bool) {
	a = a.Unmap().WithZone("")
	p.mu.Lock()
	defer p.mu.Unlock()
	name, ok = p.byAddr[a]
	return name, ok
}

// Contains reports whether a (or its IPv4-mapped form) lies in one of the
// pool's prefixes, assigned or not.
func (p *Pool) Contains(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	return p.v4.Contains(a) || (p.v6.IsValid() && p.v6.Contains(a))
}

// Len returns the number of names assigned so far.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byName)
}

func addV4(base netip.Addr, n uint32) netip.Addr {
	b := base.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += n
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func addV6(base netip.Addr, n uint64) netip.Addr {
	b := base.As16()
	carry := n
	for i := 15; i >= 0 && carry != 0; i-- {
		sum := uint64(b[i]) + carry&0xff
		b[i] = byte(sum)
		carry = carry>>8 + sum>>8
	}
	return netip.AddrFrom16(b)
}
