package client

import (
	"context"
	"net/url"

	"github.com/cagebox/cagebox/api"
)

// AddRelay adds a relay to a sandbox: the daemon holds the connection
// and delivers what arrives to the guest's port.
func (c *Client) AddRelay(ctx context.Context, id string, req *api.RelayRequest) (*api.Relay, error) {
	var r api.Relay
	return &r, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/relays", req, &r)
}

// Relays lists a sandbox's relays with their connections' state.
func (c *Client) Relays(ctx context.Context, id string) ([]api.Relay, error) {
	var l []api.Relay
	return l, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/relays", nil, &l)
}

// RemoveRelay stops a relay and drops its queued events.
func (c *Client) RemoveRelay(ctx context.Context, id, name string) error {
	return c.do(ctx, "DELETE", "/v1/sandboxes/"+url.PathEscape(id)+"/relays/"+url.PathEscape(name), nil, nil)
}
