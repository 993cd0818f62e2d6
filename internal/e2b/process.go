package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/e2b/envdpb"
	"github.com/cagebox/cagebox/internal/e2b/envdpb/envdpbconnect"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
)

// procTable is one sandbox's processes started through envd. Their pids
// are handles the front hands out (from 1000 up), not guest pids: the
// agent runs each process in a process group of its own and reports only
// its end.
type procTable struct {
	// mu guards byPID and next.
	mu    sync.Mutex
	byPID map[uint32]*process
	next  uint32
}

func (t *procTable) add(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p.pid = t.next
	t.next++
	t.byPID[p.pid] = p
}

func (t *procTable) remove(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byPID[p.pid] == p {
		delete(t.byPID, p.pid)
	}
}

func (t *procTable) find(sel *envdpb.ProcessSelector) (*process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *envdpb.ProcessSelector_Pid:
		if p := t.byPID[v.Pid]; p != nil {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	case *envdpb.ProcessSelector_Tag:
		for _, p := range t.byPID {
			if p.tag == v.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", v.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process: give a pid or a tag"))
}

func (t *procTable) list() []*process {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*process, 0, len(t.byPID))
	for _, p := range t.byPID {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

func (t *procTable) killAll() {
	for _, p := range t.list() {
		p.kill()
	}
}

// process is one running process: its output is published to the streams
// (Start, Connect) subscribed to it.
type process struct {
	pid    uint32
	tag    string
	config *envdpb.ProcessConfig
	pty    bool
	cancel context.CancelFunc
	resize chan agentproto.WinSize
	done   chan struct{}

	// mu guards the fields below.
	mu     sync.Mutex
	stdin  *io.PipeWriter // nil: no stdin, or closed
	subs   map[*subscriber]struct{}
	killed bool
	end    *envdpb.ProcessEvent_EndEvent
}

type subscriber struct {
	ch   chan *envdpb.ProcessEvent
	gone chan struct{}
}

func (p *process) subscribe() *subscriber {
	s := &subscriber{ch: make(chan *envdpb.ProcessEvent), gone: make(chan struct{})}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	return s
}

func (p *process) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	close(s.gone)
}

// publish hands ev to every subscriber, waiting for each (the process's
// output is paced by its readers; with none it is dropped).
func (p *process) publish(ev *envdpb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

func (p *process) kill() {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	p.cancel()
}

// output is a process's stdout, stderr or terminal as data events.
type output struct {
	p    *process
	kind int // 1 stdout, 2 stderr, 3 pty
}

func (o output) Write(b []byte) (int, error) {
	d := &envdpb.ProcessEvent_DataEvent{}
	c := append([]byte(nil), b...)
	switch o.kind {
	case 1:
		d.Output = &envdpb.ProcessEvent_DataEvent_Stdout{Stdout: c}
	case 2:
		d.Output = &envdpb.ProcessEvent_DataEvent_Stderr{Stderr: c}
	default:
		d.Output = &envdpb.ProcessEvent_DataEvent_Pty{Pty: c}
	}
	o.p.publish(&envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_Data{Data: d}})
	return len(b), nil
}

// processService implements envd's process service on the agent.
type processService struct{ s *Server }

var _ envdpbconnect.ProcessHandler = processService{}

// userOf is the user of an envd request: HTTP basic auth's user name
// (what the SDK sends), else the image's default.
func userOf(h http.Header) (string, error) {
	a, ok := strings.CutPrefix(h.Get("Authorization"), "Basic ")
	if !ok {
		return "", nil
	}
	b, err := base64.StdEncoding.DecodeString(a)
	if err != nil {
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("authorization: %v", err))
	}
	u, _, _ := strings.Cut(string(b), ":")
	return u, nil
}

// connectErr gives a manager error its Connect code.
func connectErr(err error) error {
	var ce *connect.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return err
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, store.ErrNotFound):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, errdefs.ErrInvalid):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, errdefs.ErrDenied), errors.Is(err, errdefs.ErrUnauthorized):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, errdefs.ErrConflict):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, errdefs.ErrUnavailable):
		return connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

