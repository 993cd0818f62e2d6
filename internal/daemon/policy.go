package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/livepolicy"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/store"
)

// The live policy endpoints: a running sandbox's policy (GET, PUT, PATCH,
// history, usage), the tenant's named policies, approvals of held
// requests, and freeze/thaw. A sandbox, policy or approval of another
// tenant answers 404.

// livePolicy returns the live policy of a running sandbox of t.
func (s *Server) livePolicy(r *http.Request, t *store.Tenant) (*livepolicy.Sandbox, error) {
	id := r.PathValue("id")
	if _, err := s.mgr.Get(r.Context(), scope(t), id); err != nil {
		return nil, err
	}
	reg := s.mgr.Live()
	if reg == nil {
		return nil, fmt.Errorf("%w: this daemon runs sandboxes without a network; there is no policy to change", errdefs.ErrUnavailable)
	}
	lp, ok := reg.Get(id)
	if !ok {
		return nil, fmt.Errorf("%w: sandbox %q is not running; its policy can change only while it runs", errdefs.ErrConflict, id)
	}
	return lp, nil
}

// writePolicy answers with the sandbox's policy in force, its generation
// also as the ETag (what If-Match takes).
func writePolicy(w http.ResponseWriter, lp *livepolicy.Sandbox) error {
	doc, gen, ref := lp.Policy()
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	w.Header().Set("ETag", strconv.FormatInt(gen, 10))
	writeJSON(w, 200, &api.SandboxPolicy{Generation: gen, Policy: b, Ref: ref, Frozen: lp.Frozen()})
	return nil
}

func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	lp, err := s.livePolicy(r, t)
	if err != nil {
		return err
	}
	return writePolicy(w, lp)
}

// ifMatch reads If-Match: a generation (optionally quoted); 0 if absent.
func ifMatch(r *http.Request) (int64, error) {
	h := strings.Trim(strings.TrimSpace(r.Header.Get("If-Match")), `"`)
	if h == "" || h == "*" {
		return 0, nil
	}
	g, err := strconv.ParseInt(h, 10, 64)
	if err != nil || g < 1 {
		return 0, fmt.Errorf("%w: If-Match: %q is not a policy generation (GET the policy for it)", errdefs.ErrInvalid, h)
	}
	return g, nil
}

// readDocument reads a policy document body (JSON or YAML).
func readDocument(r *http.Request) (*policy.Document, error) {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, policy.MaxDocumentSize+1))
	if err != nil {
		return nil, fmt.Errorf("%w: policy body: %v (the limit is %d bytes)", errdefs.ErrInvalid, err, policy.MaxDocumentSize)
	}
	d, err := policy.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	return d, nil
}

func actor(t *store.Tenant) string { return "api:" + t.ID }

// principal is who owns what t does (a freeze): livepolicy.Admin for the
// admin, else the tenant's id.
func principal(t *store.Tenant) string {
	if t.ID == adminTenantID {
		return livepolicy.Admin
	}
	return t.ID
}

func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	lp, err := s.livePolicy(r, t)
	if err != nil {
		return err
	}
	gen, err := ifMatch(r)
	if err != nil {
		return err
	}
	doc, err := readDocument(r)
	if err != nil {
		return err
	}
	// An explicit document replaces the named policy the sandbox followed.
	if _, err := lp.Replace(r.Context(), doc, gen, actor(t), r.URL.Query().Get("reason"), ""); err != nil {
		return err
	}
	return writePolicy(w, lp)
}

func (s *Server) patchPolicy(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	lp, err := s.livePolicy(r, t)
	if err != nil {
		return err
	}
	gen, err := ifMatch(r)
	if err != nil {
		return err
	}
	var p api.PolicyPatch
	if err := decode(r, &p); err != nil {
		return err
	}
	edit, err := patchEdit(&p)
	if err != nil {
		return err
	}
	if _, err := lp.Update(r.Context(), gen, actor(t), p.Op+" rule", edit); err != nil {
		return err
	}
	return writePolicy(w, lp)
}

