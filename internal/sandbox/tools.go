package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/isolation"
)

// Named tools: a tenant registers a command under a name (PutTool) and
// callers run it with an input (Execute) without knowing where it runs —
// each execute is a fresh sandbox (a warm-pool claim where a pool holds
// its class) that is removed when the result is back.

// Limits of tools.
const (
	DefaultToolTimeout = 60 * time.Second
	MaxToolTimeout     = time.Hour
	// MaxToolOutput bounds stdout and stderr each in a result.
	MaxToolOutput = 1 << 20
	// MaxToolInput bounds an execute's input.
	MaxToolInput = 8 << 20
)

var toolName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// Tools is the manager's service of a tenant's registered tools
// (Manager.Tools): checked when put, each execute a fresh sandbox made and
// bound as any create (a pool claim when one matches), removed after.
type Tools struct{ m *Manager }

// Tools is the service of the tenants' registered tools.
func (m *Manager) Tools() *Tools { return m.tools }

// PutTool registers (replace: or replaces) a tool of tenant after checking
// everything an execute needs: a bad tool is refused here, not at its
// first execute.
func (tl *Tools) PutTool(ctx context.Context, tenant *store.Tenant, t *api.Tool, replace bool) (*api.Tool, error) {
	if err := tl.checkTool(ctx, tenant, t); err != nil {
		return nil, err
	}
	t.CreatedAt = time.Time{}
	spec, err := json.Marshal(t)
	if err != nil {
		return nil, err
	}
	st := &store.Tool{TenantID: tenant.ID, Name: t.Name, Spec: spec}
	if err := tl.m.cfg.Store.PutTool(ctx, st, replace); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: a tool named %q exists: remove it first (cagebox tool rm %s) or replace it", errdefs.ErrConflict, t.Name, t.Name)
		}
		return nil, err
	}
	out := *t
	out.CreatedAt = st.CreatedAt
	return &out, nil
}

func (tl *Tools) checkTool(ctx context.Context, tenant *store.Tenant, t *api.Tool) error {
	if !toolName.MatchString(t.Name) {
		return invalid("name: %q must be 1-63 lowercase letters, digits, '-' or '_', starting with a letter", t.Name)
	}
	if len(t.Argv) == 0 || t.Argv[0] == "" {
		return invalid("argv: give the command the tool runs")
	}
	if t.InputFile != "" && !strings.HasPrefix(t.InputFile, "/") {
		return invalid("input_file: %q must be an absolute path in the sandbox", t.InputFile)
	}
	if _, err := toolTimeout(t.Timeout); err != nil {
		return err
	}
	if err := ValidateEnv("env", t.Env); err != nil {
		return err
	}
	for _, s := range t.Secrets {
		if s.Value != "" {
			return invalid("secrets: %s has an inline value; a tool binds stored secrets only (cagebox secret add %s …, then --secret %s=vault:%s)", s.Name, s.Name, s.Name, s.Name)
		}
	}
	if len(t.Allow) > 0 {
		if _, err := policy.AllowHosts(t.Allow...); err != nil {
			return invalid("allow: %v", err)
		}
	}
	if t.PolicyRef != "" {
		if _, err := tl.m.cfg.Store.GetNamedPolicy(ctx, tenant.ID, t.PolicyRef); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return invalid("policy_ref: no policy is named %q; create it with `cagebox policy create %s FILE`", t.PolicyRef, t.PolicyRef)
			}
			return err
		}
	}
	if len(t.InputSchema) > 0 {
		var v map[string]any
		if err := json.Unmarshal(t.InputSchema, &v); err != nil {
			return invalid("input_schema: not a JSON object: %v", err)
		}
	}
	if t.MemoryBytes != 0 && t.MemoryBytes < MinMemory {
		return invalid("memory: %d bytes is below the minimum of %d MiB", t.MemoryBytes, MinMemory>>20)
	}
	if t.CPUs < 0 || t.CPUs > 64 {
		return invalid("cpus: %v is out of range (0 < cpus <= 64)", t.CPUs)
	}
	img := t.Image
	if img == "" {
		img = "default"
	}
	if _, err := tl.m.cfg.Images.Get(img); err != nil {
		return invalid("image: %v", err)
	}
	if _, err := tl.toolRuntime(t, tenant); err != nil {
		return err
	}
	return nil
}

