package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/audit"
	"github.com/cagebox/cagebox/internal/cleanup"
	"github.com/cagebox/cagebox/internal/console"
	"github.com/cagebox/cagebox/internal/gateway"
	"github.com/cagebox/cagebox/internal/hooks"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/ingress"
	"github.com/cagebox/cagebox/internal/kvm"
	"github.com/cagebox/cagebox/internal/link"
	"github.com/cagebox/cagebox/internal/livepolicy"
	"github.com/cagebox/cagebox/internal/metrics"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/statedir"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/qemu"
)

// Run serves until ctx ends. Sandboxes keep running after it returns; the
// next daemon re-attaches to them.
//
// It is an ordered list of constructors, each of which keeps what it made
// in d and adds its undo to d.undo; whatever happens, the undo steps run
// in reverse when Run returns (the event path, made early, closes last).
func Run(ctx context.Context, cfg Config) error {
	d := &wiring{cfg: cfg, log: cfg.Logger}
	if d.log == nil {
		d.log = slog.Default()
	}
	defer d.undo.Run()
	for _, step := range []func(context.Context) error{
		d.listeners, // admin key, TCP and E2B listeners: a refused setting leaves nothing behind
		d.host,      // the home's state directories, the host's network names, the socket, the agent
		d.store,     // SQLite, the runtimes and their probes
		d.events,    // metrics and the event path
		d.policy,    // the live policy (freezes restored before anything attaches)
		d.gateway,   // the egress gateway and the vault
		d.manager,   // the sandbox manager: sandboxes recovered, pools started
		d.inbound,   // webhooks, ingress, relays, the E2B front
		d.api,       // the API on the unix socket and TCP
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return d.serve(ctx)
}

// wiring is what Run's constructors make, in the order they make it.
// Closures handed to a piece made early read a later piece (the live
// policy's freeze and trigger actions reach the gateway, the vault and the
// manager) through these fields, which are set before any traffic flows.
type wiring struct {
	cfg  Config
	log  *slog.Logger
	undo cleanup.Stack

	adminKey   []byte
	tcp, e2b   *apiListener
	sock       string
	st         *sqlite.Store
	images     *image.Cache
	met        *metrics.Metrics
	eventLog   *audit.Log
	hookKey    []byte
	tenantHTTP *http.Client
	live       *livepolicy.Registry
	gw         *gateway.Gateway
	v          *vault.Vault
	mgr        *sandbox.Manager
	hooks      *hooks.Service
	ingress    *ingress.Server
	srv        *Server
	errc       chan error
	servers    []*http.Server
}

// listeners checks the admin key and takes the TCP and E2B listeners
// first, so that a refused setting leaves nothing behind.
func (d *wiring) listeners(ctx context.Context) error {
	cfg := d.cfg
	if cfg.AdminKeyFile != "" {
		if cfg.Listen == "" {
			return errors.New("--admin-key-file is the admin's key over TCP: give --listen ADDR too")
		}
		k, err := LoadAdminKey(cfg.AdminKeyFile)
		if err != nil {
			return err
		}
		d.adminKey = k
	}
	tl, err := openAPIListener(ctx, cfg, d.log)
	if err != nil {
		return err
	}
	if tl != nil {
		d.tcp = tl
		d.undo.Add(func() { tl.Close() })
	}
	if cfg.E2B.Listen != "" {
		lcfg := cfg
		lcfg.Listen = cfg.E2B.Listen
		el, err := openListener(ctx, lcfg, "--e2b-listen", d.log)
		if err != nil {
			return err
		}
		d.e2b = el
		d.undo.Add(func() { el.Close() })
	}
	return nil
}

// host makes the home and its state directories 0700 (image trees hold
// root-owned and setuid files no local user may reach; an older release,
// an `image build` before the first start, or an operator's mkdir may have
// left them wider), takes the host-wide network names (one daemon per
// nftables table and interface prefix), refuses another daemon of this
// home, and checks the agent binary — before anything is touched.
func (d *wiring) host(context.Context) error {
	cfg := d.cfg
	repaired, err := statedir.RepairHome(cfg.Home)
	for _, r := range repaired {
		d.log.Warn("state directory was open to other users: narrowed", "dir", r.Dir, "was", r.Was.Perm().String(), "now", statedir.Mode.String())
	}
	if err != nil {
		return fmt.Errorf("home %s: %w", cfg.Home, err)
	}
	hostLock, err := link.LockHost("", link.Config{TableName: cfg.Network.TableName, IfPrefix: cfg.Network.IfPrefix}, cfg.Home)
	if err != nil {
		return err
	}
	d.undo.Add(hostLock.Release)
	d.sock = client.SocketPath(cfg.Home)
	if err := removeStaleSocket(d.sock); err != nil {
		return err
	}
	if _, err := os.Stat(cfg.AgentPath); err != nil {
		return fmt.Errorf("cagebox-agent binary: %w (build it with `make build`, or pass --agent)", err)
	}
	return checkAgentBinary(cfg.AgentPath)
}

// store opens the store, registers the runtimes, removes what dead
// probes and stale microVM templates left, and probes what this host
// offers in the background (KVM boots, runsc's kvm platform), so the
// first create and `cagebox runtimes` find the verdicts made; each probe
// is bounded and runs once per daemon start.
func (d *wiring) store(ctx context.Context) error {
	cfg, log := d.cfg, d.log
	st, err := sqlite.Open(filepath.Join(cfg.Home, "cagebox.db"))
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	d.st = st
	d.undo.Add(func() { st.Close() })
	RegisterRuntimes(cfg.Home)
	d.undo.Add(func() {
		for _, rt := range isolation.All() {
			if c, ok := rt.(isolation.Closer); ok {
				c.Close()
			}
		}
	})
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
	if def := cfg.DefaultRuntime; def != "" && def != "auto" {
		if _, ok := isolation.Lookup(def); !ok {
			return fmt.Errorf("--default-runtime: unknown runtime %q: `cagebox runtimes` lists them", def)
		}
	}
	probed := make(chan struct{})
	d.undo.Add(func() {
		// A probe cut short by the daemon's exit would leave runsc's
		// processes behind: wait for it (each is bounded).
		select {
		case <-probed:
		case <-time.After(2 * kvm.DefaultTimeout):
		}
	})
	go func() {
		defer close(probed)
		for _, rt := range isolation.All() {
			if ctx.Err() != nil {
				return
			}
			attrs := []any{"runtime", rt.Name(), "class", rt.Class().String()}
			if ds, ok := rt.(isolation.Describer); ok {
				attrs = append(attrs, "detail", ds.Detail())
			}
			if err := rt.Available(); err != nil {
				log.Info("runtime unavailable", append(attrs, "reason", err.Error())...)
				continue
			}
			log.Info("runtime available", attrs...)
		}
	}()
	d.images = &image.Cache{Dir: filepath.Join(cfg.Home, "images")}
	return nil
}

// events makes the one event path of the gateway (proxy, resolver), the
// manager and the API, and the metrics, which count what happens from one
// tap on it; their gauges read the store and the manager when scraped.
// Closed last (its undo is among the first added): events of sandboxes'
// last requests, emitted while the gateway closes, are stored too.
func (d *wiring) events(context.Context) error {
	st := d.st
	d.met = metrics.New(metrics.Sources{
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
		EventsDropped: func() int64 { return d.eventLog.Stats().Dropped },
		Pools: func() map[string]int {
			if d.mgr == nil {
				return nil
			}
			out := map[string]int{}
			for _, p := range d.mgr.Pools().Status().Pools {
				out[p.Class] = p.Ready
			}
			return out
		},
	})
	d.eventLog = audit.New(audit.Config{Store: st, Logger: d.log, Rate: d.cfg.Events.Rate, Burst: d.cfg.Events.Burst, Tap: d.met.Observe})
	d.undo.Add(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.eventLog.Close(ctx); err != nil {
			d.log.Error("store queued events", "err", err)
		}
	})
	var err error
	if d.hookKey, err = webhookKey(d.cfg.Home); err != nil {
		return err
	}
	d.tenantHTTP, err = tenantClient(d.cfg)
	return err
}

