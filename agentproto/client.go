package agentproto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
)

// killWait bounds how long Exec waits, after its context is cancelled, for
// the agent to confirm that the process is gone.
const killWait = time.Second

// Client is the host side of a connection to an agent. It is safe for
// concurrent use.
type Client struct {
	conn    net.Conn
	sess    *yamux.Session
	nextID  atomic.Uint64
	agent   string // agent version from the handshake
	refused string // why the agent refuses to run anything, from the handshake
}

// NewClient performs the handshake on conn and starts a session. ctx bounds
// the handshake only. The client owns conn from then on: it is closed on
// error and by Close.
func NewClient(ctx context.Context, conn net.Conn, token string) (*Client, error) {
	c, err := newClient(ctx, conn, token)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

func newClient(ctx context.Context, conn net.Conn, token string) (*Client, error) {
	if d, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(d); err != nil {
			return nil, fmt.Errorf("agentproto: set handshake deadline: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	ok, err := clientHandshake(conn, token)
	stopped := stop()
	if err != nil || !stopped {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("agentproto: handshake: %w", ctx.Err())
		}
		// The conn's deadline (ctx's) may expire before ctx notices.
		if d, ok := ctx.Deadline(); ok && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(d) {
			return nil, fmt.Errorf("agentproto: handshake: %w", context.DeadlineExceeded)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("agentproto: handshake: %w", err)
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("agentproto: clear handshake deadline: %w", err)
	}
	cfg := yamuxConfig()
	// The host never accepts streams from the agent; a small backlog plus
	// GoAway below make the agent unable to open any.
	cfg.AcceptBacklog = 1
	sess, err := yamux.Client(conn, cfg)
	if err != nil {
		return nil, fmt.Errorf("agentproto: start session: %w", err)
	}
	if err := sess.GoAway(); err != nil {
		sess.Close()
		return nil, fmt.Errorf("agentproto: start session: %w", err)
	}
	return &Client{conn: conn, sess: sess, agent: ok.Version, refused: ok.Refused}, nil
}

func clientHandshake(conn net.Conn, token string) (*helloOK, error) {
	p, err := json.Marshal(hello{Proto: ProtocolVersion, Token: token})
	if err != nil {
		return nil, err
	}
	if err := newFrameWriter(conn).write(frameHello, p); err != nil {
		return nil, fmt.Errorf("send hello: %w", err)
	}
	t, p, err := newFrameReader(conn).next()
	if err != nil {
		return nil, fmt.Errorf("read hello reply: %w", err)
	}
	switch t {
	case frameHelloOK:
	case frameError:
		err := decodeError(p)
		var re *RemoteError
		if errors.As(err, &re) {
			re.Kind = kindHandshake
		}
		return nil, err
	default:
		return nil, fmt.Errorf("%w: unexpected %s frame in handshake", ErrProtocol, t)
	}
	var ok helloOK
	if err := json.Unmarshal(p, &ok); err != nil {
		return nil, fmt.Errorf("%w: bad hello reply: %v", ErrProtocol, err)
	}
	if ok.Proto != ProtocolVersion {
		return nil, fmt.Errorf("%w: agent speaks protocol %d, want %d", ErrProtocol, ok.Proto, ProtocolVersion)
	}
	return &ok, nil
}

func yamuxConfig() *yamux.Config {
	cfg := yamux.DefaultConfig()
	// No keepalive: a paused guest must not kill the session; operations are
	// bounded by their contexts instead.
	cfg.EnableKeepAlive = false
	cfg.ConnectionWriteTimeout = 30 * time.Second
	cfg.StreamCloseTimeout = 30 * time.Second
	cfg.StreamOpenTimeout = 30 * time.Second
	cfg.LogOutput = io.Discard
	return cfg
}

// AgentVersion is the version the agent announced in the handshake.
func (c *Client) AgentVersion() string { return c.agent }

// Refused is the agent's refusal from the handshake: empty when it runs
// processes, else why it refuses every exec and file operation (the
// processes it would start would keep capabilities).
func (c *Client) Refused() error {
	if c.refused == "" {
		return nil
	}
	msg := c.refused
	if len(msg) > maxErrorMessage {
		msg = msg[:maxErrorMessage]
	}
	return &RemoteError{Kind: kindRefused, Message: ErrRefused.Error() + ": " + msg}
}

// Done is closed when the session with the agent has ended.
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// Close ends the session and closes the connection.
func (c *Client) Close() error {
	err := c.sess.Close()
	c.conn.Close()
	return err
}

// stream is one operation in flight.
type stream struct {
	st   *yamux.Stream
	fr   *frameReader
	fw   *frameWriter
	stop func() bool
}

// open starts an operation: it opens a stream and sends req. Until close,
// cancelling ctx makes the stream's reads and writes fail.
func (c *Client) open(ctx context.Context, req *request) (*stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("agentproto: encode request: %w", err)
	}
	if len(p) > MaxJSONSize {
		return nil, fmt.Errorf("agentproto: %s request of %d bytes exceeds %d: %w", req.Op, len(p), MaxJSONSize, ErrInvalid)
	}
	st, err := c.sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("agentproto: open stream: %w", err)
	}
	s := &stream{st: st, fr: newFrameReader(st), fw: newFrameWriter(st)}
	s.stop = context.AfterFunc(ctx, func() { st.SetDeadline(time.Unix(1, 0)) })
	if err := s.fw.write(frameRequest, p); err != nil {
		s.close()
		return nil, s.err(ctx, fmt.Errorf("send %s request: %w", req.Op, err))
	}
	return s, nil
}

func (s *stream) close() {
	s.stop()
	s.st.Close()
}

// err prefers the context's error when the context caused err.
func (s *stream) err(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w: agent closed the stream early", ErrProtocol)
	}
	var re *RemoteError
	if errors.As(err, &re) {
		return err
	}
	return fmt.Errorf("agentproto: %w", err)
}

