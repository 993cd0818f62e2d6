//go:build !lite

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/cagebox/cagebox/internal/kube/router"
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
