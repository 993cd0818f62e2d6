package policy

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/cagebox/cagebox/internal/hostname"
)

// Approval says who decides held requests besides an operator using the
// API or `cagebox approvals`.
type Approval struct {
	// Webhook, when set, is POSTed each held request (method, host, path,
	// a bounded body preview with placeholders, sandbox, tenant), signed
	// with an HMAC header; it answers {"decision": "allow"|"deny"}. A
	// failure or a timeout denies. http:// only to loopback.
	Webhook string `json:"webhook,omitempty" yaml:"webhook,omitempty"`
	// Timeout bounds the webhook call (Go duration, default 30s).
	Timeout string `json:"timeout,omitempty" yaml:"timeout,omitempty"`
}

// Budget caps what requests in its scope may use over the session. Its
// scope is the requests whose host matches one of Hosts or whose deciding
// rule is one of Rules; neither: every request of the sandbox.
type Budget struct {
	Name  string   `json:"name" yaml:"name"`
	Hosts []string `json:"hosts,omitempty" yaml:"hosts,omitempty"`
	Rules []string `json:"rules,omitempty" yaml:"rules,omitempty"`
	// Requests caps the number of allowed requests (0: no cap).
	Requests int64 `json:"requests,omitempty" yaml:"requests,omitempty"`
	// BytesUp and BytesDown cap request and response body bytes.
	BytesUp   int64 `json:"bytes_up,omitempty" yaml:"bytes_up,omitempty"`
	BytesDown int64 `json:"bytes_down,omitempty" yaml:"bytes_down,omitempty"`
	// Spend caps the USD the responses report using (tokens × Prices).
	Spend float64 `json:"spend,omitempty" yaml:"spend,omitempty"`
	// Rate is requests per second (a token bucket of Burst, default
	// max(1, Rate)); a request over the rate is refused, not queued.
	Rate  float64 `json:"rate,omitempty" yaml:"rate,omitempty"`
	Burst int     `json:"burst,omitempty" yaml:"burst,omitempty"`
	// Action when the budget is spent: "deny" (default) or "hold".
	Action string `json:"action,omitempty" yaml:"action,omitempty"`
}

// Price is USD per million tokens.
type Price struct {
	Input  float64 `json:"input" yaml:"input"`
	Output float64 `json:"output" yaml:"output"`
}

// Trigger changes the sandbox's policy for the rest of the session. It
// fires when After (a rule name) has allowed a request — and When, if
// set, is true for that request — or, without After, when When is true
// for any decided request. A trigger fires at most once.
type Trigger struct {
	Name  string        `json:"name" yaml:"name"`
	After string        `json:"after,omitempty" yaml:"after,omitempty"`
	When  string        `json:"when,omitempty" yaml:"when,omitempty"`
	Do    TriggerAction `json:"do" yaml:"do"`
}

// TriggerAction is what a trigger does. Every field set is applied.
type TriggerAction struct {
	// Deny puts a deny rule for each host before every other rule.
	Deny []string `json:"deny,omitempty" yaml:"deny,omitempty"`
	// Only narrows the policy to these hosts (Document.Only; intersected
	// with an existing Only).
	Only []string `json:"only,omitempty" yaml:"only,omitempty"`
	// Policy swaps the document for the tenant's named policy.
	Policy string `json:"policy,omitempty" yaml:"policy,omitempty"`
	// Revoke revokes these vault secrets (for every sandbox using them);
	// Unbind unbinds them from this sandbox only.
	Revoke []string `json:"revoke,omitempty" yaml:"revoke,omitempty"`
	Unbind []string `json:"unbind,omitempty" yaml:"unbind,omitempty"`
	// Pause pauses the sandbox.
	Pause bool `json:"pause,omitempty" yaml:"pause,omitempty"`
}

