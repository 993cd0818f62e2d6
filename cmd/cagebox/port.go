package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
)

// parsePublish parses --publish PORT[:public].
func parsePublish(vals []string) ([]api.PortSpec, error) {
	var out []api.PortSpec
	for _, v := range vals {
		p, mode, _ := strings.Cut(v, ":")
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("--publish %q: want PORT or PORT:public, PORT 1-65535", v)
		}
		s := api.PortSpec{Port: n}
		switch mode {
		case "":
		case "public":
			s.Public = true
		default:
			return nil, fmt.Errorf("--publish %q: after the port only :public is allowed", v)
		}
		out = append(out, s)
	}
	return out, nil
}

func parsePortArg(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %q: want a TCP port 1-65535", s)
	}
	return n, nil
}

// printPortAdded shows a newly published port; the token is shown only
// this once.
func printPortAdded(id string, p *api.Port) {
	fmt.Fprintf(os.Stderr, "published port %d of %s", p.Port, id)
	if p.Public {
		fmt.Fprint(os.Stderr, " (public: no token needed)")
	}
	fmt.Fprintln(os.Stderr)
	if p.URL != "" {
		fmt.Fprintf(os.Stderr, "  url:   %s\n  path:  %s\n", p.URL, p.PathURL)
	}
	if !p.Public && p.Token != "" {
		fmt.Fprintf(os.Stderr, "  token: %s   (send as X-Cagebox-Access; shown once)\n", p.Token)
	}
}

func portCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "port",
		Short: "Publish sandbox ports through the daemon's ingress listener (https://PORT-ID.DOMAIN)",
	}
	var public bool
	var ttl string
	var tokenOnly bool
	add := &cobra.Command{
		Use:   "add ID PORT",
		Short: "Publish a port (again: a new access token, revoking the old one and its signed URLs)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := parsePortArg(args[1])
			if err != nil {
				return err
			}
			p, err := g.client().AddPort(cmd.Context(), args[0], api.PortSpec{Port: port, Public: public, TTL: ttl})
			if err != nil {
				return err
			}
			if tokenOnly {
				fmt.Println(p.Token)
				return nil
			}
			printPortAdded(args[0], p)
			return nil
		},
	}
	add.Flags().BoolVar(&public, "public", false, "no access token needed: anyone with the URL reaches the port")
	add.Flags().StringVar(&ttl, "ttl", "", "unpublish after this long, e.g. 1h (default: until removed)")
	add.Flags().BoolVar(&tokenOnly, "print-token", false, "print only the access token on stdout (for scripts)")
	rm := callCmd("rm ID PORT", "Unpublish a port", cobra.ExactArgs(2), func(ctx context.Context, args []string) error {
		port, err := parsePortArg(args[1])
		if err != nil {
			return err
		}
		return g.client().RemovePort(ctx, args[0], port)
	})
	ls := listCmd("ls ID", "List a sandbox's published ports", cobra.ExactArgs(1),
		func(ctx context.Context, args []string) ([]api.Port, error) { return g.client().Ports(ctx, args[0]) },
		[]string{"PORT", "ACCESS", "URL", "EXPIRES"}, func(p api.Port) []string {
			access, exp := "token", "-"
			if p.Public {
				access = "public"
			}
			if p.ExpiresAt != nil {
				exp = time.Until(*p.ExpiresAt).Round(time.Second).String()
			}
			return []string{strconv.Itoa(p.Port), access, p.URL, exp}
		})
	var urlTTL string
	urlc := &cobra.Command{
		Use:   "url ID PORT",
		Short: "Print a signed URL of a port: whoever holds it reaches the port until it expires",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := parsePortArg(args[1])
			if err != nil {
				return err
			}
			u, err := g.client().PortURL(cmd.Context(), args[0], port, urlTTL)
			if err != nil {
				return err
			}
			fmt.Println(u.URL)
			return nil
		},
	}
	urlc.Flags().StringVar(&urlTTL, "ttl", "1h", "how long the URL works, e.g. 10m (publishing the port again revokes it sooner)")
	cmd.AddCommand(add, rm, ls, urlc)
	return cmd
}