// reply reads one frame that must be a reply (decoded into v) or an error.
func (s *stream) reply(v any) error {
	t, p, err := s.fr.next()
	if err != nil {
		return err
	}
	switch t {
	case frameReply:
		if err := json.Unmarshal(p, v); err != nil {
			return fmt.Errorf("%w: bad reply: %v", ErrProtocol, err)
		}
		return nil
	case frameError:
		return decodeError(p)
	default:
		return fmt.Errorf("%w: unexpected %s frame", ErrProtocol, t)
	}
}

// Health asks the agent how it is.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	s, err := c.open(ctx, &request{Op: opHealth})
	if err != nil {
		return nil, err
	}
	defer s.close()
	var h Health
	if err := s.reply(&h); err != nil {
		return nil, s.err(ctx, err)
	}
	return &h, nil
}

// Sync flushes the guest's filesystems to their backing store (sync(2))
// and returns when they are: the host calls it before it copies a
// sandbox's writable layer.
func (c *Client) Sync(ctx context.Context) error {
	s, err := c.open(ctx, &request{Op: opSync})
	if err != nil {
		return err
	}
	defer s.close()
	if err := s.reply(&struct{}{}); err != nil {
		return s.err(ctx, err)
	}
	return nil
}

// Exec runs a process in the guest. It streams stdin (may be nil) to the
// process, and the process's stdout and stderr (either may be nil to
// discard) back as they come. A non-nil stdin implies req.Stdin. Exec
// returns when the process has exited and its output has been delivered.
//
// A process that cannot be started is not an error: the result says why
// (ExitCode 127 or 126 and Error). Cancelling ctx kills the process group
// and returns ctx.Err(). If writing to stdout or stderr fails, the process
// group is killed and the write error returned.
//
// Exec returns without waiting for a stdin reader that is blocked in Read;
// that goroutine ends when Read returns.
func (c *Client) Exec(ctx context.Context, req *ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*ExecResult, error) {
	if req != nil && req.TTY != nil {
		return nil, fmt.Errorf("agentproto: exec: a TTY exec goes through ExecPTY: %w", ErrInvalid)
	}
	return c.exec(ctx, req, stdin, stdout, stderr, nil)
}

// ExecPTY runs a process on a pseudo-terminal of size req.TTY (required;
// an empty req.Argv runs the user's login shell from the guest's passwd,
// else /bin/sh):
// stdin's bytes go to the terminal (a 0x03 is Ctrl-C: the line discipline
// signals the foreground job), the terminal's output goes to out, and each
// size received from resize (may be nil) resizes it. Otherwise it behaves
// as Exec.
func (c *Client) ExecPTY(ctx context.Context, req *ExecRequest, stdin io.Reader, out io.Writer, resize <-chan WinSize) (*ExecResult, error) {
	if req == nil || req.TTY == nil {
		return nil, fmt.Errorf("agentproto: exec: ExecPTY needs a TTY size: %w", ErrInvalid)
	}
	if !req.TTY.Valid() {
		return nil, fmt.Errorf("agentproto: exec: pty size %dx%d: rows and cols must be 1..%d: %w", req.TTY.Rows, req.TTY.Cols, MaxWinSize, ErrInvalid)
	}
	return c.exec(ctx, req, stdin, out, nil, resize)
}

