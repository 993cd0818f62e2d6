// Package sandbox manages sandbox lifecycles: create, start, exec, stop,
// pause, destroy; maximum lifetime and idle timeouts; and re-attaching to
// running sandboxes after a daemon restart. It owns the contexts sandboxes
// live under: no request context ever bounds a sandbox's life.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/audit"
	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/gateway"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/oci"
)

// Statuses a sandbox record goes through.
const (
	StatusCreating  = "creating"
	StatusRunning   = "running"
	StatusPaused    = "paused"
	StatusStopped   = "stopped"
	StatusFailed    = "failed"
	StatusDestroyed = "destroyed"
)

// agentStartTimeout bounds the wait for a started sandbox's agent to answer
// (VMs under TCG boot in seconds; a container's agent answers in ms).
const agentStartTimeout = 60 * time.Second

// Limits on create requests.
const (
	MinMemory   = 32 << 20
	MaxEnvBytes = 256 << 10
)

// Config configures a Manager.
type Config struct {
	Store  store.Store
	Images *image.Cache
	// StateDir holds one directory per sandbox.
	StateDir  string
	AgentPath string
	Logger    *slog.Logger
	// MinIsolation is the daemon-wide floor.
	MinIsolation isolation.Class
	// DefaultRuntime serves requests that name no runtime; "" or "auto"
	// is the strongest available runtime meeting the floor.
	DefaultRuntime string
	// DefaultTimeout is the maximum lifetime when a request gives none
	// (0 = unlimited).
	DefaultTimeout time.Duration
	// Now is the clock (tests); nil = time.Now.
	Now func() time.Time
	// Gateway attaches sandboxes to the network; nil = no network at all.
	Gateway *gateway.Gateway
	// Vault holds credentials for secret bindings; nil = no bindings.
	Vault *vault.Vault
	// Events is the event path (the daemon's, shared with the gateway);
	// nil = one of the manager's own with the defaults, closed by Close.
	Events *audit.Log
}

// Manager runs sandboxes for every tenant.
type Manager struct {
	cfg Config
	log *slog.Logger

	// mu guards live.
	mu   sync.Mutex
	live map[string]*entry

	events    *audit.Log
	ownEvents bool // made by New: Close closes it
	closeOne  sync.Once
}

// entry is a sandbox the daemon is attached to.
type entry struct {
	id, tenant string
	sb         isolation.Sandbox
	token      string
	// started, when set, is closed once the runtime's Start returns: a
	// dial loop waiting out its backoff retries at once (runtimes whose
	// agent endpoint appears only at the end of Start).
	started chan struct{}

	// mu guards client, execs, active and persisted.
	mu     sync.Mutex
	client *agentproto.Client
	execs  int
	paused bool
	// active is the last API activity; persisted is the value last written
	// to the store (the reaper writes it back, so execs cost no store write).
	active, persisted time.Time
}

// New returns a Manager. Call Recover before serving requests.
func New(cfg Config) *Manager {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MinIsolation == 0 {
		cfg.MinIsolation = isolation.Namespaces
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, live: map[string]*entry{}, events: cfg.Events}
	if m.events == nil {
		m.events = audit.New(audit.Config{Store: cfg.Store, Logger: cfg.Logger, Now: cfg.Now})
		m.ownEvents = true
	}
	return m
}

// specRecord is what is stored as store.Sandbox.Spec: the request as
// applied (never secrets) plus the agent token, which lets the daemon
// reconnect after a restart. The token authenticates the host to the agent;
// it is not a user credential and never leaves the daemon's store.
type specRecord struct {
	Resources   isolation.Resources `json:"resources"`
	Env         []string            `json:"env,omitempty"`
	AgentToken  string              `json:"agent_token"`
	StateDir    string              `json:"state_dir"`
	IdleTimeout string              `json:"idle_timeout,omitempty"`
	Policy      *policy.Document    `json:"policy,omitempty"`
	Secrets     []boundSecret       `json:"secrets,omitempty"`
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "sb-" + hex.EncodeToString(b)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrInvalid, fmt.Sprintf(format, args...))
}

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateEnv checks KEY=VALUE pairs.
func ValidateEnv(field string, env []string) error {
	total := 0
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !envKey.MatchString(k) {
			return invalid("%s: %q is not KEY=VALUE with a valid name", field, kv)
		}
		if strings.ContainsAny(v, "\x00\n") {
			return invalid("%s: the value of %s contains a newline or NUL byte", field, k)
		}
		total += len(kv)
	}
	if total > MaxEnvBytes {
		return invalid("%s: %d bytes of environment, the limit is %d", field, total, MaxEnvBytes)
	}
	return nil
}

