package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/policy"
)

func policyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Change a running sandbox's egress policy live; named policies; usage and history"}
	var asJSON bool
	get := &cobra.Command{
		Use:   "get ID [--json]",
		Short: "Show the policy in force and its generation",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.client().Policy(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(p)
			}
			return printPolicy(p)
		},
	}
	get.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var ifGen int64
	set := &cobra.Command{
		Use:   "set ID FILE [--if-generation N]",
		Short: "Replace the policy (YAML or JSON; - for stdin); applies to the very next request",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := readPolicyFile(args[1])
			if err != nil {
				return err
			}
			p, err := g.client().SetPolicy(cmd.Context(), args[0], b, ifGen)
			if err != nil {
				return err
			}
			fmt.Printf("%s: policy generation %d\n", args[0], p.Generation)
			return nil
		},
	}
	set.Flags().Int64Var(&ifGen, "if-generation", 0, "refuse if the policy is no longer at this generation (409)")

	var path, method, name, timeout, when string
	var ports []int
	var at int
	addRule := func(action string) *cobra.Command {
		c := &cobra.Command{
			Use:   action + " ID HOST [--path P] [--method M] [--port N] [--name NAME] [--at INDEX]",
			Short: map[string]string{"allow": "Allow a host (put first unless --at says otherwise)", "deny": "Deny a host (put first)", "hold": "Hold requests to a host for approval"}[action],
			Args:  cobra.ExactArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				r := policy.Rule{Name: name, Host: args[1], Action: action, Ports: ports, When: when, Timeout: timeout}
				if path != "" {
					r.Paths = []string{path}
				}
				if method != "" {
					r.Methods = []string{method}
				}
				raw, _ := json.Marshal(r)
				patch := &api.PolicyPatch{Op: "add", Rule: raw}
				if cmd.Flags().Changed("at") {
					patch.Index = &at
				}
				p, err := g.client().PatchPolicy(cmd.Context(), args[0], patch)
				if err != nil {
					return err
				}
				fmt.Printf("%s: policy generation %d\n", args[0], p.Generation)
				return nil
			},
		}
		c.Flags().StringVar(&path, "path", "", "path glob, e.g. /v1/**")
		c.Flags().StringVar(&method, "method", "", "HTTP method, e.g. POST")
		c.Flags().IntSliceVar(&ports, "port", nil, "ports (default 443 and 80)")
		c.Flags().StringVar(&name, "name", "", "rule name (default ACTION:HOST)")
		c.Flags().IntVar(&at, "at", 0, "position in the rules (0 is first)")
		c.Flags().StringVar(&when, "when", "", "CEL condition (policy version 2)")
		if action == "hold" {
			c.Flags().StringVar(&timeout, "timeout", "", "how long a request waits for a decision (default 60s)")
		}
		return c
	}
	rm := &cobra.Command{
		Use:   "rm-rule ID NAME",
		Short: "Remove the rule named NAME",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.client().PatchPolicy(cmd.Context(), args[0], &api.PolicyPatch{Op: "remove", Name: args[1]})
			if err != nil {
				return err
			}
			fmt.Printf("%s: policy generation %d\n", args[0], p.Generation)
			return nil
		},
	}
	history := listCmd("history ID [--json]", "Every generation of the sandbox's policy: who changed it and when", cobra.ExactArgs(1),
		func(ctx context.Context, args []string) ([]api.PolicyVersion, error) {
			return g.client().PolicyHistory(ctx, args[0])
		},
		[]string{"GENERATION", "WHEN", "BY", "RULES", "REASON"}, func(v api.PolicyVersion) []string {
			var d policy.Document
			_ = json.Unmarshal(v.Policy, &d)
			return []string{strconv.FormatInt(v.Generation, 10), v.CreatedAt.Local().Format(time.DateTime), v.Actor, strconv.Itoa(len(d.Rules)), v.Reason}
		})
	usage := listCmd("usage ID [--json]", "What the sandbox has used of each budget", cobra.ExactArgs(1),
		func(ctx context.Context, args []string) ([]api.BudgetUsage, error) {
			return g.client().PolicyUsage(ctx, args[0])
		},
		[]string{"BUDGET", "REQUESTS", "SENT", "RECEIVED", "SPEND", "STATE"}, func(u api.BudgetUsage) []string {
			state := "ok"
			if u.Exhausted {
				state = "spent"
			}
			return []string{u.Name, ofMax(strconv.FormatInt(u.Requests, 10), u.MaxRequests), ofMax(strconv.FormatInt(u.BytesUp, 10), u.MaxBytesUp),
				ofMax(strconv.FormatInt(u.BytesDown, 10), u.MaxBytesDown), fmt.Sprintf("$%.4f", u.Spend) + maxSpend(u.MaxSpend), state}
		})

	create := &cobra.Command{
		Use:   "create NAME FILE",
		Short: "Create a named policy for sandboxes to follow (--policy-ref NAME)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := readPolicyFile(args[1])
			if err != nil {
				return err
			}
			p, err := g.client().CreateNamedPolicy(cmd.Context(), args[0], b)
			if err != nil {
				return err
			}
			fmt.Printf("policy %s created (generation %d)\n", p.Name, p.Generation)
			return nil
		},
	}
	var namedGen int64
	update := &cobra.Command{
		Use:   "update NAME FILE [--if-generation N]",
		Short: "Replace a named policy; every running sandbox following it gets it at once",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := readPolicyFile(args[1])
			if err != nil {
				return err
			}
			p, err := g.client().UpdateNamedPolicy(cmd.Context(), args[0], b, namedGen)
			if err != nil {
				return err
			}
			fmt.Printf("policy %s generation %d; sandboxes updated: %s\n", p.Name, p.Generation, orNone(p.Updated))
			return nil
		},
	}
	update.Flags().Int64Var(&namedGen, "if-generation", 0, "refuse if the named policy is no longer at this generation (409)")
	ls := listCmd("ls [--json]", "List the tenant's named policies", cobra.NoArgs,
		func(ctx context.Context, _ []string) ([]api.NamedPolicy, error) { return g.client().NamedPolicies(ctx) },
		[]string{"NAME", "GENERATION", "UPDATED"}, func(p api.NamedPolicy) []string {
			return []string{p.Name, strconv.FormatInt(p.Generation, 10), p.UpdatedAt.Local().Format(time.DateTime)}
		})
	del := callCmd("delete NAME", "Delete a named policy no running sandbox follows", cobra.ExactArgs(1),
		func(ctx context.Context, args []string) error { return g.client().DeleteNamedPolicy(ctx, args[0]) })
	cmd.AddCommand(get, set, addRule("allow"), addRule("deny"), addRule("hold"), rm, history, usage, create, update, ls, del)
	return cmd
}