// policy starts the live policy; its freeze closes the gateway's
// connections and its trigger actions reach the vault and the manager,
// made next (through d, before any sandbox attaches).
func (d *wiring) policy(ctx context.Context) error {
	d.live = livepolicy.New(livepolicy.Config{
		Store: budgetCounter{Store: d.st, m: d.met}, Emit: d.eventLog.Emit, Logger: d.log, WebhookKey: d.hookKey, WebhookClient: d.tenantHTTP,
		CloseConns: func(id string) int { return d.gw.CloseConns(id) },
		Act: func(ctx context.Context, id, trigger string, a policy.TriggerAction) error {
			return triggerAct(ctx, d.st, d.v, d.mgr, id, trigger, a)
		},
	})
	return d.live.Start(ctx)
}

// gateway makes the egress gateway and opens the vault.
func (d *wiring) gateway(context.Context) error {
	var err error
	if d.gw, err = newGateway(d.cfg, d.live, d.eventLog.Emit, d.log); err != nil {
		return err
	}
	v, closeVault, err := openVault(d.cfg)
	if err != nil {
		return err
	}
	d.v = v
	d.undo.Add(closeVault)
	return nil
}

// manager makes the sandbox manager, gives the gateway the links to keep
// and clear, re-attaches the sandboxes that still run and starts the
// pools.
func (d *wiring) manager(ctx context.Context) error {
	cfg := d.cfg
	roots, err := mounts.NewRoots(cfg.MountRoots, cfg.Home)
	if err != nil {
		return err
	}
	d.mgr = sandbox.New(sandbox.Config{
		MountRoots: roots, VolumeDir: filepath.Join(cfg.Home, "volumes"), SnapshotDir: filepath.Join(cfg.Home, "snapshots"),
		Gateway: d.gw, Vault: d.v,
		Store: d.st, Images: d.images, StateDir: filepath.Join(cfg.Home, "sandboxes"),
		AgentPath: cfg.AgentPath, Logger: d.log, MinIsolation: cfg.MinIsolation,
		DefaultTimeout: cfg.DefaultTimeout, DefaultRuntime: cfg.DefaultRuntime,
		Events: d.eventLog, Pools: cfg.Pools, PoolMemory: poolMemory(cfg.PoolMemory), OnCreate: d.met.ObserveCreate,
	})
	if err := statedir.Make(filepath.Join(cfg.Home, "sandboxes")); err != nil {
		return err
	}
	keep, ours, err := keepSandbox(ctx, d.st)
	if err != nil {
		return err
	}
	// Pooled sandboxes an older daemon recorded as files are ours, and
	// none is kept.
	ours = append(ours, sandbox.LegacyPoolIDs(filepath.Join(cfg.Home, "sandboxes"))...)
	if err := d.gw.Init(ctx, keep, ours); err != nil {
		return err
	}
	d.undo.Add(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.gw.Close(cctx); err != nil {
			d.log.Error("close gateway", "err", err)
		}
	})
	if err := d.mgr.Recover(ctx); err != nil {
		return fmt.Errorf("recover sandboxes: %w", err)
	}
	d.undo.Add(d.mgr.Close)
	d.mgr.Ports().SyncPorts(ctx)
	if err := d.mgr.ImageRefs().Prune(ctx); err != nil {
		d.log.Warn("prune image references", "err", err)
	}
	if err := d.mgr.Pools().Start(); err != nil {
		return fmt.Errorf("--pool: %w", err)
	}
	return nil
}

