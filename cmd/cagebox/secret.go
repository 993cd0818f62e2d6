package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// secretValue reads a value from exactly one source; never from argv (it
// would sit in shell history and /proc/*/cmdline).
func secretValue(fromEnv, fromFile string) (string, error) {
	switch {
	case fromEnv != "" && fromFile != "":
		return "", errors.New("give the value with --from-env or --from-file, not both")
	case fromEnv != "":
		v, ok := os.LookupEnv(fromEnv)
		if !ok || v == "" {
			return "", fmt.Errorf("--from-env: environment variable %s is not set", fromEnv)
		}
		return v, nil
	case fromFile != "":
		b, err := os.ReadFile(fromFile)
		if err != nil {
			return "", fmt.Errorf("--from-file: %w", err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	if fi, err := os.Stdin.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		return "", errors.New("no value: pipe it on stdin, or use --from-env VAR or --from-file FILE")
	}
	b, err := io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	if err != nil {
		return "", fmt.Errorf("read stdin: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// envNote says when a secret may be put inside guests.
func envNote(allowEnv bool) string {
	if allowEnv {
		return "; mode env allowed: sandboxes may hold the real value"
	}
	return ""
}

func secretCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "secret", Short: "Manage credentials in the vault (values never leave the host)"}
	var fromEnv, fromFile, inject string
	var hosts []string
	var allowEnv bool
	add := &cobra.Command{
		Use:   "add NAME --host HOST[,HOST] [--allow-env] [--from-env VAR | --from-file F | < stdin]",
		Short: "Store a secret (replaces one of the same name)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(hosts) == 0 {
				return errors.New("--host: name the hosts this secret may be sent to")
			}
			v, err := secretValue(fromEnv, fromFile)
			if err != nil {
				return err
			}
			s, err := g.client().PutSecret(cmd.Context(), &api.PutSecretRequest{Name: args[0], Value: v, Hosts: hosts, Inject: inject, AllowEnv: allowEnv})
			if err != nil {
				return err
			}
			fmt.Printf("%s stored (version %d, …%s) for %s%s\n", s.Name, s.Version, s.Preview, strings.Join(s.Hosts, ", "), envNote(s.AllowEnv))
			return nil
		},
	}
	add.Flags().StringSliceVar(&hosts, "host", nil, "hosts the secret may be sent to (exact or *.wildcard; repeatable or comma-separated)")
	add.Flags().StringVar(&fromEnv, "from-env", "", "read the value from this environment variable")
	add.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file")
	add.Flags().StringVar(&inject, "inject", "", `header the gateway sets on requests to the hosts, e.g. "Authorization: Bearer {value}"`)
	add.Flags().BoolVar(&allowEnv, "allow-env", false, "let sandboxes bind it with mode env, which puts the REAL value inside the guest (default: refused)")

	var rotEnv, rotFile string
	var rotAllowEnv bool
	rotate := &cobra.Command{
		Use:   "rotate NAME [--allow-env[=false]] [--from-env VAR | --from-file F | < stdin]",
		Short: "Replace a secret's value (running sandboxes use it from the next request)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := secretValue(rotEnv, rotFile)
			if err != nil {
				return err
			}
			req := &api.RotateSecretRequest{Value: v}
			if cmd.Flags().Changed("allow-env") {
				req.AllowEnv = &rotAllowEnv
			}
			s, err := g.client().RotateSecretWith(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Printf("%s rotated (version %d, …%s)%s\n", s.Name, s.Version, s.Preview, envNote(s.AllowEnv))
			return nil
		},
	}
	rotate.Flags().StringVar(&rotEnv, "from-env", "", "read the value from this environment variable")
	rotate.Flags().StringVar(&rotFile, "from-file", "", "read the value from this file")
	rotate.Flags().BoolVar(&rotAllowEnv, "allow-env", false, "set whether mode env may put the new value inside guests (default: unchanged)")

	ls := listCmd("ls", "List secrets (the last 4 characters only)", cobra.NoArgs,
		func(ctx context.Context, _ []string) ([]api.Secret, error) { return g.client().Secrets(ctx) },
		[]string{"NAME", "PREVIEW", "HOSTS", "ENV", "VERSION", "UPDATED", "STATUS"}, func(s api.Secret) []string {
			status := "active"
			if s.RevokedAt != nil {
				status = "revoked " + s.RevokedAt.Local().Format(time.DateTime)
			}
			env := "no"
			if s.AllowEnv {
				env = "allowed"
			}
			return []string{s.Name, "…" + s.Preview, strings.Join(s.Hosts, ","), env, strconv.FormatInt(s.Version, 10), s.UpdatedAt.Local().Format(time.DateTime), status}
		})
	rm := simpleCmd(g, "rm", "Delete secrets", func(ctx context.Context, c *client.Client, name string) error { return c.DeleteSecret(ctx, name) })
	revoke := simpleCmd(g, "revoke", "Revoke secrets: unusable from the next request on", func(ctx context.Context, c *client.Client, name string) error {
		_, err := c.RevokeSecret(ctx, name)
		return err
	})
	rm.Use, revoke.Use = "rm NAME [NAME...]", "revoke NAME [NAME...]"
	unbind := &cobra.Command{
		Use:   "unbind SANDBOX NAME",
		Short: "Remove a secret binding from a running sandbox (its placeholder is refused from the next request)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := g.client().Unbind(cmd.Context(), args[0], args[1]); err != nil {
				return err
			}
			fmt.Printf("%s unbound from %s\n", args[1], args[0])
			return nil
		},
	}
	var keyFile string
	rotateKey := &cobra.Command{
		Use:   docRotateKey.use,
		Short: docRotateKey.short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hctx, cancel := context.WithTimeout(cmd.Context(), time.Second)
			_, err := g.client().Health(hctx)
			cancel()
			if err == nil {
				return errors.New("a daemon is running on this home: stop it first (its vault holds the old key)")
			}
			id, n, err := rotateMasterKey(cmd.Context(), g.home, keyFile)
			if err != nil {
				return err
			}
			fmt.Printf("re-sealed %d secrets under master key %s\n", n, id)
			return nil
		},
	}
	rotateKey.Flags().StringVar(&keyFile, "master-key-file", "", "the daemon's master key file (default $CAGEBOX_HOME/master.key)")
	cmd.AddCommand(add, ls, rotate, rm, revoke, unbind, rotateKey)
	return cmd
}
