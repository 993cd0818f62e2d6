// Package store defines the daemon's persistent state — tenants, API keys,
// sandboxes and the event log — behind one interface, so that a single-host
// daemon can keep it in SQLite (package store/sqlite) and a cluster in
// Postgres. Every implementation must pass the conformance suite in
// package store/storetest.
//
// Conventions every implementation follows:
//
//   - Times are normalised to UTC and truncated to microseconds (the
//     precision Postgres keeps) before they are written, and the normalised
//     values are written back into the struct the caller passed, so a value
//     read back compares equal with time.Time.Equal.
//   - A missing row is an error wrapping ErrNotFound; a duplicate ID (or API
//     key hash) is an error wrapping ErrConflict. Test with errors.Is.
//   - Tenant isolation is part of the query: a sandbox or event of another
//     tenant is not found, never fetched and filtered afterwards.
//   - JSON columns (Sandbox.Spec, Sandbox.State, Event.Data) round-trip as
//     equivalent JSON, not necessarily byte for byte (Postgres jsonb may
//     reformat). An empty value reads back as nil.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Sentinel errors. Implementations wrap them with context, e.g.
// fmt.Errorf("sandbox %q: %w", id, ErrNotFound).
var (
	// ErrNotFound means the row does not exist, or belongs to another
	// tenant, or (for API keys) has been revoked.
	ErrNotFound = errors.New("not found")
	// ErrConflict means a row with the same identity already exists.
	ErrConflict = errors.New("already exists")
)

// AdminTenantID is the tenant every store creates when it is opened. It owns
// the daemon's own (unix socket) access.
const AdminTenantID = "admin"

// Tenant is an isolation boundary: API keys, sandboxes and events belong to
// exactly one tenant.
type Tenant struct {
	ID   string
	Name string
	// MinIsolation is the weakest isolation class this tenant's sandboxes
	// may use ("" for no floor).
	MinIsolation string
	// Untrusted marks a tenant running untrusted code for others
	// (multi-tenant): its floor is at least the hypervisor class.
	Untrusted bool
	CreatedAt time.Time // set by CreateTenant when zero
}

// APIKey authenticates a tenant over TCP. Only a hash of the secret is
// stored.
type APIKey struct {
	ID        string
	TenantID  string
	Hash      []byte // sha256 of the secret; unique across all keys
	Prefix    string // first characters of the secret, for display
	CreatedAt time.Time
	RevokedAt *time.Time // nil while the key is valid
}

// Sandbox is the persisted record of one sandbox.
type Sandbox struct {
	ID string
	// TenantID is "" for a sandbox of no tenant (made ahead of its tenant:
	// a pooled one). Such a row is no tenant's, not even the admin's:
	// GetSandbox and the lists never return it; ListUnownedSandboxes
	// does, and BindSandbox gives it its tenant.
	TenantID string
	Runtime  string
	Image    string
	// Status is one of "pooled", "creating", "running", "paused",
	// "hibernated", "stopped", "failed", "destroyed"; the store keeps it as
	// text and gives it no meaning.
	Status string
	Spec   json.RawMessage // the create request as given; never secrets
	State  json.RawMessage // the runtime's recovery state
	Error  string          // why the sandbox failed, for the user

	CreatedAt time.Time // set by CreateSandbox when zero; never changed
	UpdatedAt time.Time // set by the store on every create and update
	// ExpiresAt is the end of the sandbox's maximum lifetime (nil: none).
	ExpiresAt   *time.Time
	IdleTimeout time.Duration
	LastActive  time.Time // CreatedAt when zero at create
	// Labels are the caller's KEY=VALUE tags: written by CreateSandbox,
	// never changed by UpdateSandbox. Empty reads back as nil.
	Labels map[string]string
}

// Event is one entry of the append-only event log.
type Event struct {
	Seq       int64 // assigned by AppendEvent; strictly increasing
	Time      time.Time
	TenantID  string // "" for events not tied to a tenant
	SandboxID string // "" for events not tied to a sandbox
	Kind      string
	Data      json.RawMessage
}

