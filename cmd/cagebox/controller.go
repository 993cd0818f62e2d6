//go:build !lite

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/cagebox/cagebox/internal/kube/controller"
	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/isolation"
)

func controllerCmd(g *globals) *cobra.Command {
	var kubeconfig, ns, keyFile, caFile, ingress, domain, health, metrics, logLevel, minIso, routerAddr, routerBase string
	var bestOf int
	var imageMap []string
	var resync time.Duration
	var leaderElect bool
	cmd := &cobra.Command{
		Use:   docController.use,
		Short: docController.short,
		Long: `Run the fleet controller. It reconciles the agent-sandbox API objects
(agents.x-k8s.io Sandbox; extensions.agents.x-k8s.io SandboxTemplate,
SandboxClaim, SandboxWarmPool, v1beta1) onto the cagebox node agents that
announce themselves with Leases in --namespace (cagebox node), talking to
each node's API with the fleet admin key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))
			klog.SetLogger(logr.FromSlogHandler(log.Handler()))
			if keyFile == "" {
				return errors.New("--node-key-file is required: the file holding the fleet admin key the nodes' --admin-key-file holds")
			}
			key, err := controller.ReadKeyFile(keyFile)
			if err != nil {
				return fmt.Errorf("--node-key-file: %w", err)
			}
			if caFile != "" {
				if _, err := os.Stat(caFile); err != nil {
					return fmt.Errorf("--node-ca: %w", err)
				}
			}
			if bestOf < 1 {
				return fmt.Errorf("--best-of %d: want 1 or more", bestOf)
			}
			if resync < 100*time.Millisecond {
				return fmt.Errorf("--resync %v: want at least 100ms (e.g. 5s)", resync)
			}
			if ingress != "" && domain == "" {
				return errors.New("--ingress needs --ingress-domain (the fleet's wildcard domain, PORT-ID.DOMAIN)")
			}
			var floor isolation.Class
			if minIso != "" {
				f, err := isolation.ParseClass(minIso)
				if err != nil {
					return fmt.Errorf("--min-isolation: %w", err)
				}
				floor = f
			}
			images, err := controller.ParseImageMap(imageMap)
			if err != nil {
				return fmt.Errorf("--image-map: %w", err)
			}
			rc, err := kubeConfig(kubeconfig)
			if err != nil {
				return err
			}
			mgr, err := controller.NewManager(rc, controller.ManagerOptions{Namespace: ns, Health: health, Metrics: metrics, LeaderElect: leaderElect})
			if err != nil {
				return fmt.Errorf("controller manager: %w", err)
			}
			ctl := controller.New(controller.Config{
				Namespace: ns, Dial: controller.TCPDialer(key, caFile), BestOf: bestOf,
				IngressDomain: domain, Resync: resync, Log: log, MinIsolation: floor, ImageMap: images,
			})
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			if err := ctl.SetupWithManager(ctx, mgr); err != nil {
				return fmt.Errorf("controller: %w", err)
			}
			errc := make(chan error, 3)
			if routerAddr != "" {
				go func() {
					if err := runtimeRouter(ctx, routerAddr, routerBase, rc, ctl, log.With("component", "sandbox-router")); err != nil && ctx.Err() == nil {
						errc <- fmt.Errorf("sandbox router: %w", err)
					}
				}()
			}
			if ingress != "" {
				go func() {
					if err := fleetRouter(ctx, ingress, domain, ctl.LookupIngress, log.With("component", "router")); err != nil && ctx.Err() == nil {
						errc <- fmt.Errorf("fleet router: %w", err)
					}
				}()
			}
			go func() { errc <- mgr.Start(ctx) }()
			log.Info("controller running", "namespace", ns, "apiserver", rc.Host, "best_of", bestOf, "resync", resync, "ingress", ingress, "ingress_domain", domain, "health", health)
			err = <-errc
			cancel()
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (env KUBECONFIG; default: the in-cluster service account)")
	f.StringVar(&ns, "namespace", fleet.DefaultNamespace, "namespace of the node Leases (and the leader election lease)")
	f.StringVar(&keyFile, "node-key-file", "", "file holding the fleet admin key the node agents accept (required)")
	f.StringVar(&caFile, "node-ca", "", "CA certificate (PEM) that issued the node agents' API certificates (besides the system roots)")
	f.StringVar(&minIso, "min-isolation", "", "the fleet's isolation floor: namespaces, app-kernel or hypervisor (a Namespace's cagebox.dev/isolation-floor annotation raises it for that namespace; templates can only raise it further)")
	f.StringArrayVar(&imageMap, "image-map", nil, "REF=IMAGE (repeatable): a template image REF (matched exactly, without its digest, or by repository) runs as the cagebox image IMAGE; any other full reference (REGISTRY/REPO[:TAG][@sha256:…]) is pulled by the node")
	f.IntVar(&bestOf, "best-of", 2, "how many eligible nodes a placement samples; the one with the most free memory wins (warm pools first for claims)")
	f.StringVar(&ingress, "ingress", "", "serve the fleet ingress router on ADDR (needs --ingress-domain)")
	f.StringVar(&domain, "ingress-domain", "", "the fleet's domain: Sandbox URLs are https://PORT-ID.DOMAIN/ and serviceFQDN ID.DOMAIN")
	f.StringVar(&routerAddr, "router-listen", "", "serve the agent-sandbox clients' sandbox-router and legacy runtime API (plain HTTP, X-Sandbox-ID/X-Sandbox-Namespace headers, Kubernetes bearer tokens) on ADDR, e.g. :8080")
	f.StringVar(&routerBase, "router-base-dir", "/app", "the directory in each sandbox that the runtime API's relative paths and commands start from")
	f.StringVar(&health, "health", "", "serve /healthz and /readyz on ADDR (e.g. :8081)")
	f.StringVar(&metrics, "metrics", "", "serve controller-runtime's /metrics on ADDR (off by default)")
	f.DurationVar(&resync, "resync", 5*time.Second, "how often unplaced Sandboxes, node liveness and stray node sandboxes are checked")
	f.BoolVar(&leaderElect, "leader-elect", false, "elect one active controller among replicas (Lease cagebox-controller in --namespace)")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}

// kubeConfig is the apiserver config of file, or the in-cluster one.
func kubeConfig(file string) (*rest.Config, error) {
	if file != "" {
		c, err := clientcmd.BuildConfigFromFlags("", file)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", file, err)
		}
		return c, nil
	}
	c, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no --kubeconfig and not in a pod (%v): pass --kubeconfig FILE", err)
	}
	return c, nil
}
