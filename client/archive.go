package client

import (
	"context"
	"io"
	"net/url"
)

// ArchiveGet streams the directory (or file) at path in sandbox id as a
// tar archive (GET /v1/sandboxes/{id}/archive). The caller closes it. It
// is the guest's word: extract it with internal/tarx, which treats it as
// hostile. A body that ends early (the daemon broke the connection) is a
// read error, not a short archive.
func (c *Client) ArchiveGet(ctx context.Context, id, path string) (io.ReadCloser, error) {
	q := url.Values{"path": {path}}
	resp, err := c.open(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/archive?"+q.Encode(), "", nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ArchivePut sends the tar archive r to sandbox id, which extracts it under
// path (PUT /v1/sandboxes/{id}/archive).
func (c *Client) ArchivePut(ctx context.Context, id, path string, r io.Reader) error {
	q := url.Values{"path": {path}}
	resp, err := c.open(ctx, "PUT", "/v1/sandboxes/"+url.PathEscape(id)+"/archive?"+q.Encode(), "application/x-tar", r)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