func parseDuration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, invalid("%s: %q is not a duration such as 30s, 10m or 2h", field, s)
	}
	return d, nil
}

// Create creates and starts a sandbox for tenant.
func (m *Manager) Create(ctx context.Context, tenant *store.Tenant, req *api.CreateSandboxRequest) (*api.Sandbox, error) {
	if req.MemoryBytes != 0 && req.MemoryBytes < MinMemory {
		return nil, invalid("memory: %d bytes is below the minimum of %d MiB", req.MemoryBytes, MinMemory>>20)
	}
	if req.CPUs < 0 || req.CPUs > 64 {
		return nil, invalid("cpus: %v is out of range (0 < cpus <= 64)", req.CPUs)
	}
	if req.PIDs < 0 || req.DiskBytes < 0 || req.MemoryBytes < 0 {
		return nil, invalid("limits must not be negative")
	}
	if req.PIDs != 0 && req.PIDs < 8 {
		return nil, invalid("pids: %d is too few for the agent and a shell (at least 8)", req.PIDs)
	}
	timeout, err := parseDuration("timeout", req.Timeout)
	if err != nil {
		return nil, err
	}
	idle, err := parseDuration("idle_timeout", req.IdleTimeout)
	if err != nil {
		return nil, err
	}
	if err := ValidateEnv("env", req.Env); err != nil {
		return nil, err
	}
	doc, pol, err := PolicyOf(req.Policy, req.Allow)
	if err != nil {
		return nil, err
	}
	rt, err := m.PickRuntime(req.Runtime, tenant)
	if err != nil {
		if errors.Is(err, isolation.ErrUnavailable) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: runtime: %v", errdefs.ErrInvalid, err)
	}
	imgName := req.Image
	if imgName == "" {
		imgName = "default"
	}
	img, err := m.cfg.Images.Get(imgName)
	if err != nil {
		if errors.Is(err, image.ErrNotFound) {
			return nil, fmt.Errorf("%w: %v", errdefs.ErrNotFound, err)
		}
		if errors.Is(err, image.ErrInvalid) {
			return nil, fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
		}
		return nil, fmt.Errorf("image %s: %w", imgName, err)
	}

	id := newID()
	bound, secretEnv, undoSecrets, err := m.bindSecrets(ctx, tenant.ID, id, req.Secrets)
	if err != nil {
		undoSecrets()
		return nil, err
	}
	creds, err := m.credentialBindings(tenant.ID, bound)
	if err != nil {
		undoSecrets()
		return nil, fmt.Errorf("%w: secrets: %v", errdefs.ErrInvalid, err)
	}
	tok := make([]byte, 32)
	_, _ = rand.Read(tok)
	res := isolation.Resources{MemoryBytes: req.MemoryBytes, CPUs: req.CPUs, PIDs: req.PIDs, DiskBytes: req.DiskBytes}
	applyDefaults(&res)
	spec := &isolation.Spec{
		ID:         id,
		StateDir:   filepath.Join(m.cfg.StateDir, id),
		RootFS:     img.Path,
		AgentPath:  m.cfg.AgentPath,
		AgentToken: hex.EncodeToString(tok),
		Env:        append(append([]string(nil), req.Env...), secretEnv...),
		Hostname:   "sandbox",
		Resources:  res,
	}
	sr := specRecord{Resources: res, Env: req.Env, AgentToken: spec.AgentToken, StateDir: spec.StateDir, IdleTimeout: req.IdleTimeout, Policy: doc, Secrets: bound}
	specJSON, _ := json.Marshal(sr)
	now := m.cfg.Now().UTC()
	if timeout == 0 {
		timeout = m.cfg.DefaultTimeout
	}
	rec := &store.Sandbox{
		ID: id, TenantID: tenant.ID, Runtime: rt.Name(), Image: img.Name,
		Status: StatusCreating, Spec: specJSON, CreatedAt: now, UpdatedAt: now,
		IdleTimeout: idle, LastActive: now,
	}
	if timeout > 0 {
		exp := now.Add(timeout)
		rec.ExpiresAt = &exp
	}
	log := m.log.With("sandbox", id, "tenant", tenant.ID, "runtime", rt.Name())
	// The record exists before anything is made on the host, so a crash at
	// any later point is found and cleaned up by Recover.
	if err := m.cfg.Store.CreateSandbox(ctx, rec); err != nil {
		undoSecrets()
		return nil, fmt.Errorf("record sandbox: %w", err)
	}
	// Setup is bounded by the daemon, not by the caller's connection: a
	// client that hangs up mid-create must not leave a half-made sandbox.
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fail := func(err error) (*api.Sandbox, error) {
		undoSecrets()
		log.Error("create failed", "err", err)
		rec.Status, rec.Error = StatusFailed, err.Error()
		rec.UpdatedAt = m.cfg.Now().UTC()
		_ = m.cfg.Store.UpdateSandbox(sctx, rec)
		m.emit(tenant.ID, id, "sandbox.failed", map[string]any{"error": err.Error()})
		return nil, err
	}
	t0 := time.Now()
	if gw := m.cfg.Gateway; gw != nil {
		att, err := gw.Attach(sctx, id, tenant.ID, pol, false)
		if err != nil {
			return fail(fmt.Errorf("attach network: %w", err))
		}
		att.Credentials.Install(creds)
		spec.NetNS = att.Link.NetNSPath
		spec.GuestIf, spec.GuestAddr, spec.Gateway, spec.Prefix = att.Link.GuestIf, att.Link.GuestAddr, att.Link.HostAddr, att.Link.Prefix
		spec.Nameserver = att.Link.HostAddr.String()
		spec.TrustedCAPEM = att.CA.CertPEM()
		spec.Env = append(isolation.CAEnv(), spec.Env...)
	}
	sb, err := rt.Create(sctx, spec)
	tCreate := time.Since(t0)
	if err != nil {
		m.detach(id)
		return fail(fmt.Errorf("create %s sandbox: %w", rt.Name(), err))
	}
	st := sb.State()
	rec.State, _ = json.Marshal(st)
	if err := m.cfg.Store.UpdateSandbox(sctx, rec); err != nil {
		_ = sb.Destroy(sctx)
		m.detach(id)
		return fail(fmt.Errorf("record sandbox state: %w", err))
	}
	// The agent's socket exists before Start (the runtime made it), so the
	// handshake is started alongside the runtime: it completes the moment
	// the agent runs, overlapping the runtime's own exit.
	t1 := time.Now()
	e := &entry{id: id, tenant: tenant.ID, sb: sb, token: spec.AgentToken, active: now, persisted: now, started: make(chan struct{})}
	actx, acancel := context.WithCancel(sctx)
	defer acancel()
	agentErr := make(chan error, 1)
	go func() {
		c, err := e.agent(actx)
		if err == nil {
			// The agent found that the processes it would start keep
			// capabilities: it runs nothing, and the sandbox is not made.
			err = c.Refused()
		}
		agentErr <- err
	}()
	err = sb.Start(sctx)
	close(e.started)
	if err != nil {
		acancel()
		<-agentErr
		e.dropAll()
		_ = sb.Destroy(sctx)
		m.detach(id)
		return fail(fmt.Errorf("start %s sandbox: %w", rt.Name(), err))
	}
	tStart := time.Since(t1)
	var aerr error
	select {
	case aerr = <-agentErr:
	case <-time.After(agentStartTimeout):
		// An agent that died at start never answers: do not hold the
		// caller for the whole setup budget.
		acancel()
		<-agentErr
		aerr = fmt.Errorf("no answer within %s", agentStartTimeout)
	}
	if aerr != nil {
		e.dropAll()
		_ = sb.Destroy(sctx)
		m.detach(id)
		if errors.Is(aerr, agentproto.ErrRefused) {
			return fail(fmt.Errorf("the sandbox's %w", aerr))
		}
		return fail(fmt.Errorf("sandbox started but its agent does not answer: %w", aerr))
	}
	rec.Status = StatusRunning
	rec.UpdatedAt = m.cfg.Now().UTC()
	if err := m.cfg.Store.UpdateSandbox(sctx, rec); err != nil {
		_ = sb.Destroy(sctx)
		m.detach(id)
		return fail(fmt.Errorf("record sandbox: %w", err))
	}
	m.mu.Lock()
	m.live[id] = e
	m.mu.Unlock()
	var envMode []string
	for _, b := range bound {
		if b.Mode == ModeEnv {
			envMode = append(envMode, b.Name)
		}
	}
	if len(envMode) > 0 {
		m.emit(tenant.ID, id, "secret.env_delivered", map[string]any{"names": envMode, "warning": "real values are inside the guest"})
	}
	log.Info("sandbox running", "image", img.Name, "setup", tCreate, "start", tStart, "agent_ready", time.Since(t1))
	m.emit(tenant.ID, id, "sandbox.created", map[string]any{"runtime": rt.Name(), "image": img.Name})
	return m.view(rec), nil
}

