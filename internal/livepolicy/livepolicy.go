// Package livepolicy is the runtime half of a sandbox's egress policy:
// the policy that follows the live session. Each running sandbox has a
// [Sandbox] here holding its current compiled policy (a versioned
// document: every change is one atomic replace recorded as the next
// generation), its session counters, budgets and rate buckets, and its
// freeze flag. The [Registry] holds them all, parks held requests on
// waiters keyed by approval id, and freezes sandboxes by id, tenant or
// all at once.
//
// The gateway asks [Sandbox.Decide] for every request (and the resolver
// asks [Sandbox.AllowsName]/[Sandbox.NamesHost] for every name), so a
// change applies to the very next request, on connections already open
// too. Decide never fails open: a frozen sandbox, a spent budget, a hold
// that times out or a store error all deny, naming why.
//
// Approvals, budget usage and the policy's generations live in the store
// (package store's PolicyStore), so a daemon restart neither loses spend
// nor leaves a waiter hanging: pending approvals are expired at start-up
// and their requests, whose connections died with the old daemon, are
// denied.
package livepolicy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/safedial"
	"github.com/cagebox/cagebox/internal/store"
)

// Names of decisions this package makes (besides the policy's own).
const (
	RuleFreeze  = "freeze"
	RuleBudget  = "budget:" // + budget name
	RuleStoreDB = "builtin:store"
)

// Config configures a Registry.
type Config struct {
	Store store.PolicyStore
	// Emit records an audit event.
	Emit func(tenant, sandbox string, ev api.EventPayload)
	// Act carries out the parts of a trigger this package cannot: revoke
	// or unbind secrets, pause the sandbox (the daemon wires it to the
	// vault and the sandbox manager). Nil: those parts are refused with an
	// event. (A swap to a named policy is this package's: named.go.)
	Act func(ctx context.Context, sandboxID, trigger string, a policy.TriggerAction) error
	// CloseConns closes a sandbox's open proxy connections (freeze).
	CloseConns func(sandboxID string) int
	// WebhookKey is the daemon's key, from which each tenant's approval
	// webhook key is derived (WebhookKey func); WebhookClient sends them
	// (default: package safedial's guarded dialer, no redirects — a
	// tenant's URL never reaches the host, its network or metadata).
	WebhookKey    []byte
	WebhookClient *http.Client
	Logger        *slog.Logger
	Now           func() time.Time
}

// Registry holds every running sandbox's live policy.
type Registry struct {
	cfg Config
	log *slog.Logger

	// fmu serialises Freeze, Thaw and the removal of a sandbox, so that
	// the store records freezes in the order they are made (freeze.go).
	fmu sync.Mutex

	// mu guards the fields below.
	mu              sync.Mutex
	sbs             map[string]*Sandbox
	waiters         map[string]chan verdict  // approval id → its held request
	frozenAll       bool                     // always the admin's
	frozenTenants   map[string]string        // tenant → the principal that froze it
	frozenSandboxes map[string]frozenSandbox // sandbox → its own freeze
}

