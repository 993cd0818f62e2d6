package livepolicy

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/store"
)

// verdict is the decision a held request receives.
type verdict struct {
	allow    bool
	by       string
	reason   string
	remember bool
}

// HeldRequest is what an approval shows of the request it holds: no header
// value, and of the body a bounded preview of what the guest sent.
type HeldRequest struct {
	Method   string `json:"method"`
	Host     string `json:"host"`
	Port     int    `json:"port"`
	Path     string `json:"path"`
	BodySize int64  `json:"body_size"`
	Timeout  string `json:"timeout"`
	// Preview is the body's first bytes (at most PreviewBytes, invalid
	// UTF-8 replaced): what the guest sent, placeholders and all — real
	// values are swapped in only after a request is allowed.
	Preview string `json:"preview,omitempty"`
}

// PreviewBytes bounds a held request's body preview.
const PreviewBytes = 1024

// WebhookRequest is what an approval webhook receives (POST, JSON). The
// header X-Cagebox-Signature is "sha256=" + hex(HMAC-SHA256(key,
// timestamp + "." + body)) with the timestamp (unix seconds) in
// X-Cagebox-Timestamp, so a receiver can check it came from this daemon
// and is fresh.
type WebhookRequest struct {
	ID       string      `json:"id"`
	Sandbox  string      `json:"sandbox"`
	Tenant   string      `json:"tenant"`
	Rule     string      `json:"rule"`
	Request  HeldRequest `json:"request"`
	Deadline time.Time   `json:"deadline"`
}

// WebhookAnswer is the webhook's answer.
type WebhookAnswer struct {
	Decision string `json:"decision"` // "allow" or "deny"
	Reason   string `json:"reason,omitempty"`
}

// Signature headers of approval webhooks.
const (
	HeaderSignature = "X-Cagebox-Signature"
	HeaderTimestamp = "X-Cagebox-Timestamp"
)

// Sign returns the signature header value for body at ts.
func Sign(key []byte, ts int64, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte("."))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// hold parks the request until it is decided (API, CLI or webhook), its
// hold times out, or its guest goes away; it returns the final decision.
func (g *Registry) hold(ctx context.Context, s *Sandbox, p *policy.Policy, r *policy.Request, d policy.Decision) policy.Decision {
	timeout := d.HoldTimeout
	if timeout <= 0 {
		timeout = policy.DefaultHoldTimeout
	}
	id := newID("ap-")
	held := HeldRequest{Method: r.Method, Host: r.Host, Port: r.Port, Path: r.Path, BodySize: r.BodySize, Timeout: timeout.String()}
	if held.Method == "" {
		held.Method = "GET"
	}
	if r.Peek != nil {
		held.Preview = strings.ToValidUTF8(string(r.Peek(PreviewBytes)), "\uFFFD")
	}
	raw, _ := json.Marshal(held)
	deadline := g.cfg.Now().Add(timeout)
	ch, unwait := g.waiter(id)
	defer unwait()
	if err := g.cfg.Store.CreateApproval(ctx, &store.Approval{ID: id, TenantID: s.Tenant, SandboxID: s.ID, Rule: d.Rule, Request: raw, Deadline: deadline}); err != nil {
		return policy.Decision{Rule: d.Rule, Reason: "the held request could not be recorded; denied"}
	}
	g.cfg.Emit(s.Tenant, s.ID, api.ApprovalPending{ID: id, Rule: d.Rule, Method: held.Method, Host: r.Host, Path: r.Path, TimeoutMS: timeout.Milliseconds()})

	if a, wt := p.Approval(); a != nil && a.Webhook != "" {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(wt, timeout))
		go func() {
			defer cancel()
			v := g.callWebhook(wctx, a.Webhook, WebhookRequest{ID: id, Sandbox: s.ID, Tenant: s.Tenant, Rule: d.Rule, Request: held, Deadline: deadline})
			if _, err := g.resolve(context.WithoutCancel(ctx), "", id, v); err != nil && !errors.Is(err, errdefs.ErrConflict) {
				g.log.Warn("record webhook decision", "approval", id, "err", err)
			}
		}()
	}

	v := g.await(ctx, id, ch, timeout, "the guest closed the request while it was held")
	if v.allow {
		if v.remember {
			s.remember(ctx, id, d.Rule, r, true)
		}
		return policy.Decision{Allow: true, Rule: d.Rule, Reason: fmt.Sprintf("rule %q held the request; %s approved it (%s)", d.Rule, v.by, id)}
	}
	if v.remember {
		s.remember(ctx, id, d.Rule, r, false)
	}
	why := v.reason
	if why == "" {
		why = "denied by " + v.by
	}
	return policy.Decision{Rule: d.Rule, Reason: fmt.Sprintf("rule %q held the request and it was not approved: %s (%s)", d.Rule, why, id)}
}