func ofMax(v string, max int64) string {
	if max <= 0 {
		return v
	}
	return v + "/" + strconv.FormatInt(max, 10)
}

func maxSpend(m float64) string {
	if m <= 0 {
		return ""
	}
	return fmt.Sprintf("/$%.2f", m)
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func readPolicyFile(f string) ([]byte, error) {
	var b []byte
	var err error
	if f == "-" {
		b, err = readAllStdin()
	} else {
		b, err = os.ReadFile(f)
	}
	if err != nil {
		return nil, fmt.Errorf("policy file: %w", err)
	}
	// Check here too, so a mistake is shown with the file's name before
	// anything is sent.
	if _, err := policy.Parse(b); err != nil {
		return nil, fmt.Errorf("%s: %w", f, err)
	}
	return b, nil
}

func readAllStdin() ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(os.Stdin, policy.MaxDocumentSize+1))
	if err == nil && len(b) > policy.MaxDocumentSize {
		return nil, errors.New("the document on stdin is over 1 MiB")
	}
	return b, err
}

func printPolicy(p *api.SandboxPolicy) error {
	var d policy.Document
	if err := json.Unmarshal(p.Policy, &d); err != nil {
		return err
	}
	extra := ""
	if p.Ref != "" {
		extra += ", follows " + p.Ref
	}
	if p.Frozen {
		extra += ", FROZEN"
	}
	fmt.Printf("generation %d (version %d, default %s%s)\n", p.Generation, d.Version, d.Default, extra)
	if len(d.Only) > 0 {
		fmt.Printf("narrowed to: %s\n", strings.Join(d.Only, ", "))
	}
	return printList(false, d.Rules, []string{"NAME", "ACTION", "HOST", "PORTS", "METHODS", "PATHS", "WHEN"}, func(r policy.Rule) []string {
		ports := make([]string, len(r.Ports))
		for i, pt := range r.Ports {
			ports[i] = strconv.Itoa(pt)
		}
		action := r.Action
		if r.Protocol != "" && r.Protocol != policy.ProtocolHTTP {
			action += "/" + r.Protocol
		}
		return []string{r.Name, action, r.Host, strings.Join(ports, ","), dash(strings.Join(r.Methods, ",")), dash(strings.Join(r.Paths, ",")), dash(r.When)}
	})
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func approvalsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "approvals", Short: "Held requests waiting for a decision"}
	var state, sb string
	var follow, asJSON bool
	ls := &cobra.Command{
		Use:   "ls [--state pending|allowed|denied|expired] [--sandbox ID] [--follow] [--json]",
		Short: "List held requests (pending by default); --follow prints new ones as they come",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !follow {
				as, err := g.client().Approvals(cmd.Context(), state, sb)
				if err != nil {
					return err
				}
				return printList(asJSON, as, []string{"ID", "SANDBOX", "RULE", "REQUEST", "STATE", "DEADLINE"}, approvalRow)
			}
			return followApprovals(cmd.Context(), g, state, sb, asJSON)
		},
	}
	ls.Flags().StringVar(&state, "state", "pending", "pending, allowed, denied, expired or \"\" for all")
	ls.Flags().StringVar(&sb, "sandbox", "", "only this sandbox's")
	ls.Flags().BoolVar(&follow, "follow", false, "keep printing new ones")
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON (one object per line with --follow)")
	var remember bool
	var reason string
	decide := func(verb string) *cobra.Command {
		c := &cobra.Command{
			Use:   verb + " ID [--remember] [--reason TEXT]",
			Short: map[string]string{"approve": "Let a held request through", "deny": "Refuse a held request (the guest gets a 403 naming the rule)"}[verb],
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				d := "deny"
				if verb == "approve" {
					d = "allow"
				}
				a, err := g.client().DecideApproval(cmd.Context(), args[0], &api.ApprovalDecision{Decision: d, Remember: remember, Reason: reason})
				if err != nil {
					return err
				}
				fmt.Printf("%s %s\n", a.ID, a.State)
				return nil
			},
		}
		c.Flags().BoolVar(&remember, "remember", false, "make the decision a rule for the rest of the session")
		c.Flags().StringVar(&reason, "reason", "", "recorded with the decision")
		return c
	}
	var keyTenant string
	key := &cobra.Command{
		Use:   "webhook-key [--tenant ID]",
		Short: "Print the key your approval webhooks are signed with (X-Cagebox-Signature); each tenant has its own",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k, err := g.client().ApprovalWebhookKey(cmd.Context(), keyTenant)
			if err != nil {
				return err
			}
			fmt.Println(k.Key)
			return nil
		},
	}
	key.Flags().StringVar(&keyTenant, "tenant", "", "another tenant's key (the admin only)")
	cmd.AddCommand(ls, decide("approve"), decide("deny"), key)
	return cmd
}