func applyDefaults(r *isolation.Resources) {
	if r.MemoryBytes == 0 {
		r.MemoryBytes = oci.DefaultMemoryBytes
	}
	if r.CPUs == 0 {
		r.CPUs = oci.DefaultCPUs
	}
	if r.PIDs == 0 {
		r.PIDs = oci.DefaultPIDs
	}
	if r.DiskBytes == 0 {
		r.DiskBytes = 1 << 30
	}
}

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

// dropClient forgets a broken client so the next call redials.
func (e *entry) dropClient(c *agentproto.Client) {
	e.mu.Lock()
	if e.client == c {
		e.client.Close()
		e.client = nil
	}
	e.mu.Unlock()
}

func (m *Manager) view(r *store.Sandbox) *api.Sandbox {
	var sr specRecord
	_ = json.Unmarshal(r.Spec, &sr)
	class := ""
	if rt, ok := isolation.Lookup(r.Runtime); ok {
		class = rt.Class().String()
	}
	v := &api.Sandbox{
		ID: r.ID, Tenant: r.TenantID, Runtime: r.Runtime, Class: class, Image: r.Image,
		Status: r.Status, Error: r.Error, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt,
		LastActive: r.LastActive,
		Resources: api.Resources{
			MemoryBytes: sr.Resources.MemoryBytes, CPUs: sr.Resources.CPUs,
			PIDs: sr.Resources.PIDs, DiskBytes: sr.Resources.DiskBytes,
		},
	}
	if r.IdleTimeout > 0 {
		v.IdleTimeout = r.IdleTimeout.String()
	}
	if sr.Policy != nil {
		v.Policy, _ = json.Marshal(sr.Policy)
	}
	for _, b := range sr.Secrets {
		v.Secrets = append(v.Secrets, api.BoundSecret{Name: b.Name, Secret: b.Secret, Hosts: b.Hosts, Mode: b.Mode, Headers: b.Headers, Query: b.Query, HMAC: b.HMAC})
		if b.Mode == ModeEnv {
			v.RealInGuest = append(v.RealInGuest, b.Name)
		}
	}
	if gw := m.cfg.Gateway; gw != nil {
		if a, ok := gw.Get(r.ID); ok {
			v.Network = &api.Network{Address: a.Link.GuestAddr.String(), Gateway: a.Link.HostAddr.String(), HostIf: a.Link.HostIf}
		}
	}
	return v
}

