package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/coder/websocket"

	"github.com/cagebox/cagebox/api"
)

// PtyOptions say what a terminal runs and its size.
type PtyOptions struct {
	Argv       []string // default: the user's login shell in the guest, else /bin/sh
	Env        []string // KEY=VALUE
	Cwd, User  string
	Timeout    string // e.g. "30s": the command is killed after it
	Rows, Cols int    // default 24x80
}

// Pty is a command running on a pseudo-terminal in a sandbox. Read gives
// the terminal's output (io.EOF once the command has ended), Write types
// into it (a 0x03 byte is Ctrl-C), Resize resizes it, Wait reports how the
// command ended.
type Pty struct {
	conn *websocket.Conn
	out  *io.PipeReader
	done chan struct{}

	// mu guards exit and err, set before done is closed.
	mu   sync.Mutex
	exit *api.PtyControl
	err  error
}

// Pty starts a command on a terminal in sandbox id
// (GET /v1/sandboxes/{id}/pty, a WebSocket). ctx bounds the connection
// only; Close ends the session (and the command).
func (c *Client) Pty(ctx context.Context, id string, o PtyOptions) (*Pty, error) {
	q := url.Values{}
	for _, a := range o.Argv {
		q.Add("argv", a)
	}
	for _, e := range o.Env {
		q.Add("env", e)
	}
	if o.Cwd != "" {
		q.Set("cwd", o.Cwd)
	}
	if o.User != "" {
		q.Set("user", o.User)
	}
	if o.Timeout != "" {
		q.Set("timeout", o.Timeout)
	}
	if o.Rows > 0 {
		q.Set("rows", strconv.Itoa(o.Rows))
	}
	if o.Cols > 0 {
		q.Set("cols", strconv.Itoa(o.Cols))
	}
	h := http.Header{}
	if c.key != "" {
		h.Set("Authorization", "Bearer "+c.key)
	}
	u := c.base + "/v1/sandboxes/" + url.PathEscape(id) + "/pty?" + q.Encode()
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 && resp.StatusCode != http.StatusSwitchingProtocols {
			defer resp.Body.Close()
			return nil, decodeError(resp)
		}
		return nil, fmt.Errorf("pty: connect: %w", err)
	}
	// Terminal output arrives in messages of at most the agent's frame.
	conn.SetReadLimit(1 << 20)
	pr, pw := io.Pipe()
	p := &Pty{conn: conn, out: pr, done: make(chan struct{})}
	go p.readLoop(pw)
	return p, nil
}

func (p *Pty) readLoop(pw *io.PipeWriter) {
	var err error
	defer func() {
		p.mu.Lock()
		if p.exit == nil && p.err == nil {
			p.err = err
		}
		p.mu.Unlock()
		pw.CloseWithError(io.EOF)
		close(p.done)
	}()
	for {
		typ, b, rerr := p.conn.Read(context.Background())
		if rerr != nil {
			if websocket.CloseStatus(rerr) == websocket.StatusNormalClosure {
				if p.exitSet() {
					return
				}
				err = errors.New("pty: the daemon closed the terminal without an exit status")
				return
			}
			var ce websocket.CloseError
			if errors.As(rerr, &ce) {
				err = fmt.Errorf("pty: %s", ce.Reason)
			} else {
				err = fmt.Errorf("pty: %w", rerr)
			}
			return
		}
		if typ == websocket.MessageBinary {
			if _, werr := pw.Write(b); werr != nil {
				// Nobody reads the output any more: keep draining so the
				// exit status still arrives.
				continue
			}
			continue
		}
		var m api.PtyControl
		if json.Unmarshal(b, &m) == nil && m.Type == "exit" {
			p.mu.Lock()
			p.exit = &m
			p.mu.Unlock()
		}
	}
}

func (p *Pty) exitSet() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit != nil
}

// Read reads the terminal's output.
func (p *Pty) Read(b []byte) (int, error) { return p.out.Read(b) }

// Write types b into the terminal.
func (p *Pty) Write(b []byte) (int, error) {
	if err := p.conn.Write(context.Background(), websocket.MessageBinary, b); err != nil {
		return 0, fmt.Errorf("pty: write: %w", err)
	}
	return len(b), nil
}

// Resize sets the terminal's size.
func (p *Pty) Resize(rows, cols int) error {
	b, _ := json.Marshal(api.PtyControl{Type: "resize", Rows: rows, Cols: cols})
	if err := p.conn.Write(context.Background(), websocket.MessageText, b); err != nil {
		return fmt.Errorf("pty: resize: %w", err)
	}
	return nil
}

// Wait waits for the command to end and returns how: ExitCode (128+n after
// signal n), Signal, TimedOut, OOMKilled, Error (a command that could not
// start). The error is set when the session ended without an exit status.
func (p *Pty) Wait(ctx context.Context) (*api.PtyControl, error) {
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit != nil {
		return p.exit, nil
	}
	return nil, p.err
}

// Done is closed once the session has ended.
func (p *Pty) Done() <-chan struct{} { return p.done }

// Close ends the session; a command still running is killed.
func (p *Pty) Close() error {
	err := p.conn.Close(websocket.StatusNormalClosure, "")
	p.out.Close()
	return err
}
