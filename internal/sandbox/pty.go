package sandbox

import (
	"context"
	"io"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
)

// Pty runs a command (none: the user's login shell in the guest, else
// /bin/sh) on a pseudo-terminal of size ws in a running sandbox:
// stdin's bytes are typed into the terminal, its output goes to out, and
// each size from resize resizes it. It counts as activity while it runs (an
// open terminal keeps an idle timeout away) and ends like Exec.
func (g *Guest) Pty(ctx context.Context, tenant, id string, req *api.ExecRequest, ws agentproto.WinSize, stdin io.Reader, out io.Writer, resize <-chan agentproto.WinSize) (*api.ExecFrame, error) {
	m := g.m
	if !ws.Valid() {
		return nil, invalid("rows and cols: give a terminal size of 1..%d each", agentproto.MaxWinSize)
	}
	// No command: the agent runs the user's login shell (its passwd's).
	shell := len(req.Argv) == 0
	if shell {
		r := *req
		r.Argv = []string{"(login shell)"}
		req = &r
	}
	return m.guest.execute(ctx, tenant, id, req, func(c *agentproto.Client, areq *agentproto.ExecRequest) (*agentproto.ExecResult, error) {
		if shell {
			areq.Argv = nil
		}
		areq.TTY = &ws
		areq.Stdin = true
		return c.ExecPTY(ctx, areq, stdin, out, resize)
	})
}
