package main

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
)

// webhookCmd is `cagebox webhook add|ls|rm`: stable URLs whose deliveries
// the daemon verifies with a vault secret and delivers to a guest port.
func webhookCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Webhooks verified at the edge: https://hooks.DOMAIN/w/TOKEN → a guest port, queued while it sleeps",
	}
	var req api.WebhookRequest
	add := &cobra.Command{
		Use:   "add ID NAME --port P --verify github|stripe|slack|hmac:SPEC --secret VAULT_KEY [--path /hook]",
		Short: "Add a webhook; prints its URL (once: only a hash of its token is kept)",
		Long: `Add a webhook to a sandbox. Deliveries to its URL are verified with the
shared secret held in the vault under VAULT_KEY (cagebox secret add), by the
sender's scheme: github (X-Hub-Signature-256), stripe (Stripe-Signature, 5 min
tolerance), slack (X-Slack-Signature + timestamp) or
hmac:header=NAME[,alg=sha256][,encoding=hex|base64][,prefix=P][,timestamp-header=NAME][,tolerance=5m][,id-header=NAME].
Forgeries, stale timestamps and replays get 401; a verified delivery gets 202 at
once and is delivered to the guest's PORT and PATH (waking it if it sleeps), in
order, at least once, with retries. The guest never needs the secret.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := req
			r.Name = args[1]
			w, err := g.client().AddWebhook(cmd.Context(), args[0], &r)
			if err != nil {
				return err
			}
			fmt.Println(w.URL)
			fmt.Fprintf(os.Stderr, "webhook %s of %s → guest port %d%s, verified by %s with secret %s (the URL is shown this once)\n", w.Name, w.SandboxID, w.Port, w.Path, w.Verify, w.Secret)
			return nil
		},
	}
	add.Flags().IntVar(&req.Port, "port", 0, "the guest's port deliveries go to")
	add.Flags().StringVar(&req.Path, "path", "/", "the guest's path deliveries go to")
	add.Flags().StringVar(&req.Verify, "verify", "", "how the sender signs: github, stripe, slack or hmac:SPEC")
	add.Flags().StringVar(&req.Secret, "secret", "", "the vault secret holding the shared signing secret")
	ls := listCmd("ls ID", "List a sandbox's webhooks", cobra.ExactArgs(1),
		func(ctx context.Context, args []string) ([]api.Webhook, error) {
			return g.client().Webhooks(ctx, args[0])
		},
		[]string{"NAME", "PORT", "PATH", "VERIFY", "SECRET", "PENDING"}, func(w api.Webhook) []string {
			return []string{w.Name, strconv.Itoa(w.Port), w.Path, w.Verify, w.Secret, strconv.Itoa(w.Pending)}
		})
	rm := callCmd("rm ID NAME", "Remove a webhook and its queued deliveries", cobra.ExactArgs(2),
		func(ctx context.Context, args []string) error { return g.client().RemoveWebhook(ctx, args[0], args[1]) })
	cmd.AddCommand(add, ls, rm)
	return cmd
}
