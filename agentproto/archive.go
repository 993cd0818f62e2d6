package agentproto

import (
	"context"
	"fmt"
	"io"
)

// ArchiveLimits bound an archive the agent extracts; zero fields mean the
// agent's defaults (1 GiB of files, 100000 entries).
type ArchiveLimits struct {
	MaxBytes   int64
	MaxEntries int
}

// ArchiveGet writes the directory (or file) at path in the guest to w as a
// tar stream: a directory's contents with names relative to it, symlinks
// as links, device nodes and FIFOs skipped. The stream is the guest's
// word: extract it with internal/tarx, which treats it as hostile. If it
// fails after data has been written, w holds a truncated archive.
func (c *Client) ArchiveGet(ctx context.Context, path string, w io.Writer) error {
	s, err := c.open(ctx, &request{Op: opArchiveGet, Path: path})
	if err != nil {
		return err
	}
	defer s.close()
	for {
		t, p, err := s.fr.next()
		if err != nil {
			return s.err(ctx, err)
		}
		switch t {
		case frameData:
			if _, err := w.Write(p); err != nil {
				return fmt.Errorf("agentproto: archive %s: %w", path, err)
			}
		case frameEOF:
			return nil
		case frameError:
			return decodeError(p)
		default:
			return s.err(ctx, fmt.Errorf("%w: unexpected %s frame in an archive", ErrProtocol, t))
		}
	}
}

// ArchivePut streams the tar archive r to the guest, which extracts it
// under path (created if missing). Entries that would land outside path
// (absolute names, "..", through a symlink), device nodes and FIFOs are
// refused (ErrInvalid); going over lim is ErrTooLarge. What was extracted
// before a refusal stays.
func (c *Client) ArchivePut(ctx context.Context, path string, r io.Reader, lim ArchiveLimits) error {
	s, err := c.open(ctx, &request{Op: opArchivePut, Path: path, Max: lim.MaxBytes, MaxEntries: lim.MaxEntries})
	if err != nil {
		return err
	}
	defer s.close()
	// The agent waits for more after a read error: sendFrom ends its wait.
	sendErr := s.sendFrom(r, "read archive", true)
	var v struct{}
	if err := s.reply(&v); err != nil {
		select {
		case serr := <-sendErr:
			if serr != nil && ctx.Err() == nil {
				if _, ok := err.(*RemoteError); !ok {
					return fmt.Errorf("agentproto: archive into %s: %w", path, serr)
				}
			}
		default:
		}
		return s.err(ctx, err)
	}
	s.close()
	select {
	case err := <-sendErr:
		if err != nil {
			return s.err(ctx, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
