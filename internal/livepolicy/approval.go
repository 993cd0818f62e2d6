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
