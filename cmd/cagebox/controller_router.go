//go:build !lite

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cagebox/cagebox/internal/kube/controller"
	"github.com/cagebox/cagebox/internal/kube/router"
	"github.com/cagebox/cagebox/internal/kube/runtimeapi"
)

// fleetRouter serves the fleet ingress (`cagebox controller --ingress`)
// until ctx ends: TLS connections for PORT-ID.DOMAIN are spliced,
// unterminated, to the ingress listener of the node that runs sandbox ID.
func fleetRouter(ctx context.Context, addr, domain string, lookup func(id string) (nodeIngress string, ok bool), log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--ingress %s: %w", addr, err)
	}
	r := router.New(router.Config{Domain: domain, Lookup: lookup, Logger: log})
	go func() { <-ctx.Done(); _ = r.Close() }()
	if err := r.Serve(ln); err != nil && !errors.Is(err, router.ErrClosed) {
		return err
	}
	return nil
}

// runtimeRouter serves the agent-sandbox clients' sandbox-router with the
// legacy runtime API (`cagebox controller --router-listen`) until ctx
// ends, answering from the nodes' APIs (internal/kube/runtimeapi).
func runtimeRouter(ctx context.Context, addr, base string, rc *rest.Config, ctl *controller.Controller, log *slog.Logger) error {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--router-listen %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler: runtimeapi.New(runtimeapi.Config{
			Resolve: func(ctx context.Context, ns, name string) (runtimeapi.Node, string, error) {
				n, id, err := ctl.SandboxOnNode(ctx, ns, name)
				if err != nil {
					if errors.Is(err, controller.ErrNotRunning) {
						return nil, "", fmt.Errorf("%w: %v", runtimeapi.ErrNoSandbox, err)
					}
					return nil, "", err
				}
				rn, ok := n.(runtimeapi.Node)
				if !ok {
					return nil, "", fmt.Errorf("node API %T cannot exec", n)
				}
				return rn, id, nil
			},
			Authorize: runtimeapi.KubeAuthorizer(cs),
			BaseDir:   base,
			Log:       log,
		}),
		ReadHeaderTimeout: 30 * time.Second,
	}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	log.Info("sandbox router listening", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