// waiter registers the channel a decision on approval id is sent to;
// unwait forgets it.
func (g *Registry) waiter(id string) (ch chan verdict, unwait func()) {
	ch = make(chan verdict, 1)
	g.mu.Lock()
	g.waiters[id] = ch
	g.mu.Unlock()
	return ch, func() {
		g.mu.Lock()
		delete(g.waiters, id)
		g.mu.Unlock()
	}
}

// await waits for the decision on approval id (sent on ch) for at most
// timeout; unanswered it expires the approval, and a caller that goes
// away (ctx) withdraws it, saying gone.
func (g *Registry) await(ctx context.Context, id string, ch chan verdict, timeout time.Duration, gone string) verdict {
	t := time.NewTimer(timeout)
	defer t.Stop()
	var v verdict
	select {
	case v = <-ch:
	case <-t.C:
		v = verdict{by: "timeout", reason: fmt.Sprintf("no decision within %s", timeout)}
		if _, err := g.finish(context.WithoutCancel(ctx), "", id, store.ApprovalExpired, v); errors.Is(err, errdefs.ErrConflict) {
			// Decided at the very last moment: take that decision.
			select {
			case v = <-ch:
			default:
			}
		}
	case <-ctx.Done():
		v = verdict{by: "guest", reason: gone}
		_, _ = g.finish(context.WithoutCancel(ctx), "", id, store.ApprovalExpired, v)
	}
	return v
}

// Decide answers a held request: allow or deny, by whom, and whether to
// remember it as a rule for the rest of the session. tenantID "" is the
// admin. ErrConflict if it was already decided (or timed out).
func (g *Registry) Decide(ctx context.Context, tenantID, id string, allow, remember bool, by, reason string) (*store.Approval, error) {
	return g.resolve(ctx, tenantID, id, verdict{allow: allow, by: by, reason: reason, remember: remember})
}

func (g *Registry) resolve(ctx context.Context, tenantID, id string, v verdict) (*store.Approval, error) {
	state := store.ApprovalDenied
	if v.allow {
		state = store.ApprovalAllowed
	}
	return g.finish(ctx, tenantID, id, state, v)
}

// finish records the decision (once: the store refuses a second) and
// wakes the waiter.
func (g *Registry) finish(ctx context.Context, tenantID, id, state string, v verdict) (*store.Approval, error) {
	a, err := g.cfg.Store.DecideApproval(ctx, tenantID, id, state, v.by, v.reason, v.remember)
	if errors.Is(err, store.ErrConflict) {
		return a, fmt.Errorf("%w: approval %s was already %s", errdefs.ErrConflict, id, a.State)
	}
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	ch := g.waiters[id]
	g.mu.Unlock()
	if ch != nil {
		select {
		case ch <- v:
		default:
		}
	}
	g.cfg.Emit(a.TenantID, a.SandboxID, api.ApprovalDecided{ID: id, Rule: a.Rule, State: state, By: v.by, Reason: v.reason, Remember: v.remember})
	return a, nil
}

// remember turns a decision into a rule at the top of the policy for the
// rest of the session: this method, host and exact path.
func (s *Sandbox) remember(ctx context.Context, id, rule string, r *policy.Request, allow bool) {
	action := policy.ActionDeny
	if allow {
		action = policy.ActionAllow
	}
	method := r.Method
	if method == "" {
		method = "GET"
	}
	_, err := s.Update(ctx, 0, "approval:"+id, "remembered decision", func(doc *policy.Document) (*policy.Document, error) {
		nr := policy.Rule{Name: "approval:" + id, Host: r.Host, Ports: []int{r.Port}, Methods: []string{method}, Action: action}
		if p := r.Path; p != "" && p != "/" && policy.ValidPathPattern(p) {
			nr.Paths = []string{p}
		}
		doc.Rules = append([]policy.Rule{nr}, doc.Rules...)
		return doc, nil
	})
	if err != nil {
		s.g.log.Warn("remember approval", "sandbox", s.ID, "approval", id, "rule", rule, "err", err)
	}
}

// maxWebhookAnswer bounds the webhook's answer.
const maxWebhookAnswer = 64 << 10

// What a held request's approval shows of a webhook that did not decide:
// fixed texts, never the status, the transport error or the answer's
// bytes (the URL is the tenant's: the reason would be a probe of what
// answers where). The operator's log has the detail.
const (
	webhookUnreachable = "approval webhook unreachable"
	webhookBadAnswer   = "approval webhook gave no allow or deny answer"
)

