package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
)

func volumeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Named volumes: data that outlives sandboxes, mounted with --mount type=volume,src=NAME,dst=/data[,rw]",
	}
	var size string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Make an empty volume (an ext4 filesystem; sparse on the host)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var n int64
			if size != "" {
				var err error
				if n, err = parseSize(size); err != nil {
					return fmt.Errorf("--size: %w", err)
				}
			}
			v, err := g.client().CreateVolume(cmd.Context(), args[0], n)
			if err != nil {
				return err
			}
			fmt.Println(v.Name)
			return nil
		},
	}
	create.Flags().StringVar(&size, "size", "", "filesystem size, e.g. 512M or 4G (default 1G, at most 64G)")
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List your volumes and the sandboxes that mount them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := g.client().Volumes(cmd.Context())
			if err != nil {
				return err
			}
			if len(l) == 0 && !asJSON {
				fmt.Println("no volumes (cagebox volume create NAME makes one)")
				return nil
			}
			return printList(asJSON, l, []string{"NAME", "SIZE", "MOUNTED BY", "CREATED"}, func(v api.Volume) []string {
				var by []string
				for _, a := range v.AttachedTo {
					mode := "ro"
					if a.RW {
						mode = "rw"
					}
					by = append(by, a.Sandbox+" ("+mode+")")
				}
				name := v.Name
				if v.VMOnly {
					name += " (microVMs only)"
				}
				mounted := strings.Join(by, ", ")
				if mounted == "" {
					mounted = "-"
				}
				return []string{name, fmt.Sprintf("%d MiB", v.SizeBytes>>20), mounted, v.CreatedAt.Local().Format(time.DateTime)}
			})
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := callCmd("rm NAME", "Remove a volume and its data (refused while a sandbox mounts it)", cobra.ExactArgs(1),
		func(ctx context.Context, args []string) error { return g.client().RemoveVolume(ctx, args[0]) })
	cmd.AddCommand(create, ls, rm)
	return cmd
}
