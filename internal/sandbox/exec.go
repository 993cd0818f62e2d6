package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/isolation"
)

// Guest is the manager's service of what runs in a sandbox's guest
// (Manager.Guest): processes (exec, pty), files and archives, through the
// sandbox's agent.
type Guest struct{ m *Manager }

// Guest is the service of the sandboxes' guests.
func (m *Manager) Guest() *Guest { return m.guest }

// agent returns a connected agent client, dialling (and waiting for the
// agent to answer) when there is none.
func (e *entry) agent(ctx context.Context) (*agentproto.Client, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.client != nil {
		return e.client, nil
	}
	var lastErr error
	started := e.started
	for attempt := 0; ; attempt++ {
		conn, err := e.sb.DialAgent(ctx)
		if err == nil {
			var c *agentproto.Client
			c, err = agentproto.NewClient(ctx, conn, e.token)
			if err == nil {
				e.client = c
				return c, nil
			}
			conn.Close()
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
		case <-time.After(time.Duration(min(attempt+1, 10)) * 5 * time.Millisecond):
		case <-started:
			started = nil // once: a closed channel would spin
		}
	}
}

// oomBaseline is the sandbox's OOM kill count as last seen (read once,
// the first time).
func (e *entry) oomBaseline(oc isolation.OOMCounter) uint64 {
	e.mu.Lock()
	known, n := e.oomKnown, e.oomSeen
	e.mu.Unlock()
	if known {
		return n
	}
	n, err := oc.OOMKills()
	if err == nil {
		e.sawOOMKills(n)
	}
	return n
}

// sawOOMKills records the sandbox's OOM kill count.
func (e *entry) sawOOMKills(n uint64) {
	e.mu.Lock()
	if !e.oomKnown || n > e.oomSeen {
		e.oomKnown, e.oomSeen = true, n
	}
	e.mu.Unlock()
}

// dropClient forgets a broken client so the next call redials.
func (e *entry) dropClient(c *agentproto.Client) {
	e.mu.Lock()
	if e.client == c {
		e.client.Close()
		e.client = nil
	}
	e.mu.Unlock()
}

// ExecOutput receives an exec's output.
type ExecOutput struct {
	Stdout, Stderr io.Writer
}

// Exec runs a command in a running sandbox, streaming its output. The
// result carries OOMKilled when the sandbox's OOM counter rose during a
// run that ended by SIGKILL.
func (g *Guest) Exec(ctx context.Context, tenant, id string, req *api.ExecRequest, stdin io.Reader, out ExecOutput) (*api.ExecFrame, error) {
	m := g.m
	if !req.Stdin {
		stdin = nil
	}
	return m.guest.execute(ctx, tenant, id, req, func(c *agentproto.Client, areq *agentproto.ExecRequest) (*agentproto.ExecResult, error) {
		return c.Exec(ctx, areq, stdin, out.Stdout, out.Stderr)
	})
}

// execute checks req, finds the running sandbox, counts the exec as
// activity while it runs, and reports its end; run starts it on the agent.
func (g *Guest) execute(ctx context.Context, tenant, id string, req *api.ExecRequest, run func(*agentproto.Client, *agentproto.ExecRequest) (*agentproto.ExecResult, error)) (*api.ExecFrame, error) {
	m := g.m
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, invalid("argv: give the command to run")
	}
	if err := ValidateEnv("env", req.Env); err != nil {
		return nil, err
	}
	timeout, err := parseDuration("timeout", req.Timeout)
	if err != nil {
		return nil, err
	}
	// The hot path answers from memory: no store read per exec.
	m.mu.Lock()
	e := m.live[id]
	m.mu.Unlock()
	if e == nil || (tenant != "" && e.tenant != tenant) {
		if _, _, err := m.attached(ctx, tenant, id); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: sandbox %s is not running", errdefs.ErrConflict, id)
	}
	// Activity first, so the reaper does not pause it again at once.
	e.touch(m.cfg.Now())
	if err := m.wake(ctx, e, "exec"); err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.execs++
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.execs--
		e.mu.Unlock()
		e.touch(m.cfg.Now())
	}()
	e.touch(m.cfg.Now())
	var oomBefore uint64
	oc, hasOOM := e.sb.(isolation.OOMCounter)
	whole := hasOOM && oomKillsSandbox(e.sb)
	switch {
	case whole:
		// A sandbox whose OOM kills it whole (isolation.OOMScope) and
		// that has had one is dead: say so rather than wait for its agent.
		if oomBefore, _ = oc.OOMKills(); oomBefore > 0 {
			msg := m.guest.lostToOOM(e)
			return nil, fmt.Errorf("%w: sandbox %s is %s: %s", errdefs.ErrConflict, id, StatusFailed, msg)
		}
	case hasOOM:
		// Elsewhere the counter only tells a SIGKILL apart: it is read
		// after a SIGKILL only, against the count last seen (no cgroup
		// read on an exec's path otherwise).
		oomBefore = e.oomBaseline(oc)
	}
	c, err := e.agent(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: agent of %s: %v", errdefs.ErrUnavailable, id, err)
	}
	areq := &agentproto.ExecRequest{Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User, Timeout: timeout, Stdin: req.Stdin}
	e.mu.Lock()
	if areq.Cwd == "" {
		areq.Cwd = e.execCwd
	}
	if areq.User == "" {
		areq.User = e.execUser
	}
	e.mu.Unlock()
	res, err := run(c, areq)
	if err != nil {
		if ctx.Err() == nil && isConnErr(err) {
			e.dropClient(c)
		}
		// The agent went away with the whole sandbox: an OOM, when the
		// counter says so, is what the user hears about, not the
		// protocol error it caused.
		if hasOOM && oomKillsSandbox(e.sb) {
			if after, oerr := oc.OOMKills(); oerr == nil && after > oomBefore {
				msg := m.guest.lostToOOM(e)
				code := 137
				f := &api.ExecFrame{Stream: "exit", ExitCode: &code, Signal: "SIGKILL", OOMKilled: true, Error: msg}
				m.Emit(e.tenant, id, api.SandboxExec{Command: req.Argv[0], Args: len(req.Argv) - 1, ExitCode: code, OOMKilled: true})
				return f, nil
			}
		}
		return nil, fmt.Errorf("exec in %s: %w", id, err)
	}
	code := res.ExitCode
	f := &api.ExecFrame{Stream: "exit", ExitCode: &code, Signal: res.Signal, TimedOut: res.TimedOut, Error: res.Error}
	if hasOOM && res.Signal == "SIGKILL" {
		if after, err := oc.OOMKills(); err == nil {
			f.OOMKilled = after > oomBefore
			e.sawOOMKills(after)
		}
	}
	m.Emit(e.tenant, id, api.SandboxExec{Command: req.Argv[0], Args: len(req.Argv) - 1, ExitCode: code, OOMKilled: f.OOMKilled, TimedOut: res.TimedOut})
	return f, nil
}

