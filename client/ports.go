package client

import (
	"context"
	"net/url"
	"strconv"

	"github.com/cagebox/cagebox/api"
)

func portsPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) + "/ports" }

// AddPort publishes a sandbox's port through the ingress listener; the
// result carries the access token, once (again for a published port: a
// new token, the old one and its signed URLs revoked).
func (c *Client) AddPort(ctx context.Context, id string, spec api.PortSpec) (*api.Port, error) {
	var p api.Port
	return &p, c.do(ctx, "POST", portsPath(id), spec, &p)
}

// Ports lists a sandbox's published ports.
func (c *Client) Ports(ctx context.Context, id string) ([]api.Port, error) {
	var l []api.Port
	return l, c.do(ctx, "GET", portsPath(id), nil, &l)
}

// RemovePort unpublishes a port.
func (c *Client) RemovePort(ctx context.Context, id string, port int) error {
	return c.do(ctx, "DELETE", portsPath(id)+"/"+strconv.Itoa(port), nil, nil)
}

// PortURL makes a signed URL of a port valid for ttl ("" = 1h).
func (c *Client) PortURL(ctx context.Context, id string, port int, ttl string) (*api.PortURL, error) {
	var u api.PortURL
	return &u, c.do(ctx, "POST", portsPath(id)+"/"+strconv.Itoa(port)+"/url", &api.PortURLRequest{TTL: ttl}, &u)
}

// AddWebhook adds a webhook to a sandbox; the answer's URL and Token are
// shown this once.
func (c *Client) AddWebhook(ctx context.Context, id string, req *api.WebhookRequest) (*api.Webhook, error) {
	var w api.Webhook
	return &w, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/webhooks", req, &w)
}

// Webhooks lists a sandbox's webhooks.
func (c *Client) Webhooks(ctx context.Context, id string) ([]api.Webhook, error) {
	var l []api.Webhook
	return l, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/webhooks", nil, &l)
}

// RemoveWebhook removes a webhook and its queued deliveries.
func (c *Client) RemoveWebhook(ctx context.Context, id, name string) error {
	return c.do(ctx, "DELETE", "/v1/sandboxes/"+url.PathEscape(id)+"/webhooks/"+url.PathEscape(name), nil, nil)
}
