package link

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Names inside the table.
const (
	setLinks      = "links"     // ifname . ipv4_addr of every link (anti-spoofing)
	chainSpoof    = "antispoof" // filter prerouting, priority raw
	chainRedirect = "redirect"  // nat prerouting, priority dstnat
	chainInput    = "input"     // filter input
	chainForward  = "forward"   // filter forward
	chainOutput   = "output"    // filter output: host → sandbox (ingress)
	setPublished  = "published" // ipv4_addr . inet_service of every published port
)

// DefaultIngressMark is the default socket mark of ingress connections.
const DefaultIngressMark uint32 = 0x6362_0001

// Registers as nft(8) numbers them (32-bit): a concatenation is built in
// consecutive registers, the 16-byte ifname in 8..11, the address in 12.
const (
	reg1     = 1  // NFT_REG_1, scratch
	regIfKey = 8  // NFT_REG32_00
	regAddr  = 12 // NFT_REG32_04
)

const ifNameSize = 16 // IFNAMSIZ

var linksKeyType = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)

func (m *Manager) table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: m.cfg.TableName}
}

func (m *Manager) linksSet() *nftables.Set {
	return &nftables.Set{
		Table:         m.table(),
		Name:          setLinks,
		KeyType:       linksKeyType,
		Concatenation: true,
	}
}

func setKey(l *Link) []byte {
	k := make([]byte, ifNameSize, ifNameSize+4)
	copy(k, l.HostIf)
	a := l.GuestAddr.As4()
	return append(k, a[:]...)
}

// tableExists reports whether the table is present.
func (m *Manager) tableExists(c *nftables.Conn) (bool, error) {
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("list nftables tables: %w", err)
	}
	for _, t := range ts {
		if t.Name == m.cfg.TableName {
			return true, nil
		}
	}
	return false, nil
}

// Init (re)creates the table from scratch in one atomic transaction: a stale
// table (from a crashed daemon) is deleted and the new one, with its chains,
// rules and the set elements of every known link, is added in the same
// batch, so known sandboxes are never unconfined in between. It then brings
// up the host ends of known links (Close set them down).
func (m *Manager) Init(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("link: init: %w", err)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("link: init: nftables: %w", err)
	}
	exists, err := m.tableExists(c)
	if err != nil {
		return fmt.Errorf("link: init: %w", err)
	}
	if exists {
		m.log.Info("replacing existing nftables table")
		c.DelTable(m.table())
	}
	if err := m.buildTable(c); err != nil {
		return fmt.Errorf("link: init: %w", err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("link: init: install table %s: %w", m.cfg.TableName, err)
	}
	m.ready = true
	for _, l := range m.links {
		if err := setHostUp(l.HostIf, true); err != nil {
			m.log.Warn("link of known sandbox is missing; Recover or Destroy it", "sandbox", l.ID, "err", err)
		}
	}
	m.log.Info("nftables table installed", "links", len(m.links), "proxy_port", m.cfg.ProxyPort, "dns_port", m.cfg.DNSPort)
	return nil
}

