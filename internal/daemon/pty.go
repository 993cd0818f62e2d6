package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
)

// maxPtyMessage bounds a message from the client: terminal input is typed
// (or pasted) and control messages are small.
const maxPtyMessage = 64 << 10

// ptyRequest reads the pty route's query: argv (repeatable; default the
// user's login shell in the guest, else /bin/sh), rows, cols (default 24x80), env (repeatable K=V), cwd, user,
// timeout (as exec's).
func ptyRequest(r *http.Request) (*api.ExecRequest, agentproto.WinSize, error) {
	q := r.URL.Query()
	req := &api.ExecRequest{Argv: q["argv"], Env: q["env"], Cwd: q.Get("cwd"), User: q.Get("user"), Timeout: q.Get("timeout"), Stdin: true}
	ws := agentproto.WinSize{Rows: 24, Cols: 80}
	for name, dst := range map[string]*uint16{"rows": &ws.Rows, "cols": &ws.Cols} {
		v := q.Get(name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil || n < 1 || n > agentproto.MaxWinSize {
			return nil, ws, fmt.Errorf("%w: %s: %q is not a terminal size of 1..%d", errdefs.ErrInvalid, name, v, agentproto.MaxWinSize)
		}
		*dst = uint16(n)
	}
	if err := sandbox.ValidateEnv("env", req.Env); err != nil {
		return nil, ws, err
	}
	if req.Timeout != "" {
		if d, err := time.ParseDuration(req.Timeout); err != nil || d <= 0 {
			return nil, ws, fmt.Errorf("%w: timeout: %q is not a duration such as 30s", errdefs.ErrInvalid, req.Timeout)
		}
	}
	if len(req.Argv) > 0 && req.Argv[0] == "" {
		return nil, ws, fmt.Errorf("%w: argv: the command must not be empty", errdefs.ErrInvalid)
	}
	return req, ws, nil
}

// pty: GET /v1/sandboxes/{id}/pty is a WebSocket to a command on a
// pseudo-terminal. Binary messages both ways are terminal bytes; text
// messages are JSON control (ptyControl). Errors found before the upgrade
// are the usual JSON answers; after it, the close frame's reason says.
func (s *Server) pty(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	req, ws, err := ptyRequest(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, err := s.mgr.Get(r.Context(), scope(t), id)
	if err != nil {
		return err
	}
	switch sb.Status {
	case sandbox.StatusRunning, sandbox.StatusPaused, sandbox.StatusHibernated:
	default:
		return fmt.Errorf("%w: sandbox %s is %s: a terminal needs a running sandbox", errdefs.ErrConflict, id, sb.Status)
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return fmt.Errorf("%w: %s is a WebSocket endpoint: send a WebSocket upgrade (Connection: Upgrade, Upgrade: websocket)", errdefs.ErrInvalid, r.URL.Path)
	}
	// A cross-origin upgrade (a page of another site driving the user's
	// browser) is refused: here with the usual JSON answer, and again by
	// Accept's default options.
	if o := r.Header.Get("Origin"); o != "" {
		if u, err := url.Parse(o); err != nil || !strings.EqualFold(u.Host, r.Host) {
			return fmt.Errorf("%w: request Origin %q is not authorized for Host %q: a terminal opens only from a page of the daemon's own origin", errdefs.ErrDenied, o, r.Host)
		}
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		s.log.Debug("pty: websocket accept", "sandbox", id, "err", err)
		return nil // Accept has answered
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxPtyMessage)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdinR, stdinW := io.Pipe()
	resize := make(chan agentproto.WinSize, 16)
	// Client messages: terminal input and control. The client going away
	// (a read error) ends the command.
	readErr := make(chan error, 1)
	go func() {
		defer cancel()
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				stdinW.CloseWithError(err)
				readErr <- err
				return
			}
			if typ == websocket.MessageBinary {
				if _, err := stdinW.Write(b); err != nil {
					return
				}
				continue
			}
			var m api.PtyControl
			if err := json.Unmarshal(b, &m); err != nil || m.Type != "resize" {
				conn.Close(websocket.StatusUnsupportedData, `text messages are JSON control: {"type":"resize","rows":N,"cols":M}`)
				return
			}
			if m.Rows < 1 || m.Cols < 1 || m.Rows > agentproto.MaxWinSize || m.Cols > agentproto.MaxWinSize {
				continue
			}
			size := agentproto.WinSize{Rows: uint16(m.Rows), Cols: uint16(m.Cols)}
			if !size.Valid() {
				continue
			}
			select {
			case resize <- size:
			default: // a flood of resizes: drop, a later one wins
			}
		}
	}()
	out := &wsWriter{ctx: ctx, conn: conn}
	res, err := s.mgr.Guest().Pty(ctx, scope(t), id, req, ws, stdinR, out, resize)
	stdinR.Close()
	if err != nil {
		select {
		case rerr := <-readErr:
			s.log.Debug("pty: client gone", "sandbox", id, "err", rerr)
			return nil
		default:
		}
		code := websocket.StatusInternalError
		switch {
		case errors.Is(err, errdefs.ErrInvalid), errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrConflict):
			code = websocket.StatusPolicyViolation
		}
		conn.Close(code, closeReason(err.Error()))
		return nil
	}
	b, _ := json.Marshal(api.PtyControl{Type: "exit", ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled, Error: res.Error})
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		return nil
	}
	conn.Close(websocket.StatusNormalClosure, "")
	return nil
}

// closeReason fits msg into a close frame (at most 123 bytes).
func closeReason(msg string) string {
	if len(msg) <= 123 {
		return msg
	}
	msg = msg[:120]
	for !utf8Valid(msg) {
		msg = msg[:len(msg)-1]
	}
	return msg + "..."
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

// wsWriter sends each write as one binary message.
type wsWriter struct {
	ctx  context.Context
	conn *websocket.Conn
}

func (w *wsWriter) Write(p []byte) (int, error) {
	if err := w.conn.Write(w.ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}
