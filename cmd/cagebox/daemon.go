//go:build !lite

package main

import (
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/internal/audit"
	"github.com/cagebox/cagebox/internal/daemon"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/internal/relay"
	"github.com/cagebox/cagebox/isolation"
)

// daemonFlags are the flags of `cagebox daemon`, shared by `cagebox node`
// (which runs the same daemon): one definition, one parser.
type daemonFlags struct {
	listen, agent, minIso, timeout, logLevel, linkPool, defRuntime string
	resolve, upstreamCAs, hostPublic, mountRoots                   []string
	tlsCert, tlsKey                                                string
	insecureListen                                                 bool
	proxyPort, dnsPort                                             uint16
	netCfgTable, netCfgPrefix, masterKey, exfil                    string
	adminKeyFile                                                   string
	lim                                                            limitFlags
	ing                                                            ingressFlags
	relayDiscordURL                                                string
	tenantURLsAllowPrivate                                         bool
	eventRetention                                                 string
	eventRate                                                      float64
	eventBurst                                                     int
	pools                                                          []string
	poolMem                                                        string
	e2b                                                            daemon.E2BConfig
}

func daemonCmd(g *globals) *cobra.Command {
	var f daemonFlags
	cmd := &cobra.Command{
		Use:   docDaemon.use,
		Short: docDaemon.short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config(g)
			if err != nil {
				return err
			}
			return daemon.Run(cmd.Context(), cfg)
		},
	}
	f.register(cmd)
	return cmd
}

