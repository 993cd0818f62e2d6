package client

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/url"
	"strconv"

	"github.com/cagebox/cagebox/api"
)

// sendDoc sends a policy document (JSON or YAML bytes) with an optional
// If-Match generation and decodes the JSON answer into out.
func (c *Client) sendDoc(ctx context.Context, method, path string, doc []byte, ifGen int64, out any) error {
	r, err := c.req(ctx, method, path, bytes.NewReader(doc))
	if err != nil {
		return err
	}
	ct := "application/yaml"
	if t := bytes.TrimLeft(doc, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		ct = "application/json"
	}
	r.Header.Set("Content-Type", ct)
	if ifGen > 0 {
		r.Header.Set("If-Match", strconv.FormatInt(ifGen, 10))
	}
	resp, err := c.http.Do(r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return decodeError(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Policy returns a running sandbox's live policy.
func (c *Client) Policy(ctx context.Context, id string) (*api.SandboxPolicy, error) {
	var p api.SandboxPolicy
	return &p, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/policy", nil, &p)
}

// SetPolicy replaces a sandbox's policy with doc (JSON or YAML); ifGen > 0
// refuses (409) if the policy is no longer at that generation.
func (c *Client) SetPolicy(ctx context.Context, id string, doc []byte, ifGen int64) (*api.SandboxPolicy, error) {
	var p api.SandboxPolicy
	return &p, c.sendDoc(ctx, "PUT", "/v1/sandboxes/"+url.PathEscape(id)+"/policy", doc, ifGen, &p)
}

// PatchPolicy adds, removes or moves one rule.
func (c *Client) PatchPolicy(ctx context.Context, id string, patch *api.PolicyPatch) (*api.SandboxPolicy, error) {
	var p api.SandboxPolicy
	return &p, c.do(ctx, "PATCH", "/v1/sandboxes/"+url.PathEscape(id)+"/policy", patch, &p)
}

// PolicyHistory lists every generation of a sandbox's policy.
func (c *Client) PolicyHistory(ctx context.Context, id string) ([]api.PolicyVersion, error) {
	var vs []api.PolicyVersion
	return vs, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/policy/history", nil, &vs)
}

// PolicyUsage lists what a sandbox used of each budget.
func (c *Client) PolicyUsage(ctx context.Context, id string) ([]api.BudgetUsage, error) {
	var us []api.BudgetUsage
	return us, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/policy/usage", nil, &us)
}

// CreateNamedPolicy creates a tenant's named policy.
func (c *Client) CreateNamedPolicy(ctx context.Context, name string, doc []byte) (*api.NamedPolicy, error) {
	var p api.NamedPolicy
	return &p, c.sendDoc(ctx, "POST", "/v1/policies?name="+url.QueryEscape(name), doc, 0, &p)
}

// UpdateNamedPolicy replaces a named policy and the policy of every
// running sandbox following it.
func (c *Client) UpdateNamedPolicy(ctx context.Context, name string, doc []byte, ifGen int64) (*api.NamedPolicy, error) {
	var p api.NamedPolicy
	return &p, c.sendDoc(ctx, "PUT", "/v1/policies/"+url.PathEscape(name), doc, ifGen, &p)
}

// NamedPolicies lists the tenant's named policies.
func (c *Client) NamedPolicies(ctx context.Context) ([]api.NamedPolicy, error) {
	var ps []api.NamedPolicy
	return ps, c.do(ctx, "GET", "/v1/policies", nil, &ps)
}

// NamedPolicy returns one named policy.
func (c *Client) NamedPolicy(ctx context.Context, name string) (*api.NamedPolicy, error) {
	var p api.NamedPolicy
	return &p, c.do(ctx, "GET", "/v1/policies/"+url.PathEscape(name), nil, &p)
}

// DeleteNamedPolicy deletes a named policy no running sandbox follows.
func (c *Client) DeleteNamedPolicy(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/policies/"+url.PathEscape(name), nil, nil)
}

// Approvals lists held requests (state and sandbox filter when not "").
func (c *Client) Approvals(ctx context.Context, state, sandbox string) ([]api.Approval, error) {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	if sandbox != "" {
		q.Set("sandbox", sandbox)
	}
	var as []api.Approval
	return as, c.do(ctx, "GET", "/v1/approvals?"+q.Encode(), nil, &as)
}

// ApprovalWebhookKey returns the key the caller's tenant's approval
// webhooks are signed with (tenant: another's, for the admin).
func (c *Client) ApprovalWebhookKey(ctx context.Context, tenant string) (*api.WebhookKey, error) {
	q := url.Values{}
	if tenant != "" {
		q.Set("tenant", tenant)
	}
	var k api.WebhookKey
	return &k, c.do(ctx, "GET", "/v1/approvals/webhook-key?"+q.Encode(), nil, &k)
}

// DecideApproval allows or denies a held request.
func (c *Client) DecideApproval(ctx context.Context, id string, d *api.ApprovalDecision) (*api.Approval, error) {
	var a api.Approval
	return &a, c.do(ctx, "POST", "/v1/approvals/"+url.PathEscape(id), d, &a)
}

// Freeze cuts sandboxes off the network; Thaw restores them.
func (c *Client) Freeze(ctx context.Context, req *api.FreezeRequest) (*api.FreezeResult, error) {
	var r api.FreezeResult
	return &r, c.do(ctx, "POST", "/v1/freeze", req, &r)
}

// Thaw undoes Freeze for the same scope.
func (c *Client) Thaw(ctx context.Context, req *api.FreezeRequest) (*api.FreezeResult, error) {
	var r api.FreezeResult
	return &r, c.do(ctx, "POST", "/v1/thaw", req, &r)
}
