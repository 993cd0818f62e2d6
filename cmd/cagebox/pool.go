package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
)

func poolCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pool",
		Short: "Warm pools: started, idle sandboxes that creates claim (set with cagebox daemon --pool)",
	}
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the warm pools: target, ready, claims, misses, fills (admin only)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := g.client().Pools(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(p)
			}
			if len(p.Pools) == 0 {
				fmt.Println("no warm pools: start the daemon with --pool RUNTIME:IMAGE[:MEMORY]=N, e.g. --pool container:busybox=4")
				return nil
			}
			if err := printList(false, p.Pools, []string{"CLASS", "TARGET", "READY", "FILLING", "CLAIMS", "MISSES", "FILLS", "FAILURES", "LAST FILL", "LAST ERROR"}, func(s api.PoolStatus) []string {
				return []string{s.Class, strconv.Itoa(s.Target), strconv.Itoa(s.Ready), strconv.FormatBool(s.Filling),
					fmt.Sprint(s.Claims), fmt.Sprint(s.Misses), fmt.Sprint(s.Fills), fmt.Sprint(s.Failures),
					fmt.Sprintf("%dms", s.LastFillMs), s.LastError}
			}); err != nil {
				return err
			}
			fmt.Printf("memory: %s of the %s budget (the ready sandboxes' limits)\n", mib(p.MemoryUsed), mib(p.MemoryBudget))
			return nil
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(ls)
	return cmd
}

// mib shows a size in MiB (GiB from 10 GiB up), rounded.
func mib(n int64) string {
	if n >= 10<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%d MiB", (n+(1<<19))>>20)
}