// oomKillsSandbox reports whether running out of memory kills sb whole
// (its runtime has no OOM killer inside the guest).
func oomKillsSandbox(sb isolation.Sandbox) bool {
	sc, ok := sb.(isolation.OOMScope)
	return ok && sc.OOMKillsSandbox()
}

// lostToOOM handles a sandbox that its memory limit killed whole: the first
// caller detaches it, releases what it held on the host and marks its
// record failed, saying why; every caller gets that message.
func (g *Guest) lostToOOM(e *entry) string {
	m := g.m
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	limit := ""
	r, err := m.cfg.Store.GetSandbox(ctx, "", e.id)
	if err == nil {
		var sr specRecord
		if json.Unmarshal(r.Spec, &sr) == nil && sr.Resources.MemoryBytes > 0 {
			limit = fmt.Sprintf(" of %d MiB", sr.Resources.MemoryBytes>>20)
		}
	}
	msg := fmt.Sprintf("the sandbox ran out of memory: it reached its memory limit%s and was killed with everything in it (its runtime has no OOM killer inside the sandbox); create a new sandbox with a larger --memory", limit)
	m.mu.Lock()
	first := m.live[e.id] == e
	if first {
		delete(m.live, e.id)
	}
	m.mu.Unlock()
	if !first {
		return msg
	}
	m.log.Warn("sandbox killed by its memory limit", "sandbox", e.id)
	e.dropAll()
	if err := e.sb.Destroy(ctx); err != nil {
		m.log.Error("destroy after OOM", "sandbox", e.id, "err", err)
	}
	m.detach(e.id)
	if r != nil {
		r.Status, r.Error = StatusFailed, msg
		r.UpdatedAt = m.cfg.Now().UTC()
		if err := m.cfg.Store.UpdateSandbox(ctx, r); err != nil {
			m.log.Error("record sandbox OOM", "sandbox", e.id, "err", err)
		}
	}
	m.Emit(e.tenant, e.id, api.SandboxFailed{Error: msg, OOMKilled: true})
	return msg
}

func isConnErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// agentOf returns the agent client of a running sandbox of tenant and
// records the activity.
func (g *Guest) agentOf(ctx context.Context, tenant, id string) (*agentproto.Client, error) {
	m := g.m
	_, e, err := m.attached(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	// A frozen guest would never answer: wake an idle-paused one, refuse
	// one paused through the API.
	e.touch(m.cfg.Now())
	if err := m.wake(ctx, e, "files"); err != nil {
		return nil, err
	}
	c, err := e.agent(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: agent of %s: %v", errdefs.ErrUnavailable, id, err)
	}
	return c, nil
}

// WriteFile writes a file into a running sandbox.
func (g *Guest) WriteFile(ctx context.Context, tenant, id, path string, mode os.FileMode, r io.Reader) error {
	m := g.m
	c, err := m.guest.agentOf(ctx, tenant, id)
	if err != nil {
		return err
	}
	return c.WriteFile(ctx, path, mode, r)
}

// ReadFile reads a file from a running sandbox.
func (g *Guest) ReadFile(ctx context.Context, tenant, id, path string, w io.Writer, max int64) error {
	m := g.m
	c, err := m.guest.agentOf(ctx, tenant, id)
	if err != nil {
		return err
	}
	return c.ReadFile(ctx, path, w, max)
}

// ListDir lists a directory in a running sandbox.
func (g *Guest) ListDir(ctx context.Context, tenant, id, path string) ([]agentproto.FileInfo, error) {
	m := g.m
	c, err := m.guest.agentOf(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return c.ListDir(ctx, path)
}

func (e *entry) dropAll() {
	e.mu.Lock()
	if e.client != nil {
		e.client.Close()
		e.client = nil
	}
	e.mu.Unlock()
}