// Limits of version 2 fields.
const (
	DefaultHoldTimeout    = 60 * time.Second
	MaxHoldTimeout        = 24 * time.Hour
	DefaultWebhookTimeout = 30 * time.Second
	MaxWebhookTimeout     = 10 * time.Minute
	MaxBudgets            = 100
	MaxTriggers           = 100
	MaxPrices             = 1000
	MaxWhenLen            = 4096
	// RuleOnly names denials by Document.Only.
	RuleOnly = "only"
)

// CompiledBudget is a validated Budget.
type CompiledBudget struct {
	Budget
	hosts []string // canonical patterns
}

// Covers reports whether a request to host decided by rule counts
// against b.
func (b *CompiledBudget) Covers(host, rule string) bool {
	if len(b.hosts) == 0 && len(b.Rules) == 0 {
		return true
	}
	if slices.Contains(b.Rules, rule) {
		return true
	}
	h, ok := hostname.Normalize(host)
	if !ok {
		return false
	}
	for _, p := range b.hosts {
		if hostname.Match(p, h) {
			return true
		}
	}
	return false
}

// CompiledTrigger is a validated Trigger.
type CompiledTrigger struct {
	Trigger
	when *condition
}

// Fires reports whether the trigger fires for a request the policy
// decided d with, given its attributes and r.Session. An evaluation
// error fires it: a trigger narrows, so failing closed means applying it.
func (t *CompiledTrigger) Fires(r *Request, d Decision) bool {
	if t.After != "" && (!d.Allow || d.Rule != t.After) {
		return false
	}
	if t.when == nil {
		return t.After != ""
	}
	ok, err := t.when.evalIn(&activation{r: r})
	return ok || err != nil
}

