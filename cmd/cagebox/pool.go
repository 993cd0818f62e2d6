package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/pool"
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
			if err := printList(false, p.Pools, []string{"CLASS", "TARGET", "READY", "FILLING", "CLAIMS", "MISSES", "FILLS", "FAILURES", "LAST FILL", "LAST ERROR"}, func(s api.PoolStatus) []string {
				return []string{s.Class, strconv.Itoa(s.Target), strconv.Itoa(s.Ready), strconv.FormatBool(s.Filling),
					fmt.Sprint(s.Claims), fmt.Sprint(s.Misses), fmt.Sprint(s.Fills), fmt.Sprint(s.Failures),
					fmt.Sprintf("%dms", s.LastFillMs), s.LastError}
			}); err != nil {
				return err
			}
			fmt.Printf("memory: %s of %s budget\n", pool.FormatSize(p.MemoryUsed), pool.FormatSize(p.MemoryBudget))
			return nil
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(ls)
	return cmd
}