func (c *Client) exec(ctx context.Context, req *ExecRequest, stdin io.Reader, stdout, stderr io.Writer, resize <-chan WinSize) (*ExecResult, error) {
	if req == nil || (len(req.Argv) == 0 && req.TTY == nil) {
		return nil, fmt.Errorf("agentproto: exec: empty argv: %w", ErrInvalid)
	}
	r := *req
	if stdin != nil {
		r.Stdin = true
	}
	id := c.nextID.Add(1)
	s, err := c.open(ctx, &request{Op: opExec, ID: id, Exec: &r})
	if err != nil {
		return nil, err
	}
	defer s.close()
	if r.Stdin {
		if stdin == nil {
			if err := s.fw.write(frameStdinClose, nil); err != nil {
				return nil, c.execErr(ctx, s, id, fmt.Errorf("close stdin: %w", err))
			}
		} else {
			go pumpStdin(s.fw, stdin)
		}
	}
	if resize != nil {
		done := make(chan struct{})
		defer close(done)
		go pumpResize(s.fw, resize, done)
	}
	for {
		t, p, err := s.fr.next()
		if err != nil {
			return nil, c.execErr(ctx, s, id, err)
		}
		switch t {
		case frameStdout, frameStderr:
			w := stdout
			if t == frameStderr {
				w = stderr
			}
			if w == nil {
				continue
			}
			if _, err := w.Write(p); err != nil {
				c.kill(id)
				return nil, fmt.Errorf("agentproto: exec: write %s: %w", t, err)
			}
		case frameExit:
			var res ExecResult
			if err := json.Unmarshal(p, &res); err != nil {
				return nil, c.execErr(ctx, s, id, fmt.Errorf("%w: bad exit frame: %v", ErrProtocol, err))
			}
			return &res, nil
		case frameError:
			return nil, c.execErr(ctx, s, id, decodeError(p))
		default:
			return nil, c.execErr(ctx, s, id, fmt.Errorf("%w: unexpected %s frame in exec", ErrProtocol, t))
		}
	}
}

// execErr handles a failed exec stream: the process is killed unless the
// agent itself reported the error. After a cancelled ctx it waits a little
// for the agent to confirm the process is gone, so that when Exec returns
// ctx.Err() the process group has been killed.
func (c *Client) execErr(ctx context.Context, s *stream, id uint64, err error) error {
	var re *RemoteError
	if errors.As(err, &re) {
		return s.err(ctx, err)
	}
	c.kill(id)
	if ctx.Err() != nil {
		s.st.SetReadDeadline(time.Now().Add(killWait))
		for {
			t, _, err := s.fr.next()
			if err != nil || t == frameExit || t == frameError {
				break
			}
		}
	}
	return s.err(ctx, err)
}

// kill SIGKILLs the process group of exec id, on a stream of its own: the
// exec's stream may be stuck behind stdin that the process does not read.
func (c *Client) kill(id uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), killWait)
	defer cancel()
	s, err := c.open(ctx, &request{Op: opSignal, ID: id, Signal: int(syscall.SIGKILL)})
	if err != nil {
		return
	}
	defer s.close()
	var v struct{}
	_ = s.reply(&v)
}

// pumpResize sends each size from ch as a resize frame until done.
func pumpResize(fw *frameWriter, ch <-chan WinSize, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case ws, ok := <-ch:
			if !ok {
				return
			}
			if !ws.Valid() {
				continue
			}
			b := []byte{byte(ws.Rows >> 8), byte(ws.Rows), byte(ws.Cols >> 8), byte(ws.Cols)}
			if fw.write(frameResize, b) != nil {
				return
			}
		}
	}
}

func pumpStdin(fw *frameWriter, r io.Reader) {
	buf, put := getChunk()
	for {
		n, err := r.Read(buf[headerSize:])
		if n > 0 {
			if werr := fw.writeBuf(frameStdin, buf[:headerSize+n]); werr != nil {
				put(true)
				return
			}
		}
		if err != nil {
			// EOF or a failing reader: either way the process sees EOF.
			fw.write(frameStdinClose, nil)
			put(false)
			return
		}
	}
}

