package agentproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Frame limits. Both sides reject frames above these sizes.
const (
	// MaxFrameSize is the largest payload of any frame.
	MaxFrameSize = 1 << 20
	// MaxJSONSize is the largest payload of a JSON control frame.
	MaxJSONSize = 64 << 10

	headerSize = 5
	chunkSize  = 32 << 10 // payload size of the data frames we send
)

// ErrProtocol is wrapped by errors caused by a peer that does not follow the
// protocol: unknown or oversized frames, unexpected frame types, bad JSON.
var ErrProtocol = errors.New("protocol violation")

type frameType byte

const (
	frameHello      frameType = iota + 1 // JSON hello (host → agent)
	frameHelloOK                         // JSON hello reply (agent → host)
	frameRequest                         // JSON request, first frame of a stream
	frameReply                           // JSON reply
	frameError                           // JSON wireError
	frameData                            // file data
	frameEOF                             // end of file data or of a listing; empty
	frameStdin                           // process stdin bytes
	frameStdout                          // process stdout bytes
	frameStderr                          // process stderr bytes
	frameStdinClose                      // close process stdin; empty
	frameExit                            // JSON ExecResult, last frame of an exec
	frameSignal                          // one byte: signal number for the process group
	frameResize                          // 4 bytes: rows, cols (big-endian uint16) of a pty exec
	frameTypeEnd
)

func (t frameType) String() string {
	names := [...]string{"invalid", "hello", "hello-ok", "request", "reply", "error",
		"data", "eof", "stdin", "stdout", "stderr", "stdin-close", "exit", "signal", "resize"}
	if int(t) < len(names) {
		return names[t]
	}
	return fmt.Sprintf("frame(%d)", byte(t))
}

// maxPayload is the largest payload allowed for a frame type.
func (t frameType) maxPayload() int {
	switch t {
	case frameHello, frameHelloOK, frameRequest, frameReply, frameError, frameExit:
		return MaxJSONSize
	case frameEOF, frameStdinClose:
		return 0
	case frameSignal:
		return 1
	case frameResize:
		return 4
	default:
		return MaxFrameSize
	}
}

// frameReader reads frames from r. The payload returned by next is valid
// until the following call. The reader never reads past the end of a frame,
// so the underlying reader can be handed to something else between frames.
type frameReader struct {
	r   io.Reader
	hdr [headerSize]byte
	buf []byte
}

func newFrameReader(r io.Reader) *frameReader { return &frameReader{r: r} }

func (fr *frameReader) next() (frameType, []byte, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, fmt.Errorf("read frame header: %w", err)
		}
		return 0, nil, err // io.EOF at a frame boundary is a clean end
	}
	t := frameType(fr.hdr[0])
	n := binary.BigEndian.Uint32(fr.hdr[1:])
	if t == 0 || t >= frameTypeEnd {
		return 0, nil, fmt.Errorf("%w: unknown frame type %d", ErrProtocol, byte(t))
	}
	if int64(n) > int64(t.maxPayload()) {
		return 0, nil, fmt.Errorf("%w: %s frame of %d bytes exceeds limit of %d", ErrProtocol, t, n, t.maxPayload())
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n, max(int(n), 4<<10))
	}
	p := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, fmt.Errorf("read %s frame: %w", t, err)
	}
	return t, p, nil
}

// frameWriter writes whole frames to w; it is safe for concurrent use and
// never interleaves two frames.
type frameWriter struct {
	// mu serialises writes to w.
	mu sync.Mutex
	w  io.Writer
}

func newFrameWriter(w io.Writer) *frameWriter { return &frameWriter{w: w} }

// write sends one frame with payload p, copying it after the header so the
// frame goes out in one Write.
func (fw *frameWriter) write(t frameType, p []byte) error {
	if len(p) > t.maxPayload() {
		return fmt.Errorf("%s frame of %d bytes exceeds limit of %d", t, len(p), t.maxPayload())
	}
	b := make([]byte, headerSize+len(p))
	copy(b[headerSize:], p)
	return fw.writeBuf(t, b)
}

// writeBuf sends buf as one frame; buf[:headerSize] is overwritten with the
// header and buf[headerSize:] is the payload. It avoids a copy for data
// frames read straight into buf[headerSize:].
func (fw *frameWriter) writeBuf(t frameType, buf []byte) error {
	putHeader(buf, t, len(buf)-headerSize)
	fw.mu.Lock()
	defer fw.mu.Unlock()
	_, err := fw.w.Write(buf)
	return err
}

func putHeader(b []byte, t frameType, n int) {
	b[0] = byte(t)
	binary.BigEndian.PutUint32(b[1:headerSize], uint32(n))
}

// chunkPool holds buffers of headerSize+chunkSize bytes for data frames.
var chunkPool = sync.Pool{New: func() any {
	b := make([]byte, headerSize+chunkSize)
	return &b
}}

// getChunk returns a pooled data-frame buffer and the function that gives
// it back. After a failed write the transport may still hold the buffer
// (yamux leaves a timed-out frame queued), so then it is not given back.
func getChunk() (buf []byte, put func(writeFailed bool)) {
	bp := chunkPool.Get().(*[]byte)
	return *bp, func(writeFailed bool) {
		if !writeFailed {
			chunkPool.Put(bp)
		}
	}
}
