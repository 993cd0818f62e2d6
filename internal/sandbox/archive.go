package sandbox

import (
	"context"
	"io"

	"github.com/cagebox/cagebox/agentproto"
)

// ArchiveGet writes the directory (or file) at path in a running sandbox
// to w as a tar stream. The stream is the guest's word: whoever extracts
// it treats it as hostile (internal/tarx).
func (m *Manager) ArchiveGet(ctx context.Context, tenant, id, path string, w io.Writer) error {
	c, err := m.agentOf(ctx, tenant, id)
	if err != nil {
		return err
	}
	return c.ArchiveGet(ctx, path, w)
}

// ArchivePut extracts the tar stream r under path in a running sandbox.
func (m *Manager) ArchivePut(ctx context.Context, tenant, id, path string, r io.Reader, lim agentproto.ArchiveLimits) error {
	c, err := m.agentOf(ctx, tenant, id)
	if err != nil {
		return err
	}
	return c.ArchivePut(ctx, path, r, lim)
}
