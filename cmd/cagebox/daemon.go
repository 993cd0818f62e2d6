package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
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
		Use:   "daemon",
		Short: "Run the cagebox daemon",
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