// patchEdit turns a PATCH into an edit of the document.
func patchEdit(p *api.PolicyPatch) (func(*policy.Document) (*policy.Document, error), error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: patch: %s", errdefs.ErrInvalid, fmt.Sprintf(format, args...))
	}
	idx := func(n int) (int, error) {
		if p.Index == nil {
			return 0, nil
		}
		if *p.Index < 0 || *p.Index > n {
			return 0, bad("index %d is out of range; the policy has %d rules (0 is first, %d is last)", *p.Index, n, n)
		}
		return *p.Index, nil
	}
	find := func(d *policy.Document) (int, error) {
		i := slices.IndexFunc(d.Rules, func(r policy.Rule) bool { return r.Name == p.Name })
		if i < 0 {
			return 0, fmt.Errorf("%w: no rule is named %q (cagebox policy get lists them)", errdefs.ErrNotFound, p.Name)
		}
		return i, nil
	}
	switch p.Op {
	case "add":
		if len(p.Rule) == 0 {
			return nil, bad("add needs rule: {host, action, ...}")
		}
		var rule policy.Rule
		dec := json.NewDecoder(strings.NewReader(string(p.Rule)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rule); err != nil {
			return nil, bad("rule: %v", err)
		}
		return func(d *policy.Document) (*policy.Document, error) {
			if rule.Name != "" && slices.ContainsFunc(d.Rules, func(r policy.Rule) bool { return r.Name == rule.Name }) {
				return nil, fmt.Errorf("%w: a rule is already named %q; remove it first or choose another name", errdefs.ErrConflict, rule.Name)
			}
			i, err := idx(len(d.Rules))
			if err != nil {
				return nil, err
			}
			if rule.Name == "" {
				rule.Name = uniqueName(d, rule)
			}
			d.Rules = slices.Insert(d.Rules, i, rule)
			if rule.Action == policy.ActionHold || rule.When != "" || rule.Timeout != "" {
				d.Version = 2
			}
			return d, nil
		}, nil
	case "remove":
		if p.Name == "" {
			return nil, bad("remove needs name")
		}
		return func(d *policy.Document) (*policy.Document, error) {
			i, err := find(d)
			if err != nil {
				return nil, err
			}
			d.Rules = slices.Delete(d.Rules, i, i+1)
			return d, nil
		}, nil
	case "move":
		if p.Name == "" || p.Index == nil {
			return nil, bad("move needs name and index")
		}
		return func(d *policy.Document) (*policy.Document, error) {
			i, err := find(d)
			if err != nil {
				return nil, err
			}
			rule := d.Rules[i]
			d.Rules = slices.Delete(d.Rules, i, i+1)
			j, err := idx(len(d.Rules))
			if err != nil {
				return nil, err
			}
			d.Rules = slices.Insert(d.Rules, j, rule)
			return d, nil
		}, nil
	}
	return nil, bad("op %q: write add, remove or move", p.Op)
}

// uniqueName names an added rule after its action and host.
func uniqueName(d *policy.Document, r policy.Rule) string {
	base := r.Action + ":" + strings.TrimPrefix(r.Host, "*.")
	if len(base) > policy.MaxNameLen-4 {
		base = base[:policy.MaxNameLen-4]
	}
	name := base
	for n := 2; slices.ContainsFunc(d.Rules, func(x policy.Rule) bool { return x.Name == name }); n++ {
		name = base + "#" + strconv.Itoa(n)
	}
	return name
}

func (s *Server) policyHistory(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	id := r.PathValue("id")
	if _, err := s.mgr.Get(r.Context(), scope(t), id); err != nil {
		return err
	}
	vs, err := s.store.ListPolicyVersions(r.Context(), scope(t), id)
	if err != nil {
		return err
	}
	out := make([]api.PolicyVersion, 0, len(vs))
	for _, v := range vs {
		out = append(out, api.PolicyVersion{Generation: v.Generation, Actor: v.Actor, Reason: v.Reason, CreatedAt: v.CreatedAt, Policy: v.Document})
	}
	writeJSON(w, 200, out)
	return nil
}

