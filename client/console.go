package client

import (
	"context"

	"github.com/cagebox/cagebox/api"
)

// ConsoleSession asks the daemon for a one-time web console link (admin,
// over the unix socket only).
func (c *Client) ConsoleSession(ctx context.Context) (*api.ConsoleSession, error) {
	var out api.ConsoleSession
	return &out, c.do(ctx, "POST", "/v1/console/sessions", nil, &out)
}
