package daemon

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

// Archive limits for PUT: the body, the files' total size and the number
// of entries the agent extracts.
const (
	maxArchiveBody    = 2 << 30
	maxArchiveBytes   = 1 << 30
	maxArchiveEntries = 100_000
)

// getArchive: GET /v1/sandboxes/{id}/archive?path=/dir answers the guest
// directory (or file) as application/x-tar. The answer is streamed: an
// error before the first byte is the usual JSON answer; one after it
// breaks the connection, so a client sees a truncated body, never a
// short archive that looks whole.
func (s *Server) getArchive(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	lw := &lazyTar{w: w}
	if err := s.mgr.Guest().ArchiveGet(r.Context(), scope(t), r.PathValue("id"), p, lw); err != nil {
		if !lw.started {
			return archiveErr(err)
		}
		s.log.Warn("archive: failed mid-stream", "sandbox", r.PathValue("id"), "err", err)
		panic(http.ErrAbortHandler)
	}
	if !lw.started {
		lw.start()
	}
	return nil
}

// lazyTar sends the 200 header with the first bytes of the archive.
type lazyTar struct {
	w       http.ResponseWriter
	started bool
}

func (l *lazyTar) start() {
	l.started = true
	l.w.Header().Set("Content-Type", "application/x-tar")
	l.w.WriteHeader(http.StatusOK)
}

func (l *lazyTar) Write(p []byte) (int, error) {
	if !l.started {
		l.start()
	}
	return l.w.Write(p)
}

// putArchive: PUT /v1/sandboxes/{id}/archive?path=/dir with a tar body
// extracts it under the guest directory (created if missing).
func (s *Server) putArchive(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	body := http.MaxBytesReader(w, r.Body, maxArchiveBody)
	lim := agentproto.ArchiveLimits{MaxBytes: maxArchiveBytes, MaxEntries: maxArchiveEntries}
	if err := s.mgr.Guest().ArchivePut(r.Context(), scope(t), r.PathValue("id"), p, body, lim); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("%w: the archive is over %d bytes: send a smaller one, or several", errdefs.ErrInvalid, int64(maxArchiveBody))
		}
		return archiveErr(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// archiveErr classifies the agent's refusals (ErrInvalid: an unsafe entry;
// ErrTooLarge: over a limit) besides agentErr's file errors.
func archiveErr(err error) error {
	switch {
	case errors.Is(err, agentproto.ErrInvalid):
		return fmt.Errorf("%w: %v (entries must stay under the directory: no absolute names, no .., nothing through a symlink; no device nodes or FIFOs)", errdefs.ErrInvalid, err)
	case errors.Is(err, agentproto.ErrTooLarge):
		return fmt.Errorf("%w: %v (at most %d bytes of files and %d entries per archive)", errdefs.ErrInvalid, err, maxArchiveBytes, maxArchiveEntries)
	}
	return agentErr(err)
}