// detach removes a sandbox's network (link, resolver, listener, CA).
func (m *Manager) detach(id string) {
	if gw := m.cfg.Gateway; gw != nil {
		if err := gw.Detach(context.Background(), id, false); err != nil {
			m.log.Error("detach network", "sandbox", id, "err", err)
		}
	}
}

// PolicyOf builds a sandbox's policy from a request's document and --allow
// hosts. Neither given: deny everything.
func PolicyOf(raw json.RawMessage, allow []string) (*policy.Document, *policy.Policy, error) {
	doc := &policy.Document{Version: 1, Default: "deny"}
	if len(raw) > 0 && string(raw) != "null" {
		d, err := policy.Parse(raw)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: policy: %v", errdefs.ErrInvalid, err)
		}
		doc = d
	}
	if len(allow) > 0 {
		extra, err := policy.AllowHosts(allow...)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: allow: %v", errdefs.ErrInvalid, err)
		}
		doc.Rules = append(doc.Rules, extra.Rules...)
	}
	pol, err := policy.Compile(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: policy: %v", errdefs.ErrInvalid, err)
	}
	return doc, pol, nil
}

// Get returns a sandbox of tenant ("" = any, for the admin).
func (m *Manager) Get(ctx context.Context, tenant, id string) (*api.Sandbox, error) {
	r, err := m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return nil, notFound(id, err)
	}
	return m.view(r), nil
}

func notFound(id string, err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: no sandbox %q (cagebox ls lists yours)", errdefs.ErrNotFound, id)
	}
	return err
}

// List returns the sandboxes of tenant ("" = all).
func (m *Manager) List(ctx context.Context, tenant string) ([]*api.Sandbox, error) {
	rs, err := m.cfg.Store.ListSandboxes(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]*api.Sandbox, 0, len(rs))
	for _, r := range rs {
		out = append(out, m.view(r))
	}
	return out, nil
}