// sendFrom streams r to the agent as data frames and then EOF, in the
// background, and reports how it ended on the returned channel. A read
// error of r is wrapped as what; with closeOnReadErr the stream is closed
// too (an agent waiting for more data stops waiting).
func (s *stream) sendFrom(r io.Reader, what string, closeOnReadErr bool) <-chan error {
	sendErr := make(chan error, 1)
	go func() {
		buf, put := getChunk()
		writeFailed := false
		defer func() { put(writeFailed) }()
		for {
			n, err := io.ReadFull(r, buf[headerSize:])
			if n > 0 {
				if werr := s.fw.writeBuf(frameData, buf[:headerSize+n]); werr != nil {
					writeFailed = true
					sendErr <- werr
					return
				}
			}
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				sendErr <- s.fw.write(frameEOF, nil)
				return
			}
			if err != nil {
				sendErr <- fmt.Errorf("%s: %w", what, err)
				if closeOnReadErr {
					s.close()
				}
				return
			}
		}
	}()
	return sendErr
}

// WriteFile writes the contents of r to path in the guest, replacing the
// file atomically, with permissions mode; missing parent directories are
// created. The data is streamed.
func (c *Client) WriteFile(ctx context.Context, path string, mode os.FileMode, r io.Reader) error {
	s, err := c.open(ctx, &request{Op: opWriteFile, Path: path, Mode: uint32(mode)})
	if err != nil {
		return err
	}
	defer s.close()
	// Send in the background so that an early error from the agent (say,
	// permission denied) is seen at once; closing the stream stops the sender.
	sendErr := s.sendFrom(r, "read source", false)
	var v struct{}
	if err := s.reply(&v); err != nil {
		// Do not wait for the sender: it may be blocked reading r. Closing
		// the stream (deferred) makes its next write fail.
		return s.err(ctx, err)
	}
	// An honest agent only acknowledges after the EOF frame, so the sender
	// is done or about to be; closing the stream stops it otherwise.
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

// ReadFile copies the file at path in the guest to w. It fails with an error
// matching ErrTooLarge if the file holds more than max bytes (max <= 0 means
// DefaultReadMax); for files whose size is not known in advance (/proc, pipes)
// part of the data may have been written to w by then.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer, max int64) error {
	if max <= 0 {
		max = DefaultReadMax
	}
	s, err := c.open(ctx, &request{Op: opReadFile, Path: path, Max: max})
	if err != nil {
		return err
	}
	defer s.close()
	var n int64
	for {
		t, p, err := s.fr.next()
		if err != nil {
			return s.err(ctx, err)
		}
		switch t {
		case frameData:
			n += int64(len(p))
			if n > max {
				return fmt.Errorf("agentproto: read %s: more than %d bytes: %w", path, max, ErrTooLarge)
			}
			if _, err := w.Write(p); err != nil {
				return fmt.Errorf("agentproto: read %s: %w", path, err)
			}
		case frameEOF:
			return nil
		case frameError:
			return decodeError(p)
		default:
			return s.err(ctx, fmt.Errorf("%w: unexpected %s frame in read", ErrProtocol, t))
		}
	}
}

// ListDir lists the directory at path in the guest, in directory order.
// Entries describe the links themselves, not what symlinks point to.
func (c *Client) ListDir(ctx context.Context, path string) ([]FileInfo, error) {
	s, err := c.open(ctx, &request{Op: opListDir, Path: path})
	if err != nil {
		return nil, err
	}
	defer s.close()
	var out []FileInfo
	for {
		t, p, err := s.fr.next()
		if err != nil {
			return nil, s.err(ctx, err)
		}
		switch t {
		case frameReply:
			var batch []FileInfo
			if err := json.Unmarshal(p, &batch); err != nil {
				return nil, s.err(ctx, fmt.Errorf("%w: bad listing: %v", ErrProtocol, err))
			}
			for _, fi := range batch {
				if !validName(fi.Name) {
					return nil, s.err(ctx, fmt.Errorf("%w: bad file name %q in listing", ErrProtocol, fi.Name))
				}
			}
			if len(out)+len(batch) > maxListEntries {
				return nil, fmt.Errorf("agentproto: list %s: more than %d entries: %w", path, maxListEntries, ErrTooLarge)
			}
			out = append(out, batch...)
		case frameEOF:
			return out, nil
		case frameError:
			return nil, decodeError(p)
		default:
			return nil, s.err(ctx, fmt.Errorf("%w: unexpected %s frame in listing", ErrProtocol, t))
		}
	}
}

// validName reports whether name is a plain directory entry name.
func validName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\x00")
}
