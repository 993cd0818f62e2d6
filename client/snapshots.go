package client

import (
	"context"
	"net/url"

	"github.com/cagebox/cagebox/api"
)

// CreateSnapshot saves the running sandbox id for new sandboxes to start
// from (name "": the daemon picks one).
func (c *Client) CreateSnapshot(ctx context.Context, id, name string) (*api.Snapshot, error) {
	var out api.Snapshot
	return &out, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/snapshots", &api.CreateSnapshotRequest{Name: name}, &out)
}

// Snapshots lists the caller's snapshots (the admin's: all).
func (c *Client) Snapshots(ctx context.Context) ([]api.Snapshot, error) {
	var out []api.Snapshot
	return out, c.do(ctx, "GET", "/v1/snapshots", nil, &out)
}

// Snapshot is one of the caller's snapshots.
func (c *Client) Snapshot(ctx context.Context, name string) (*api.Snapshot, error) {
	var out api.Snapshot
	return &out, c.do(ctx, "GET", "/v1/snapshots/"+url.PathEscape(name), nil, &out)
}

// RemoveSnapshot deletes a snapshot (refused while a sandbox started from
// it exists).
func (c *Client) RemoveSnapshot(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/snapshots/"+url.PathEscape(name), nil, nil)
}

// Fork makes copies of the running sandbox id.
func (c *Client) Fork(ctx context.Context, id string, req *api.ForkRequest) (*api.ForkResponse, error) {
	var out api.ForkResponse
	return &out, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/fork", req, &out)
}
