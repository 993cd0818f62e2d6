// Package link gives every sandbox its own routed point-to-point network link
// and confines it with one nftables table the daemon owns.
//
// Each sandbox gets a network namespace (bind-mounted at NetNSDir/<prefix>-<hash>
// so an OCI runtime can join it by path) and a veth pair: the host end is named
// <prefix><hash> (for example cbx0123456789ab) and keeps the first usable
// address of a /30 carved from the pool, the guest end is moved into the
// namespace as eth0 with the second address and a default route via the host
// end. There is no bridge: sandboxes share no L2 segment, and IPv6 is disabled
// on both ends.
//
// The table (family inet, default name "cagebox") matches sandbox traffic by
// the interface-name prefix, so no per-sandbox rules exist; the only
// per-sandbox state is one element (host interface . guest address) in the set
// "links" that the anti-spoofing chain checks. For traffic entering from a
// sandbox link:
//
//   - anything that is not IPv4, or whose source address is not the link's own
//     guest address, is dropped before connection tracking;
//   - TCP to port 53 and UDP to port 53 are redirected to DNSPort, every other
//     TCP connection is redirected to ProxyPort, in both cases on the link's own
//     host address (no 127.0.0.1 redirects, so route_localnet stays off); the
//     proxy recovers the original destination with [OriginalDst];
//   - on input only established/related traffic, TCP to ProxyPort and TCP/UDP
//     to DNSPort addressed to the receiving link's own host address are
//     accepted; everything else (other ports, other host addresses, ICMP) is
//     dropped;
//   - nothing is forwarded from or to a sandbox link;
//   - from the host into a link, only established/related traffic (replies
//     to the sandbox's own connections) and new TCP connections that carry
//     the ingress socket mark (IngressMark) to a published port of that
//     link's guest (the set "published", guest address . port) leave; the
//     rest is dropped, so no host process reaches a guest's ports except
//     the daemon's ingress, and it only those published.
//
// Removing the table removes every rule. [Manager.Close] does that at daemon
// shutdown and sets the host ends of the remaining links down, so sandboxes
// that outlive the daemon have no network at all (rather than an unconfined
// one) until the next [Manager.Init] reinstalls the rules and brings them up.
package link

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"regexp"
	"sync"

	"github.com/cagebox/cagebox/internal/cleanup"
)

// Defaults for the zero fields of a Config.
const (
	DefaultTableName = "cagebox"
	DefaultIfPrefix  = "cbx"
	DefaultNetNSDir  = "/run/netns"
	// GuestIf is the name of the sandbox's interface inside its namespace.
	GuestIf = "eth0"
)

// DefaultPool is the address pool used when Config.Pool is not set.
var DefaultPool = netip.MustParsePrefix("10.201.0.0/16")

// Errors returned by the Manager; wrap-compatible with errors.Is.
var (
	// ErrExists: a link for this sandbox id exists or is being set up/torn down.
	ErrExists = errors.New("link exists")
	// ErrPoolExhausted: every /30 of the pool is in use.
	ErrPoolExhausted = errors.New("address pool exhausted")
	// ErrNotReady: the nftables table is not installed (Init not called, or
	// Close called); no link is created without its confinement.
	ErrNotReady = errors.New("network rules not installed")
)

// hashLen is the number of hex digits of the id hash in interface names:
// a 3-character prefix plus 12 digits is the 15-character IFNAMSIZ limit.
const hashLen = 12

var ifPrefixRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,2}$`)

// Config configures a Manager. Zero fields take the defaults noted.
type Config struct {
	// Pool holds the link addresses, carved into /30s (host end .1, guest
	// end .2 of each). IPv4 only. Default 10.201.0.0/16.
	Pool netip.Prefix
	// TableName is the nftables table (family inet). Default "cagebox".
	TableName string
	// ProxyPort is the host-side transparent proxy port (TCP). Required.
	ProxyPort uint16
	// DNSPort is the host-side resolver port (UDP and TCP). Required.
	DNSPort uint16
	// StateDir is where allocations are persisted (links.json) so that a
	// restarted daemon knows what is in use. Empty: in memory only.
	StateDir string
	// IfPrefix starts every host interface and namespace name and is what
	// the rules match on ("cbx*"). 1-3 characters [a-z][a-z0-9]*. Default
	// "cbx". Two managers on one host (a daemon and a test) must use
	// different prefixes, tables and pools.
	IfPrefix string
	// NetNSDir holds the namespace bind mounts. Default /run/netns (where
	// `ip netns` looks).
	NetNSDir string
	// IngressMark is the socket mark (SO_MARK) of the daemon's ingress
	// connections: the only new connections from the host into a link,
	// and only to its published ports. Default DefaultIngressMark.
	IngressMark uint32
}

func (c *Config) setDefaults() error {
	if !c.Pool.IsValid() {
		c.Pool = DefaultPool
	}
	if !c.Pool.Addr().Is4() {
		return fmt.Errorf("link: pool %s: only IPv4 pools are supported", c.Pool)
	}
	if c.Pool.Bits() > 30 {
		return fmt.Errorf("link: pool %s: smaller than a /30", c.Pool)
	}
	c.Pool = c.Pool.Masked()
	if c.TableName == "" {
		c.TableName = DefaultTableName
	}
	if c.IfPrefix == "" {
		c.IfPrefix = DefaultIfPrefix
	}
	if !ifPrefixRE.MatchString(c.IfPrefix) {
		return fmt.Errorf("link: interface prefix %q: want 1-3 characters [a-z][a-z0-9]*", c.IfPrefix)
	}
	if c.NetNSDir == "" {
		c.NetNSDir = DefaultNetNSDir
	}
	if c.IngressMark == 0 {
		c.IngressMark = DefaultIngressMark
	}
	if c.ProxyPort == 0 || c.DNSPort == 0 {
		return errors.New("link: proxy and DNS ports are required")
	}
	if c.ProxyPort == c.DNSPort {
		return errors.New("link: proxy and DNS ports must differ")
	}
	return nil
}

// Link is one sandbox's routed point-to-point link.
type Link struct {
	ID        string       `json:"id"`         // sandbox id
	NetNSPath string       `json:"netns_path"` // bind-mounted namespace file the OCI runtime joins
	HostIf    string       `json:"host_if"`    // host-side veth name, prefix + 12 hex digits
	GuestIf   string       `json:"guest_if"`   // name inside the namespace: "eth0"
	HostAddr  netip.Addr   `json:"host_addr"`  // gateway (host end)
	GuestAddr netip.Addr   `json:"guest_addr"` // the sandbox's address
	Prefix    netip.Prefix `json:"prefix"`     // the /30
	// Published are the guest's TCP ports the daemon's ingress may
	// connect to (SetPublished); nothing else enters the link.
	Published []uint16 `json:"published,omitempty"`
}

// Manager creates, tracks and removes links and owns the nftables table.
// It is safe for concurrent use.
type Manager struct {
	cfg       Config
	log       *slog.Logger
	statePath string // "" when not persisting
	hostRE    *regexp.Regexp
	nsRE      *regexp.Regexp

	// nsDirMu guards nsDirReady (NetNSDir is prepared once, retried on error).
	nsDirMu    sync.Mutex
	nsDirReady bool

	// mu guards the fields below and serialises changes to the table and
	// to the state file.
	mu sync.Mutex
	// links holds committed links by sandbox id.
	links map[string]*Link
	// byAddr indexes committed links by guest address.
	byAddr map[netip.Addr]*Link
	// busy marks ids with a Create or Destroy in progress.
	busy map[string]bool
	// used maps every allocated /30 (committed or in progress) to its id.
	used map[netip.Prefix]string
	// ifs maps every host interface name in use to its id.
	ifs map[string]string
	// ready: the table is installed (Init ran and Close did not since).
	ready bool
}

// NewManager validates cfg, applies defaults and loads persisted allocations.
// It changes nothing on the host; call Init, then Recover.
func NewManager(cfg Config, log *slog.Logger) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		cfg:    cfg,
		log:    log.With("component", "link", "table", cfg.TableName),
		hostRE: regexp.MustCompile(`^` + cfg.IfPrefix + `[0-9a-f]{12}$`),
		nsRE:   regexp.MustCompile(`^` + cfg.IfPrefix + `-[0-9a-f]{12}$`),
		links:  map[string]*Link{},
		byAddr: map[netip.Addr]*Link{},
		busy:   map[string]bool{},
		used:   map[netip.Prefix]string{},
		ifs:    map[string]string{},
	}
	if cfg.StateDir != "" {
		m.statePath = filepath.Join(cfg.StateDir, stateFile)
		links, err := loadState(m.statePath)
		if err != nil {
			return nil, err
		}
		for _, l := range links {
			m.commitLocked(l)
		}
		if len(links) > 0 {
			m.log.Info("loaded link allocations", "count", len(links))
		}
	}
	return m, nil
}

// Config returns the effective configuration (defaults applied).
func (m *Manager) Config() Config { return m.cfg }

// names derives the host interface and namespace names for a sandbox id.
func (m *Manager) names(id string) (hostIf, nsPath string) {
	sum := sha256.Sum256([]byte(id))
	h := hex.EncodeToString(sum[:])[:hashLen]
	return m.cfg.IfPrefix + h, filepath.Join(m.cfg.NetNSDir, m.cfg.IfPrefix+"-"+h)
}

// Get returns a copy of the link of sandbox id.
func (m *Manager) Get(id string) (*Link, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.links[id]
	if !ok {
		return nil, false
	}
	c := *l
	return &c, true
}

// List returns copies of every committed link.
func (m *Manager) List() []*Link {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Link, 0, len(m.links))
	for _, l := range m.links {
		c := *l
		out = append(out, &c)
	}
	return out
}

// LookupByAddr returns the link whose guest address is a (IPv4 or
// IPv4-mapped IPv6): the proxy and resolver identify sandboxes by source
// address, which the anti-spoofing rule makes trustworthy.
func (m *Manager) LookupByAddr(a netip.Addr) (*Link, bool) {
	a = a.Unmap()
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.byAddr[a]
	if !ok {
		return nil, false
	}
	c := *l
	return &c, true
}

// commitLocked records l as in use. m.mu must be held.
func (m *Manager) commitLocked(l *Link) {
	m.links[l.ID] = l
	m.byAddr[l.GuestAddr] = l
	m.used[l.Prefix] = l.ID
	m.ifs[l.HostIf] = l.ID
}

// forgetLocked releases everything recorded for l. m.mu must be held.
func (m *Manager) forgetLocked(l *Link) {
	if m.links[l.ID] == l {
		delete(m.links, l.ID)
	}
	if m.byAddr[l.GuestAddr] == l {
		delete(m.byAddr, l.GuestAddr)
	}
	if m.used[l.Prefix] == l.ID {
		delete(m.used, l.Prefix)
	}
	if m.ifs[l.HostIf] == l.ID {
		delete(m.ifs, l.HostIf)
	}
}

// allocLocked picks the lowest free /30 of the pool. m.mu must be held.
func (m *Manager) allocLocked() (netip.Prefix, error) {
	p := m.cfg.Pool
	n := uint32(1) << (30 - p.Bits())
	base := p.Addr().As4()
	b := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	for i := uint32(0); i < n; i++ {
		v := b + i*4
		a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		pr := netip.PrefixFrom(a, 30)
		if _, ok := m.used[pr]; !ok {
			return pr, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("link: %d links in %s: %w", n, p, ErrPoolExhausted)
}

// Create makes the link of sandbox id: a named network namespace, a veth
// pair whose guest end is eth0 inside it, addresses, lo up, a default route
// via the host end, IPv6 disabled on both ends, and the anti-spoofing set
// element. On any failure everything made so far is undone.
func (m *Manager) Create(ctx context.Context, id string) (_ *Link, err error) {
	if id == "" {
		return nil, errors.New("link: empty sandbox id")
	}
	hostIf, nsPath := m.names(id)

	m.mu.Lock()
	if !m.ready {
		m.mu.Unlock()
		return nil, fmt.Errorf("link: create %q: %w (call Init first)", id, ErrNotReady)
	}
	if _, ok := m.links[id]; ok || m.busy[id] {
		m.mu.Unlock()
		return nil, fmt.Errorf("link: create %q: %w", id, ErrExists)
	}
	if other, ok := m.ifs[hostIf]; ok {
		m.mu.Unlock()
		return nil, fmt.Errorf("link: create %q: interface name %s already used by %q: %w", id, hostIf, other, ErrExists)
	}
	pr, err := m.allocLocked()
	if err != nil {
		m.mu.Unlock()
		return nil, err
	}
	l := &Link{
		ID:        id,
		NetNSPath: nsPath,
		HostIf:    hostIf,
		GuestIf:   GuestIf,
		HostAddr:  pr.Addr().Next(),
		GuestAddr: pr.Addr().Next().Next(),
		Prefix:    pr,
	}
	m.busy[id] = true
	m.used[pr] = id
	m.ifs[hostIf] = id
	m.mu.Unlock()

	log := m.log.With("sandbox", id, "if", hostIf)
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Run()
			m.mu.Lock()
			delete(m.busy, id)
			if m.used[pr] == id {
				delete(m.used, pr)
			}
			if m.ifs[hostIf] == id {
				delete(m.ifs, hostIf)
			}
			m.mu.Unlock()
			log.Warn("link setup failed; undone", "err", err)
		}
	}()

	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("link: create %q: %w", id, err)
	}
	if err := m.plumb(l, &undo); err != nil {
		return nil, fmt.Errorf("link: create %q: %w", id, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("link: create %q: %w", id, err)
	}

	// Commit: set element, memory and state file together under mu so that
	// a concurrent Init (which rebuilds the set from m.links) cannot lose it.
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ready {
		return nil, fmt.Errorf("link: create %q: %w", id, ErrNotReady)
	}
	if err := m.setElements(true, l); err != nil {
		return nil, fmt.Errorf("link: create %q: %w", id, err)
	}
	m.commitLocked(l)
	delete(m.busy, id)
	if err := m.saveLocked(); err != nil {
		m.forgetLocked(l)
		m.busy[id] = true // the deferred undo clears it
		if derr := m.setElements(false, l); derr != nil {
			log.Error("removing set element after failed commit", "err", derr)
		}
		return nil, fmt.Errorf("link: create %q: %w", id, err)
	}
	log.Debug("link created", "host", l.HostAddr, "guest", l.GuestAddr, "netns", l.NetNSPath)
	c := *l
	return &c, nil
}

// Destroy removes the link of sandbox id: set element, veth pair, namespace
// mount and file, allocation. It is idempotent: an unknown id still has its
// derived interface and namespace removed if they exist, and succeeds.
func (m *Manager) Destroy(ctx context.Context, id string) error {
	hostIf, nsPath := m.names(id)

	m.mu.Lock()
	if m.busy[id] {
		m.mu.Unlock()
		return fmt.Errorf("link: destroy %q: operation in progress: %w", id, ErrExists)
	}
	l, known := m.links[id]
	if known {
		hostIf, nsPath = l.HostIf, l.NetNSPath
		// Remove the element first: from here on the link is cut off.
		if m.ready {
			if err := m.publishElements(false, l, l.Published); err != nil && !isNotExist(err) {
				m.mu.Unlock()
				return fmt.Errorf("link: destroy %q: %w", id, err)
			}
			if err := m.setElements(false, l); err != nil && !isNotExist(err) {
				m.mu.Unlock()
				return fmt.Errorf("link: destroy %q: %w", id, err)
			}
		}
	}
	m.busy[id] = true
	m.mu.Unlock()

	err := errors.Join(deleteVeth(hostIf), deleteNetNS(nsPath))

	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.busy, id)
	if err != nil {
		return fmt.Errorf("link: destroy %q: %w", id, err)
	}
	if known {
		m.forgetLocked(l)
		if err := m.saveLocked(); err != nil {
			return fmt.Errorf("link: destroy %q: %w", id, err)
		}
		m.log.Debug("link destroyed", "sandbox", id, "if", hostIf)
	}
	return nil
}

// DestroyAll destroys every link the manager knows about. The table stays;
// a full teardown is DestroyAll then Close.
func (m *Manager) DestroyAll(ctx context.Context) error {
	m.mu.Lock()
	ids := make([]string, 0, len(m.links))
	for id := range m.links {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	var errs []error
	for _, id := range ids {
		errs = append(errs, m.Destroy(ctx, id))
	}
	return errors.Join(errs...)
}