func toolTimeout(s string) (time.Duration, error) {
	if s == "" {
		return DefaultToolTimeout, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > MaxToolTimeout {
		return 0, invalid("timeout: %q is not a duration between 1s and %s, such as 30s or 5m", s, MaxToolTimeout)
	}
	return d, nil
}

// toolRuntime picks the runtime of an execute: the tool's (or auto, or
// the daemon's default), at or above both the tool's floor and the
// tenant's.
func (tl *Tools) toolRuntime(t *api.Tool, tenant *store.Tenant) (isolation.Runtime, error) {
	floor := tl.m.Floor(tenant)
	if t.RuntimeFloor != "" {
		c, err := isolation.ParseClass(t.RuntimeFloor)
		if err != nil {
			return nil, invalid("runtime_floor: %v", err)
		}
		if c > floor {
			floor = c
		}
	}
	name := t.Runtime
	if name == "" {
		if d := tl.m.cfg.DefaultRuntime; d != "" && d != "auto" {
			if rt, err := isolation.Pick(d, floor); err == nil {
				return rt, nil
			}
		}
		name = "auto"
	}
	rt, err := isolation.Pick(name, floor)
	if err != nil {
		if errors.Is(err, isolation.ErrUnavailable) {
			return nil, err
		}
		return nil, invalid("runtime: %v", err)
	}
	return rt, nil
}

// GetTool returns a tool of tenant.
func (tl *Tools) GetTool(ctx context.Context, tenant, name string) (*api.Tool, error) {
	st, err := tl.m.cfg.Store.GetTool(ctx, tenant, name)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("%w: no tool %q (cagebox tool ls lists yours)", errdefs.ErrNotFound, name)
		}
		return nil, err
	}
	return toolOf(st)
}

func toolOf(st *store.Tool) (*api.Tool, error) {
	var t api.Tool
	if err := json.Unmarshal(st.Spec, &t); err != nil {
		return nil, fmt.Errorf("tool %q: stored spec: %w", st.Name, err)
	}
	t.Name, t.CreatedAt = st.Name, st.CreatedAt
	return &t, nil
}

// ListTools lists the tools of tenant ("" = all).
func (tl *Tools) ListTools(ctx context.Context, tenant string) ([]*api.Tool, error) {
	sts, err := tl.m.cfg.Store.ListTools(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]*api.Tool, 0, len(sts))
	for _, st := range sts {
		t, err := toolOf(st)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// DeleteTool removes a tool of tenant.
func (tl *Tools) DeleteTool(ctx context.Context, tenant, name string) error {
	if err := tl.m.cfg.Store.DeleteTool(ctx, tenant, name); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: no tool %q (cagebox tool ls lists yours)", errdefs.ErrNotFound, name)
		}
		return err
	}
	return nil
}