func (s *Server) policyUsage(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	lp, err := s.livePolicy(r, t)
	if err != nil {
		return err
	}
	out := []api.BudgetUsage{}
	for _, b := range lp.Usage() {
		out = append(out, api.BudgetUsage{
			Name: b.Budget.Name, Requests: b.Used.Requests, BytesUp: b.Used.BytesUp, BytesDown: b.Used.BytesDown, Spend: b.Spent,
			MaxRequests: b.Budget.Requests, MaxBytesUp: b.Budget.BytesUp, MaxBytesDown: b.Budget.BytesDown, MaxSpend: b.Budget.Spend,
			Rate: b.Budget.Rate, Exhausted: b.Exhausted,
		})
	}
	writeJSON(w, 200, out)
	return nil
}

// Named policies.

func namedView(p *store.NamedPolicy, updated []string) api.NamedPolicy {
	return api.NamedPolicy{Name: p.Name, Generation: p.Generation, Policy: p.Document, UpdatedAt: p.UpdatedAt, Updated: updated}
}

func validPolicyName(name string) error {
	if name == "" || len(name) > policy.MaxNameLen || strings.ContainsAny(name, "/ \t\n") {
		return fmt.Errorf("%w: policy name %q: 1-%d characters, no spaces or slashes", errdefs.ErrInvalid, name, policy.MaxNameLen)
	}
	return nil
}

func (s *Server) createNamedPolicy(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	name := r.URL.Query().Get("name")
	if err := validPolicyName(name); err != nil {
		return err
	}
	doc, err := readDocument(r)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(doc)
	p := &store.NamedPolicy{TenantID: t.ID, Name: name, Document: b}
	if err := s.store.PutNamedPolicy(r.Context(), p, 0); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("%w: a policy named %q exists; update it with PUT /v1/policies/%s", errdefs.ErrConflict, name, name)
		}
		return err
	}
	writeJSON(w, 201, namedView(p, nil))
	return nil
}

func (s *Server) listNamedPolicies(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	ps, err := s.store.ListNamedPolicies(r.Context(), t.ID)
	if err != nil {
		return err
	}
	out := make([]api.NamedPolicy, 0, len(ps))
	for _, p := range ps {
		out = append(out, namedView(p, nil))
	}
	writeJSON(w, 200, out)
	return nil
}

func (s *Server) getNamedPolicy(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	p, err := s.store.GetNamedPolicy(r.Context(), t.ID, r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, namedView(p, nil))
	return nil
}

// updateNamedPolicy replaces a named policy and every running sandbox of
// the tenant that follows it (each gets a new generation).
func (s *Server) updateNamedPolicy(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	name := r.PathValue("name")
	gen, err := ifMatch(r)
	if err != nil {
		return err
	}
	if gen == 0 {
		gen = -1
	}
	doc, err := readDocument(r)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(doc)
	p := &store.NamedPolicy{TenantID: t.ID, Name: name, Document: b}
	if err := s.store.PutNamedPolicy(r.Context(), p, gen); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: no policy is named %q; create it with `cagebox policy create %s FILE`", errdefs.ErrNotFound, name, name)
		}
		return err
	}
	var updated []string
	if reg := s.mgr.Live(); reg != nil {
		updated, err = reg.ApplyNamed(r.Context(), t.ID, name, doc, p.Generation)
	}
	writeJSON(w, 200, namedView(p, updated))
	return err
}

