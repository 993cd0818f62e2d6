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
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/audit"
	"github.com/cagebox/cagebox/internal/console"
	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/gateway"
	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/ingress"
	"github.com/cagebox/cagebox/internal/kvm"
	"github.com/cagebox/cagebox/internal/link"
	"github.com/cagebox/cagebox/internal/livepolicy"
	"github.com/cagebox/cagebox/internal/metrics"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/internal/safedial"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
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

// Run serves until ctx ends. Sandboxes keep running after it returns; the
// next daemon re-attaches to them.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	// The admin key and the TCP listener are checked (and taken) first,
	// so that a refused setting leaves nothing behind.
	var adminKey []byte
	if cfg.AdminKeyFile != "" {
		if cfg.Listen == "" {
			return errors.New("--admin-key-file is the admin's key over TCP: give --listen ADDR too")
		}
		k, err := LoadAdminKey(cfg.AdminKeyFile)
		if err != nil {
			return err
		}
		adminKey = k
	}
	tl, err := openAPIListener(ctx, cfg, log)
	if err != nil {
		return err
	}
	if tl != nil {
		defer tl.Close()
	}
	var e2bl *apiListener
	if cfg.E2B.Listen != "" {
		lcfg := cfg
		lcfg.Listen = cfg.E2B.Listen
		if e2bl, err = openListener(ctx, lcfg, "--e2b-listen", log); err != nil {
			return err
		}
		defer e2bl.Close()
	}
	// The home and its state directories are 0700: image trees hold
	// root-owned and setuid files no local user may reach. An older
	// release, an `image build` before the first start, or an operator's
	// mkdir may have left them wider.
	repaired, err := statedir.RepairHome(cfg.Home)
	for _, r := range repaired {
		log.Warn("state directory was open to other users: narrowed", "dir", r.Dir, "was", r.Was.Perm().String(), "now", statedir.Mode.String())
	}
	if err != nil {
		return fmt.Errorf("home %s: %w", cfg.Home, err)
	}
	// One daemon per set of host network resources: the nftables table and
	// the interface prefix are taken host-wide before anything is touched.
	hostLock, err := link.LockHost("", link.Config{TableName: cfg.Network.TableName, IfPrefix: cfg.Network.IfPrefix}, cfg.Home)
	if err != nil {
		return err
	}
	defer hostLock.Release()
	// Another daemon of this home (with other network names) is refused
	// before anything is touched.
	sock := client.SocketPath(cfg.Home)
	if err := removeStaleSocket(sock); err != nil {
		return err
	}
	if _, err := os.Stat(cfg.AgentPath); err != nil {
		return fmt.Errorf("cagebox-agent binary: %w (build it with `make build`, or pass --agent)", err)
	}
	if err := checkAgentBinary(cfg.AgentPath); err != nil {
		return err
	}
	st, err := sqlite.Open(filepath.Join(cfg.Home, "cagebox.db"))
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer st.Close()
	RegisterRuntimes(cfg.Home)
	// A KVM probe VMM whose daemon died mid-probe without taking it along
	// (the parent-death signal normally does) is killed now.
	kvm.SweepProbes(kvm.DefaultStateDir, log)
	// microVM templates whose inputs changed (kernel, agent, image, QEMU)
	// are never restored from again: remove them.
	if rt, ok := isolation.Lookup(qemu.Name); ok {
		if q, ok := rt.(*qemu.Runtime); ok {
			if gone, err := q.PruneTemplates(nil); err != nil {
				log.Warn("prune microVM templates", "err", err)
			} else if len(gone) > 0 {
				log.Info("removed stale microVM templates", "count", len(gone))
			}
		}
	}
	if d := cfg.DefaultRuntime; d != "" && d != "auto" {
		if _, ok := isolation.Lookup(d); !ok {
			return fmt.Errorf("--default-runtime: unknown runtime %q: `cagebox runtimes` lists them", d)
		}
	}
	// Probe what this host offers (KVM boots, runsc's kvm platform) in the
	// background now, so the first create and `cagebox runtimes` find the
	// verdicts made; each probe is bounded and runs once per daemon start.
	probed := make(chan struct{})
	defer func() {
		// A probe cut short by the daemon's exit would leave runsc's
		// processes behind: wait for it (each is bounded).
		select {
		case <-probed:
		case <-time.After(2 * kvm.DefaultTimeout):
		}
	}()
	go func() {
		defer close(probed)
		for _, rt := range isolation.All() {
			if ctx.Err() != nil {
				return
			}
			attrs := []any{"runtime", rt.Name(), "class", rt.Class().String()}
			if d, ok := rt.(isolation.Describer); ok {
				attrs = append(attrs, "detail", d.Detail())
			}
			if err := rt.Available(); err != nil {
				log.Info("runtime unavailable", append(attrs, "reason", err.Error())...)
				continue
			}
			log.Info("runtime available", attrs...)
		}
	}()
	images := &image.Cache{Dir: filepath.Join(cfg.Home, "images")}
	// One event path for the gateway (proxy, resolver), the manager and
	// the API. Closed last (deferred first): events of sandboxes' last
	// requests, emitted while the gateway closes, are stored too.
	// Metrics count what happens from one tap on the event path; their
	// gauges read the store and the manager (made below) when scraped.
	var (
		mgr    *sandbox.Manager
		events *audit.Log
	)
	met := metrics.New(metrics.Sources{
		Sandboxes: func() map[[2]string]int {
			rs, err := st.ListSandboxes(context.Background(), "")
			if err != nil {
				return nil
			}
			out := map[[2]string]int{}
			for _, r := range rs {
				out[[2]string{r.Runtime, r.Status}]++
			}
			return out
		},
		PendingApprovals: func() int {
			as, _ := st.ListApprovals(context.Background(), "", "", store.ApprovalPending, 100000)
			return len(as)
		},
		EventsDropped: func() int64 { return events.Stats().Dropped },
		Pools: func() map[string]int {
			if mgr == nil {
				return nil
			}
			out := map[string]int{}
			for _, p := range mgr.Pools().Pools {
				out[p.Class] = p.Ready
			}
			return out
		},
	})
	events = audit.New(audit.Config{Store: st, Logger: log, Rate: cfg.Events.Rate, Burst: cfg.Events.Burst, Tap: met.Observe})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := events.Close(ctx); err != nil {
			log.Error("store queued events", "err", err)
		}
	}()
	emit := events.Emit
	hookKey, err := webhookKey(cfg.Home)
	if err != nil {
		return err
	}
	tenantHTTP, err := tenantClient(cfg)
	if err != nil {
		return err
	}
	// The live policy's trigger actions and freeze reach the manager and
	// the gateway, which are made below; the closures read them then.
	var (
		gw *gateway.Gateway
		v  *vault.Vault
	)
	live := livepolicy.New(livepolicy.Config{
		Store: budgetCounter{Store: st, m: met}, Emit: emit, Logger: log, WebhookKey: hookKey, WebhookClient: tenantHTTP,
		CloseConns: func(id string) int { return gw.CloseConns(id) },
		Act: func(ctx context.Context, id, trigger string, a policy.TriggerAction) error {
			return triggerAct(ctx, st, v, mgr, id, trigger, a)
		},
	})
	if err := live.Start(ctx); err != nil {
		return err
	}
	gw, err = newGateway(cfg, live, emit, log)
	if err != nil {
		return err
	}
	v, closeVault, err := openVault(cfg)
	if err != nil {
		return err
	}
	defer closeVault()
	roots, err := mounts.NewRoots(cfg.MountRoots, cfg.Home)
	if err != nil {
		return err
	}
	mgr = sandbox.New(sandbox.Config{
		MountRoots: roots, VolumeDir: filepath.Join(cfg.Home, "volumes"),
		Gateway: gw, Vault: v,
		Store: st, Images: images, StateDir: filepath.Join(cfg.Home, "sandboxes"),
		AgentPath: cfg.AgentPath, Logger: log, MinIsolation: cfg.MinIsolation,
		DefaultTimeout: cfg.DefaultTimeout, DefaultRuntime: cfg.DefaultRuntime,
		Events: events, Pools: cfg.Pools, PoolMemory: poolMemory(cfg.PoolMemory), OnCreate: met.ObserveCreate,
	})
	if err := statedir.Make(filepath.Join(cfg.Home, "sandboxes")); err != nil {
		return err
	}
	keep, ours, err := keepSandbox(ctx, st)
	if err != nil {
		return err
	}
	// Pooled sandboxes an older daemon recorded as files are ours, and
	// none is kept.
	ours = append(ours, sandbox.LegacyPoolIDs(filepath.Join(cfg.Home, "sandboxes"))...)
	if err := gw.Init(ctx, keep, ours); err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.Close(cctx); err != nil {
			log.Error("close gateway", "err", err)
		}
	}()
	if err := mgr.Recover(ctx); err != nil {
		return fmt.Errorf("recover sandboxes: %w", err)
	}
	defer mgr.Close()
	mgr.SyncPorts(ctx)
	if err := mgr.PruneImageRefs(ctx); err != nil {
		log.Warn("prune image references", "err", err)
	}
	if err := mgr.StartPool(); err != nil {
		return fmt.Errorf("--pool: %w", err)
	}
	var ingressSrv *ingress.Server
	hooksSvc := newHooks(cfg, st, v, mgr, emit, &ingressSrv)
	ingressSrv, stopIngress, err := startIngress(cfg, mgr, gw, emit, hooksSvc, log)
	if err != nil {
		return err
	}
	defer stopIngress()
	srv := NewServer(st, mgr, images, v, log)
	srv.SetAdminKey(adminKey)
	if cfg.Ingress.Addr != "" {
		srv.ingressDomain = strings.TrimSuffix(strings.ToLower(cfg.Ingress.Domain), ".")
	}
	srv.metrics = met.Handler()
	srv.hooks = hooksSvc
	srv.webhookKey = hookKey
	srv.relays = newRelays(st, hooksSvc, v, emit, log, cfg.RelayDiscordURL, tenantHTTP, mgr.SecretHosts)
	if e2bl != nil {
		stopE2B, err := startE2B(cfg, e2bl, srv, mgr, ingressSrv, log)
		if err != nil {
			return err
		}
		defer stopE2B()
	}

	// The socket is created 0600 from the start (umask), not chmod-ed after.
	old := umask(0o177)
	ul, err := net.Listen("unix", sock)
	umask(old)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	defer os.Remove(sock)
	unixSrv := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context { return ViaUnix(ctx) }}
	errc := make(chan error, 2)
	go func() { errc <- unixSrv.Serve(ul) }()
	var tcpSrv *http.Server
	if tl != nil {
		tcpSrv = &http.Server{Handler: notUnderIngress(cfg.Ingress, console.SecureHeaders(srv)), ReadHeaderTimeout: 10 * time.Second, TLSConfig: tl.tls}
		go func() {
			if tl.tls != nil {
				errc <- tcpSrv.ServeTLS(tl.Listener, "", "")
				return
			}
			errc <- tcpSrv.Serve(tl.Listener)
		}()
		log.Info("api on tcp (API keys required)", "addr", tl.Addr().String(), "https", tl.tls != nil)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go mgr.RunReaper(rctx, time.Second)
	if hooksSvc != nil {
		hooksDone := make(chan struct{})
		go func() { hooksSvc.Run(rctx); close(hooksDone) }()
		defer func() { cancel(); <-hooksDone }()
	}
	if srv.relays != nil {
		events.Watch(srv.relays.lifecycle, relayLifecycle...)
		relaysDone := make(chan struct{})
		go func() { srv.relays.run(rctx); close(relaysDone) }()
		defer func() { cancel(); <-relaysDone }()
	}
	go audit.Retain(rctx, audit.RetainConfig{Store: st, Keep: cfg.Events.Retention, Logger: log})
	log.Info("cagebox daemon ready", "socket", sock, "home", cfg.Home, "sandboxes", mgr.Count())
	if cfg.Ready != nil {
		cfg.Ready()
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = unixSrv.Shutdown(sctx)
	srv.closeConsole()
	if tcpSrv != nil {
		_ = tcpSrv.Shutdown(sctx)
	}
	log.Info("cagebox daemon stopped; sandboxes keep running")
	return nil
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
