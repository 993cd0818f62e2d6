//go:build !lite

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/daemon"
	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/kube/nodeagent"
)

// nodeFlags are `cagebox node`'s own flags (besides every daemon flag).
type nodeFlags struct {
	kubeconfig, nodeName, namespace string
	advertiseURL, advertiseIngress  string
	leaseDuration                   time.Duration
}

// nodeCmd runs the daemon as a fleet node on Kubernetes: the daemon (its
// API on --listen, the fleet admin key from --admin-key-file) and the node
// agent that keeps the node's Lease. Either stopping stops both.
func nodeCmd(g *globals) *cobra.Command {
	var df daemonFlags
	var nf nodeFlags
	cmd := &cobra.Command{
		Use:   docNode.use,
		Short: docNode.short,
		Long: `Run the cagebox daemon as a node of a fleet on Kubernetes (a DaemonSet pod,
privileged, host network). It serves the API on --listen to the fleet's admin
key (--admin-key-file) and keeps a coordination.k8s.io Lease named
cagebox-node-NODE in --namespace, renewed every third of --lease-duration, with
the API endpoint, the ingress address and the node's capacity (runtimes, memory,
sandboxes, warm pools) in its annotations. When it stops, the lease is left to
expire: a node restarted within --lease-duration keeps its sandboxes in place.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if df.listen == "" {
				return errors.New("cagebox node needs --listen ADDR:PORT: the fleet controller reaches the node's API there (with --tls-cert/--tls-key off loopback)")
			}
			if df.adminKeyFile == "" {
				return errors.New("cagebox node needs --admin-key-file FILE: the fleet admin key (at least 32 characters, from a Kubernetes Secret) the controller calls the node with")
			}
			cfg, err := df.config(g)
			if err != nil {
				return err
			}
			if _, err := daemon.LoadAdminKey(df.adminKeyFile); err != nil {
				return err
			}
			acfg, err := nf.agentConfig(&df)
			if err != nil {
				return err
			}
			acfg.Logger = cfg.Logger
			sock := client.Unix(client.SocketPath(cfg.Home))
			acfg.Capacity = func(ctx context.Context) fleet.Capacity {
				c, err := daemon.NodeCapacity(ctx, sock)
				if err != nil {
					cfg.Logger.Warn("node capacity is partial", "err", err)
				}
				return c
			}
			return runNode(cmd.Context(), cfg, acfg)
		},
	}
	df.register(cmd)
	cmd.Flags().StringVar(&nf.kubeconfig, "kubeconfig", "", "kubeconfig file of the cluster (default: the pod's in-cluster service account)")
	cmd.Flags().StringVar(&nf.nodeName, "node-name", "", "this node's name in the fleet (default $NODE_NAME, else the hostname)")
	cmd.Flags().StringVar(&nf.namespace, "namespace", "", "namespace of the node Leases (default $POD_NAMESPACE, else "+fleet.DefaultNamespace+")")
	cmd.Flags().StringVar(&nf.advertiseURL, "advertise-url", "", "the node API's URL the controller calls (default https://ADDR:PORT with the --listen port and the address of the default route's interface, or the --listen address when it names one; http:// without --tls-cert)")
	cmd.Flags().StringVar(&nf.advertiseIngress, "advertise-ingress", "", "the ingress address ADDR:PORT the fleet router forwards to (default from --ingress unless it is loopback-only; none without --ingress)")
	cmd.Flags().DurationVar(&nf.leaseDuration, "lease-duration", 15*time.Second, "how long the node's lease lives without renewal (whole seconds); it is renewed every third of it, and a node silent for longer has its sandboxes placed again")
	return cmd
}

// agentConfig resolves the node flags' defaults into the node agent's
// configuration and builds its Kubernetes client.
func (nf *nodeFlags) agentConfig(df *daemonFlags) (nodeagent.Config, error) {
	var none nodeagent.Config
	node := nf.nodeName
	if node == "" {
		node = os.Getenv("NODE_NAME")
	}
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return none, fmt.Errorf("--node-name: none given, no $NODE_NAME, and the hostname: %w", err)
		}
		node = h
	}
	ns := nf.namespace
	if ns == "" {
		ns = os.Getenv("POD_NAMESPACE")
	}
	if ns == "" {
		ns = fleet.DefaultNamespace
	}
	if nf.leaseDuration < time.Second || nf.leaseDuration%time.Second != 0 {
		return none, fmt.Errorf("--lease-duration %s: want whole seconds, at least 1s (e.g. 15s)", nf.leaseDuration)
	}
	endpoint := nf.advertiseURL
	if endpoint == "" {
		scheme := "https"
		if df.tlsCert == "" {
			scheme = "http"
		}
		hp, err := advertised(df.listen, defaultRouteAddr)
		if err != nil {
			return none, fmt.Errorf("--advertise-url: none given and %w", err)
		}
		endpoint = scheme + "://" + hp
	} else if err := checkAdvertiseURL(endpoint); err != nil {
		return none, err
	}
	ingress := nf.advertiseIngress
	if ingress == "" && df.ing.cfg.Addr != "" {
		host, _, err := net.SplitHostPort(df.ing.cfg.Addr)
		if err == nil && !isLoopbackHost(host) {
			if ingress, err = advertised(df.ing.cfg.Addr, defaultRouteAddr); err != nil {
				return none, fmt.Errorf("--advertise-ingress: none given and %w", err)
			}
		}
	}
	rc, err := restConfig(nf.kubeconfig)
	if err != nil {
		return none, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return none, fmt.Errorf("kubernetes client: %w", err)
	}
	return nodeagent.Config{Client: cs, Namespace: ns, Node: node, Endpoint: endpoint, Ingress: ingress, LeaseDuration: nf.leaseDuration}, nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
		}
		return rc, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no --kubeconfig, and not in a pod (%w): give --kubeconfig FILE", err)
	}
	return rc, nil
}

func checkAdvertiseURL(s string) error {
	scheme, hp, ok := strings.Cut(s, "://")
	if !ok || (scheme != "https" && scheme != "http") {
		return fmt.Errorf("--advertise-url %q: want https://ADDR:PORT", s)
	}
	if _, _, err := net.SplitHostPort(strings.TrimSuffix(hp, "/")); err != nil {
		return fmt.Errorf("--advertise-url %q: want https://ADDR:PORT: %v", s, err)
	}
	return nil
}

func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// advertised is the ADDR:PORT others reach a listener on listen at: its
// own address when it names one, else (all addresses) the address of the
// default route's interface (route).
func advertised(listen string, route func() (netip.Addr, error)) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("%q is not HOST:PORT: %w", listen, err)
	}
	if host != "" {
		if a, err := netip.ParseAddr(host); err != nil || !a.IsUnspecified() {
			return net.JoinHostPort(host, port), nil
		}
	}
	a, err := route()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(a.String(), port), nil
}

// defaultRouteAddr is the first IPv4 address of the interface the IPv4
// default route leaves by (/proc/net/route).
func defaultRouteAddr() (netip.Addr, error) {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return netip.Addr{}, fmt.Errorf("find the default route: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 8 || fs[1] != "00000000" || fs[7] != "00000000" {
			continue
		}
		ifc, err := net.InterfaceByName(fs[0])
		if err != nil {
			return netip.Addr{}, fmt.Errorf("default route interface %s: %w", fs[0], err)
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return netip.Addr{}, fmt.Errorf("default route interface %s: %w", fs[0], err)
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
				return p.Addr(), nil
			}
		}
		return netip.Addr{}, fmt.Errorf("default route interface %s has no IPv4 address: give --advertise-url", fs[0])
	}
	return netip.Addr{}, errors.New("this host has no IPv4 default route: give --advertise-url https://ADDR:PORT")
}

// runNode runs the daemon and, once it answers, the node agent; the first
// to stop stops the other. The lease is announced only for a daemon that
// serves. When parent ends both stop and runNode returns nil.
func runNode(parent context.Context, cfg daemon.Config, acfg nodeagent.Config) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	ready := make(chan struct{})
	cfg.Ready = func() { close(ready) }
	daemonDone := make(chan error, 1)
	go func() { daemonDone <- daemon.Run(ctx, cfg) }()
	select {
	case err := <-daemonDone:
		if err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
		if parent.Err() == nil {
			return errors.New("daemon: it stopped before it was ready")
		}
		return nil
	case <-ready:
	}
	agentDone := make(chan error, 1)
	go func() { agentDone <- nodeagent.Run(ctx, acfg) }()
	select {
	case err := <-daemonDone:
		cancel()
		<-agentDone
		switch {
		case err != nil:
			return fmt.Errorf("daemon: %w (the node agent stopped too; the lease expires)", err)
		case parent.Err() == nil:
			return errors.New("daemon: it stopped; the node agent stopped too (the lease expires)")
		}
		return nil
	case err := <-agentDone:
		cancel()
		derr := <-daemonDone
		switch {
		case err != nil:
			return fmt.Errorf("node agent: %w (the daemon stopped too; its sandboxes keep running)", err)
		case parent.Err() == nil:
			return errors.New("node agent: it stopped; the daemon stopped too (its sandboxes keep running)")
		}
		return derr
	}
}