// Close deletes the table at daemon shutdown. Links are kept (sandboxes may
// outlive the daemon and be recovered) but their host ends are set down:
// without the table nothing would confine them, so they get no network at
// all until the next Init reinstalls the rules and brings them up again.
// For a full teardown call DestroyAll first.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for _, l := range m.links {
		if err := setHostUp(l.HostIf, false); err != nil {
			errs = append(errs, err)
		}
	}
	m.ready = false
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("link: close: nftables: %w", err)
	}
	exists, err := m.tableExists(c)
	if err != nil {
		errs = append(errs, err)
	} else if exists {
		c.DelTable(m.table())
		if err := c.Flush(); err != nil && !isNotExist(err) {
			errs = append(errs, fmt.Errorf("delete table %s: %w", m.cfg.TableName, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("link: close: %w", err)
	}
	m.log.Info("nftables table removed", "links_kept_down", len(m.links))
	return nil
}

// setElements adds or deletes the anti-spoofing elements of links in one
// transaction. m.mu must be held and m.ready true.
func (m *Manager) setElements(add bool, links ...*Link) error {
	if len(links) == 0 {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	els := make([]nftables.SetElement, len(links))
	for i, l := range links {
		els[i] = nftables.SetElement{Key: setKey(l)}
	}
	if add {
		err = c.SetAddElements(m.linksSet(), els)
	} else {
		err = c.SetDeleteElements(m.linksSet(), els)
	}
	if err == nil {
		err = c.Flush()
	}
	if err != nil {
		op := "add"
		if !add {
			op = "delete"
		}
		return fmt.Errorf("%s set element: %w", op, err)
	}
	return nil
}

func isNotExist(err error) bool { return errors.Is(err, unix.ENOENT) }

// buildTable queues the whole table on c.
func (m *Manager) buildTable(c *nftables.Conn) error {
	t := c.AddTable(m.table())
	set := m.linksSet()
	var els []nftables.SetElement
	for _, l := range m.links {
		els = append(els, nftables.SetElement{Key: setKey(l)})
	}
	if err := c.AddSet(set, els); err != nil {
		return fmt.Errorf("add set: %w", err)
	}
	pub := m.publishedSet()
	var pels []nftables.SetElement
	for _, l := range m.links {
		for _, p := range l.Published {
			pels = append(pels, nftables.SetElement{Key: publishedKey(l, p)})
		}
	}
	if err := c.AddSet(pub, pels); err != nil {
		return fmt.Errorf("add set: %w", err)
	}
	accept := nftables.ChainPolicyAccept
	chain := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{
			Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept,
		})
	}
	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: all})
	}
	fromSandbox := ifPrefix(expr.MetaKeyIIFNAME, m.cfg.IfPrefix)
	toSandbox := ifPrefix(expr.MetaKeyOIFNAME, m.cfg.IfPrefix)
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	acc := []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}

	// Before conntrack: only IPv4 from the link's own guest address.
	spoof := chain(chainSpoof, nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityRaw)
	rule(spoof, fromSandbox, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{unix.NFPROTO_IPV4}},
	}, drop)
	rule(spoof, fromSandbox, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: regIfKey},
		&expr.Payload{DestRegister: regAddr, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: regIfKey, SetName: set.Name, SetID: set.ID, Invert: true},
	}, drop)

	// DNS to the resolver, every other TCP connection to the proxy, both on
	// the receiving link's own address.
	nat := chain(chainRedirect, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
	rule(nat, fromSandbox, l4(unix.IPPROTO_UDP), dport(53), redirect(m.cfg.DNSPort))
	rule(nat, fromSandbox, l4(unix.IPPROTO_TCP), dport(53), redirect(m.cfg.DNSPort))
	rule(nat, fromSandbox, l4(unix.IPPROTO_TCP), redirect(m.cfg.ProxyPort))

	in := chain(chainInput, nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
	rule(in, fromSandbox, []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{
			SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0),
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}, acc)
	rule(in, fromSandbox, l4(unix.IPPROTO_TCP), dport(m.cfg.ProxyPort), ownAddr(), acc)
	rule(in, fromSandbox, l4(unix.IPPROTO_UDP), dport(m.cfg.DNSPort), ownAddr(), acc)
	rule(in, fromSandbox, l4(unix.IPPROTO_TCP), dport(m.cfg.DNSPort), ownAddr(), acc)
	rule(in, fromSandbox, drop)

	fwd := chain(chainForward, nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
	rule(fwd, fromSandbox, drop)
	rule(fwd, toSandbox, drop)

	// From the host into a link: replies to the sandbox's own
	// connections, and the daemon's ingress connections (marked) to
	// published ports; nothing else.
	out := chain(chainOutput, nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter)
	rule(out, toSandbox, []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{
			SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0),
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}, acc)
	rule(out, toSandbox, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(m.cfg.IngressMark)},
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.NFPROTO_IPV4}},
	}, l4(unix.IPPROTO_TCP), []expr.Any{
		&expr.Payload{DestRegister: regIfKey, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Payload{DestRegister: regIfKey + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: regIfKey, SetName: pub.Name, SetID: pub.ID},
	}, acc)
	rule(out, toSandbox, drop)
	return nil
}

var publishedKeyType = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)

func (m *Manager) publishedSet() *nftables.Set {
	return &nftables.Set{
		Table:         m.table(),
		Name:          setPublished,
		KeyType:       publishedKeyType,
		Concatenation: true,
	}
}

// publishedKey is guest address . port, each field padded to 4 bytes.
func publishedKey(l *Link, port uint16) []byte {
	a := l.GuestAddr.As4()
	return []byte{a[0], a[1], a[2], a[3], byte(port >> 8), byte(port), 0, 0}
}

// publishElements adds or deletes published-port elements of l in one
// transaction. m.mu must be held and m.ready true.
func (m *Manager) publishElements(add bool, l *Link, ports []uint16) error {
	if len(ports) == 0 {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	els := make([]nftables.SetElement, len(ports))
	for i, p := range ports {
		els[i] = nftables.SetElement{Key: publishedKey(l, p)}
	}
	if add {
		err = c.SetAddElements(m.publishedSet(), els)
	} else {
		err = c.SetDeleteElements(m.publishedSet(), els)
	}
	if err == nil {
		err = c.Flush()
	}
	if err != nil {
		return fmt.Errorf("published ports: %w", err)
	}
	return nil
}

// ifPrefix matches an interface name starting with prefix (nft: "cbx*").
func ifPrefix(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte(prefix)},
	}
}

func l4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{proto}},
	}
}

func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(p)},
	}
}

func redirect(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: reg1, Data: binaryutil.BigEndian.PutUint16(p)},
		&expr.Redir{RegisterProtoMin: reg1},
	}
}

// ownAddr matches packets addressed to a local address of the receiving
// interface itself (nft: fib daddr . iif type local); after a redirect that
// is the link's host address, while the host's other addresses (another
// link's gateway, the uplink's address) are not.
func ownAddr() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: reg1, FlagDADDR: true, FlagIIF: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}