// attached finds a running sandbox of tenant that this daemon is attached to.
func (m *Manager) attached(ctx context.Context, tenant, id string) (*store.Sandbox, *entry, error) {
	r, err := m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return nil, nil, notFound(id, err)
	}
	m.mu.Lock()
	e := m.live[id]
	m.mu.Unlock()
	if e == nil {
		if r.Error != "" {
			return r, nil, fmt.Errorf("%w: sandbox %s is %s, not running: %s", errdefs.ErrConflict, id, r.Status, r.Error)
		}
		return r, nil, fmt.Errorf("%w: sandbox %s is %s, not running", errdefs.ErrConflict, id, r.Status)
	}
	return r, e, nil
}

// touch records API activity in memory; flushActivity stores it.
func (e *entry) touch(now time.Time) {
	e.mu.Lock()
	if now.After(e.active) {
		e.active = now
	}
	e.mu.Unlock()
}

// flushActivity writes changed activity times to the store.
func (m *Manager) flushActivity(ctx context.Context) {
	m.mu.Lock()
	entries := make([]*entry, 0, len(m.live))
	for _, e := range m.live {
		entries = append(entries, e)
	}
	m.mu.Unlock()
	for _, e := range entries {
		e.mu.Lock()
		t, changed := e.active, e.active.After(e.persisted)
		e.mu.Unlock()
		if !changed {
			continue
		}
		if err := m.cfg.Store.TouchSandbox(ctx, e.id, t); err == nil {
			e.mu.Lock()
			e.persisted = t
			e.mu.Unlock()
		}
	}
}

// lastActive is the later of the stored and the in-memory activity time.
func (m *Manager) lastActive(r *store.Sandbox) time.Time {
	t := r.LastActive
	m.mu.Lock()
	e := m.live[r.ID]
	m.mu.Unlock()
	if e != nil {
		e.mu.Lock()
		if e.active.After(t) {
			t = e.active
		}
		e.mu.Unlock()
	}
	return t
}

// ExecOutput receives an exec's output.
type ExecOutput struct {
	Stdout, Stderr io.Writer
}