// New returns a Registry.
func New(cfg Config) *Registry {
	if cfg.Emit == nil {
		cfg.Emit = func(string, string, api.EventPayload) {}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.WebhookClient == nil {
		cfg.WebhookClient = safedial.New(safedial.Config{}).HTTPClient(nil)
	}
	return &Registry{cfg: cfg, log: cfg.Logger, sbs: map[string]*Sandbox{}, waiters: map[string]chan verdict{},
		frozenTenants: map[string]string{}, frozenSandboxes: map[string]frozenSandbox{}}
}

// Start restores the freezes a previous daemon recorded (call it before
// any sandbox is attached: no gateway serves a sandbox a freeze should
// cut off) and expires approvals a previous daemon left pending: their
// waiters and the guests' connections are gone, so they are denied.
func (g *Registry) Start(ctx context.Context) error {
	if err := g.loadFreezes(ctx); err != nil {
		return err
	}
	n, err := g.cfg.Store.ExpirePendingApprovals(ctx, "the daemon restarted while the request was held; it was denied")
	if err != nil {
		return fmt.Errorf("livepolicy: %w", err)
	}
	if n > 0 {
		g.log.Info("expired approvals left pending by the previous daemon", "count", n)
	}
	return nil
}

// Sandbox is one sandbox's live policy.
type Sandbox struct {
	ID, Tenant string
	g          *Registry
	live       policy.Live
	// upd serialises updates (compute, record, swap) so two edits never
	// compute from the same base. Decide never takes it.
	upd sync.Mutex

	// mu guards the fields below.
	mu        sync.Mutex
	gen       int64
	ref       string // the named policy it follows ("" none)
	requests  int64
	fired     map[string]int64
	triggered map[string]bool
	usage     map[string]*store.BudgetUsage
	buckets   map[string]*rate.Limiter
	exhausted map[string]bool // budgets reported exhausted (one event each)
}

// Attach registers a sandbox. A new sandbox (recovered false) records doc
// as generation 1; a recovered one loads its newest generation and its
// budget usage from the store (doc is then only a fallback for a sandbox
// created before live policy existed, recorded as generation 1).
func (g *Registry) Attach(ctx context.Context, id, tenant string, doc *policy.Document, ref string, recovered bool) (*Sandbox, error) {
	s := &Sandbox{ID: id, Tenant: tenant, g: g, ref: ref, fired: map[string]int64{}, triggered: map[string]bool{},
		usage: map[string]*store.BudgetUsage{}, buckets: map[string]*rate.Limiter{}, exhausted: map[string]bool{}}
	if recovered {
		v, err := g.cfg.Store.LatestPolicyVersion(ctx, id)
		switch {
		case err == nil:
			var d policy.Document
			if err := json.Unmarshal(v.Document, &d); err != nil {
				return nil, fmt.Errorf("livepolicy: generation %d of %s: %w", v.Generation, id, err)
			}
			doc, s.gen, s.ref = &d, v.Generation, v.Ref
		case errors.Is(err, store.ErrNotFound):
		default:
			return nil, fmt.Errorf("livepolicy: %w", err)
		}
		us, err := g.cfg.Store.ListBudgetUsage(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("livepolicy: %w", err)
		}
		for _, u := range us {
			s.usage[u.Budget] = u
		}
	}
	if doc == nil {
		doc = &policy.Document{Version: 1}
	}
	p, err := policy.Compile(doc)
	if err != nil {
		return nil, fmt.Errorf("livepolicy: %w", err)
	}
	if s.gen == 0 {
		if err := s.record(ctx, p.Document(), 1, "create", "", ref); err != nil {
			return nil, err
		}
		s.gen = 1
	}
	s.install(p)
	g.mu.Lock()
	g.sbs[id] = s
	g.mu.Unlock()
	return s, nil
}

// Detach forgets a sandbox; with remove, its usage and its own freeze
// are deleted and its pending approvals expired (the sandbox is gone).
// Without remove (a daemon that stops) its freeze stays.
func (g *Registry) Detach(ctx context.Context, id string, remove bool) {
	if remove {
		g.fmu.Lock()
		defer g.fmu.Unlock()
	}
	g.mu.Lock()
	delete(g.sbs, id)
	if remove {
		delete(g.frozenSandboxes, id)
	}
	g.mu.Unlock()
	if remove {
		if err := g.cfg.Store.DeletePolicyState(ctx, id); err != nil {
			g.log.Warn("delete live policy state", "sandbox", id, "err", err)
		}
	}
}

// Get returns a sandbox's live policy.
func (g *Registry) Get(id string) (*Sandbox, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.sbs[id]
	return s, ok
}

// install swaps in p and rebuilds the rate buckets of budgets whose rate
// changed (a budget keeps its bucket across unrelated edits).
func (s *Sandbox) install(p *policy.Policy) {
	s.mu.Lock()
	for _, b := range p.Budgets() {
		if b.Rate <= 0 {
			delete(s.buckets, b.Name)
			continue
		}
		l := s.buckets[b.Name]
		if l == nil || l.Limit() != rate.Limit(b.Rate) || l.Burst() != b.Burst {
			s.buckets[b.Name] = rate.NewLimiter(rate.Limit(b.Rate), b.Burst)
		}
	}
	s.mu.Unlock()
	s.live.Set(p)
}

func (s *Sandbox) record(ctx context.Context, doc *policy.Document, gen int64, actor, reason, ref string) error {
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	err = s.g.cfg.Store.AppendPolicyVersion(ctx, &store.PolicyVersion{SandboxID: s.ID, TenantID: s.Tenant, Generation: gen, Document: b, Actor: actor, Reason: reason, Ref: ref})
	if errors.Is(err, store.ErrConflict) {
		return fmt.Errorf("%w: the policy changed meanwhile (generation %d exists); read it again and retry", errdefs.ErrConflict, gen)
	}
	if err != nil {
		return fmt.Errorf("livepolicy: record generation %d: %w", gen, err)
	}
	return nil
}

// Policy returns the current document (defaults filled in), its
// generation and the named policy the sandbox follows.
func (s *Sandbox) Policy() (*policy.Document, int64, string) {
	s.mu.Lock()
	gen, ref := s.gen, s.ref
	s.mu.Unlock()
	return s.live.Current().Document(), gen, ref
}

// ErrGenerationMismatch is returned (wrapped, with ErrConflict) when an
// update names a generation that is no longer current.
var ErrGenerationMismatch = errors.New("generation mismatch")

// Set replaces the policy with doc, atomically: the document is
// validated and compiled first (an invalid one changes nothing and the
// error names the field), then recorded as the next generation, then
// swapped in. ifGen > 0 must equal the current generation (else a
// conflict). It returns the new generation.
func (s *Sandbox) Set(ctx context.Context, doc *policy.Document, ifGen int64, actor, reason string) (int64, error) {
	return s.update(ctx, ifGen, actor, reason, nil, func(*policy.Document) (*policy.Document, error) { return doc, nil })
}

// Replace is Set that also changes which named policy the sandbox follows
// ("" none), recorded with the generation (a restart keeps it).
func (s *Sandbox) Replace(ctx context.Context, doc *policy.Document, ifGen int64, actor, reason, ref string) (int64, error) {
	return s.update(ctx, ifGen, actor, reason, &ref, func(*policy.Document) (*policy.Document, error) { return doc, nil })
}

// Update applies edit to a copy of the current document and sets the
// result (see Set). Concurrent updates are serialised: each edit sees the
// document the previous one made.
func (s *Sandbox) Update(ctx context.Context, ifGen int64, actor, reason string, edit func(*policy.Document) (*policy.Document, error)) (int64, error) {
	return s.update(ctx, ifGen, actor, reason, nil, edit)
}

func (s *Sandbox) update(ctx context.Context, ifGen int64, actor, reason string, newRef *string, edit func(*policy.Document) (*policy.Document, error)) (int64, error) {
	s.upd.Lock()
	defer s.upd.Unlock()
	s.mu.Lock()
	gen, ref := s.gen, s.ref
	s.mu.Unlock()
	if newRef != nil {
		ref = *newRef
	}
	if ifGen > 0 && ifGen != gen {
		return gen, fmt.Errorf("%w: %w: the policy is at generation %d, not %d; read it again and retry", errdefs.ErrConflict, ErrGenerationMismatch, gen, ifGen)
	}
	doc, err := edit(s.live.Current().Document())
	if err != nil {
		return gen, err
	}
	p, err := policy.Compile(doc)
	if err != nil {
		return gen, fmt.Errorf("%w: %w", errdefs.ErrInvalid, err)
	}
	if err := s.record(ctx, p.Document(), gen+1, actor, reason, ref); err != nil {
		return gen, err
	}
	s.mu.Lock()
	s.gen, s.ref = gen+1, ref
	s.mu.Unlock()
	s.install(p)
	s.g.cfg.Emit(s.Tenant, s.ID, api.PolicyChanged{Generation: gen + 1, Actor: actor, Reason: reason, Rules: len(p.Document().Rules)})
	return gen + 1, nil
}

// Ref returns the named policy the sandbox follows ("" none).
func (s *Sandbox) Ref() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ref
}

