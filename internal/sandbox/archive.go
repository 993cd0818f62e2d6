package sandbox

import (
	"context"
	"io"

	"github.com/cagebox/cagebox/agentproto"
)

// ArchiveGet writes the directory (or file) at path in a running sandbox
// to w as a tar stream. The stream is the guest's word: whoever extracts
// it treats it as hostile (internal/tarx).
func (g *Guest) ArchiveGet(ctx context.Context, tenant, id, path string, w io.Writer) error {
	m := g.m
	c, err := m.guest.agentOf(ctx, tenant, id)
	if err != nil {
		return err
	}
	return c.ArchiveGet(ctx, path, w)
}

// ArchivePut extracts the tar stream r under path in a running sandbox.
func (g *Guest) ArchivePut(ctx context.Context, tenant, id, path string, r io.Reader, lim agentproto.ArchiveLimits) error {
	m := g.m
	c, err := m.guest.agentOf(ctx, tenant, id)
	if err != nil {
		return err
	}
	return c.ArchivePut(ctx, path, r, lim)
}