// Execute runs a tool of tenant once with input: a fresh sandbox, the
// input on stdin (or in the tool's input file), and back its exit code,
// bounded output, duration and the egress decisions made; the sandbox is
// removed after.
func (tl *Tools) Execute(ctx context.Context, tenant *store.Tenant, name string, req *api.ExecuteRequest) (*api.ExecuteResult, error) {
	t, err := tl.GetTool(ctx, tenant.ID, name)
	if err != nil {
		return nil, err
	}
	if len(req.Input) > MaxToolInput {
		return nil, invalid("input: %d bytes, the limit is %d", len(req.Input), MaxToolInput)
	}
	maxOut := req.MaxOutput
	if maxOut <= 0 || maxOut > MaxToolOutput {
		maxOut = MaxToolOutput
	}
	timeout, err := toolTimeout(t.Timeout)
	if err != nil {
		return nil, err
	}
	rt, err := tl.toolRuntime(t, tenant)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	sb, pooled, err := tl.m.create(ctx, tenant, &api.CreateSandboxRequest{
		Runtime: rt.Name(), Image: t.Image, MemoryBytes: t.MemoryBytes, CPUs: t.CPUs,
		Env: t.Env, Allow: t.Allow, PolicyRef: t.PolicyRef, Secrets: t.Secrets,
		// A backstop: the exec's own timeout ends the run first.
		Timeout: (timeout + time.Minute).String(),
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("tool %s: %w", name, err)
	}
	defer func() {
		if err := tl.m.RemoveAsync(context.Background(), tenant.ID, sb.ID); err != nil {
			tl.m.log.Error("remove a tool's sandbox", "sandbox", sb.ID, "err", err)
		}
	}()
	res := &api.ExecuteResult{Tool: name, Sandbox: sb.ID, Runtime: sb.Runtime, Pooled: pooled, Egress: []api.EgressDecision{}}
	var (
		egMu sync.Mutex
		eg   []api.EgressDecision
	)
	if gw := tl.m.cfg.Gateway; gw != nil {
		if a, ok := gw.Get(sb.ID); ok {
			stop := a.Observe(func(p api.EventPayload) {
				var d api.Egress
				switch e := p.(type) {
				case api.EgressAllow:
					d = api.Egress(e)
				case api.EgressDeny:
					d = api.Egress(e)
				case api.EgressError:
					d = api.Egress(e)
				default:
					return
				}
				egMu.Lock()
				defer egMu.Unlock()
				if len(eg) < 256 {
					eg = append(eg, api.EgressDecision{Host: d.Host, Method: d.Method, Path: d.Path,
						Allowed: d.Verdict == "allow", Rule: d.Rule, Reason: d.Reason})
				}
			})
			defer stop()
		}
	}
	var stdin io.Reader
	if t.InputFile != "" {
		if err := tl.m.guest.WriteFile(ctx, tenant.ID, sb.ID, t.InputFile, 0o644, strings.NewReader(req.Input)); err != nil {
			return nil, fmt.Errorf("tool %s: write input to %s: %w", name, t.InputFile, err)
		}
	} else {
		stdin = strings.NewReader(req.Input)
	}
	stdout, stderr := &capped{max: maxOut}, &capped{max: maxOut}
	ereq := &api.ExecRequest{Argv: t.Argv, Timeout: timeout.String(), Stdin: stdin != nil}
	frame, err := tl.m.guest.Exec(ctx, tenant.ID, sb.ID, ereq, stdin, ExecOutput{Stdout: stdout, Stderr: stderr})
	if err != nil {
		return nil, fmt.Errorf("tool %s: %w", name, err)
	}
	res.DurationMs = time.Since(t0).Milliseconds()
	if frame.ExitCode != nil {
		res.ExitCode = *frame.ExitCode
	}
	res.TimedOut, res.OOMKilled = frame.TimedOut, frame.OOMKilled
	res.Stdout, res.StdoutTruncated = stdout.String(), stdout.cut
	res.Stderr, res.StderrTruncated = stderr.String(), stderr.cut
	// The proxy reports a request when it ends, which can be a moment
	// after the process that made it exited.
	if tl.m.cfg.Gateway != nil {
		time.Sleep(20 * time.Millisecond)
	}
	egMu.Lock()
	res.Egress = append(res.Egress, eg...)
	egMu.Unlock()
	return res, nil
}

// capped keeps the first max bytes written and whether more came.
type capped struct {
	bytes.Buffer
	max int64
	cut bool
}

func (c *capped) Write(p []byte) (int, error) {
	n := len(p)
	if room := c.max - int64(c.Len()); int64(len(p)) > room {
		c.cut = true
		if room <= 0 {
			return n, nil
		}
		p = p[:room]
	}
	c.Buffer.Write(p)
	return n, nil
}

// RequestAccess asks an operator to let a running sandbox of tenant reach
// host, waiting up to wait for the decision (livepolicy.RequestAccess).
func (m *Manager) RequestAccess(ctx context.Context, tenant, id, host, reason string, wait time.Duration) (*api.AccessResult, error) {
	if _, _, err := m.attached(ctx, tenant, id); err != nil {
		return nil, err
	}
	reg := m.Live()
	if reg == nil {
		return nil, fmt.Errorf("%w: this daemon has no network: no access to ask for", errdefs.ErrUnavailable)
	}
	s, ok := reg.Get(id)
	if !ok {
		return nil, fmt.Errorf("%w: sandbox %s has no live policy", errdefs.ErrConflict, id)
	}
	r, err := s.RequestAccess(ctx, host, reason, wait)
	if err != nil {
		return nil, err
	}
	return &api.AccessResult{Approval: r.Approval, Allowed: r.Allowed, By: r.By, Reason: r.Reason}, nil
}