// WebhookKey is the key a tenant's approval webhooks are signed with:
// HMAC-SHA256 of the daemon's key over the tenant's ID (hex), so no
// tenant's receiver can sign for another's. The daemon's key itself is
// given to nobody.
func WebhookKey(daemonKey []byte, tenant string) []byte {
	m := hmac.New(sha256.New, daemonKey)
	m.Write([]byte("cagebox approval webhook key v1\x00"))
	m.Write([]byte(tenant))
	return []byte(hex.EncodeToString(m.Sum(nil)))
}

func (g *Registry) callWebhook(ctx context.Context, url string, wr WebhookRequest) verdict {
	body, _ := json.Marshal(wr)
	log := g.log.With("approval", wr.ID, "sandbox", wr.Sandbox, "tenant", wr.Tenant)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		log.Warn("approval webhook request", "err", err)
		return verdict{by: "webhook", reason: webhookUnreachable}
	}
	ts := g.cfg.Now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, Sign(WebhookKey(g.cfg.WebhookKey, wr.Tenant), ts, body))
	resp, err := g.cfg.WebhookClient.Do(req)
	if err != nil {
		log.Warn("approval webhook unreachable", "err", err)
		return verdict{by: "webhook", reason: webhookUnreachable}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		log.Warn("approval webhook answered", "status", resp.StatusCode)
		return verdict{by: "webhook", reason: webhookBadAnswer}
	}
	var ans WebhookAnswer
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxWebhookAnswer)).Decode(&ans); err != nil {
		log.Warn("approval webhook answer", "err", err)
		return verdict{by: "webhook", reason: webhookBadAnswer}
	}
	switch ans.Decision {
	case "allow":
		return verdict{allow: true, by: "webhook", reason: ans.Reason}
	case "deny":
		if ans.Reason == "" {
			ans.Reason = "the webhook denied it"
		}
		return verdict{by: "webhook", reason: ans.Reason}
	}
	log.Warn("approval webhook answer", "decision", ans.Decision)
	return verdict{by: "webhook", reason: webhookBadAnswer}
}

// Admin is the operator's principal (the admin tenant's id). A freeze is
// owned by the principal that made it; only that principal or the admin
// lifts it, and a tenant's freeze of a scope the admin froze leaves the
// admin its owner: a tenant never undoes the operator.
const Admin = "admin"

// Actor is who freezes or thaws: Principal is Admin or a tenant's id (the
// freeze's owner), By is what events name (e.g. "api:alpha", "trigger:x").
type Actor struct {
	Principal, By string
}

// Freeze cuts sandboxes off the network at once: by id, every sandbox of
// a tenant, or all (the admin's only). Their open connections are closed,
// DNS refuses and every request is denied (placeholders never reach a
// swap) until Thaw. The freeze records who made it; a freeze by a tenant
// of a scope the admin already froze stays the admin's. It returns the
// sandboxes affected.
func (g *Registry) Freeze(sc Scope, who Actor) ([]string, error) {
	if sc.All && who.Principal != Admin {
		return nil, fmt.Errorf("%w: freezing all sandboxes is for the admin; freeze your tenant instead", errdefs.ErrDenied)
	}
	g.mu.Lock()
	var hit []*Sandbox
	switch {
	case sc.All:
		g.frozenAll = true
		for _, s := range g.sbs {
			hit = append(hit, s)
		}
	case sc.Tenant != "":
		g.frozenTenants[sc.Tenant] = owner(g.frozenTenants[sc.Tenant], who.Principal)
		for _, s := range g.sbs {
			if s.Tenant == sc.Tenant {
				hit = append(hit, s)
			}
		}
	default:
		if s := g.sbs[sc.Sandbox]; s != nil {
			s.mu.Lock()
			s.frozenBy = owner(s.frozenBy, who.Principal)
			s.mu.Unlock()
			hit = append(hit, s)
		}
	}
	g.mu.Unlock()
	if g.cfg.CloseConns != nil {
		for _, s := range hit {
			g.cfg.CloseConns(s.ID)
		}
	}
	return g.emitFreeze(sc, hit, true, who.By), nil
}

// owner is who owns a freeze after p freezes a scope cur froze ("" none):
// the admin's stays the admin's.
func owner(cur, p string) string {
	if cur == Admin {
		return Admin
	}
	return p
}