// inbound starts what reaches sandboxes from outside: webhook deliveries,
// the ingress listener, the API server's relays, and the E2B front.
func (d *wiring) inbound(context.Context) error {
	cfg := d.cfg
	d.hooks = newHooks(cfg, d.st, d.v, d.mgr, d.eventLog.Emit, &d.ingress)
	ing, stopIngress, err := startIngress(cfg, d.mgr, d.gw, d.eventLog.Emit, d.hooks, d.log)
	if err != nil {
		return err
	}
	d.ingress = ing
	d.undo.Add(stopIngress)
	srv := NewServer(d.st, d.mgr, d.images, d.v, d.log)
	srv.SetAdminKey(d.adminKey)
	if cfg.Ingress.Addr != "" {
		srv.ingressDomain = strings.TrimSuffix(strings.ToLower(cfg.Ingress.Domain), ".")
	}
	srv.metrics = d.met.Handler()
	srv.hooks = d.hooks
	srv.webhookKey = d.hookKey
	srv.relays = newRelays(d.st, d.hooks, d.v, d.eventLog.Emit, d.log, cfg.RelayDiscordURL, d.tenantHTTP, d.mgr.Secrets().Hosts)
	d.srv = srv
	if d.e2b != nil {
		stopE2B, err := startE2B(cfg, d.e2b, srv, d.mgr, d.ingress, d.log)
		if err != nil {
			return err
		}
		d.undo.Add(stopE2B)
	}
	return nil
}