// AllowsName asks the current policy, false while frozen.
func (s *Sandbox) AllowsName(name string) bool {
	return !s.Frozen() && s.live.AllowsName(name)
}

// NamesHost asks the current policy, false while frozen (DNS refuses).
func (s *Sandbox) NamesHost(name string) bool {
	return !s.Frozen() && s.live.NamesHost(name)
}

// Frozen reports whether the sandbox is cut off (itself, its tenant or
// everything).
func (s *Sandbox) Frozen() bool {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	_, own := s.g.frozenSandboxes[s.ID]
	return own || s.g.frozenAll || s.g.frozenTenants[s.Tenant] != ""
}

// Decide decides one request: freeze first, then the policy, then the
// budgets in scope; a hold waits for its approval (bounded by the rule's
// timeout and ctx); an allowed request counts toward the session and may
// fire triggers. It never fails open.
func (s *Sandbox) Decide(ctx context.Context, r *policy.Request) (policy.Decision, error) {
	if s.Frozen() {
		return policy.Decision{Rule: RuleFreeze, Reason: "the sandbox is frozen: an operator cut it off the network"}, nil
	}
	p := s.live.Current()
	if p == nil {
		return policy.Decision{}, errors.New("livepolicy: no policy")
	}
	r.SessionFunc = s.session
	d, err := p.Decide(ctx, r)
	if err != nil {
		return d, err
	}
	if !d.Allow && !d.Hold {
		s.count(d.Rule, false)
		return d, nil
	}
	if bd, ok := s.checkBudgets(ctx, p, r, d); !ok {
		if !bd.Hold {
			return bd, nil
		}
		d = bd
	}
	if d.Hold {
		d = s.g.hold(ctx, s, p, r, d)
		if !d.Allow {
			s.count(d.Rule, false)
			return d, nil
		}
	}
	s.count(d.Rule, true)
	s.fireTriggers(ctx, p, r, d)
	return d, nil
}

