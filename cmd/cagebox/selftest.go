package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/internal/selftest"
)

// selftestCmd runs the escape and exfiltration battery (internal/selftest)
// through the daemon, one sandbox per runtime.
func selftestCmd(g *globals) *cobra.Command {
	var (
		runtimes []string
		img      string
		upstream string
		asJSON   bool
		verbose  bool
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "selftest",
		Short: "Run the escape and exfiltration battery in one sandbox per runtime; exits 1 if any case fails",
		Long: `Creates one sandbox per runtime through the daemon (like any client), runs every case of
the battery in it (privileged-style escapes, device nodes, the agent, namespaces, kernel
interfaces, capabilities, host namespaces, exfiltration), removes it, and prints a table:
case × runtime → pass / FAIL / n/a (with the reason), and a score per runtime
(passed/applicable). Cases that need an allowed upstream run only with --upstream NAME: a
name the daemon can reach (it is allowed in the test sandboxes).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := g.client()
			o := selftest.Options{Runtimes: runtimes, Image: img, Upstream: upstream, CaseTimeout: timeout}
			if verbose {
				o.Progress = os.Stderr
			}
			start := time.Now()
			rep, err := selftest.Run(cmd.Context(), c, selftest.Cases(), o)
			if err != nil {
				return err
			}
			if asJSON {
				if err := rep.JSON(os.Stdout); err != nil {
					return err
				}
			} else {
				rep.Table(os.Stdout)
				fmt.Printf("\n(%s)\n", time.Since(start).Round(time.Second))
			}
			if !rep.OK() {
				return &exitError{code: 1, msg: "selftest: an attack succeeded (FAIL above)"}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&runtimes, "runtime", nil, "runtime to test (repeatable; default: every runtime the daemon lists)")
	cmd.Flags().StringVar(&img, "image", "default", "guest image of the test sandboxes (cases needing python3 or curl are n/a without them)")
	cmd.Flags().StringVar(&upstream, "upstream", "", "a name the daemon can reach, allowed in the test sandboxes, for the cases that need an allowed upstream (fronting, placeholders, non-HTTP on 443)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "print each case's verdict on stderr as it runs")
	cmd.Flags().DurationVar(&timeout, "case-timeout", time.Minute, "time limit of one case")
	return cmd
}