// Exec runs a command in a running sandbox, streaming its output. The
// result carries OOMKilled when the sandbox's OOM counter rose during a
// run that ended by SIGKILL.
func (m *Manager) Exec(ctx context.Context, tenant, id string, req *api.ExecRequest, stdin io.Reader, out ExecOutput) (*api.ExecFrame, error) {
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
	e.mu.Lock()
	if e.paused {
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: sandbox %s is paused: cagebox resume %s", errdefs.ErrConflict, id, id)
	}
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
	if hasOOM {
		oomBefore, _ = oc.OOMKills()
	}
	// A sandbox whose OOM kills it whole (isolation.OOMScope) and that has
	// had one is dead: say so rather than wait for its agent.
	if hasOOM && oomBefore > 0 && oomKillsSandbox(e.sb) {
		msg := m.lostToOOM(e)
		return nil, fmt.Errorf("%w: sandbox %s is %s: %s", errdefs.ErrConflict, id, StatusFailed, msg)
	}
	c, err := e.agent(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: agent of %s: %v", errdefs.ErrUnavailable, id, err)
	}
	areq := &agentproto.ExecRequest{Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User, Timeout: timeout, Stdin: req.Stdin}
	if !req.Stdin {
		stdin = nil
	}
	res, err := c.Exec(ctx, areq, stdin, out.Stdout, out.Stderr)
	if err != nil {
		if ctx.Err() == nil && isConnErr(err) {
			e.dropClient(c)
		}
		// The agent went away with the whole sandbox: an OOM, when the
		// counter says so, is what the user hears about, not the
		// protocol error it caused.
		if hasOOM && oomKillsSandbox(e.sb) {
			if after, oerr := oc.OOMKills(); oerr == nil && after > oomBefore {
				msg := m.lostToOOM(e)
				code := 137
				f := &api.ExecFrame{Stream: "exit", ExitCode: &code, Signal: "SIGKILL", OOMKilled: true, Error: msg}
				m.emit(e.tenant, id, "sandbox.exec", map[string]any{"command": req.Argv[0], "args": len(req.Argv) - 1, "exit_code": code, "oom_killed": true, "timed_out": false})
				return f, nil
			}
		}
		return nil, fmt.Errorf("exec in %s: %w", id, err)
	}
	code := res.ExitCode
	f := &api.ExecFrame{Stream: "exit", ExitCode: &code, Signal: res.Signal, TimedOut: res.TimedOut, Error: res.Error}
	if hasOOM && res.Signal == "SIGKILL" {
		if after, err := oc.OOMKills(); err == nil && after > oomBefore {
			f.OOMKilled = true
		}
	}
	m.emit(e.tenant, id, "sandbox.exec", map[string]any{"command": req.Argv[0], "args": len(req.Argv) - 1, "exit_code": code, "oom_killed": f.OOMKilled, "timed_out": res.TimedOut})
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
func (m *Manager) lostToOOM(e *entry) string {
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
	m.emit(e.tenant, e.id, "sandbox.failed", map[string]any{"error": msg, "oom_killed": true})
	return msg
}

func isConnErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// agentOf returns the agent client of a running sandbox of tenant and
// records the activity.
func (m *Manager) agentOf(ctx context.Context, tenant, id string) (*agentproto.Client, error) {
	_, e, err := m.attached(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	e.touch(m.cfg.Now())
	c, err := e.agent(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: agent of %s: %v", errdefs.ErrUnavailable, id, err)
	}
	return c, nil
}

// WriteFile writes a file into a running sandbox.
func (m *Manager) WriteFile(ctx context.Context, tenant, id, path string, mode os.FileMode, r io.Reader) error {
	c, err := m.agentOf(ctx, tenant, id)
	if err != nil {
		return err
	}
	return c.WriteFile(ctx, path, mode, r)
}

// ReadFile reads a file from a running sandbox.
func (m *Manager) ReadFile(ctx context.Context, tenant, id, path string, w io.Writer, max int64) error {
	c, err := m.agentOf(ctx, tenant, id)
	if err != nil {
		return err
	}
	return c.ReadFile(ctx, path, w, max)
}

// ListDir lists a directory in a running sandbox.
func (m *Manager) ListDir(ctx context.Context, tenant, id, path string) ([]agentproto.FileInfo, error) {
	c, err := m.agentOf(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return c.ListDir(ctx, path)
}

// Pause freezes a running sandbox.
func (m *Manager) Pause(ctx context.Context, tenant, id string) (*api.Sandbox, error) {
	return m.transition(ctx, tenant, id, StatusRunning, StatusPaused, "sandbox.paused", func(ctx context.Context, e *entry) error {
		return e.sb.Pause(ctx)
	})
}

// Resume thaws a paused sandbox.
func (m *Manager) Resume(ctx context.Context, tenant, id string) (*api.Sandbox, error) {
	return m.transition(ctx, tenant, id, StatusPaused, StatusRunning, "sandbox.resumed", func(ctx context.Context, e *entry) error {
		return e.sb.Resume(ctx)
	})
}

func (m *Manager) transition(ctx context.Context, tenant, id, from, to, kind string, fn func(context.Context, *entry) error) (*api.Sandbox, error) {
	r, e, err := m.attached(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if r.Status != from {
		return nil, fmt.Errorf("%w: sandbox %s is %s, not %s", errdefs.ErrConflict, id, r.Status, from)
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := fn(sctx, e); err != nil {
		return nil, fmt.Errorf("%s %s: %w", strings.TrimPrefix(kind, "sandbox."), id, err)
	}
	e.mu.Lock()
	e.paused = to == StatusPaused
	e.mu.Unlock()
	r.Status = to
	r.UpdatedAt = m.cfg.Now().UTC()
	if err := m.cfg.Store.UpdateSandbox(sctx, r); err != nil {
		return nil, err
	}
	m.emit(r.TenantID, id, kind, nil)
	return m.view(r), nil
}

// Stop stops a sandbox's processes; its record and writable layer stay
// until Remove.
func (m *Manager) Stop(ctx context.Context, tenant, id string, grace time.Duration) (*api.Sandbox, error) {
	r, err := m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return nil, notFound(id, err)
	}
	m.mu.Lock()
	e := m.live[id]
	delete(m.live, id)
	m.mu.Unlock()
	if e == nil {
		return m.view(r), nil
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace+30*time.Second)
	defer cancel()
	e.dropAll()
	if err := e.sb.Stop(sctx, grace); err != nil {
		m.log.Warn("stop", "sandbox", id, "err", err)
	}
	r.Status = StatusStopped
	r.UpdatedAt = m.cfg.Now().UTC()
	if err := m.cfg.Store.UpdateSandbox(sctx, r); err != nil {
		return nil, err
	}
	m.emit(r.TenantID, id, "sandbox.stopped", nil)
	return m.view(r), nil
}

func (e *entry) dropAll() {
	e.mu.Lock()
	if e.client != nil {
		e.client.Close()
		e.client = nil
	}
	e.mu.Unlock()
}

// Remove destroys a sandbox and deletes its record.
func (m *Manager) Remove(ctx context.Context, tenant, id string) error {
	r, err := m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return notFound(id, err)
	}
	if err := m.destroy(r, "removed"); err != nil {
		return err
	}
	return m.cfg.Store.DeleteSandbox(context.Background(), id)
}

// destroy tears a sandbox down on the host and marks its record.
func (m *Manager) destroy(r *store.Sandbox, reason string) error {
	m.mu.Lock()
	e := m.live[r.ID]
	delete(m.live, r.ID)
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var sb isolation.Sandbox
	if e != nil {
		e.dropAll()
		sb = e.sb
	} else {
		sb = m.sandboxFromRecord(ctx, r)
	}
	if sb != nil {
		if err := sb.Destroy(ctx); err != nil {
			m.log.Error("destroy", "sandbox", r.ID, "err", err)
			return fmt.Errorf("destroy %s: %w", r.ID, err)
		}
	} else {
		m.cleanupOrphanDir(r)
	}
	m.detach(r.ID)
	var sr specRecord
	if json.Unmarshal(r.Spec, &sr) == nil {
		m.dropInline(r.TenantID, sr.Secrets)
	}
	r.Status = StatusDestroyed
	if reason != "removed" {
		r.Error = reason
	}
	r.UpdatedAt = m.cfg.Now().UTC()
	if err := m.cfg.Store.UpdateSandbox(ctx, r); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	m.emit(r.TenantID, r.ID, "sandbox.destroyed", map[string]any{"reason": reason})
	m.log.Info("sandbox destroyed", "sandbox", r.ID, "reason", reason)
	return nil
}

// sandboxFromRecord rebuilds a runtime handle for a sandbox this daemon is
// not attached to (stopped, or found after a restart), so it can be destroyed.
func (m *Manager) sandboxFromRecord(ctx context.Context, r *store.Sandbox) isolation.Sandbox {
	if len(r.State) == 0 {
		return nil
	}
	var st isolation.State
	if json.Unmarshal(r.State, &st) != nil {
		return nil
	}
	rt, ok := isolation.Lookup(st.Runtime)
	if !ok {
		return nil
	}
	sb, err := rt.Recover(ctx, st)
	if err != nil {
		// Recover of a sandbox that no longer runs cleans up and says gone.
		return nil
	}
	return sb
}

// cleanupOrphanDir removes what a sandbox that never recorded its runtime
// state left: mounts below its state dir, then the dir.
func (m *Manager) cleanupOrphanDir(r *store.Sandbox) {
	var sr specRecord
	if json.Unmarshal(r.Spec, &sr) != nil || sr.StateDir == "" {
		return
	}
	unmountBelow(sr.StateDir)
	_ = os.RemoveAll(sr.StateDir)
}

// Recover re-attaches to every sandbox the store says is running or
// paused, and cleans up (and marks failed) those that are gone.
func (m *Manager) Recover(ctx context.Context) error {
	rs, err := m.cfg.Store.ListSandboxes(ctx, "")
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	for _, r := range rs {
		switch r.Status {
		case StatusRunning, StatusPaused, StatusCreating:
		default:
			continue
		}
		log := m.log.With("sandbox", r.ID)
		var sr specRecord
		_ = json.Unmarshal(r.Spec, &sr)
		var st isolation.State
		sb := isolation.Sandbox(nil)
		var rerr error
		if r.Status != StatusCreating && len(r.State) > 0 && json.Unmarshal(r.State, &st) == nil {
			if rt, ok := isolation.Lookup(st.Runtime); ok {
				sb, rerr = rt.Recover(ctx, st)
			} else {
				rerr = fmt.Errorf("runtime %q is not registered", st.Runtime)
			}
		} else if r.Status == StatusCreating {
			rerr = errors.New("the daemon stopped while the sandbox was being created")
			if s := m.sandboxFromRecord(ctx, r); s != nil {
				_ = s.Destroy(ctx)
			}
		}
		if sb != nil && rerr != nil {
			// A runtime that returns its sandbox with an error (ErrGone)
			// still gets it cleaned up; it is never taken for running.
			_ = sb.Destroy(ctx)
			sb = nil
		}
		if sb == nil {
			if rerr == nil {
				rerr = errors.New("no runtime state recorded")
			}
			m.cleanupOrphanDir(r)
			m.detach(r.ID)
			r.Status = StatusFailed
			r.Error = "lost after a daemon restart and cleaned up: " + rerr.Error()
			r.UpdatedAt = m.cfg.Now().UTC()
			_ = m.cfg.Store.UpdateSandbox(ctx, r)
			m.emit(r.TenantID, r.ID, "sandbox.lost", map[string]any{"error": rerr.Error()})
			log.Warn("sandbox lost after restart", "err", rerr)
			continue
		}
		if gw := m.cfg.Gateway; gw != nil {
			_, pol, err := PolicyOf(nil, nil)
			if sr.Policy != nil {
				pol, err = policy.Compile(sr.Policy)
			}
			var att *gateway.Attachment
			if err == nil {
				att, err = gw.Attach(ctx, r.ID, r.TenantID, pol, true)
			}
			if err == nil {
				var creds *credentials.Bindings
				if creds, err = m.credentialBindings(r.TenantID, sr.Secrets); err == nil {
					att.Credentials.Install(creds)
				}
			}
			if err != nil {
				// Without its gateway the sandbox would have no policy
				// point: destroy it rather than run it unconfined.
				log.Error("re-attach network failed; destroying the sandbox", "err", err)
				_ = sb.Destroy(ctx)
				m.detach(r.ID)
				r.Status, r.Error = StatusFailed, "network could not be re-attached after a daemon restart: "+err.Error()
				r.UpdatedAt = m.cfg.Now().UTC()
				_ = m.cfg.Store.UpdateSandbox(ctx, r)
				continue
			}
		}
		m.mu.Lock()
		m.live[r.ID] = &entry{id: r.ID, tenant: r.TenantID, sb: sb, token: sr.AgentToken, paused: r.Status == StatusPaused}
		m.mu.Unlock()
		m.emit(r.TenantID, r.ID, "sandbox.reattached", nil)
		log.Info("re-attached sandbox after restart", "status", r.Status)
	}
	return nil
}

// Reap destroys sandboxes past their maximum lifetime or idle timeout.
// The daemon calls it periodically.
func (m *Manager) Reap(ctx context.Context) {
	rs, err := m.cfg.Store.ListSandboxes(ctx, "")
	if err != nil {
		m.log.Error("reap: list", "err", err)
		return
	}
	now := m.cfg.Now()
	for _, r := range rs {
		switch r.Status {
		case StatusRunning, StatusPaused, StatusStopped:
		default:
			continue
		}
		reason := ""
		if r.ExpiresAt != nil && now.After(*r.ExpiresAt) {
			reason = "maximum lifetime reached"
		} else if r.IdleTimeout > 0 && now.Sub(m.lastActive(r)) > r.IdleTimeout && !m.busy(r.ID) {
			reason = fmt.Sprintf("idle for more than %s", r.IdleTimeout)
		}
		if reason != "" {
			if err := m.destroy(r, reason); err != nil {
				m.log.Error("reap", "sandbox", r.ID, "err", err)
			}
		}
	}
}

// busy reports whether an exec is running in the sandbox.
func (m *Manager) busy(id string) bool {
	m.mu.Lock()
	e := m.live[id]
	m.mu.Unlock()
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.execs > 0
}

// RunReaper calls Reap every interval until ctx ends.
func (m *Manager) RunReaper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.flushActivity(ctx)
			m.Reap(ctx)
		}
	}
}