// session returns a snapshot of the counters for conditions.
func (s *Sandbox) session() *policy.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := &policy.Session{Requests: s.requests, Fired: make(map[string]int64, len(s.fired))}
	for k, v := range s.fired {
		ss.Fired[k] = v
	}
	for _, u := range s.usage {
		ss.Spend += float64(u.SpendMicros) / 1e6
		ss.BytesUp += u.BytesUp
		ss.BytesDown += u.BytesDown
	}
	return ss
}

func (s *Sandbox) count(rule string, allowed bool) {
	s.mu.Lock()
	s.fired[rule]++
	if allowed {
		s.requests++
	}
	s.mu.Unlock()
}

// checkBudgets reserves one request in every budget in scope, exactly
// (under the sandbox's lock, so parallel requests cannot overshoot a
// request cap), and refuses when one is spent. Bytes and spend are known
// only after a response (Account), so a budget of those is checked
// against what completed requests used.
func (s *Sandbox) checkBudgets(ctx context.Context, p *policy.Policy, r *policy.Request, d policy.Decision) (policy.Decision, bool) {
	bs := p.Budgets()
	if len(bs) == 0 {
		return d, true
	}
	var inScope []*policy.CompiledBudget
	s.mu.Lock()
	for i := range bs {
		b := &bs[i]
		if !b.Covers(r.Host, d.Rule) {
			continue
		}
		u := s.usage[b.Name]
		if u == nil {
			u = &store.BudgetUsage{SandboxID: s.ID, Budget: b.Name}
			s.usage[b.Name] = u
		}
		why := ""
		switch {
		case b.Requests > 0 && u.Requests >= b.Requests:
			why = fmt.Sprintf("%d of %d requests used", u.Requests, b.Requests)
		case b.BytesUp > 0 && u.BytesUp >= b.BytesUp:
			why = fmt.Sprintf("%d of %d bytes sent", u.BytesUp, b.BytesUp)
		case b.BytesDown > 0 && u.BytesDown >= b.BytesDown:
			why = fmt.Sprintf("%d of %d bytes received", u.BytesDown, b.BytesDown)
		case b.Spend > 0 && float64(u.SpendMicros)/1e6 >= b.Spend:
			why = fmt.Sprintf("$%.4f of $%.2f spent", float64(u.SpendMicros)/1e6, b.Spend)
		case s.buckets[b.Name] != nil && !s.buckets[b.Name].Allow():
			why = fmt.Sprintf("over %g requests per second", b.Rate)
		}
		if why != "" {
			first := !s.exhausted[b.Name]
			s.exhausted[b.Name] = true
			s.mu.Unlock()
			if first {
				s.g.cfg.Emit(s.Tenant, s.ID, api.PolicyBudgetExhausted{Budget: b.Name, Reason: why, Host: r.Host, Rule: d.Rule})
			}
			out := policy.Decision{Rule: RuleBudget + b.Name, Reason: fmt.Sprintf("budget %q is spent (%s)", b.Name, why)}
			if b.Action == policy.ActionHold {
				out.Hold, out.HoldTimeout = true, policy.DefaultHoldTimeout
			}
			return out, false
		}
		inScope = append(inScope, b)
	}
	for _, b := range inScope {
		s.usage[b.Name].Requests++
	}
	s.mu.Unlock()
	for _, b := range inScope {
		if _, err := s.g.cfg.Store.AddBudgetUsage(ctx, store.BudgetUsage{SandboxID: s.ID, Budget: b.Name, Requests: 1}); err != nil {
			return policy.Decision{Rule: RuleStoreDB, Reason: "budget usage could not be recorded; denied"}, false
		}
	}
	return d, true
}

