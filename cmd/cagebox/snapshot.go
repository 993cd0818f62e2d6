package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
)

func snapshotCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Saved sandboxes to start new ones from: cagebox create --from-snapshot NAME",
	}
	var name string
	create := &cobra.Command{
		Use:   "create ID",
		Short: "Save a running sandbox (a microVM: memory and disks; a container or gVisor sandbox: its writable layer, taken frozen)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sn, err := g.client().CreateSnapshot(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			fmt.Println(sn.Name)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "the snapshot's name: 1-63 of [a-z0-9-] (default: the daemon picks one)")
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List your snapshots",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := g.client().Snapshots(cmd.Context())
			if err != nil {
				return err
			}
			if len(l) == 0 && !asJSON {
				fmt.Println("no snapshots (cagebox snapshot create ID makes one)")
				return nil
			}
			return printList(asJSON, l, []string{"NAME", "OF", "RUNTIME", "KIND", "SIZE", "IN USE", "CREATED"}, func(s api.Snapshot) []string {
				kind := s.Kind
				if s.Fork {
					kind += " (fork)"
				}
				return []string{s.Name, s.Sandbox, s.Runtime, kind, fmt.Sprintf("%.1f MiB", float64(s.SizeBytes)/(1<<20)), fmt.Sprint(s.InUse), s.CreatedAt.Local().Format(time.DateTime)}
			})
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := callCmd("rm NAME", "Remove a snapshot (refused while a sandbox started from it exists)", cobra.ExactArgs(1),
		func(ctx context.Context, args []string) error { return g.client().RemoveSnapshot(ctx, args[0]) })
	cmd.AddCommand(create, ls, rm)
	return cmd
}

func forkCmd(g *globals) *cobra.Command {
	var req api.ForkRequest
	var labels []string
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Copy a running sandbox into new sandboxes of the same tenant (fresh placeholders, the parent's live policy); prints their ids",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := parseLabels("--label", labels)
			if err != nil {
				return err
			}
			req.Labels = l
			res, err := g.client().Fork(cmd.Context(), args[0], &req)
			if err != nil {
				return err
			}
			for _, sb := range res.Sandboxes {
				fmt.Println(sb.ID)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&req.Count, "count", 1, "how many copies (1-16)")
	cmd.Flags().StringVar(&req.Timeout, "timeout", "", "each copy's maximum lifetime, e.g. 30m (default: the daemon's)")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "tag every copy KEY=VALUE (repeatable)")
	return cmd
}
