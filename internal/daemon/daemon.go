// Package daemon wires the cagebox daemon together: store, images,
// runtimes, sandbox manager and the HTTP API on a unix socket (admin) and
// optionally TCP (API keys). It owns the lifecycle contexts.
package daemon

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/gateway"
	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/kvm"
	"github.com/cagebox/cagebox/internal/livepolicy"
	"github.com/cagebox/cagebox/internal/metrics"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/internal/safedial"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/internal/vault/sqlitebackend"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/container"
	"github.com/cagebox/cagebox/isolation/firecracker"
	"github.com/cagebox/cagebox/isolation/gvisor"
	"github.com/cagebox/cagebox/isolation/qemu"
)

// Config configures the daemon.
type Config struct {
	// Home is the state directory ($CAGEBOX_HOME).
	Home string
	// Listen is an optional TCP address for the API (API keys required).
	// Plain HTTP is allowed on loopback addresses only, unless
	// InsecureListen; with TLSCert and TLSKey (PEM files) it is HTTPS.
	Listen         string
	TLSCert        string
	TLSKey         string
	InsecureListen bool
	// AdminKeyFile holds the fleet admin key (at least MinAdminKeyLen
	// characters): a TCP request bearing it is the admin, as over the unix
	// socket. Needs Listen.
	AdminKeyFile string
	// AgentPath is the static cagebox-agent binary.
	AgentPath    string
	MinIsolation isolation.Class
	// DefaultRuntime serves requests that name no runtime ("auto": the
	// strongest available that meets the floor).
	DefaultRuntime string
	// DefaultTimeout is the maximum lifetime of sandboxes created without one.
	DefaultTimeout time.Duration
	Logger         *slog.Logger
	// Ready, if set, is called once the API answers.
	Ready func()
	// Network configures the egress gateway.
	Network NetworkConfig
	// MasterKeyFile holds the vault's master key (created 0600 at first
	// start); default $CAGEBOX_HOME/master.key. CAGEBOX_MASTER_KEY (hex or
	// base64) takes precedence and is removed from the environment.
	MasterKeyFile string
	// Events bounds the event path: per-sandbox rate, retention.
	Events EventConfig
	// Pools are the warm pools to keep; PoolMemory bounds the memory of
	// their ready sandboxes (0: a quarter of the host's memory).
	Pools      []pool.Target
	PoolMemory int64
	// MountRoots are the host directories tenants may bind-mount from
	// (--mount-root); none: no bind mounts. Checked at start
	// (mounts.NewRoots): never /, never overlapping Home.
	MountRoots []string
	// Ingress is the inbound listener for published ports.
	Ingress IngressConfig
	// RelayDiscordURL overrides the Discord Gateway URL relays connect to
	// (tests, self-hosted gateways); "" = relay.DefaultDiscordURL.
	RelayDiscordURL string
	// E2B is the E2B protocol front (docs/e2b.md).
	E2B E2BConfig
	// TenantURLsAllowPrivate lets the URLs tenants supply (WebSocket
	// relays, approval webhooks) reach loopback, private, link-local and
	// the host's addresses, and literal addresses (refused by default;
	// metadata endpoints stay refused): --tenant-urls-allow-private, once
	// --relay-allow-private.
	TenantURLsAllowPrivate bool
}

// EventConfig configures audit events (package audit).
type EventConfig struct {
	// Rate is each sandbox's sustained events a second per class (bulk:
	// egress and DNS; priority: lifecycle and secrets); 0 = audit's
	// default, negative = no limit. Burst: 0 = audit's default.
	Rate  float64
	Burst int
	// Retention is how long events are kept; 0 keeps them forever.
	Retention time.Duration
}

// NetworkConfig configures sandbox networking.
type NetworkConfig struct {
	Pool                netip.Prefix
	ProxyPort, DNSPort  uint16
	TableName, IfPrefix string
	// Resolve are explicit upstream overrides (tests, demos).
	Resolve map[string]netip.AddrPort
	// UpstreamCAFiles are extra roots for verifying upstreams.
	UpstreamCAFiles []string
	// HostPublicAddrs are the host's public addresses that are on none of
	// its interfaces (1:1 NAT, cloud public IPs; see ParseHostAddr): no
	// upstream may have one. Interface addresses are learned.
	HostPublicAddrs []netip.Prefix
	// Exfil: flag (default), block or off — credential-shaped strings that
	// are not a sandbox's placeholders.
	Exfil string
	// ExfilScan bounds the exfil scan of one request (zero: defaults).
	ExfilScan credentials.ScanBudget
	// Limits bound each sandbox's in-flight request bytes, body read times
	// and upstream connections (zero: defaults).
	Limits gateway.Limits
}