// Account adds what a finished request used to the budgets in its scope:
// body bytes both ways and, for LLM responses, the spend priced from the
// usage the response reported (micro-USD).
func (s *Sandbox) Account(ctx context.Context, host, rule string, up, down, spendMicros int64) {
	p := s.live.Current()
	if p == nil || up == 0 && down == 0 && spendMicros == 0 {
		return
	}
	for _, b := range p.Budgets() {
		if !b.Covers(host, rule) {
			continue
		}
		u, err := s.g.cfg.Store.AddBudgetUsage(ctx, store.BudgetUsage{SandboxID: s.ID, Budget: b.Name, BytesUp: up, BytesDown: down, SpendMicros: spendMicros})
		if err != nil {
			s.g.log.Warn("record budget usage", "sandbox", s.ID, "budget", b.Name, "err", err)
			continue
		}
		s.mu.Lock()
		if cur := s.usage[b.Name]; cur != nil {
			// Requests are counted in memory first (reserved); keep the
			// larger so a slow store write never lets one through twice.
			u.Requests = max(u.Requests, cur.Requests)
		}
		s.usage[b.Name] = u
		s.mu.Unlock()
	}
}

// Usage returns what the sandbox has used of each budget of its policy.
func (s *Sandbox) Usage() []BudgetState {
	p := s.live.Current()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []BudgetState
	for _, b := range p.Budgets() {
		st := BudgetState{Budget: b.Budget}
		if u := s.usage[b.Name]; u != nil {
			st.Used = *u
		}
		st.Spent = float64(st.Used.SpendMicros) / 1e6
		st.Exhausted = s.exhausted[b.Name]
		out = append(out, st)
	}
	return out
}

// BudgetState is a budget and what is used of it.
type BudgetState struct {
	Budget    policy.Budget
	Used      store.BudgetUsage
	Spent     float64
	Exhausted bool
}

// fireTriggers applies every trigger that fires for this request, once.
func (s *Sandbox) fireTriggers(ctx context.Context, p *policy.Policy, r *policy.Request, d policy.Decision) {
	for _, t := range p.Triggers() {
		s.mu.Lock()
		done := s.triggered[t.Name]
		s.mu.Unlock()
		if done || !t.Fires(r, d) {
			continue
		}
		s.mu.Lock()
		if s.triggered[t.Name] {
			s.mu.Unlock()
			continue
		}
		s.triggered[t.Name] = true
		s.mu.Unlock()
		s.applyTrigger(ctx, t.Trigger, r)
	}
}

