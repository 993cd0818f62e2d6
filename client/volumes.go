package client

import (
	"context"
	"net/url"

	"github.com/cagebox/cagebox/api"
)

// CreateVolume makes a named volume (size 0: the daemon's default, 1 GiB).
func (c *Client) CreateVolume(ctx context.Context, name string, sizeBytes int64) (*api.Volume, error) {
	var out api.Volume
	return &out, c.do(ctx, "POST", "/v1/volumes", &api.CreateVolumeRequest{Name: name, SizeBytes: sizeBytes}, &out)
}

// Volumes lists the caller's volumes and the sandboxes that mount them.
func (c *Client) Volumes(ctx context.Context) ([]api.Volume, error) {
	var out []api.Volume
	return out, c.do(ctx, "GET", "/v1/volumes", nil, &out)
}

// RemoveVolume deletes a volume and its data.
func (c *Client) RemoveVolume(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/volumes/"+url.PathEscape(name), nil, nil)
}