// Store is the daemon's persistent state. Implementations are safe for
// concurrent use.
type Store interface {
	// CreateTenant inserts t, setting CreatedAt when zero. ErrConflict if
	// the ID exists.
	CreateTenant(ctx context.Context, t *Tenant) error
	// GetTenant returns the tenant or ErrNotFound.
	GetTenant(ctx context.Context, id string) (*Tenant, error)
	// ListTenants returns all tenants ordered by CreatedAt, then ID.
	ListTenants(ctx context.Context) ([]*Tenant, error)

	// CreateAPIKey inserts k, setting CreatedAt when zero. ErrNotFound if
	// its tenant does not exist; ErrConflict if the ID or Hash exists.
	CreateAPIKey(ctx context.Context, k *APIKey) error
	// APIKeyByHash returns the valid key with this hash; ErrNotFound if
	// there is none or it has been revoked.
	APIKeyByHash(ctx context.Context, hash []byte) (*APIKey, error)
	// RevokeAPIKey marks the key revoked now. Revoking a revoked key keeps
	// the first revocation time. ErrNotFound if the key does not exist.
	RevokeAPIKey(ctx context.Context, id string) error
	// ListAPIKeys returns the tenant's keys, revoked ones included,
	// ordered by CreatedAt, then ID. tenantID "" lists every tenant's.
	ListAPIKeys(ctx context.Context, tenantID string) ([]*APIKey, error)

	// CreateSandbox inserts s, setting CreatedAt (when zero), UpdatedAt
	// and LastActive (when zero). ErrNotFound if its tenant does not exist;
	// ErrConflict if the ID exists. TenantID "" makes a row of no tenant.
	CreateSandbox(ctx context.Context, s *Sandbox) error
	// BindSandbox gives the row of no tenant with s.ID its tenant
	// s.TenantID and every other field of s (as CreateSandbox writes them:
	// CreatedAt, LastActive and UpdatedAt are set likewise). ErrNotFound
	// if the row is missing or already has a tenant, or the tenant does
	// not exist.
	BindSandbox(ctx context.Context, s *Sandbox) error
	// ListUnownedSandboxes returns the rows of no tenant, ordered by
	// CreatedAt, then ID.
	ListUnownedSandboxes(ctx context.Context) ([]*Sandbox, error)
	// GetSandbox returns the sandbox. tenantID "" matches any tenant
	// (admin); otherwise a sandbox of another tenant is ErrNotFound.
	GetSandbox(ctx context.Context, tenantID, id string) (*Sandbox, error)
	// ListSandboxes returns the tenant's sandboxes (tenantID "": all)
	// ordered by CreatedAt, then ID.
	ListSandboxes(ctx context.Context, tenantID string) ([]*Sandbox, error)
	// ListSandboxesLabeled is ListSandboxes of the sandboxes that carry
	// every one of labels (none: all of them).
	ListSandboxesLabeled(ctx context.Context, tenantID string, labels map[string]string) ([]*Sandbox, error)
	// UpdateSandbox replaces the mutable fields of the row with s.ID and
	// sets s.UpdatedAt. ID, TenantID and CreatedAt never change: when
	// s.TenantID is not "" it must match the row's tenant, else
	// ErrNotFound; "" matches any row, one of no tenant included.
	// ErrNotFound if the row is missing.
	UpdateSandbox(ctx context.Context, s *Sandbox) error
	// TouchSandbox records activity at t. LastActive never moves
	// backwards: an older t leaves it unchanged. ErrNotFound if missing.
	TouchSandbox(ctx context.Context, id string, t time.Time) error
	// DeleteSandbox removes the row; its events stay. ErrNotFound if
	// missing.
	DeleteSandbox(ctx context.Context, id string) error

	// AppendEvent appends e, setting e.Seq and, when zero, e.Time.
	AppendEvent(ctx context.Context, e *Event) error
	// AppendEvents appends a batch in one transaction (one sync for all),
	// in order, setting each Seq and zero Time; all or nothing.
	AppendEvents(ctx context.Context, es []*Event) error
	// ListEvents returns events with Seq > afterSeq in Seq order, at most
	// limit of them (limit <= 0: no limit). tenantID and sandboxID filter
	// when not "".
	ListEvents(ctx context.Context, tenantID, sandboxID string, afterSeq int64, limit int) ([]*Event, error)
	// DeleteEventsBefore deletes the oldest events whose Time is before
	// before, of every tenant, at most limit of them (limit <= 0: no
	// limit), in one transaction, and returns how many it deleted.
	// Retention calls it in small batches so that no call holds the
	// store's write lock for long.
	DeleteEventsBefore(ctx context.Context, before time.Time, limit int) (int64, error)

	// PolicyStore is the live policy's state.
	PolicyStore

	// WebhookStore is webhooks and their delivery queue.
	WebhookStore
	// RelayStore is relays (their deliveries are a webhook's).
	RelayStore
	// PortStore is the sandboxes' published ports.
	PortStore

	// PutTool creates (replace false: ErrConflict if the name is taken)
	// or replaces a tenant's tool; GetTool/DeleteTool: ErrNotFound if
	// missing; ListTools: tenantID "" lists every tenant's.
	PutTool(ctx context.Context, t *Tool, replace bool) error
	GetTool(ctx context.Context, tenantID, name string) (*Tool, error)
	ListTools(ctx context.Context, tenantID string) ([]*Tool, error)
	DeleteTool(ctx context.Context, tenantID, name string) error

	// VolumeStore is the tenants' named volumes.
	VolumeStore
	// SnapshotStore is the tenants' sandbox snapshots.
	SnapshotStore

	// Close releases the store. It does not cancel anything the daemon
	// runs.
	Close() error
}