// ParseResolve parses HOST:PORT=ADDR:PORT.
func ParseResolve(s string) (string, netip.AddrPort, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return "", netip.AddrPort{}, fmt.Errorf("--resolve %q: want HOST:PORT=ADDR:PORT", s)
	}
	host, port, err := net.SplitHostPort(k)
	if err != nil || host == "" || port == "" {
		return "", netip.AddrPort{}, fmt.Errorf("--resolve %q: %q is not HOST:PORT", s, k)
	}
	name, err := hostname.Parse(host)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("--resolve %q: %w", s, err)
	}
	ap, err := netip.ParseAddrPort(v)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("--resolve %q: %q is not ADDR:PORT", s, v)
	}
	return name + ":" + port, ap, nil
}

// ParseHostAddr parses a --host-public-addr value: an address
// ("203.0.113.7", "2001:db8::7") or a prefix ("203.0.113.0/28").
func ParseHostAddr(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		a, aerr := netip.ParseAddr(s)
		if aerr != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("--host-public-addr %q: want an address such as 203.0.113.7 or a prefix such as 203.0.113.0/28", s)
		}
		a = a.Unmap()
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("--host-public-addr %q: write an IPv4 address in its IPv4 form", s)
	}
	return p.Masked(), nil
}

// RegisterRuntimes registers the runtimes built into this binary.
func RegisterRuntimes(home string) {
	if _, ok := isolation.Lookup(container.Name); !ok {
		isolation.Register(container.New(container.Options{StateRoot: filepath.Join(home, "oci")}))
	}
	if _, ok := isolation.Lookup(gvisor.Name); !ok {
		isolation.Register(gvisor.New(gvisor.Options{StateRoot: filepath.Join(home, "runsc"), Binary: os.Getenv("CAGEBOX_RUNSC")}))
	}
	if _, ok := isolation.Lookup(qemu.Name); !ok {
		isolation.Register(qemu.New(qemu.Options{Dir: filepath.Join(home, "vm"), Binary: os.Getenv("CAGEBOX_QEMU")}))
	}
	if _, ok := isolation.Lookup(firecracker.Name); !ok {
		// Firecracker trusts the KVM verdict of the qemu runtime's probe
		// (the same guest kernel), so the host is probed once.
		var probe func() kvm.Verdict
		if q, ok := isolation.Lookup(qemu.Name); ok {
			if q, ok := q.(*qemu.Runtime); ok {
				probe = q.KVM
			}
		}
		isolation.Register(firecracker.New(firecracker.Options{Dir: filepath.Join(home, "vm"), ChrootBase: filepath.Join(home, "jail"), Probe: probe}))
	}
}

// removeStaleSocket removes a socket no daemon answers on, and refuses to
// start when one does.
func removeStaleSocket(sock string) error {
	if _, err := os.Stat(sock); err != nil {
		return nil
	}
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("another daemon answers on %s: stop it first", sock)
	}
	return os.Remove(sock)
}

// NewAPIKey makes a key ("cbk_" + 32 random bytes hex) and its stored record.
func NewAPIKey(tenant string) (string, *store.APIKey) {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	key := "cbk_" + hex.EncodeToString(b)
	idb := make([]byte, 6)
	_, _ = rand.Read(idb)
	return key, &store.APIKey{
		ID: "key-" + hex.EncodeToString(idb), TenantID: tenant, Hash: HashKey(key),
		Prefix: key[:12], CreatedAt: time.Now().UTC(),
	}
}

// addUpstreamCAs adds the --upstream-ca files to pool.
func addUpstreamCAs(pool *x509.CertPool, files []string) error {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("--upstream-ca: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return fmt.Errorf("--upstream-ca %s: no PEM certificate in it", f)
		}
	}
	return nil
}

// tenantClient is the one HTTP client of every URL a tenant supplies
// (relays, approval webhooks) and of the Discord gateway: package
// safedial's dialer under the gateway's overrides (--resolve) and the
// host's public addresses, TLS verified against the system's roots and
// --upstream-ca, no redirects followed.
func tenantClient(cfg Config) (*http.Client, error) {
	n := cfg.Network
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if err := addUpstreamCAs(roots, n.UpstreamCAFiles); err != nil {
		return nil, err
	}
	d := safedial.New(safedial.Config{Overrides: n.Resolve, HostAddrs: n.HostPublicAddrs, AllowPrivate: cfg.TenantURLsAllowPrivate})
	return d.HTTPClient(roots), nil
}

func newGateway(cfg Config, live *livepolicy.Registry, emit func(string, string, api.EventPayload), log *slog.Logger) (*gateway.Gateway, error) {
	n := cfg.Network
	var roots *x509.CertPool
	if len(n.UpstreamCAFiles) > 0 {
		roots = x509.NewCertPool()
		if err := addUpstreamCAs(roots, n.UpstreamCAFiles); err != nil {
			return nil, err
		}
	}
	return gateway.New(gateway.Config{
		Live:     live,
		StateDir: filepath.Join(cfg.Home, "net"), Pool: n.Pool,
		ProxyPort: n.ProxyPort, DNSPort: n.DNSPort, TableName: n.TableName, IfPrefix: n.IfPrefix,
		Resolve: n.Resolve, UpstreamCAs: roots, Emit: emit, Logger: log,
		HostAddrs:   n.HostPublicAddrs,
		Credentials: credentials.Config{Exfil: n.Exfil, ExfilScan: n.ExfilScan}, Limits: n.Limits,
	})
}

