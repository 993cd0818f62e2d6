package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/spf13/cobra"
)

func consoleCmd(g *globals) *cobra.Command {
	var open bool
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Print a one-time link that logs a browser on this host into the web console as the admin",
		Long: `cagebox console asks the daemon, over its unix socket, to serve the web console on a
loopback port (127.0.0.1, opened on first use) and prints a link with a one-time token:
opening it logs that browser in as the admin (the token works once, within a minute).
--open tries xdg-open. Tenants log in with an API key at /ui/login on the daemon's
--listen address instead.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.tcp != nil {
				return fmt.Errorf("cagebox console talks to the daemon's unix socket on this host: drop --host/CAGEBOX_HOST (tenants log in at https://HOST/ui/ with an API key)")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			s, err := g.client().ConsoleSession(ctx)
			if err != nil {
				return fmt.Errorf("console link: %w", err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.URL)
			fmt.Fprintf(cmd.ErrOrStderr(), "Open it before %s; it works once.\n", s.ExpiresAt.Local().Format(time.TimeOnly))
			if open {
				x := exec.Command("xdg-open", s.URL)
				x.Stdout, x.Stderr = os.Stderr, os.Stderr
				if err := x.Start(); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "could not start xdg-open (%v): open the link yourself\n", err)
				} else {
					go func() { _ = x.Wait() }()
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&open, "open", false, "open the link with xdg-open")
	return cmd
}