func (ps processService) Start(ctx context.Context, req *connect.Request[envdpb.StartRequest], stream *connect.ServerStream[envdpb.StartResponse]) error {
	tg := targetOf(ctx)
	m := req.Msg
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd: give the command to run"))
	}
	user, err := userOf(req.Header())
	if err != nil {
		return err
	}
	ereq := &api.ExecRequest{Argv: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Cwd: cfg.GetCwd(), User: user}
	keys := make([]string, 0, len(cfg.GetEnvs()))
	for k := range cfg.GetEnvs() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ereq.Env = append(ereq.Env, k+"="+cfg.GetEnvs()[k])
	}
	if err := sandbox.ValidateEnv("envs", ereq.Env); err != nil {
		return connectErr(err)
	}
	pctx, cancel := context.WithCancel(ps.s.life)
	p := &process{tag: m.GetTag(), config: cfg, cancel: cancel, done: make(chan struct{}), subs: map[*subscriber]struct{}{}}
	var stdin io.Reader
	if m.Pty != nil || m.Stdin == nil || m.GetStdin() {
		r, w := io.Pipe()
		stdin, p.stdin = r, w
		ereq.Stdin = true
	}
	var ws agentproto.WinSize
	if m.Pty != nil {
		p.pty = true
		p.resize = make(chan agentproto.WinSize, 4)
		ws = winSize(m.GetPty().GetSize())
		if !ws.Valid() {
			cancel()
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("pty.size: rows and cols must be 1..%d", agentproto.MaxWinSize))
		}
	}
	table := ps.s.procs.table(tg.id)
	table.add(p)
	sub := p.subscribe()
	defer p.unsubscribe(sub)
	go ps.s.run(pctx, table, p, tg, ereq, ws, stdin)
	send := func(ev *envdpb.ProcessEvent) error { return stream.Send(&envdpb.StartResponse{Event: ev}) }
	return follow(ctx, req.Header(), p, sub, send)
}

// winSize converts a terminal size; one out of range is not Valid.
func winSize(sz *envdpb.PTY_Size) agentproto.WinSize {
	return agentproto.WinSize{Rows: uint16(min(sz.GetRows(), agentproto.MaxWinSize+1)), Cols: uint16(min(sz.GetCols(), agentproto.MaxWinSize+1))}
}

// run runs p to its end and publishes the end.
func (s *Server) run(ctx context.Context, table *procTable, p *process, tg target, req *api.ExecRequest, ws agentproto.WinSize, stdin io.Reader) {
	defer p.cancel()
	var (
		res *api.ExecFrame
		err error
	)
	if p.pty {
		res, err = s.cfg.Manager.Guest().Pty(ctx, tg.tenant, tg.id, req, ws, stdin, output{p, 3}, p.resize)
	} else {
		res, err = s.cfg.Manager.Guest().Exec(ctx, tg.tenant, tg.id, req, stdin, sandbox.ExecOutput{Stdout: output{p, 1}, Stderr: output{p, 2}})
	}
	if r, ok := stdin.(*io.PipeReader); ok {
		r.CloseWithError(io.ErrClosedPipe)
	}
	end := &envdpb.ProcessEvent_EndEvent{}
	p.mu.Lock()
	killed := p.killed
	p.stdin = nil
	p.mu.Unlock()
	switch {
	case killed:
		end.ExitCode, end.Status = -1, "signal: killed"
	case err != nil:
		msg := err.Error()
		end.ExitCode, end.Status, end.Error = -1, "error", &msg
	default:
		end.ExitCode = int32(*res.ExitCode)
		end.Exited = res.Signal == ""
		end.Status = "exit status " + strconv.Itoa(*res.ExitCode)
		if res.Signal != "" {
			end.ExitCode, end.Status = -1, "signal: "+strings.ToLower(strings.TrimPrefix(res.Signal, "SIG"))
		}
		if res.Error != "" {
			e := res.Error
			end.Error = &e
		}
	}
	p.mu.Lock()
	p.end = end
	p.mu.Unlock()
	table.remove(p)
	close(p.done)
}