func (s *Server) deleteNamedPolicy(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	name := r.PathValue("name")
	if reg := s.mgr.Live(); reg != nil && len(reg.Following(t.ID, name)) > 0 {
		return fmt.Errorf("%w: running sandboxes follow policy %q; set their policies first", errdefs.ErrConflict, name)
	}
	if err := s.store.DeleteNamedPolicy(r.Context(), t.ID, name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// Approvals.

func approvalView(a *store.Approval) api.Approval {
	return api.Approval{ID: a.ID, Sandbox: a.SandboxID, Rule: a.Rule, Request: a.Request, State: a.State, DecidedBy: a.DecidedBy,
		Reason: a.Reason, Remember: a.Remember, CreatedAt: a.CreatedAt, Deadline: a.Deadline}
}

func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	q := r.URL.Query()
	state := q.Get("state")
	switch state {
	case "", store.ApprovalPending, store.ApprovalAllowed, store.ApprovalDenied, store.ApprovalExpired:
	default:
		return fmt.Errorf("%w: state %q: write pending, allowed, denied or expired", errdefs.ErrInvalid, state)
	}
	as, err := s.store.ListApprovals(r.Context(), scope(t), q.Get("sandbox"), state, 0)
	if err != nil {
		return err
	}
	out := make([]api.Approval, 0, len(as))
	for _, a := range as {
		out = append(out, approvalView(a))
	}
	writeJSON(w, 200, out)
	return nil
}

// approvalWebhookKey shows the caller's tenant its approval-webhook
// signing key (the admin any tenant's, ?tenant=ID).
func (s *Server) approvalWebhookKey(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	if len(s.webhookKey) == 0 {
		return fmt.Errorf("%w: this daemon signs no approval webhooks", errdefs.ErrUnavailable)
	}
	tenant := t.ID
	if q := r.URL.Query().Get("tenant"); q != "" && q != t.ID {
		if t.ID != adminTenantID {
			return fmt.Errorf("%w: a tenant sees only its own webhook key: leave out ?tenant", errdefs.ErrDenied)
		}
		tenant = q
	}
	writeJSON(w, http.StatusOK, api.WebhookKey{Tenant: tenant, Key: string(livepolicy.WebhookKey(s.webhookKey, tenant))})
	return nil
}

func (s *Server) decideApproval(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var d api.ApprovalDecision
	if err := decode(r, &d); err != nil {
		return err
	}
	if d.Decision != "allow" && d.Decision != "deny" {
		return fmt.Errorf("%w: decision %q: write allow or deny", errdefs.ErrInvalid, d.Decision)
	}
	reg := s.mgr.Live()
	if reg == nil {
		return fmt.Errorf("%w: no live policy here", errdefs.ErrUnavailable)
	}
	a, err := reg.Decide(r.Context(), scope(t), r.PathValue("id"), d.Decision == "allow", d.Remember, actor(t), d.Reason)
	if err != nil {
		return err
	}
	writeJSON(w, 200, approvalView(a))
	return nil
}

// Freeze and thaw.

func (s *Server) freeze(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	return s.setFreeze(w, r, t, true)
}

func (s *Server) thaw(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	return s.setFreeze(w, r, t, false)
}

func (s *Server) setFreeze(w http.ResponseWriter, r *http.Request, t *store.Tenant, on bool) error {
	var req api.FreezeRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	n := 0
	for _, set := range []bool{req.Sandbox != "", req.Tenant != "", req.All} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("%w: name exactly one of sandbox, tenant or all", errdefs.ErrInvalid)
	}
	reg := s.mgr.Live()
	if reg == nil {
		return fmt.Errorf("%w: no live policy here", errdefs.ErrUnavailable)
	}
	var sc livepolicy.Scope
	switch {
	case req.Sandbox != "":
		if _, err := s.mgr.Get(r.Context(), scope(t), req.Sandbox); err != nil {
			return err
		}
		sc.Sandbox = req.Sandbox
	case req.Tenant != "":
		if t.ID != adminTenantID && req.Tenant != t.ID {
			return fmt.Errorf("%w: no tenant %q", errdefs.ErrNotFound, req.Tenant)
		}
		sc.Tenant = req.Tenant
	default:
		if t.ID != adminTenantID {
			return fmt.Errorf("%w: freezing all sandboxes is for the admin; freeze your tenant instead", errdefs.ErrDenied)
		}
		sc.All = true
	}
	who := livepolicy.Actor{Principal: principal(t), By: actor(t)}
	var res api.FreezeResult
	var err error
	if on {
		res.Sandboxes, err = reg.Freeze(r.Context(), sc, who)
	} else {
		res.Sandboxes, res.StillFrozen, err = reg.Thaw(r.Context(), sc, who)
	}
	if err != nil {
		return err
	}
	if res.Sandboxes == nil {
		res.Sandboxes = []string{}
	}
	writeJSON(w, 200, &res)
	return nil
}