func (s *Sandbox) applyTrigger(ctx context.Context, t policy.Trigger, r *policy.Request) {
	a := t.Do
	s.g.cfg.Emit(s.Tenant, s.ID, api.PolicyTrigger{Trigger: t.Name, After: t.After, Host: r.Host, Method: r.Method, Path: r.Path, Actions: actions(a)})
	// The request that fired it is already allowed; the change applies
	// from the next request on. Edits of the document are applied here,
	// synchronously, before this request's response is even forwarded.
	if len(a.Deny) > 0 || len(a.Only) > 0 {
		_, err := s.Update(ctx, 0, "trigger:"+t.Name, "trigger fired", func(doc *policy.Document) (*policy.Document, error) {
			var rules []policy.Rule
			for i, h := range a.Deny {
				rules = append(rules, policy.Rule{Name: fmt.Sprintf("trigger:%s:deny[%d]", t.Name, i), Host: h, Action: policy.ActionDeny})
			}
			doc.Rules = append(rules, doc.Rules...)
			if len(a.Only) > 0 {
				doc.Only = narrow(doc.Only, a.Only)
			}
			doc.Version = 2
			return doc, nil
		})
		if err != nil {
			s.g.log.Error("apply trigger", "sandbox", s.ID, "trigger", t.Name, "err", err)
			// Fail closed: a narrowing that cannot be recorded freezes.
			s.freezeSelf(ctx, "trigger:"+t.Name+" (could not apply: "+err.Error()+")")
		}
	}
	if a.Policy != "" {
		if err := s.swapToNamed(context.WithoutCancel(ctx), t.Name, a.Policy); err != nil {
			s.g.log.Error("apply trigger", "sandbox", s.ID, "trigger", t.Name, "err", err)
			s.freezeSelf(ctx, "trigger:"+t.Name+" (could not apply: "+err.Error()+")")
		}
	}
	if len(a.Revoke) > 0 || len(a.Unbind) > 0 || a.Pause {
		rest := a
		rest.Deny, rest.Only, rest.Policy = nil, nil, ""
		if s.g.cfg.Act == nil {
			s.g.log.Error("trigger action not supported here", "sandbox", s.ID, "trigger", t.Name)
			s.freezeSelf(ctx, "trigger:"+t.Name+" (no actor)")
			return
		}
		// Act may pause the sandbox, which waits for nothing of ours;
		// still, do not hold the guest's request on it.
		go func() {
			if err := s.g.cfg.Act(context.WithoutCancel(ctx), s.ID, t.Name, rest); err != nil {
				s.g.log.Error("apply trigger", "sandbox", s.ID, "trigger", t.Name, "err", err)
				s.freezeSelf(ctx, "trigger:"+t.Name+" (could not apply: "+err.Error()+")")
			}
		}()
	}
}

// actions describes a trigger's actions for its event.
func actions(a policy.TriggerAction) []string {
	var out []string
	for _, h := range a.Deny {
		out = append(out, "deny:"+h)
	}
	for _, h := range a.Only {
		out = append(out, "only:"+h)
	}
	if a.Policy != "" {
		out = append(out, "policy:"+a.Policy)
	}
	for _, n := range a.Revoke {
		out = append(out, "revoke:"+n)
	}
	for _, n := range a.Unbind {
		out = append(out, "unbind:"+n)
	}
	if a.Pause {
		out = append(out, "pause")
	}
	return out
}

// narrow intersects an existing only list with a new one (a trigger
// only ever narrows); with no existing list it is the new one.
func narrow(cur, next []string) []string {
	if len(cur) == 0 {
		return slices.Clone(next)
	}
	var out []string
	for _, h := range next {
		if slices.Contains(cur, h) {
			out = append(out, h)
		}
	}
	if len(out) == 0 {
		// Disjoint: nothing is left; a pattern no name matches.
		out = []string{"nothing.invalid"}
	}
	return out
}

func newID(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Explain decides r with the current policy only — no hold, no budget,
// no counting, no trigger — for questions that are not a request (the
// proxy naming the rule that refuses a whole connection).
func (s *Sandbox) Explain(ctx context.Context, r *policy.Request) (policy.Decision, error) {
	if s.Frozen() {
		return policy.Decision{Rule: RuleFreeze, Reason: "the sandbox is frozen: an operator cut it off the network"}, nil
	}
	r.SessionFunc = s.session
	return s.live.Decide(ctx, r)
}

// Following returns the running sandboxes of tenant that follow the
// named policy name.
func (g *Registry) Following(tenant, name string) []*Sandbox {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []*Sandbox
	for _, s := range g.sbs {
		if s.Tenant == tenant && s.Ref() == name {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *Sandbox) int { return strings.Compare(a.ID, b.ID) })
	return out
}