// compileV2 validates and compiles the document-level fields of version
// 2 into p and the normalized document n.
func compileV2(d, n *Document, p *Policy, ruleNames map[string]int) error {
	bad := func(field, format string, args ...any) error {
		return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	for i, h := range d.Only {
		host, reason := parseHostPattern(h)
		if reason != "" {
			return bad(fmt.Sprintf("only[%d]", i), "%s", reason)
		}
		if !slices.Contains(n.Only, host) {
			n.Only = append(n.Only, host)
		}
	}
	p.only = n.Only
	if d.Approval != nil {
		a := *d.Approval
		if a.Webhook != "" {
			if reason := webhookProblem(a.Webhook); reason != "" {
				return bad("approval.webhook", "%s", reason)
			}
		}
		t, err := parseDuration(a.Timeout, DefaultWebhookTimeout, MaxWebhookTimeout)
		if err != "" {
			return bad("approval.timeout", "%s", err)
		}
		p.webhookTimeout = t
		n.Approval = &a
	}
	if len(d.Prices) > MaxPrices {
		return bad("prices", "%d prices; the limit is %d", len(d.Prices), MaxPrices)
	}
	for model, pr := range d.Prices {
		if model == "" || len(model) > 200 {
			return bad("prices", "a model name must be 1-200 characters")
		}
		if !finiteNonNeg(pr.Input) || !finiteNonNeg(pr.Output) {
			return bad("prices."+model, "prices are USD per million tokens, zero or more")
		}
		if n.Prices == nil {
			n.Prices = map[string]Price{}
		}
		n.Prices[model] = pr
	}
	if len(d.Budgets) > MaxBudgets {
		return bad("budgets", "%d budgets; the limit is %d", len(d.Budgets), MaxBudgets)
	}
	budgetNames := map[string]bool{}
	for i, b := range d.Budgets {
		f := fmt.Sprintf("budgets[%d]", i)
		if reason := uniqueNameProblem("budget", "it is shown in denials and usage", b.Name, budgetNames); reason != "" {
			return bad(f+".name", "%s", reason)
		}
		cb := CompiledBudget{Budget: b}
		cb.Hosts, cb.Rules = nil, append([]string(nil), b.Rules...)
		for j, h := range b.Hosts {
			host, reason := parseHostPattern(h)
			if reason != "" {
				return bad(fmt.Sprintf("%s.hosts[%d]", f, j), "%s", reason)
			}
			cb.Hosts = append(cb.Hosts, host)
			cb.hosts = append(cb.hosts, host)
		}
		for j, r := range b.Rules {
			if _, ok := ruleNames[r]; !ok && r != RuleDefault {
				return bad(fmt.Sprintf("%s.rules[%d]", f, j), "no rule is named %q", r)
			}
		}
		if b.Requests < 0 || b.BytesUp < 0 || b.BytesDown < 0 || !finiteNonNeg(b.Spend) || !finiteNonNeg(b.Rate) || b.Burst < 0 {
			return bad(f, "limits are zero (no cap) or more")
		}
		if b.Requests == 0 && b.BytesUp == 0 && b.BytesDown == 0 && b.Spend == 0 && b.Rate == 0 {
			return bad(f, "the budget caps nothing; set requests, bytes_up, bytes_down, spend or rate")
		}
		if b.Spend > 0 && len(d.Prices) == 0 {
			return bad(f+".spend", "a spend budget needs prices (prices: {MODEL: {input: USD/Mtok, output: USD/Mtok}})")
		}
		if b.Burst > 0 && b.Rate == 0 {
			return bad(f+".burst", "burst goes with rate")
		}
		if b.Rate > 0 && cb.Burst == 0 {
			cb.Burst = max(1, int(math.Ceil(b.Rate)))
		}
		switch b.Action {
		case "":
			cb.Action = ActionDeny
		case ActionDeny, ActionHold:
		default:
			return bad(f+".action", "%q is not a budget action; write \"deny\" (the default) or \"hold\"", b.Action)
		}
		n.Budgets = append(n.Budgets, cb.Budget)
		p.budgets = append(p.budgets, cb)
	}
	if len(d.Triggers) > MaxTriggers {
		return bad("triggers", "%d triggers; the limit is %d", len(d.Triggers), MaxTriggers)
	}
	trigNames := map[string]bool{}
	for i, t := range d.Triggers {
		f := fmt.Sprintf("triggers[%d]", i)
		if reason := uniqueNameProblem("trigger", "it is shown in events and history", t.Name, trigNames); reason != "" {
			return bad(f+".name", "%s", reason)
		}
		if t.After == "" && t.When == "" {
			return bad(f, "a trigger needs after (a rule name) or when (a condition)")
		}
		if t.After != "" {
			if _, ok := ruleNames[t.After]; !ok {
				return bad(f+".after", "no rule is named %q", t.After)
			}
		}
		ct := CompiledTrigger{Trigger: t}
		if t.When != "" {
			c, err := compileCondition(t.When)
			if err != nil {
				return bad(f+".when", "%v", err)
			}
			ct.when = c
		}
		a := t.Do
		if len(a.Deny) == 0 && len(a.Only) == 0 && a.Policy == "" && len(a.Revoke) == 0 && len(a.Unbind) == 0 && !a.Pause {
			return bad(f+".do", "the trigger does nothing; set deny, only, policy, revoke, unbind or pause")
		}
		for j, h := range a.Deny {
			if _, reason := parseHostPattern(h); reason != "" {
				return bad(fmt.Sprintf("%s.do.deny[%d]", f, j), "%s", reason)
			}
		}
		for j, h := range a.Only {
			if _, reason := parseHostPattern(h); reason != "" {
				return bad(fmt.Sprintf("%s.do.only[%d]", f, j), "%s", reason)
			}
		}
		if a.Policy != "" {
			if reason := nameProblem(a.Policy); reason != "" {
				return bad(f+".do.policy", "%s", reason)
			}
		}
		n.Triggers = append(n.Triggers, t)
		p.triggers = append(p.triggers, ct)
	}
	return nil
}

// uniqueNameProblem checks the name of a budget or trigger: given, valid
// and not used by another of its kind (recorded in seen).
func uniqueNameProblem(kind, why, name string, seen map[string]bool) string {
	switch {
	case name == "":
		return fmt.Sprintf("a %s needs a name (%s)", kind, why)
	case nameProblem(name) != "":
		return nameProblem(name)
	case seen[name]:
		return fmt.Sprintf("%s %q is defined twice", kind, name)
	}
	seen[name] = true
	return ""
}

func finiteNonNeg(f float64) bool { return f >= 0 && !math.IsInf(f, 0) && !math.IsNaN(f) }

// parseDuration parses a Go duration, with a default for "" and a bound.
func parseDuration(s string, def, maxD time.Duration) (time.Duration, string) {
	if s == "" {
		return def, ""
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Sprintf("%q is not a duration; write e.g. \"30s\" or \"5m\"", s)
	}
	if d <= 0 || d > maxD {
		return 0, fmt.Sprintf("%s is out of range; 1ms to %s", d, maxD)
	}
	return d, ""
}

// webhookProblem accepts https:// URLs, and http:// only to loopback
// (a test receiver on the host).
func webhookProblem(u string) string {
	rest, ok := strings.CutPrefix(u, "https://")
	if !ok {
		rest, ok = strings.CutPrefix(u, "http://")
		if !ok {
			return "the webhook must be an https:// URL (http:// only to 127.0.0.1, [::1] or localhost)"
		}
		host := rest
		if i := strings.IndexAny(host, "/?#"); i >= 0 {
			host = host[:i]
		}
		h := host
		if strings.HasPrefix(h, "[") {
			if j := strings.Index(h, "]"); j >= 0 {
				h = h[1:j]
			}
		} else if j := strings.LastIndex(h, ":"); j >= 0 {
			h = h[:j]
		}
		if h != "127.0.0.1" && h != "::1" && h != "localhost" {
			return "http:// webhooks may only go to loopback; use https:// for " + h
		}
	}
	if rest == "" || strings.HasPrefix(rest, "/") {
		return "the webhook URL has no host"
	}
	if len(u) > 2048 {
		return "the webhook URL is longer than 2048 characters"
	}
	return ""
}

// Budgets returns the policy's budgets.
func (p *Policy) Budgets() []CompiledBudget {
	if p == nil {
		return nil
	}
	return p.budgets
}

// Triggers returns the policy's triggers.
func (p *Policy) Triggers() []CompiledTrigger {
	if p == nil {
		return nil
	}
	return p.triggers
}

// Prices returns the price table (model → USD per million tokens).
func (p *Policy) Prices() map[string]Price {
	if p == nil {
		return nil
	}
	return p.doc.Prices
}

// Approval returns the approval settings (nil: operators only) and the
// webhook timeout.
func (p *Policy) Approval() (*Approval, time.Duration) {
	if p == nil || p.doc.Approval == nil {
		return nil, 0
	}
	a := *p.doc.Approval
	return &a, p.webhookTimeout
}

// usesV2 reports whether d uses a field of version 2.
func usesV2(d *Document) string {
	switch {
	case len(d.Only) > 0:
		return "only"
	case d.Approval != nil:
		return "approval"
	case len(d.Budgets) > 0:
		return "budgets"
	case len(d.Prices) > 0:
		return "prices"
	case len(d.Triggers) > 0:
		return "triggers"
	}
	for i, r := range d.Rules {
		switch {
		case r.Action == ActionHold:
			return fmt.Sprintf("rules[%d].action", i)
		case r.When != "":
			return fmt.Sprintf("rules[%d].when", i)
		case r.Timeout != "":
			return fmt.Sprintf("rules[%d].timeout", i)
		}
	}
	return ""
}

// ValidPathPattern reports whether p (a request path) can be used as a
// rule's path pattern that matches exactly p: it must be a valid pattern
// and have no glob characters.
func ValidPathPattern(p string) bool {
	if strings.Contains(p, "*") {
		return false
	}
	_, reason := parsePathPattern(p)
	return reason == ""
}