// config checks the flags and makes the daemon's configuration (its
// Logger included).
func (f *daemonFlags) config(g *globals) (daemon.Config, error) {
	var none daemon.Config
	agent := f.agent
	if agent == "" {
		agent = defaultAgentPath()
	}
	floor := isolation.Namespaces
	if f.minIso != "" {
		c, err := isolation.ParseClass(f.minIso)
		if err != nil {
			return none, fmt.Errorf("--min-isolation: %w", err)
		}
		floor = c
	}
	var def time.Duration
	if f.timeout != "" {
		d, err := time.ParseDuration(f.timeout)
		if err != nil {
			return none, fmt.Errorf("--default-timeout: %q is not a duration such as 1h", f.timeout)
		}
		def = d
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.logLevel)); err != nil {
		return none, fmt.Errorf("--log-level: %w", err)
	}
	netCfg := daemon.NetworkConfig{ProxyPort: f.proxyPort, DNSPort: f.dnsPort, UpstreamCAFiles: f.upstreamCAs,
		TableName: f.netCfgTable, IfPrefix: f.netCfgPrefix, Resolve: map[string]netip.AddrPort{}, Exfil: f.exfil}
	if f.linkPool != "" {
		p, err := netip.ParsePrefix(f.linkPool)
		if err != nil {
			return none, fmt.Errorf("--link-pool: %q is not a prefix such as 10.201.0.0/16", f.linkPool)
		}
		netCfg.Pool = p
	}
	if err := f.lim.apply(&netCfg); err != nil {
		return none, err
	}
	for _, r := range f.resolve {
		k, v, err := daemon.ParseResolve(r)
		if err != nil {
			return none, err
		}
		netCfg.Resolve[k] = v
	}
	for _, a := range f.hostPublic {
		p, err := daemon.ParseHostAddr(a)
		if err != nil {
			return none, err
		}
		netCfg.HostPublicAddrs = append(netCfg.HostPublicAddrs, p)
	}
	events, err := eventConfig(f.eventRetention, f.eventRate, f.eventBurst)
	if err != nil {
		return none, err
	}
	targets, err := pool.ParseTargets(f.pools...)
	if err != nil {
		return none, fmt.Errorf("--pool: %w", err)
	}
	var poolBytes int64
	if f.poolMem != "" {
		if poolBytes, err = pool.ParseSize(f.poolMem); err != nil {
			return none, fmt.Errorf("--pool-memory: %w", err)
		}
	}
	ing := f.ing
	if ing.maxBodyStr != "" {
		if ing.cfg.MaxBody, err = parseSize(ing.maxBodyStr); err != nil {
			return none, fmt.Errorf("--ingress-max-body: %w", err)
		}
	}
	if ing.cfg.Addr != "" && ing.cfg.Domain == "" {
		return none, fmt.Errorf("--ingress needs --ingress-domain D (ports are served as https://PORT-ID.D)")
	}
	if f.relayDiscordURL != "" {
		if err := relay.ValidateURL(f.relayDiscordURL); err != nil {
			return none, fmt.Errorf("--relay-discord-url: %w", err)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	return daemon.Config{
		Ingress: ing.cfg, RelayDiscordURL: f.relayDiscordURL, TenantURLsAllowPrivate: f.tenantURLsAllowPrivate,
		Pools: targets, PoolMemory: poolBytes,
		Home: g.home, Listen: f.listen, TLSCert: f.tlsCert, TLSKey: f.tlsKey, InsecureListen: f.insecureListen,
		AdminKeyFile: f.adminKeyFile, AgentPath: agent, MinIsolation: floor, DefaultRuntime: f.defRuntime,
		DefaultTimeout: def, Logger: log, Network: netCfg, MasterKeyFile: f.masterKey, Events: events,
		MountRoots: f.mountRoots, E2B: f.e2b,
	}, nil
}

// register adds the daemon's flags to cmd.
func (f *daemonFlags) register(cmd *cobra.Command) {
	f.ing.register(cmd)
	cmd.Flags().BoolVar(&f.tenantURLsAllowPrivate, "tenant-urls-allow-private", false, "let the URLs tenants supply (websocket relays, approval webhooks) reach loopback, private, link-local and this host's addresses (cloud metadata stays refused); for tests and single-tenant hosts only — prefer --resolve HOST:PORT=ADDR:PORT for one known server")
	cmd.Flags().BoolVar(&f.tenantURLsAllowPrivate, "relay-allow-private", false, "old name of --tenant-urls-allow-private")
	_ = cmd.Flags().MarkDeprecated("relay-allow-private", "use --tenant-urls-allow-private (it also covers approval webhooks)")
	cmd.Flags().StringVar(&f.relayDiscordURL, "relay-discord-url", "", "Discord Gateway URL relays connect to (default wss://gateway.discord.gg; for a self-hosted or test gateway)")
	cmd.Flags().StringVar(&f.listen, "listen", "", "also serve the API on this TCP address (API keys required), e.g. 127.0.0.1:7070; plain HTTP on loopback only, elsewhere give --tls-cert/--tls-key")
	cmd.Flags().StringVar(&f.e2b.Listen, "e2b-listen", "", "serve E2B's API and envd (the E2B SDKs: E2B_API_URL=E2B_SANDBOX_URL=http://ADDR, E2B_API_KEY=e2b_… from `cagebox tenant key`) on this TCP address; plain HTTP on loopback only, elsewhere with --tls-cert (docs/e2b.md)")
	cmd.Flags().StringVar(&f.e2b.Domain, "e2b-domain", "", "the sandbox domain D the E2B front reports (E2B_DOMAIN) and serves as PORT-ID.D: envd, and with --ingress the guest ports of getHost(port) (docs/e2b.md); default none")
	cmd.Flags().StringVar(&f.tlsCert, "tls-cert", "", "serve --listen over HTTPS with this certificate (PEM, with its chain)")
	cmd.Flags().StringVar(&f.tlsKey, "tls-key", "", "private key (PEM) of --tls-cert")
	cmd.Flags().BoolVar(&f.insecureListen, "insecure-listen", false, "allow plain HTTP on a non-loopback --listen address (API keys and secrets cross the network in clear; for trusted networks only)")
	cmd.Flags().StringVar(&f.adminKeyFile, "admin-key-file", "", "file holding the fleet admin key (at least 32 characters): a --listen request bearing it acts as the admin, as over the unix socket (the fleet controller's key; never logged)")
	cmd.Flags().StringArrayVar(&f.mountRoots, "mount-root", nil, "a host directory whose contents tenants may bind-mount into sandboxes (--mount type=bind,src=…); none by default (repeatable; never / or the daemon's home)")
	cmd.Flags().StringArrayVar(&f.hostPublic, "host-public-addr", nil, "a public address (or prefix) of this host that is on none of its interfaces, e.g. a cloud public IP behind 1:1 NAT: no upstream may have it (repeatable; interface addresses are learned)")
	cmd.Flags().StringVar(&f.agent, "agent", os.Getenv("CAGEBOX_AGENT"), "path of the static cagebox-agent binary (default: beside this binary)")
	cmd.Flags().StringVar(&f.minIso, "min-isolation", "", "isolation floor: namespaces, app-kernel or hypervisor")
	cmd.Flags().StringVar(&f.defRuntime, "default-runtime", "auto", "runtime for requests that name none: auto (the strongest available that meets the floor) or a name from `cagebox runtimes`")
	cmd.Flags().StringVar(&f.timeout, "default-timeout", "", "maximum lifetime of sandboxes created without --timeout (default unlimited)")
	cmd.Flags().StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringArrayVar(&f.resolve, "resolve", nil, "send sandboxes' traffic for HOST:PORT to ADDR:PORT (HOST:PORT=ADDR:PORT, repeatable; the only way a name may reach a loopback or private address)")
	cmd.Flags().StringArrayVar(&f.upstreamCAs, "upstream-ca", nil, "extra CA certificate (PEM) trusted when verifying upstream servers (repeatable)")
	cmd.Flags().StringVar(&f.linkPool, "link-pool", os.Getenv("CAGEBOX_LINK_POOL"), "address pool for sandbox links (default 10.201.0.0/16, one /30 each; env CAGEBOX_LINK_POOL)")
	cmd.Flags().StringVar(&f.netCfgTable, "net-table", os.Getenv("CAGEBOX_NET_TABLE"), "nftables table the daemon owns (default cagebox; env CAGEBOX_NET_TABLE)")
	cmd.Flags().StringVar(&f.netCfgPrefix, "net-ifprefix", os.Getenv("CAGEBOX_NET_IFPREFIX"), "prefix of host-side sandbox interfaces, 1-3 characters (default cbx; env CAGEBOX_NET_IFPREFIX)")
	cmd.Flags().Uint16Var(&f.proxyPort, "proxy-port", 0, "port of the transparent proxy on each sandbox's gateway address (default 15001)")
	cmd.Flags().StringVar(&f.exfil, "exfil", "flag", "requests carrying credential-shaped strings (gitleaks rules) that are not a sandbox's placeholders: flag (event), block (403) or off")
	f.lim.register(cmd)
	cmd.Flags().StringVar(&f.masterKey, "master-key-file", "", "vault master key file, created 0600 at first start (default $CAGEBOX_HOME/master.key; CAGEBOX_MASTER_KEY overrides)")
	cmd.Flags().Uint16Var(&f.dnsPort, "dns-port", 0, "port of the synthetic DNS resolver on each gateway address (default 15053)")
	cmd.Flags().StringVar(&f.eventRetention, "event-retention", "7d", "how long audit events are kept, e.g. 7d, 36h; 0 keeps them forever")
	cmd.Flags().Float64Var(&f.eventRate, "event-rate", audit.DefaultRate, "events a second each sandbox may emit (egress and DNS; lifecycle and secret events have a budget of their own); over it events are dropped and counted in events.dropped; 0 = no limit")
	cmd.Flags().StringArrayVar(&f.pools, "pool", nil, "keep warm sandboxes that creates claim: RUNTIME:IMAGE[:MEMORY]=N, comma-separated or repeated, e.g. container:busybox=4,qemu:default:1g=2 (a create matches a pool when its runtime, image and resources equal the pool's; others are made cold; PUT /v1/pools replaces them at runtime)")
	cmd.Flags().StringVar(&f.poolMem, "pool-memory", "", "memory the pools' ready sandboxes may hold together (their memory limits), e.g. 4g (default a quarter of the host's memory)")
	cmd.Flags().IntVar(&f.eventBurst, "event-burst", audit.DefaultBurst, "events a sandbox may emit at once above --event-rate")
}

// eventConfig checks the daemon's event flags.
func eventConfig(retention string, rate float64, burst int) (daemon.EventConfig, error) {
	var c daemon.EventConfig
	keep, err := parseRetention(retention)
	if err != nil {
		return c, err
	}
	c.Retention = keep
	switch {
	case rate < 0 || math.IsNaN(rate) || math.IsInf(rate, 0):
		return c, fmt.Errorf("--event-rate: %v is not a number of events a second (0 turns the limit off)", rate)
	case rate == 0:
		c.Rate = -1
	default:
		c.Rate = rate
	}
	if burst < 1 {
		return c, fmt.Errorf("--event-burst: %d: want at least 1", burst)
	}
	c.Burst = burst
	return c, nil
}

// parseRetention parses a duration such as 36h, or whole days such as 7d
// (time.ParseDuration has no days); 0 means forever.
func parseRetention(s string) (time.Duration, error) {
	bad := fmt.Errorf("--event-retention: %q is not a duration such as 7d or 36h (0 keeps events forever)", s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 || n > 100*365 {
			return 0, bad
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, bad
	}
	return d, nil
}

// limitFlags are the daemon's bounds on the work one request, or one
// sandbox's requests, make the egress gateway do (zero: the defaults).
type limitFlags struct {
	scanBytes, scanBody, inflight string
	scanTime, bodyIdle, bodyTotal time.Duration
	upstreamConns                 int
}

func (l *limitFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&l.scanBytes, "exfil-scan-bytes", "", "bytes of request text the exfil scan examines per request, decoded forms included (default 1M)")
	f.StringVar(&l.scanBody, "exfil-scan-body", "", "request body bytes read ahead and scanned (default 64K); --exfil block refuses longer bodies")
	f.DurationVar(&l.scanTime, "exfil-scan-time", 0, "time the exfil scan may take per request (default 250ms); past it --exfil block refuses")
	f.StringVar(&l.inflight, "max-inflight-bytes", "", "request body bytes a sandbox's requests may hold in the gateway at once (default 64M); over it: 503")
	f.IntVar(&l.upstreamConns, "max-upstream-conns", 0, "open upstream connections per sandbox (default 128); past it a request waits 2s, then 503")
	f.DurationVar(&l.bodyIdle, "body-idle-timeout", 0, "longest wait for more of a request body (default 30s); past it: 408")
	f.DurationVar(&l.bodyTotal, "body-timeout", 0, "longest time to receive a whole request body (default 10m); past it: 408")
}

func (l *limitFlags) apply(n *daemon.NetworkConfig) error {
	size := func(flag, v string) (int64, error) {
		if v == "" {
			return 0, nil
		}
		s, err := parseSize(v)
		if err != nil {
			return 0, fmt.Errorf("--%s: %w", flag, err)
		}
		return s, nil
	}
	var err error
	if n.ExfilScan.Bytes, err = size("exfil-scan-bytes", l.scanBytes); err != nil {
		return err
	}
	if n.ExfilScan.Body, err = size("exfil-scan-body", l.scanBody); err != nil {
		return err
	}
	if n.Limits.InFlightBytes, err = size("max-inflight-bytes", l.inflight); err != nil {
		return err
	}
	for flag, d := range map[string]time.Duration{"exfil-scan-time": l.scanTime, "body-idle-timeout": l.bodyIdle, "body-timeout": l.bodyTotal} {
		if d < 0 {
			return fmt.Errorf("--%s: %s is negative", flag, d)
		}
	}
	if l.upstreamConns < 0 {
		return fmt.Errorf("--max-upstream-conns: %d is negative", l.upstreamConns)
	}
	n.ExfilScan.Time = l.scanTime
	n.Limits.BodyIdleTimeout, n.Limits.BodyTimeout, n.Limits.UpstreamConns = l.bodyIdle, l.bodyTotal, l.upstreamConns
	return nil
}

func defaultAgentPath() string {
	self, err := os.Executable()
	if err != nil {
		return "cagebox-agent"
	}
	return filepath.Join(filepath.Dir(self), "cagebox-agent")
}

// ingressFlags are the daemon's --ingress* flags.
type ingressFlags struct {
	cfg        daemon.IngressConfig
	maxBodyStr string
}

func (f *ingressFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.cfg.Addr, "ingress", "", "serve sandboxes' published ports (cagebox port add) over HTTPS on this address, e.g. 0.0.0.0:443; needs --ingress-domain")
	cmd.Flags().StringVar(&f.cfg.Domain, "ingress-domain", "", "ingress domain D: port P of sandbox ID is https://P-ID.D/ (point *.D at this host), or https://D/s/ID/P/")
	cmd.Flags().StringVar(&f.cfg.Cert, "ingress-cert", "", "certificate (PEM, with its chain) for D and *.D; default: one signed by the daemon's own CA, $CAGEBOX_HOME/ingress/ca.pem (trust it with curl --cacert)")
	cmd.Flags().StringVar(&f.cfg.Key, "ingress-key", "", "private key (PEM) of --ingress-cert")
	cmd.Flags().StringVar(&f.maxBodyStr, "ingress-max-body", "100M", "largest request body through ingress (413 beyond), e.g. 100M")
	cmd.Flags().Float64Var(&f.cfg.Rate, "ingress-rate", 100, "requests a second each published port takes (burst 2×; a sandbox's ports together 4×); over it 429; negative = no limit")
	cmd.Flags().IntVar(&f.cfg.PublicPort, "ingress-public-port", 0, "port in the URLs the daemon hands out (default: the --ingress port; set it behind a port-forward)")
	cmd.Flags().StringVar(&f.cfg.PlainAddr, "ingress-plain", "", "also serve ingress over plain HTTP on this loopback address, for a TLS-terminating proxy on this host (it must keep the Host header), e.g. 127.0.0.1:8080")
}
