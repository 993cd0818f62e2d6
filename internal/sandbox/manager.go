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
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/audit"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/gateway"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/livepolicy"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/isolation"
)

// Statuses a sandbox record goes through.
const (
	// StatusPooled: made ahead of its tenant and kept in a warm pool; its
	// row has no tenant (no tenant sees it) until a create binds it.
	StatusPooled    = "pooled"
	StatusCreating  = "creating"
	StatusRunning   = "running"
	StatusPaused    = "paused"
	StatusStopped   = "stopped"
	StatusFailed    = "failed"
	StatusDestroyed = "destroyed"
	// StatusRemoving: RemoveAsync accepted the removal and the daemon is
	// destroying the sandbox (a restart finishes it).
	StatusRemoving = "removing"
	// StatusHibernated: saved whole to disk, its VMM ended (Hibernate);
	// Resume restores it.
	StatusHibernated = "hibernated"
)

// Idle actions (api.CreateSandboxRequest.IdleAction).
const (
	IdleDestroy   = "destroy"
	IdlePause     = "pause"
	IdleHibernate = "hibernate"
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
	// Pools are the warm pools to keep (Pools.Start), and PoolMemory bounds
	// the memory of their ready sandboxes together.
	Pools      []pool.Target
	PoolMemory int64
	// OnCreate, if set, is told each successful create's runtime, path
	// (from a pool or cold) and latency (the daemon's metrics).
	OnCreate func(runtime string, pooled bool, d time.Duration)
	// Events is the event path (the daemon's, shared with the gateway);
	// nil = one of the manager's own with the defaults, closed by Close.
	Events *audit.Log
	// MountRoots are the host directories bind mounts may come from (nil
	// or empty: none); VolumeDir holds the tenants' volume images ("":
	// no volumes).
	MountRoots *mounts.Roots
	VolumeDir  string
	// SnapshotDir holds the snapshots' files ("": no snapshots);
	// MaxSnapshots bounds each tenant's count (0: DefaultMaxSnapshots).
	SnapshotDir  string
	MaxSnapshots int
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
	// bg counts removals running in the background (RemoveAsync); Close
	// waits for them.
	bg       sync.WaitGroup
	closeOne sync.Once
	// pool keeps warm sandboxes (nil: none); creating counts creates in
	// progress, which refills wait for.
	pool     *pool.Pool
	creating atomic.Int64
	// makes and binds count calls of make and bind (make.go): every way
	// to create a sandbox goes through both, and tests check it.
	makes, binds atomic.Int64
	// ports publishes sandboxes' ports (ports.go); tools runs the tenants'
	// registered tools (tools.go); volumes keeps the tenants' volumes and
	// checks mounts (volumes.go).
	ports     *Ports
	tools     *Tools
	volumes   *Volumes
	snapshots *Snapshots
	guest     *Guest
	pools     *Pools
	secrets   *Secrets
	imageRefs *ImageRefs
	sysAudit  *audits
}

// Ports is the service of the sandboxes' published ports.
func (m *Manager) Ports() *Ports { return m.ports }