func approvalRow(a api.Approval) []string {
	var h struct {
		Method, Host, Path string
	}
	_ = json.Unmarshal(a.Request, &h)
	return []string{a.ID, a.Sandbox, a.Rule, h.Method + " " + h.Host + h.Path, a.State, a.Deadline.Local().Format(time.TimeOnly)}
}

// followApprovals polls for approvals and prints each once.
func followApprovals(ctx context.Context, g *globals, state, sb string, asJSON bool) error {
	seen := map[string]bool{}
	for {
		as, err := g.client().Approvals(ctx, state, sb)
		if err != nil {
			return err
		}
		for i := len(as) - 1; i >= 0; i-- {
			a := as[i]
			if seen[a.ID+a.State] {
				continue
			}
			seen[a.ID+a.State] = true
			if asJSON {
				b, _ := json.Marshal(a)
				fmt.Println(string(b))
			} else {
				fmt.Println(strings.Join(approvalRow(a), "  "))
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func freezeCmd(g *globals, on bool) *cobra.Command {
	verb, short := "thaw", "Restore sandboxes a freeze cut off (only whoever froze them, or the admin, can)"
	if on {
		verb, short = "freeze", "Cut sandboxes off the network at once (connections closed, DNS refused, every request denied)"
	}
	var tenant string
	var all bool
	c := &cobra.Command{
		Use:   verb + " [ID | --tenant T | --all]",
		Short: short,
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &api.FreezeRequest{Tenant: tenant, All: all}
			if len(args) == 1 {
				req.Sandbox = args[0]
			}
			f := g.client().Freeze
			if !on {
				f = g.client().Thaw
			}
			res, err := f(cmd.Context(), req)
			if err != nil {
				return err
			}
			done := "thawed"
			if on {
				done = "frozen"
			}
			fmt.Printf("%s: %s\n", done, orNone(res.Sandboxes))
			if len(res.StillFrozen) > 0 {
				fmt.Printf("still frozen (frozen by the admin; only the admin can thaw them): %s\n", strings.Join(res.StillFrozen, ", "))
			}
			return nil
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "every sandbox of this tenant")
	c.Flags().BoolVar(&all, "all", false, "every sandbox (admin)")
	return c
}
