package main

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
)

// relayCmd is `cagebox relay add|ls|rm`: connections the host holds for a
// sandbox (a Discord bot's gateway), delivering what arrives to a guest
// port, queued while it sleeps.
func relayCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Relays: the host holds a connection (a Discord bot's gateway) and delivers its events to a guest port",
	}
	var req api.RelayRequest
	add := &cobra.Command{
		Use:   "add ID discord|websocket --port P [--path /events] [--name NAME] (discord: --token-secret VAULT_KEY [--intents N]; websocket: --url wss://… [--header 'Authorization: Bearer {secret}'] [--secret VAULT_KEY])",
		Short: "Add a relay (needs the daemon's --ingress)",
		Long: `Add a relay to a sandbox. For discord, the daemon opens and keeps the bot's
Discord Gateway WebSocket (heartbeats, identify, resume after a drop, Discord's
rate limits) with the token held in the vault under VAULT_KEY, opened only while
IDENTIFY or RESUME is written; the guest never has it. Every dispatch event
({"t","s","d"} JSON) is POSTed to the guest's PORT and PATH, in order, at least
once, queued (bounded, persisted) while the sandbox sleeps and waking it. The
guest calls Discord's REST API through the egress gateway with a placeholder.

For websocket, the daemon connects to --url (public addresses only) with the
--header lines, {secret} in them standing for the vault secret's value, and
POSTs every message the server sends (text or binary) to the guest the same
way; it reconnects with backoff, and stops if the server answers 401/403.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := req
			r.Kind = args[1]
			if r.Kind != "discord" && !cmd.Flags().Changed("intents") {
				r.Intents = 0
			}
			rl, err := g.client().AddRelay(cmd.Context(), args[0], &r)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "relay %s (%s) of %s → guest port %d%s, token from secret %s\n", rl.Name, rl.Kind, rl.SandboxID, rl.Port, rl.Path, rl.TokenSecret)
			return nil
		},
	}
	add.Flags().StringVar(&req.Name, "name", "", "the relay's name (default: the kind)")
	add.Flags().IntVar(&req.Port, "port", 0, "the guest's port events go to")
	add.Flags().StringVar(&req.Path, "path", "/", "the guest's path events go to")
	add.Flags().StringVar(&req.TokenSecret, "token-secret", "", "discord: the vault secret holding the bot token")
	add.Flags().IntVar(&req.Intents, "intents", 513, "discord: gateway intents (513 = GUILDS | GUILD_MESSAGES)")
	add.Flags().StringVar(&req.TokenSecret, "secret", "", "websocket: the vault secret {secret} in --header stands for (same as --token-secret)")
	add.Flags().StringVar(&req.URL, "url", "", "websocket: the server's URL, wss://HOST/PATH")
	add.Flags().StringArrayVar(&req.Headers, "header", nil, "websocket: a handshake header 'Name: value' ({secret}: the secret's value; repeatable)")
	ls := listCmd("ls ID", "List a sandbox's relays and their connections", cobra.ExactArgs(1),
		func(ctx context.Context, args []string) ([]api.Relay, error) { return g.client().Relays(ctx, args[0]) },
		[]string{"NAME", "KIND", "PORT", "PATH", "STATE", "SEQ", "RECONNECTS", "RECEIVED", "PENDING"}, func(r api.Relay) []string {
			state := "connecting"
			switch {
			case r.State.Failed:
				state = "failed: " + r.State.LastError
			case r.State.Connected:
				state = "connected"
			case r.State.LastError != "":
				state = "reconnecting: " + r.State.LastError
			}
			return []string{r.Name, r.Kind, strconv.Itoa(r.Port), r.Path, state, strconv.FormatInt(r.State.Seq, 10),
				strconv.Itoa(r.State.Reconnects), strconv.FormatInt(r.State.Received, 10), strconv.Itoa(r.Pending)}
		})
	rm := callCmd("rm ID NAME", "Stop a relay and drop its queued events", cobra.ExactArgs(2),
		func(ctx context.Context, args []string) error { return g.client().RemoveRelay(ctx, args[0], args[1]) })
	cmd.AddCommand(add, ls, rm)
	return cmd
}