// entry is a sandbox the daemon is attached to.
type entry struct {
	id, tenant string
	sb         isolation.Sandbox
	token      string
	// started, when set, is closed once the runtime's Start returns: a
	// dial loop waiting out its backoff retries at once (runtimes whose
	// agent endpoint appears only at the end of Start).
	started chan struct{}

	// mu guards client, execs, active, persisted, oomKnown and oomSeen.
	mu     sync.Mutex
	client *agentproto.Client
	execs  int
	// oomSeen is the sandbox's OOM kill count as last read (oomKnown:
	// it was), against which an exec's SIGKILL is told apart.
	oomKnown bool
	oomSeen  uint64
	// inbound counts ingress requests in flight (busy, like execs).
	inbound int
	paused  bool
	// pausedBy is the record's PausedBy while paused: pausedIdle (the
	// next exec, file operation or inbound request wakes it), the admin or
	// a tenant (wake refuses; lifecycle.go).
	pausedBy string
	// wakeMu serialises wakes.
	wakeMu sync.Mutex
	// freezeMu serialises what freezes or thaws the sandbox: pause,
	// resume, hibernate (transition) and a snapshot's freeze and thaw, so
	// that a snapshot's thaw never undoes a pause made meanwhile.
	freezeMu sync.Mutex
	// active is the last API activity; persisted is the value last written
	// to the store (the reaper writes it back, so execs cost no store write).
	active, persisted time.Time
	// execCwd and execUser are the defaults of execs that name none (the
	// image config's WorkingDir and User); set before the entry is live.
	execCwd, execUser string
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
	m.ports = &Ports{m: m}
	m.tools = &Tools{m: m}
	m.volumes = &Volumes{m: m}
	m.snapshots = &Snapshots{m: m}
	m.guest = &Guest{m: m}
	m.pools = &Pools{m: m}
	m.secrets = &Secrets{m: m}
	m.imageRefs = &ImageRefs{m: m}
	m.sysAudit = &audits{m: m}
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
	IdleAction  string              `json:"idle_action,omitempty"`
	Policy      *policy.Document    `json:"policy,omitempty"`
	PolicyRef   string              `json:"policy_ref,omitempty"`
	Secrets     []boundSecret       `json:"secrets,omitempty"`
	// ExecCwd and ExecUser are the defaults of execs that name no cwd or
	// user: the image config's WorkingDir and User (imageconfig.go).
	ExecCwd  string `json:"exec_cwd,omitempty"`
	ExecUser string `json:"exec_user,omitempty"`
	// Mounts (checked, ordered by target) and ReadOnlyRoot are as created;
	// the volumes a sandbox holds are read from here (volumes.go).
	Mounts       []mounts.Spec `json:"mounts,omitempty"`
	ReadOnlyRoot bool          `json:"read_only_root,omitempty"`
	// LastWake: the last wake from an idle pause.
	LastWake *api.Wake `json:"last_wake,omitempty"`
	// PausedBy is who paused (or hibernated) it, while it is: the admin
	// (only the admin resumes it), a tenant, or pausedIdle (lifecycle.go).
	PausedBy string   `json:"paused_by,omitempty"`
	Audit    []string `json:"audit,omitempty"`
	// Pool is the class a pooled sandbox was made for (until bound).
	Pool string `json:"pool,omitempty"`
	// Snapshot is the id (SnapshotName the name) of the snapshot the
	// sandbox was started from: it holds the snapshot (snapshots.go).
	Snapshot     string `json:"snapshot,omitempty"`
	SnapshotName string `json:"snapshot_name,omitempty"`
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
		LastActive: r.LastActive, Labels: r.Labels,
		Resources: api.Resources{
			MemoryBytes: sr.Resources.MemoryBytes, CPUs: sr.Resources.CPUs,
			PIDs: sr.Resources.PIDs, DiskBytes: sr.Resources.DiskBytes,
		},
	}
	if r.IdleTimeout > 0 {
		v.IdleTimeout = r.IdleTimeout.String()
		v.IdleAction = sr.IdleAction
		if v.IdleAction == "" {
			v.IdleAction = IdleDestroy
		}
	}
	if sr.Policy != nil {
		v.Policy, _ = json.Marshal(sr.Policy)
	}
	v.LastWake = sr.LastWake
	v.Snapshot = sr.SnapshotName
	switch r.Status {
	case StatusRunning, StatusPaused:
		v.Persists = "restart"
	case StatusHibernated:
		v.Persists = "reboot"
	}
	if r.Status == StatusPaused || r.Status == StatusHibernated {
		v.PausedBy = sr.PausedBy
	}
	for _, b := range sr.Secrets {
		v.Secrets = append(v.Secrets, api.BoundSecret{Name: b.Name, Secret: b.Secret, Hosts: b.Hosts, Mode: b.Mode, Headers: b.Headers, Query: b.Query, HMAC: b.HMAC})
		if b.Mode == ModeEnv {
			v.RealInGuest = append(v.RealInGuest, b.Name)
		}
	}
	v.Mounts, v.ReadOnlyRoot = mountsView(sr.Mounts), sr.ReadOnlyRoot
	v.Audit = m.sysAudit.view(r.ID, r.Runtime, sr.Audit)
	if gw := m.cfg.Gateway; gw != nil {
		if a, ok := gw.Get(r.ID); ok {
			v.Network = &api.Network{Address: a.Link.GuestAddr.String(), Gateway: a.Link.HostAddr.String(), HostIf: a.Link.HostIf}
		}
	}
	return v
}

// Live returns the live policy registry (nil without a network).
func (m *Manager) Live() *livepolicy.Registry {
	if m.cfg.Gateway == nil {
		return nil
	}
	return m.cfg.Gateway.Live()
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
	v := m.view(r)
	if ps, err := m.ports.ListPorts(ctx, tenant, id); err == nil && len(ps) > 0 {
		v.Ports = ps
	}
	return v, nil
}

func notFound(id string, err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: no sandbox %q (cagebox ls lists yours)", errdefs.ErrNotFound, id)
	}
	return err
}

// List returns the sandboxes of tenant ("" = all).
func (m *Manager) List(ctx context.Context, tenant string) ([]*api.Sandbox, error) {
	return m.ListLabeled(ctx, tenant, nil)
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

// Close stores pending events and activity and drops agent connections;
// sandboxes keep running and are re-attached by the next daemon.
func (m *Manager) Close() {
	m.closeOne.Do(func() {
		if m.pool != nil {
			m.pool.Close()
		}
		m.bg.Wait()
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
// Running reports, from memory (no store read), whether sandbox id is
// attached to this daemon — running, or paused and woken by the next call
// — and whose it is: the check the hot paths (exec, the E2B front's envd)
// make before they reach its agent.
func (m *Manager) Running(id string) (tenant string, ok bool) {
	m.mu.Lock()
	e := m.live[id]
	m.mu.Unlock()
	if e == nil {
		return "", false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tenant, e.tenant != ""
}

func (m *Manager) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

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

// Floor is the isolation floor for tenant: the daemon's, raised by the
// tenant's own.
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
