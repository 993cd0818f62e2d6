package agentproto

import (
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/cagebox/cagebox/internal/tarx"
)

// maxArchiveTrailer bounds what may follow the end of a tar stream before
// the EOF frame (tar pads to its record size, 10 KiB by default).
const maxArchiveTrailer = 1 << 20

// archiveGet sends the tree at req.Path as a tar stream (symlinks as
// links, devices and FIFOs skipped) in data frames, then EOF.
func archiveGet(fw *frameWriter, req *request) error {
	path, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	w := &dataWriter{fw: fw}
	if err := tarx.Create(w, path); err != nil {
		return fmt.Errorf("archive %s: %w", path, err)
	}
	if err := w.flush(); err != nil {
		return err
	}
	return fw.write(frameEOF, nil)
}

// dataWriter turns writes into data frames of up to chunkSize bytes.
type dataWriter struct {
	fw  *frameWriter
	buf []byte
}

func (w *dataWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if w.buf == nil {
			w.buf = make([]byte, headerSize, headerSize+chunkSize)
		}
		k := min(len(p), headerSize+chunkSize-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == headerSize+chunkSize {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (w *dataWriter) flush() error {
	if len(w.buf) <= headerSize {
		return nil
	}
	err := w.fw.writeBuf(frameData, w.buf)
	w.buf = nil // a failed write may leave it queued: never reuse
	return err
}

// archivePut extracts the tar stream arriving in data frames under
// req.Path (created if missing), with tarx's rules: nothing lands outside
// it, device nodes are refused, size and entries are bounded.
func archivePut(fr *frameReader, req *request) error {
	path, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	r := &dataReader{fr: fr}
	_, err = tarx.Extract(r, path, tarx.Limits{MaxBytes: req.Max, MaxEntries: req.MaxEntries})
	switch {
	case errors.Is(err, tarx.ErrUnsafe):
		return fmt.Errorf("extract into %s: %v: %w", path, err, ErrInvalid)
	case errors.Is(err, tarx.ErrLimit):
		return fmt.Errorf("extract into %s: %v: %w", path, err, ErrTooLarge)
	case err != nil:
		return fmt.Errorf("extract into %s: %w", path, err)
	}
	// The tar reader stops at the end-of-archive marker: read up to the
	// EOF frame so the reply is the next thing on the stream.
	n, err := io.Copy(io.Discard, io.LimitReader(r, maxArchiveTrailer+1))
	if err != nil {
		return fmt.Errorf("extract into %s: %w", path, err)
	}
	if n > maxArchiveTrailer {
		return fmt.Errorf("extract into %s: more than %d bytes after the end of the archive: %w", path, maxArchiveTrailer, ErrInvalid)
	}
	return nil
}

// dataReader reads the payloads of data frames until an EOF frame.
type dataReader struct {
	fr   *frameReader
	rest []byte
	eof  bool
}

func (r *dataReader) Read(p []byte) (int, error) {
	for len(r.rest) == 0 {
		if r.eof {
			return 0, io.EOF
		}
		t, b, err := r.fr.next()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		switch t {
		case frameData:
			r.rest = b
		case frameEOF:
			r.eof = true
		default:
			return 0, fmt.Errorf("unexpected %s frame in an archive: %w", t, ErrInvalid)
		}
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

// syncFS is sync(2): every filesystem the guest sees, flushed.
func syncFS() { syscall.Sync() }