// api serves the API on the unix socket (created 0600 from the start:
// umask, not a chmod after) and, with --listen, on TCP.
func (d *wiring) api(context.Context) error {
	old := umask(0o177)
	ul, err := net.Listen("unix", d.sock)
	umask(old)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", d.sock, err)
	}
	d.undo.Add(func() { os.Remove(d.sock) })
	d.errc = make(chan error, 2)
	unixSrv := &http.Server{Handler: d.srv, ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context { return ViaUnix(ctx) }}
	d.servers = append(d.servers, unixSrv)
	go func() { d.errc <- unixSrv.Serve(ul) }()
	if tl := d.tcp; tl != nil {
		tcpSrv := &http.Server{Handler: notUnderIngress(d.cfg.Ingress, console.SecureHeaders(d.srv)), ReadHeaderTimeout: 10 * time.Second, TLSConfig: tl.tls}
		d.servers = append(d.servers, tcpSrv)
		go func() {
			if tl.tls != nil {
				d.errc <- tcpSrv.ServeTLS(tl.Listener, "", "")
				return
			}
			d.errc <- tcpSrv.Serve(tl.Listener)
		}()
		d.log.Info("api on tcp (API keys required)", "addr", tl.Addr().String(), "https", tl.tls != nil)
	}
	return nil
}

// serve runs the background services (reaper, webhook deliveries, relays,
// event retention) until ctx ends or a server fails, then shuts the API
// down; the undo steps stop the rest.
func (d *wiring) serve(ctx context.Context) error {
	rctx, cancel := context.WithCancel(ctx)
	d.undo.Add(cancel)
	go d.mgr.RunReaper(rctx, time.Second)
	if d.hooks != nil {
		hooksDone := make(chan struct{})
		go func() { d.hooks.Run(rctx); close(hooksDone) }()
		d.undo.Add(func() { cancel(); <-hooksDone })
	}
	if rs := d.srv.relays; rs != nil {
		d.eventLog.Watch(rs.lifecycle, relayLifecycle...)
		relaysDone := make(chan struct{})
		go func() { rs.run(rctx); close(relaysDone) }()
		d.undo.Add(func() { cancel(); <-relaysDone })
	}
	go audit.Retain(rctx, audit.RetainConfig{Store: d.st, Keep: d.cfg.Events.Retention, Logger: d.log})
	d.log.Info("cagebox daemon ready", "socket", d.sock, "home", d.cfg.Home, "sandboxes", d.mgr.Count())
	if d.cfg.Ready != nil {
		d.cfg.Ready()
	}
	select {
	case <-ctx.Done():
	case err := <-d.errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = d.servers[0].Shutdown(sctx)
	d.srv.closeConsole()
	for _, s := range d.servers[1:] {
		_ = s.Shutdown(sctx)
	}
	d.log.Info("cagebox daemon stopped; sandboxes keep running")
	return nil
}