// budgetCounter counts what the live policy adds to sandboxes' budgets
// into the metrics on its way to the store.
type budgetCounter struct {
	store.Store
	m *metrics.Metrics
}

func (b budgetCounter) AddBudgetUsage(ctx context.Context, delta store.BudgetUsage) (*store.BudgetUsage, error) {
	u, err := b.Store.AddBudgetUsage(ctx, delta)
	if err == nil {
		b.m.AddBudget(delta)
	}
	return u, err
}

// poolMemory is the pools' memory budget: n, or a quarter of the host's
// memory.
func poolMemory(n int64) int64 {
	if n > 0 {
		return n
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 2 << 30
	}
	return int64(si.Totalram) * int64(si.Unit) / 4
}

// keepSandbox says which sandboxes' links survive a restart (those the
// store still has as running, paused, hibernated or being created) and lists every
// sandbox the store records, pooled ones (rows of no tenant) included (the
// only ones whose links are this daemon's to remove; Recover destroys the
// pooled ones). A store that cannot be read stops the start: guessing would
// remove live sandboxes' links.
func keepSandbox(ctx context.Context, st store.Store) (func(string) bool, []string, error) {
	keep := map[string]bool{}
	rs, err := st.ListSandboxes(ctx, "")
	if err != nil {
		return nil, nil, fmt.Errorf("list sandboxes to recover: %w", err)
	}
	pooled, err := st.ListUnownedSandboxes(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list pooled sandboxes to recover: %w", err)
	}
	ours := make([]string, 0, len(rs)+len(pooled))
	for _, r := range pooled {
		ours = append(ours, r.ID)
	}
	for _, r := range rs {
		ours = append(ours, r.ID)
		switch r.Status {
		case sandbox.StatusRunning, sandbox.StatusPaused, sandbox.StatusCreating, sandbox.StatusHibernated:
			keep[r.ID] = true
		}
	}
	return func(id string) bool { return keep[id] }, ours, nil
}

// openVault opens the secret vault: its own SQLite file beside the store,
// sealed under a master key that never enters that database.
func openVault(cfg Config) (*vault.Vault, func(), error) {
	var key *vault.MasterKey
	var err error
	if os.Getenv("CAGEBOX_MASTER_KEY") != "" {
		key, err = vault.KeyFromEnv("CAGEBOX_MASTER_KEY")
		// Keep it out of every child process (runc, qemu, agents).
		os.Unsetenv("CAGEBOX_MASTER_KEY")
	} else {
		path := MasterKeyPath(cfg.Home, cfg.MasterKeyFile)
		if _, err := os.Stat(path + ".new"); err == nil {
			return nil, nil, fmt.Errorf("%s.new exists: a master-key rotation was interrupted; run `cagebox secret rotate-master-key` again to finish it", path)
		}
		key, err = vault.LoadOrCreateKeyFile(path)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("vault master key: %w", err)
	}
	b, err := sqlitebackend.Open(VaultPath(cfg.Home))
	if err != nil {
		return nil, nil, fmt.Errorf("open vault: %w", err)
	}
	return vault.New(b, key), func() { b.Close() }, nil
}

// MasterKeyPath is the vault's master key file.
func MasterKeyPath(home, flag string) string {
	if flag != "" {
		return flag
	}
	return filepath.Join(home, "master.key")
}

// VaultPath is the vault's database.
func VaultPath(home string) string { return filepath.Join(home, "vault.db") }

// RotateMasterKey re-seals every secret under a new master key, with the
// daemon stopped. The new key is written to KEY.new first; the re-seal is
// one transaction; then KEY.new replaces KEY. Interrupted at any point, a
// re-run finishes the job (records already under the new key are skipped),
// and the daemon refuses to start while KEY.new exists.
func RotateMasterKey(ctx context.Context, home, keyFile string) (string, int, error) {
	if os.Getenv("CAGEBOX_MASTER_KEY") != "" {
		return "", 0, errors.New("the master key comes from CAGEBOX_MASTER_KEY: rotate it with vault.RotateMasterKey from your own key store")
	}
	path := MasterKeyPath(home, keyFile)
	old, err := vault.LoadOrCreateKeyFile(path)
	if err != nil {
		return "", 0, err
	}
	next, err := vault.LoadOrCreateKeyFile(path + ".new")
	if err != nil {
		return "", 0, err
	}
	b, err := sqlitebackend.Open(VaultPath(home))
	if err != nil {
		return "", 0, fmt.Errorf("open vault: %w", err)
	}
	defer b.Close()
	n, err := vault.RotateMasterKey(ctx, b, old, next)
	if err != nil {
		return "", 0, err
	}
	if err := os.Rename(path+".new", path); err != nil {
		return "", 0, fmt.Errorf("install the new key: %w (the secrets are sealed under %s.new)", err, path)
	}
	return next.ID, n, nil
}