// Close stores pending events and activity and drops agent connections;
// sandboxes keep running and are re-attached by the next daemon.
func (m *Manager) Close() {
	m.closeOne.Do(func() {
		if m.ownEvents {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := m.events.Close(ctx); err != nil {
				m.log.Error("close events", "err", err)
			}
			cancel()
		}
		m.flushActivity(context.Background())
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, e := range m.live {
			e.dropAll()
		}
	})
}

// Count is the number of sandboxes this daemon is attached to.
func (m *Manager) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

// Floor is the isolation floor for tenant: the daemon's, raised by the
// tenant's own.
// PickRuntime chooses the runtime for a request naming name ("" = the
// daemon's default; "auto" = the strongest available meeting the tenant's
// floor). A default that is below the tenant's floor or unavailable here
// gives way to auto; a runtime the request names explicitly never does.
func (m *Manager) PickRuntime(name string, tenant *store.Tenant) (isolation.Runtime, error) {
	floor := m.Floor(tenant)
	if name == "" {
		if d := m.cfg.DefaultRuntime; d != "" && d != "auto" {
			if rt, err := isolation.Pick(d, floor); err == nil {
				return rt, nil
			}
		}
		name = "auto"
	}
	return isolation.Pick(name, floor)
}

func (m *Manager) Floor(tenant *store.Tenant) isolation.Class {
	floor := m.cfg.MinIsolation
	if tenant != nil && tenant.Untrusted && floor < isolation.Hypervisor {
		floor = isolation.Hypervisor
	}
	if tenant != nil && tenant.MinIsolation != "" {
		if c, err := isolation.ParseClass(tenant.MinIsolation); err == nil && c > floor {
			floor = c
		}
	}
	return floor
}