// follow streams p's events to a Start or Connect stream: the start event,
// data, keep-alives at the interval the SDK asks for, and the end.
func follow(ctx context.Context, h http.Header, p *process, sub *subscriber, send func(*envdpb.ProcessEvent) error) error {
	if err := send(&envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_Start{Start: &envdpb.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	every := 50 * time.Second
	if n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && n > 0 {
		every = time.Duration(n) * time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
		case <-p.done:
			p.mu.Lock()
			end := p.end
			p.mu.Unlock()
			return send(&envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_End{End: end}})
		case <-tick.C:
			if err := send(&envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_Keepalive{Keepalive: &envdpb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (ps processService) Connect(ctx context.Context, req *connect.Request[envdpb.ConnectRequest], stream *connect.ServerStream[envdpb.ConnectResponse]) error {
	p, err := ps.s.procs.table(targetOf(ctx).id).find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := p.subscribe()
	defer p.unsubscribe(sub)
	return follow(ctx, req.Header(), p, sub, func(ev *envdpb.ProcessEvent) error {
		return stream.Send(&envdpb.ConnectResponse{Event: ev})
	})
}

func (ps processService) List(ctx context.Context, _ *connect.Request[envdpb.ListRequest]) (*connect.Response[envdpb.ListResponse], error) {
	out := &envdpb.ListResponse{}
	for _, p := range ps.s.procs.table(targetOf(ctx).id).list() {
		pi := &envdpb.ProcessInfo{Config: p.config, Pid: p.pid}
		if p.tag != "" {
			t := p.tag
			pi.Tag = &t
		}
		out.Processes = append(out.Processes, pi)
	}
	return connect.NewResponse(out), nil
}

func (ps processService) SendInput(ctx context.Context, req *connect.Request[envdpb.SendInputRequest]) (*connect.Response[envdpb.SendInputResponse], error) {
	p, err := ps.s.procs.table(targetOf(ctx).id).find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var data []byte
	switch in := req.Msg.GetInput().GetInput().(type) {
	case *envdpb.ProcessInput_Stdin:
		data = in.Stdin
	case *envdpb.ProcessInput_Pty:
		data = in.Pty
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input: give stdin or pty bytes"))
	}
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	if w == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no open stdin (start it with stdin: true)", p.pid))
	}
	if _, err := w.Write(data); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d: stdin: %w", p.pid, err))
	}
	return connect.NewResponse(&envdpb.SendInputResponse{}), nil
}

func (ps processService) CloseStdin(ctx context.Context, req *connect.Request[envdpb.CloseStdinRequest]) (*connect.Response[envdpb.CloseStdinResponse], error) {
	p, err := ps.s.procs.table(targetOf(ctx).id).find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.pty {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("a terminal has no stdin to close: send Ctrl-D (0x04)"))
	}
	p.mu.Lock()
	w := p.stdin
	p.stdin = nil
	p.mu.Unlock()
	if w != nil {
		_ = w.Close()
	}
	return connect.NewResponse(&envdpb.CloseStdinResponse{}), nil
}

// SendSignal: SIGKILL and SIGTERM both kill the process group (the agent
// offers the host SIGKILL only).
func (ps processService) SendSignal(ctx context.Context, req *connect.Request[envdpb.SendSignalRequest]) (*connect.Response[envdpb.SendSignalResponse], error) {
	p, err := ps.s.procs.table(targetOf(ctx).id).find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	switch req.Msg.GetSignal() {
	case envdpb.Signal_SIGNAL_SIGKILL, envdpb.Signal_SIGNAL_SIGTERM:
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v: give SIGKILL or SIGTERM", req.Msg.GetSignal()))
	}
	p.kill()
	return connect.NewResponse(&envdpb.SendSignalResponse{}), nil
}

func (ps processService) Update(ctx context.Context, req *connect.Request[envdpb.UpdateRequest]) (*connect.Response[envdpb.UpdateResponse], error) {
	p, err := ps.s.procs.table(targetOf(ctx).id).find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty == nil {
		return connect.NewResponse(&envdpb.UpdateResponse{}), nil
	}
	if !p.pty {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal to resize", p.pid))
	}
	ws := winSize(req.Msg.GetPty().GetSize())
	if !ws.Valid() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("pty.size: rows and cols must be 1..%d", agentproto.MaxWinSize))
	}
	select {
	case p.resize <- ws:
	case <-p.done:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has ended", p.pid))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return connect.NewResponse(&envdpb.UpdateResponse{}), nil
}

func (ps processService) StreamInput(context.Context, *connect.ClientStream[envdpb.StreamInputRequest]) (*connect.Response[envdpb.StreamInputResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("StreamInput is not implemented: use SendInput (what the SDKs call)"))
}