// NormTime returns t in UTC truncated to the store's precision
// (microseconds). Implementations apply it to every time they write.
func NormTime(t time.Time) time.Time {
	return t.UTC().Truncate(time.Microsecond)
}

// PolicyVersion is one generation of a sandbox's live policy. Generation
// 1 is the policy the sandbox was created with; every change appends the
// next. The newest is the sandbox's current policy.
type PolicyVersion struct {
	SandboxID  string
	TenantID   string
	Generation int64
	Document   json.RawMessage
	// Actor says who made the change ("api:TENANT", "trigger:NAME",
	// "policy:NAME" for an edit of a named policy, "approval:ID").
	Actor  string
	Reason string
	// Ref is the named policy the sandbox follows from this generation on
	// ("" none).
	Ref       string
	CreatedAt time.Time // set when zero
}

// NamedPolicy is a tenant's reusable policy document; sandboxes created
// with it follow its edits.
type NamedPolicy struct {
	TenantID   string
	Name       string
	Generation int64 // 1 on create, +1 on every update
	Document   json.RawMessage
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// Approval is a held request waiting for (or given) a decision.
type Approval struct {
	ID        string
	TenantID  string
	SandboxID string
	Rule      string
	// Request describes the held request (method, host, path, preview);
	// never a real secret value.
	Request json.RawMessage
	// State is "pending", "allowed", "denied" or "expired".
	State     string
	DecidedBy string
	Reason    string
	Remember  bool
	CreatedAt time.Time
	Deadline  time.Time
	DecidedAt *time.Time
}

// Approval states.
const (
	ApprovalPending = "pending"
	ApprovalAllowed = "allowed"
	ApprovalDenied  = "denied"
	ApprovalExpired = "expired"
)

// BudgetUsage is what a sandbox has used of one budget. Spend is in
// micro-USD so sums are exact.
type BudgetUsage struct {
	SandboxID   string
	Budget      string
	Requests    int64
	BytesUp     int64
	BytesDown   int64
	SpendMicros int64
}

// PolicyStore keeps live policy state: every generation of every
// sandbox's policy, the tenants' named policies, approvals and budget
// usage. Tenant isolation follows the Store conventions.
type PolicyStore interface {
	// AppendPolicyVersion inserts v (setting CreatedAt when zero).
	// ErrConflict if the sandbox already has v.Generation: two writers
	// racing for the same generation, one loses.
	AppendPolicyVersion(ctx context.Context, v *PolicyVersion) error
	// ListPolicyVersions returns a sandbox's generations, oldest first
	// (tenantID "": any tenant).
	ListPolicyVersions(ctx context.Context, tenantID, sandboxID string) ([]*PolicyVersion, error)
	// LatestPolicyVersion returns the newest generation, or ErrNotFound.
	LatestPolicyVersion(ctx context.Context, sandboxID string) (*PolicyVersion, error)

	// PutNamedPolicy creates (ifGeneration 0: ErrConflict if it exists)
	// or updates (ifGeneration > 0: ErrConflict unless that is the stored
	// generation; ifGeneration < 0: whatever it is; ErrNotFound if there
	// is none) a named policy, and sets p.Generation and the times.
	PutNamedPolicy(ctx context.Context, p *NamedPolicy, ifGeneration int64) error
	GetNamedPolicy(ctx context.Context, tenantID, name string) (*NamedPolicy, error)
	ListNamedPolicies(ctx context.Context, tenantID string) ([]*NamedPolicy, error)
	DeleteNamedPolicy(ctx context.Context, tenantID, name string) error

	// CreateApproval inserts a pending approval.
	CreateApproval(ctx context.Context, a *Approval) error
	// DecideApproval moves a pending approval to state; ErrConflict if it
	// is no longer pending, ErrNotFound if missing (or another tenant's).
	DecideApproval(ctx context.Context, tenantID, id, state, by, reason string, remember bool) (*Approval, error)
	GetApproval(ctx context.Context, tenantID, id string) (*Approval, error)
	// ListApprovals returns approvals newest first, filtered by state and
	// sandbox when not "", at most limit (<= 0: 1000).
	ListApprovals(ctx context.Context, tenantID, sandboxID, state string, limit int) ([]*Approval, error)
	// ExpirePendingApprovals marks every pending approval expired with
	// reason (a daemon that restarts cannot resume their waiters).
	ExpirePendingApprovals(ctx context.Context, reason string) (int64, error)

	// AddBudgetUsage adds delta to the sandbox's usage of delta.Budget
	// and returns the new totals.
	AddBudgetUsage(ctx context.Context, delta BudgetUsage) (*BudgetUsage, error)
	ListBudgetUsage(ctx context.Context, sandboxID string) ([]*BudgetUsage, error)
	// DeletePolicyState removes a sandbox's usage, pending approvals and
	// freeze (its versions stay with its events, for the audit trail).
	DeletePolicyState(ctx context.Context, sandboxID string) error

	// PutFreeze records f (setting CreatedAt when zero), replacing the
	// freeze of the same scope and target.
	PutFreeze(ctx context.Context, f *Freeze) error
	// DeleteFreezes removes the freezes of fs' scopes and targets in one
	// transaction, all or none; one that is not recorded is no error.
	DeleteFreezes(ctx context.Context, fs []*Freeze) error
	// ListFreezes returns every freeze, ordered by scope, then target.
	ListFreezes(ctx context.Context) ([]*Freeze, error)
}

// Freeze scopes.
const (
	FreezeAll     = "all"
	FreezeTenant  = "tenant"
	FreezeSandbox = "sandbox"
)

// Freeze is a freeze of sandboxes' network (package livepolicy) with its
// owner, kept so that a daemon restart lifts none.
type Freeze struct {
	// Scope is FreezeAll, FreezeTenant or FreezeSandbox; Target is the
	// tenant's or sandbox's id ("" for FreezeAll).
	Scope, Target string
	// TenantID is the tenant of a sandbox freeze's sandbox ("" otherwise).
	TenantID string
	// Owner is the principal that made it: the admin or a tenant's id.
	Owner     string
	CreatedAt time.Time
}

// Tool is a tenant's registered tool (api.Tool as JSON in Spec).
type Tool struct {
	TenantID  string
	Name      string
	Spec      json.RawMessage
	CreatedAt time.Time // set by PutTool
}

// Volume is a tenant's named volume: an ext4 image under the daemon's home
// that sandboxes mount (package mounts). Which sandboxes hold it is not
// kept here: a sandbox's record names its mounts, so a crash or restart
// releases a volume with the sandbox that held it.
type Volume struct {
	TenantID  string
	Name      string
	SizeBytes int64
	// VMWritten: a microVM guest has had the volume's block device
	// writable, so its filesystem image may have been crafted; the host
	// kernel never mounts it again (only VMs may attach it).
	VMWritten bool
	CreatedAt time.Time // set by CreateVolume
}

// VolumeStore keeps volumes. Tenant isolation follows the Store
// conventions.
type VolumeStore interface {
	// CreateVolume inserts v. ErrConflict if the tenant has one of that
	// name; ErrNotFound if the tenant does not exist.
	CreateVolume(ctx context.Context, v *Volume) error
	// GetVolume returns the tenant's volume or ErrNotFound.
	GetVolume(ctx context.Context, tenantID, name string) (*Volume, error)
	// ListVolumes returns the tenant's volumes by name (tenantID "": every
	// tenant's, by tenant then name).
	ListVolumes(ctx context.Context, tenantID string) ([]*Volume, error)
	// SetVolumeVMWritten sets VMWritten. ErrNotFound if missing.
	SetVolumeVMWritten(ctx context.Context, tenantID, name string) error
	// DeleteVolume removes the row. ErrNotFound if missing.
	DeleteVolume(ctx context.Context, tenantID, name string) error
}

// Snapshot is a saved state of a sandbox that new sandboxes start from
// (package sandbox). Its files live under the daemon's home, named by ID;
// which sandboxes were started from it is not kept here: their records
// name it, as they name their volumes.
type Snapshot struct {
	ID       string
	TenantID string
	Name     string // unique per tenant
	// SandboxID is the sandbox it was taken of (which may be gone).
	SandboxID string
	Runtime   string
	Image     string
	// Status is "creating" (its files are being written: a daemon that
	// finds it so at start removes it) or "ready".
	Status    string
	Kind      string // "memory" or "filesystem"
	SizeBytes int64
	Digest    string
	// Fork: made by a fork, removed with the last sandbox started from it.
	Fork bool
	// Spec is what a sandbox started from it is created with (package
	// sandbox's record; never a secret value).
	Spec      json.RawMessage
	CreatedAt time.Time // set by CreateSnapshot
}

// SnapshotStore keeps snapshots. Tenant isolation follows the Store
// conventions.
type SnapshotStore interface {
	// CreateSnapshot inserts s. ErrConflict if the tenant has one of that
	// name or id; ErrNotFound if the tenant does not exist.
	CreateSnapshot(ctx context.Context, s *Snapshot) error
	// UpdateSnapshot writes s's status, kind, size, digest and spec.
	// ErrNotFound if missing.
	UpdateSnapshot(ctx context.Context, s *Snapshot) error
	// GetSnapshot returns the tenant's snapshot by name (tenantID "": any
	// tenant's, by id) or ErrNotFound.
	GetSnapshot(ctx context.Context, tenantID, name string) (*Snapshot, error)
	// ListSnapshots returns the tenant's snapshots by name (tenantID "":
	// every tenant's, by tenant then name).
	ListSnapshots(ctx context.Context, tenantID string) ([]*Snapshot, error)
	// DeleteSnapshot removes the row by id. ErrNotFound if missing.
	DeleteSnapshot(ctx context.Context, id string) error
}

// Port is a sandbox's published port (package ingress).
type Port struct {
	SandboxID string
	TenantID  string
	Port      int
	Public    bool
	// TokenHash is the SHA-256 of the port's access token (never the
	// token).
	TokenHash []byte
	ExpiresAt *time.Time // nil: until removed
	CreatedAt time.Time  // set by PutPort
}

// PortStore keeps published ports. Tenant isolation follows the Store
// conventions (tenantID "" matches any tenant).
type PortStore interface {
	// PutPort inserts or replaces the sandbox's port (a new token).
	PutPort(ctx context.Context, p *Port) error
	// GetPort returns a port or ErrNotFound.
	GetPort(ctx context.Context, tenantID, sandboxID string, port int) (*Port, error)
	// ListPorts returns a sandbox's ports by number (sandboxID "": every
	// sandbox's).
	ListPorts(ctx context.Context, tenantID, sandboxID string) ([]*Port, error)
	// DeletePort removes one port; ErrNotFound if it is not published.
	DeletePort(ctx context.Context, tenantID, sandboxID string, port int) error
	// DeletePorts removes every port of a sandbox (none is not an error).
	DeletePorts(ctx context.Context, sandboxID string) error
}