// Thaw lifts freezes of the scope that who owns; the admin lifts any.
// Thawing a tenant or all also lifts the sandbox-level freezes under it
// that who owns (the admin's stay when a tenant thaws: they are listed in
// stillFrozen). A freeze of the scope, or above it, that another
// principal owns refuses the whole thaw with an error wrapping
// errdefs.ErrDenied that names its owner.
func (g *Registry) Thaw(sc Scope, who Actor) (thawed, stillFrozen []string, err error) {
	admin := who.Principal == Admin
	g.mu.Lock()
	var hit []*Sandbox
	switch {
	case sc.All:
		if !admin {
			g.mu.Unlock()
			return nil, nil, refuseThaw("every sandbox", Admin)
		}
		g.frozenAll = false
		clear(g.frozenTenants)
		for _, s := range g.sbs {
			hit = append(hit, s)
		}
	case sc.Tenant != "":
		if err := g.mayThawLocked(sc.Tenant, "", who.Principal); err != nil {
			g.mu.Unlock()
			return nil, nil, err
		}
		delete(g.frozenTenants, sc.Tenant)
		for _, s := range g.sbs {
			if s.Tenant == sc.Tenant {
				hit = append(hit, s)
			}
		}
	default:
		s := g.sbs[sc.Sandbox]
		if s == nil {
			break
		}
		s.mu.Lock()
		by := s.frozenBy
		s.mu.Unlock()
		if err := g.mayThawLocked(s.Tenant, sc.Sandbox, who.Principal); err != nil {
			g.mu.Unlock()
			return nil, nil, err
		}
		if by != "" && !admin && by != who.Principal {
			g.mu.Unlock()
			return nil, nil, refuseThaw("sandbox "+sc.Sandbox, by)
		}
		hit = append(hit, s)
	}
	// Lift the sandbox-level freezes who owns (g.mu held: a freeze made
	// meanwhile is not lost).
	var done []*Sandbox
	for _, s := range hit {
		s.mu.Lock()
		if s.frozenBy == "" || admin || s.frozenBy == who.Principal {
			s.frozenBy = ""
			done = append(done, s)
		} else {
			stillFrozen = append(stillFrozen, s.ID)
		}
		s.mu.Unlock()
	}
	g.mu.Unlock()
	return g.emitFreeze(sc, done, false, who.By), stillFrozen, nil
}

// mayThawLocked refuses p a thaw under a freeze of everything or of
// tenant's sandboxes that another principal owns (g.mu held). sandbox
// names the target in the message when the thaw is of one sandbox.
func (g *Registry) mayThawLocked(tenant, sandbox, p string) error {
	if p == Admin {
		return nil
	}
	among := ""
	if sandbox != "" {
		among = " (sandbox " + sandbox + " among them)"
	}
	if g.frozenAll {
		return refuseThaw("every sandbox"+among, Admin)
	}
	if o := g.frozenTenants[tenant]; o != "" && o != p {
		return refuseThaw("tenant "+tenant+"'s sandboxes"+among, o)
	}
	return nil
}

// refuseThaw is the 403 of a thaw of what, which by froze.
func refuseThaw(what, by string) error {
	if by == Admin {
		return fmt.Errorf("%w: %s: frozen by the admin; only the admin can thaw it (ask your operator)", errdefs.ErrDenied, what)
	}
	return fmt.Errorf("%w: %s: frozen by tenant %s; only tenant %s or the admin can thaw it", errdefs.ErrDenied, what, by, by)
}

// emitFreeze sends each sandbox's frozen or thawed event and returns
// their ids.
func (g *Registry) emitFreeze(sc Scope, hit []*Sandbox, on bool, by string) []string {
	ids := make([]string, 0, len(hit))
	for _, s := range hit {
		var ev api.EventPayload = api.PolicyThawed{By: by, Scope: scopeName(sc)}
		if on {
			ev = api.PolicyFrozen{By: by, Scope: scopeName(sc)}
		}
		g.cfg.Emit(s.Tenant, s.ID, ev)
		ids = append(ids, s.ID)
	}
	return ids
}

// Scope names what Freeze and Thaw apply to: one sandbox, one tenant's
// sandboxes, or All.
type Scope struct {
	Sandbox, Tenant string
	All             bool
}

func scopeName(sc Scope) string {
	switch {
	case sc.All:
		return "all"
	case sc.Tenant != "":
		return "tenant:" + sc.Tenant
	}
	return "sandbox"
}

// freezeSelf freezes the sandbox on behalf of its own policy (a trigger
// that could not be applied fails closed): the tenant owns that freeze,
// as it owns the policy.
func (s *Sandbox) freezeSelf(by string) {
	_, _ = s.g.Freeze(Scope{Sandbox: s.ID}, Actor{Principal: s.Tenant, By: by})
}
