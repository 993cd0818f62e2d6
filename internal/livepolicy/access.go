package livepolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/store"
)

// AccessRule is the rule name of access requests (RequestAccess).
const AccessRule = "request_access"

// MaxAccessWait bounds how long RequestAccess waits for a decision.
const MaxAccessWait = 10 * time.Minute

// AccessResult is how an access request was decided.
type AccessResult struct {
	Approval string
	Allowed  bool
	By       string
	Reason   string
}

// RequestAccess asks an operator to let the sandbox reach host (an agent's
// request, e.g. through MCP's request_access): a pending approval like a
// held request's (approval.pending event, decided with `cagebox approvals
// approve|deny`, the API or the approval webhook's operator), waited for
// at most wait. Approved, the host (ports 80 and 443, every method and
// path) is allowed by a rule at the top of the policy for the rest of the
// session; denied or unanswered, nothing changes. reason is the agent's
// words, shown to the operator as the request's preview.
func (s *Sandbox) RequestAccess(ctx context.Context, host, reason string, wait time.Duration) (*AccessResult, error) {
	if _, err := policy.AllowHosts(host); err != nil {
		return nil, fmt.Errorf("%w: host: %v", errdefs.ErrInvalid, err)
	}
	if wait <= 0 || wait > MaxAccessWait {
		wait = MaxAccessWait
	}
	g := s.g
	id := newID("ap-")
	if len(reason) > PreviewBytes {
		reason = reason[:PreviewBytes]
	}
	held := HeldRequest{Method: "*", Host: host, Port: 443, Path: "/**", Timeout: wait.String(), Preview: reason}
	raw, _ := json.Marshal(held)
	ch, unwait := g.waiter(id)
	defer unwait()
	if err := g.cfg.Store.CreateApproval(ctx, &store.Approval{ID: id, TenantID: s.Tenant, SandboxID: s.ID, Rule: AccessRule, Request: raw, Deadline: g.cfg.Now().Add(wait)}); err != nil {
		return nil, fmt.Errorf("record the access request: %w", err)
	}
	g.cfg.Emit(s.Tenant, s.ID, api.ApprovalPending{ID: id, Rule: AccessRule, Method: "*", Host: host, Path: "/**", TimeoutMS: wait.Milliseconds()})
	v := g.await(ctx, id, ch, wait, "the request was withdrawn")
	res := &AccessResult{Approval: id, Allowed: v.allow, By: v.by, Reason: v.reason}
	if !v.allow {
		return res, nil
	}
	if _, err := s.Update(context.WithoutCancel(ctx), 0, "approval:"+id, "access requested and approved", func(doc *policy.Document) (*policy.Document, error) {
		nr := policy.Rule{Name: "access:" + id, Host: host, Ports: []int{80, 443}, Action: policy.ActionAllow}
		doc.Rules = append([]policy.Rule{nr}, doc.Rules...)
		return doc, nil
	}); err != nil {
		return nil, fmt.Errorf("approved, but the policy could not be changed: %w", err)
	}
	return res, nil
}
