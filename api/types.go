// Package api holds the wire types of the cagebox HTTP+JSON API, its
// OpenAPI document and the catalog of audit events (events.go). It has no
// logic beyond naming an event kind's class.
package api

import (
	_ "embed"
	"encoding/json"
	"time"
)

// OpenAPI is the API's OpenAPI 3 document, served at /openapi.json.
//
//go:embed openapi.json
var OpenAPI []byte

// Error is the body of every non-2xx answer.
type Error struct {
	Error string `json:"error"`
	// Kind is a stable machine-readable kind: not_found, invalid, denied,
	// conflict, unavailable, unauthorized, internal.
	Kind string `json:"kind"`
}

// CreateSandboxRequest creates and starts a sandbox.
type CreateSandboxRequest struct {
	// Runtime is a runtime name or "auto" (the default).
	Runtime string `json:"runtime,omitempty"`
	// Image is an image name ("default" when empty).
	Image string `json:"image,omitempty"`
	// MemoryBytes, CPUs, PIDs and DiskBytes are limits (0 = default).
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	PIDs        int64   `json:"pids,omitempty"`
	DiskBytes   int64   `json:"disk_bytes,omitempty"`
	// Timeout is the maximum lifetime (Go duration, e.g. "10m"); the
	// daemon destroys the sandbox when it passes. Empty = the daemon's default.
	Timeout string `json:"timeout,omitempty"`
	// IdleTimeout acts on the sandbox (IdleAction) after this long
	// without API activity.
	IdleTimeout string `json:"idle_timeout,omitempty"`
	// IdleAction is what the idle timeout does: "destroy" (the default),
	// "pause" (frozen in memory) or "hibernate" (microVMs: saved to disk,
	// its memory freed); the next exec or file operation resumes a paused
	// or hibernated sandbox.
	IdleAction string `json:"idle_action,omitempty"`
	// Env is the base environment of every process (KEY=VALUE).
	Env []string `json:"env,omitempty"`
	// Policy is the sandbox's egress policy document (JSON form of the
	// YAML/JSON `cagebox run --policy` file). Default: deny everything.
	Policy json.RawMessage `json:"policy,omitempty"`
	// Allow is a shorthand: one allow rule (ports 443 and 80, any method
	// and path) per host, added after Policy's rules.
	Allow []string `json:"allow,omitempty"`
	// PolicyRef names one of the tenant's named policies (instead of
	// Policy): the sandbox follows its edits.
	PolicyRef string `json:"policy_ref,omitempty"`
	// Secrets are credentials the guest sees only as placeholders.
	Secrets []SecretBinding `json:"secrets,omitempty"`
	// Mounts are host paths and volumes to mount in the guest.
	Mounts []Mount `json:"mounts,omitempty"`
	// ReadOnlyRoot makes the image root read-only: only Mounts and a
	// size-bounded /tmp are writable.
	ReadOnlyRoot bool `json:"read_only_root,omitempty"`
	// Publish are ports to publish through the ingress listener once the
	// sandbox runs (the response's Ports carry their tokens, once).
	Publish []PortSpec `json:"publish,omitempty"`
	// Audit lists syscall audit classes (exec, net, file, priv, or all)
	// whose syscalls the sandbox streams as syscall.* events. Off
	// (empty) by default.
	Audit []string `json:"audit,omitempty"`
	// Labels are the caller's KEY=VALUE tags, returned with the sandbox
	// and matched by GET /v1/sandboxes?label=KEY=VALUE (the fleet
	// controller finds its sandboxes by them). At most 16; keys up to 253
	// characters of [A-Za-z0-9._/-], values up to 63 of [A-Za-z0-9._-].
	Labels map[string]string `json:"labels,omitempty"`
	// FromSnapshot names one of the tenant's snapshots (POST
	// /v1/sandboxes/{id}/snapshots) to start from: its runtime, image,
	// resources, environment, policy and secret bindings are the
	// snapshotted sandbox's (Runtime, Image and the limits must then be
	// empty or equal; Policy, Allow, PolicyRef, Secrets and Env, when
	// given, replace the snapshot's). A microVM snapshot resumes its
	// processes; a container or gVisor snapshot starts afresh on its
	// files.
	FromSnapshot string `json:"from_snapshot,omitempty"`
}

// CreateSnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type CreateSnapshotRequest struct {
	// Name names the snapshot within its tenant: 1–63 of [a-z0-9-],
	// starting with a letter or digit. Empty: the daemon picks one.
	Name string `json:"name,omitempty"`
}

// Snapshot is a saved state of a sandbox that new sandboxes start from
// (POST /v1/sandboxes with from_snapshot).
type Snapshot struct {
	Name   string `json:"name"`
	Tenant string `json:"tenant"`
	// Sandbox is the sandbox it was taken of (which may be gone).
	Sandbox string `json:"sandbox"`
	Runtime string `json:"runtime"`
	Image   string `json:"image"`
	// Kind is "memory" (a microVM's memory, devices and disks: processes
	// go on in every sandbox started from it) or "filesystem" (the
	// writable layer: sandboxes boot afresh on its files).
	Kind      string    `json:"kind"`
	Resources Resources `json:"resources"`
	// SizeBytes is the host disk space it takes; Digest covers its
	// content and is checked at every start from it.
	SizeBytes int64  `json:"size_bytes"`
	Digest    string `json:"digest"`
	// Fork: made by POST /v1/sandboxes/{id}/fork, removed with the last
	// sandbox started from it.
	Fork bool `json:"fork,omitempty"`
	// InUse counts the sandboxes started from it that still exist; a
	// snapshot in use cannot be removed.
	InUse     int       `json:"in_use"`
	CreatedAt time.Time `json:"created_at"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	// Count is how many copies to make (1–16; 0 means 1).
	Count int `json:"count,omitempty"`
	// Labels are given to every copy (with cagebox.dev/fork.parent=ID).
	Labels map[string]string `json:"labels,omitempty"`
	// Timeout is each copy's maximum lifetime (Go duration; empty: the
	// daemon's default, as for a create).
	Timeout string `json:"timeout,omitempty"`
}

// ForkResponse is the answer of POST /v1/sandboxes/{id}/fork.
type ForkResponse struct {
	// Snapshot is the fork's snapshot (Fork true).
	Snapshot Snapshot `json:"snapshot"`
	// Sandboxes are the copies, each a sandbox of its own.
	Sandboxes []Sandbox `json:"sandboxes"`
}

// PortSpec publishes a guest port through the ingress listener; it is
// also the body of POST /v1/sandboxes/{id}/ports (again for a published
// port: a new token, which revokes the old one and its signed URLs).
type PortSpec struct {
	Port int `json:"port"`
	// Public ports need no access token.
	Public bool `json:"public,omitempty"`
	// TTL unpublishes the port after this long (Go duration; empty: never).
	TTL string `json:"ttl,omitempty"`
}

// Port is a published port.
type Port struct {
	Port   int  `json:"port"`
	Public bool `json:"public"`
	// URL is the host form (https://PORT-ID.DOMAIN/), PathURL the path
	// form (…/s/ID/PORT/); empty when the daemon runs no ingress.
	URL       string     `json:"url,omitempty"`
	PathURL   string     `json:"path_url,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	// Token is the access token (header X-Cagebox-Access), returned once
	// when the port is published; only its hash is stored.
	Token string `json:"token,omitempty"`
}

// PortURLRequest asks for a signed URL of a port valid for TTL (default 1h).
type PortURLRequest struct {
	TTL string `json:"ttl,omitempty"`
}

// PortURL is a signed URL: whoever holds it reaches the port until
// ExpiresAt (publishing the port again revokes it).
type PortURL struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Wake says why and when an idle-paused sandbox was resumed.
type Wake struct {
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// SecretBinding gives a sandbox a credential: env var Name holds a
// placeholder of the real value's shape, and the egress gateway swaps in the
// real value only on requests to Hosts over intercepted TLS.
type SecretBinding struct {
	// Name is the guest's environment variable.
	Name string `json:"name"`
	// Secret names a stored secret (default: Name); its hosts apply unless
	// Hosts narrows them.
	Secret string `json:"secret,omitempty"`
	// Value is an inline value (write-only): sealed in the vault for this
	// sandbox's life, never stored in clear or returned.
	Value string `json:"value,omitempty"`
	// Hosts: required with Value; with Secret, a subset of its hosts.
	Hosts []string `json:"hosts,omitempty"`
	// Body opts in to substitution in request bodies.
	Body bool `json:"body,omitempty"`
	// Headers names request headers, besides Authorization and the
	// secret's inject header, whose values may carry the placeholder (e.g.
	// X-Api-Key). Query names query parameters that may (e.g.
	// access_token). A placeholder anywhere else is refused with a 403.
	Headers []string `json:"headers,omitempty"`
	Query   []string `json:"query,omitempty"`
	// Mode "env" puts the REAL value in the guest's environment (for
	// protocols the gateway cannot see); inspect and events mark it. A
	// stored secret must allow it (PutSecretRequest.AllowEnv), else the
	// create is refused (403); an inline Value is the caller's own.
	// Mode "sigv4": the secret's value is "ACCESS_KEY_ID:SECRET_ACCESS_KEY";
	// the guest gets placeholder AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
	// signs normally, and the gateway verifies the signature with the
	// placeholders and re-signs with the real key.
	// Mode "hmac": the secret is an HMAC signing key; the guest gets a
	// placeholder key in Name, signs with it, and the gateway verifies the
	// signature (HMAC says how it is made) and re-signs with the real key on
	// requests to Hosts. The placeholder itself is never sent anywhere.
	Mode string `json:"mode,omitempty"`
	// HMAC configures mode "hmac".
	HMAC *HMACSigning `json:"hmac,omitempty"`
}

// HMACSigning describes a keyed-hash request signature:
// Header: Prefix + Encoding(HMAC-Algorithm(key, parts joined by "\n")).
type HMACSigning struct {
	// Algorithm: sha256 (default), sha1 or sha512.
	Algorithm string `json:"algorithm,omitempty"`
	// Header carries the signature, e.g. "X-Signature".
	Header string `json:"header"`
	// Prefix is put before the encoded signature, e.g. "sha256=".
	Prefix string `json:"prefix,omitempty"`
	// Encoding: hex (default), base64 or base64url.
	Encoding string `json:"encoding,omitempty"`
	// Sign lists the canonical parts, joined by "\n": method, path (as
	// sent), query (raw), header:NAME (e.g. header:X-Timestamp), body.
	Sign []string `json:"sign"`
	// MaxBody bounds the body read for a "body" part (default 16 MiB; a
	// bound request over it is refused with 413).
	MaxBody int64 `json:"max_body,omitempty"`
}

// BoundSecret is a binding as a sandbox shows it (never a value).
type BoundSecret struct {
	Name   string   `json:"name"`
	Secret string   `json:"secret"`
	Hosts  []string `json:"hosts"`
	Mode   string   `json:"mode"`
	// Headers and Query are the extra places the placeholder is swapped.
	Headers []string `json:"headers,omitempty"`
	Query   []string `json:"query,omitempty"`
	// HMAC is the signing configuration of a mode "hmac" binding.
	HMAC *HMACSigning `json:"hmac,omitempty"`
}

// Resources are a sandbox's limits as applied.
type Resources struct {
	MemoryBytes int64   `json:"memory_bytes"`
	CPUs        float64 `json:"cpus"`
	PIDs        int64   `json:"pids"`
	DiskBytes   int64   `json:"disk_bytes"`
}

// Sandbox describes a sandbox.
type Sandbox struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Runtime   string    `json:"runtime"`
	Class     string    `json:"class"`
	Image     string    `json:"image"`
	Status    string    `json:"status"`
	Error     string    `json:"error,omitempty"`
	Resources Resources `json:"resources"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is when the maximum lifetime ends.
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	IdleTimeout string     `json:"idle_timeout,omitempty"`
	IdleAction  string     `json:"idle_action,omitempty"`
	LastActive  time.Time  `json:"last_active"`
	// Network is the sandbox's link: its address and gateway.
	Network *Network `json:"network,omitempty"`
	// Policy is the egress policy in force.
	Policy json.RawMessage `json:"policy,omitempty"`
	// Secrets are the sandbox's credential bindings; RealInGuest lists the
	// "env" mode ones, whose real value is inside the guest.
	Secrets     []BoundSecret `json:"secrets,omitempty"`
	RealInGuest []string      `json:"real_values_in_guest,omitempty"`
	// Mounts and ReadOnlyRoot are as created.
	Mounts       []Mount `json:"mounts,omitempty"`
	ReadOnlyRoot bool    `json:"read_only_root,omitempty"`
	// Ports are the published ports (GET of one sandbox, and create).
	Ports []Port `json:"ports,omitempty"`
	// LastWake is the last time the sandbox was woken from an idle pause
	// (by an exec, a file operation or an ingress request) and why.
	LastWake *Wake `json:"last_wake,omitempty"`
	// PausedBy says who paused (or hibernated) the sandbox, while it is:
	// "admin" (the operator: only the operator resumes it, and no exec,
	// file operation or inbound request wakes it), a tenant's id, or
	// "idle timeout" (the next call wakes it).
	PausedBy string `json:"paused_by,omitempty"`
	// Audit is the sandbox's syscall audit (absent when off).
	Audit *SandboxAudit `json:"audit,omitempty"`
	// Labels are as created.
	Labels map[string]string `json:"labels,omitempty"`
	// Pooled is true in the answer of a create that a warm pool served
	// (the fleet controller marks such a Sandbox object "warm").
	Pooled bool `json:"pooled,omitempty"`
	// Snapshot names the snapshot the sandbox was started from (a fork's
	// copies: the fork's snapshot).
	Snapshot string `json:"snapshot,omitempty"`
	// Persists says what of the sandbox survives a daemon restart and a
	// host reboot: "restart" (a running or paused sandbox: the daemon
	// finds it again), "reboot" (a hibernated microVM: saved on disk).
	Persists string `json:"persists,omitempty"`
}

// Network describes a sandbox's routed link.
type Network struct {
	Address string `json:"address"`
	Gateway string `json:"gateway"`
	HostIf  string `json:"host_interface"`
}

// ExecRequest is the first line of an exec request body; when Stdin is
// true the rest of the body is the process's standard input.
type ExecRequest struct {
	Argv    []string `json:"argv"`
	Env     []string `json:"env,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	User    string   `json:"user,omitempty"`
	Timeout string   `json:"timeout,omitempty"`
	Stdin   bool     `json:"stdin,omitempty"`
}

// ExecFrame is one line of an exec response (application/x-ndjson).
type ExecFrame struct {
	// Stream is "stdout", "stderr", "exit" (the last frame) or "error".
	Stream string `json:"stream"`
	Data   []byte `json:"data,omitempty"`
	// Set on the exit frame.
	ExitCode  *int   `json:"exit_code,omitempty"`
	Signal    string `json:"signal,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	Error     string `json:"error,omitempty"`
}

// Runtime describes an isolation runtime on this host.
type Runtime struct {
	Name      string `json:"name"`
	Class     string `json:"class"`
	Available bool   `json:"available"`
	// Reason says why it is not available here.
	Reason string `json:"reason,omitempty"`
	// Detail is e.g. the OCI runtime binary in use.
	Detail string `json:"detail,omitempty"`
	// Default is true for the runtime "auto" picks.
	Default bool `json:"default,omitempty"`
}

// Image describes a cached guest image.
type Image struct {
	Name      string    `json:"name"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Digest is sha256 over the image's tree.
	Digest string `json:"digest"`
	Source string `json:"source,omitempty"`
	// ManifestDigest is the digest of the manifest (or index) an OCI
	// image was pulled or imported from; PlatformDigest that of the
	// linux/amd64 manifest chosen from an index. NAME@DIGEST pins either.
	ManifestDigest string `json:"manifest_digest,omitempty"`
	PlatformDigest string `json:"platform_digest,omitempty"`
	// Config is what an OCI image's config says about running it
	// (recorded; sandboxes do not use it yet).
	Config *ImageConfig `json:"config,omitempty"`
}

// ImageConfig is the part of an OCI image config cagebox records.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// PullImageRequest asks the daemon to pull an OCI image.
type PullImageRequest struct {
	// Ref is [REGISTRY/]REPO[:TAG][@sha256:HEX]; docker.io and latest are
	// the defaults.
	Ref string `json:"ref"`
	// Name is the cache name ("" = derived from Ref: alpine:3.20 →
	// alpine-3.20).
	Name string `json:"name,omitempty"`
	// Force replaces an image of that name made from something else.
	Force bool `json:"force,omitempty"`
	// MaxBytes and MaxFiles bound what the image may unpack to (0 = the
	// defaults: 8 GiB, 500000 files).
	MaxBytes int64 `json:"max_bytes,omitempty"`
	MaxFiles int64 `json:"max_files,omitempty"`
}

// ImportImageOptions are the query parameters of POST /v1/images/import.
type ImportImageOptions struct {
	Name     string
	Force    bool
	MaxBytes int64
	MaxFiles int64
}

// FileInfo is an entry of a directory listing.
type FileInfo struct {
	Name    string    `json:"name"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"`
	ModTime time.Time `json:"mod_time"`
	IsDir   bool      `json:"is_dir"`
}

// Tenant is an owner of sandboxes, secrets, policies and events.
type Tenant struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	MinIsolation string `json:"min_isolation,omitempty"`
	// Untrusted: multi-tenant untrusted code; the floor is hypervisor.
	Untrusted bool `json:"untrusted,omitempty"`
	// Floor is the isolation floor in force for the tenant (the daemon's
	// and the tenant's, whichever is stronger).
	Floor     string    `json:"floor,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// CreateTenantRequest creates a tenant (admin only).
type CreateTenantRequest struct {
	Name         string `json:"name"`
	MinIsolation string `json:"min_isolation,omitempty"`
	// Untrusted marks a tenant that runs untrusted code for others: its
	// sandboxes need the hypervisor class.
	Untrusted bool `json:"untrusted,omitempty"`
}

// APIKey is returned once, when a key is created; only its hash is stored.
type APIKey struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	Prefix string `json:"prefix"`
	// Key is the secret; present only in the answer to its creation.
	Key       string    `json:"key,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Event is an audit event.
type Event struct {
	Seq     int64     `json:"seq"`
	Time    time.Time `json:"time"`
	Tenant  string    `json:"tenant"`
	Sandbox string    `json:"sandbox,omitempty"`
	Kind    EventKind `json:"kind"`
	// Data is the kind's payload (see EventPayloads), absent when it has
	// no fields.
	Data any `json:"data,omitempty"`
}

// Health is the daemon's health.
type Health struct {
	Version   string `json:"version"`
	Tenant    string `json:"tenant"`
	Sandboxes int    `json:"sandboxes"`
}

// PutSecretRequest stores (or replaces) a secret in the vault. Value is
// write-only: no answer ever contains it.
type PutSecretRequest struct {
	Name  string   `json:"name"`
	Value string   `json:"value"`
	Hosts []string `json:"hosts"`
	// Inject is an optional "Header: template {value}" the gateway sets on
	// requests to the hosts even when the guest sent nothing.
	Inject string `json:"inject,omitempty"`
	// AllowEnv lets sandboxes bind the secret in mode "env", which puts
	// the real value inside the guest. Default off: such a binding is
	// refused (403).
	AllowEnv bool `json:"allow_env,omitempty"`
}

// RotateSecretRequest replaces a secret's value (bumps its version).
type RotateSecretRequest struct {
	Value string `json:"value"`
	// AllowEnv, if given, sets whether mode "env" may deliver the (new)
	// value into guests; absent keeps the setting.
	AllowEnv *bool `json:"allow_env,omitempty"`
}

// Secret describes a stored secret: never its value, only a preview.
type Secret struct {
	Name      string     `json:"name"`
	Tenant    string     `json:"tenant"`
	Hosts     []string   `json:"hosts"`
	Inject    string     `json:"inject,omitempty"`
	Preview   string     `json:"preview"`
	Version   int64      `json:"version"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// AllowEnv: sandboxes may bind it in mode "env" (the real value in
	// the guest).
	AllowEnv bool `json:"allow_env"`
}

// SandboxPolicy is a sandbox's live policy (GET/PUT /v1/sandboxes/{id}/policy).
type SandboxPolicy struct {
	// Generation increases by one with every change; send it back as
	// If-Match to update only the version you read.
	Generation int64 `json:"generation"`
	// Policy is the document in force, defaults filled in.
	Policy json.RawMessage `json:"policy"`
	// Ref is the named policy the sandbox follows ("" none).
	Ref    string `json:"ref,omitempty"`
	Frozen bool   `json:"frozen,omitempty"`
}

// PolicyPatch edits one rule (PATCH /v1/sandboxes/{id}/policy).
type PolicyPatch struct {
	// Op is "add" (Rule at Index, default first), "remove" (the rule
	// named Name) or "move" (the rule named Name to Index).
	Op    string          `json:"op"`
	Rule  json.RawMessage `json:"rule,omitempty"`
	Name  string          `json:"name,omitempty"`
	Index *int            `json:"index,omitempty"`
}

// PolicyVersion is one entry of a sandbox's policy history.
type PolicyVersion struct {
	Generation int64           `json:"generation"`
	Actor      string          `json:"actor"`
	Reason     string          `json:"reason,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	Policy     json.RawMessage `json:"policy"`
}

// BudgetUsage is one budget of a sandbox's policy and what is used of it.
type BudgetUsage struct {
	Name      string  `json:"name"`
	Requests  int64   `json:"requests"`
	BytesUp   int64   `json:"bytes_up"`
	BytesDown int64   `json:"bytes_down"`
	Spend     float64 `json:"spend"`
	// Limits as the policy sets them (0: no cap).
	MaxRequests  int64   `json:"max_requests,omitempty"`
	MaxBytesUp   int64   `json:"max_bytes_up,omitempty"`
	MaxBytesDown int64   `json:"max_bytes_down,omitempty"`
	MaxSpend     float64 `json:"max_spend,omitempty"`
	Rate         float64 `json:"rate,omitempty"`
	Exhausted    bool    `json:"exhausted"`
}

// NamedPolicy is a tenant's reusable policy (/v1/policies).
type NamedPolicy struct {
	Name       string          `json:"name"`
	Generation int64           `json:"generation"`
	Policy     json.RawMessage `json:"policy"`
	UpdatedAt  time.Time       `json:"updated_at"`
	// Sandboxes following it that were updated by the last change.
	Updated []string `json:"updated,omitempty"`
}

// WebhookKey is a tenant's approval-webhook signing key
// (GET /v1/approvals/webhook-key): its receivers check X-Cagebox-Signature
// with it; no other tenant's requests verify under it.
type WebhookKey struct {
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
}

// Approval is a held request (/v1/approvals).
type Approval struct {
	ID        string          `json:"id"`
	Sandbox   string          `json:"sandbox"`
	Rule      string          `json:"rule"`
	Request   json.RawMessage `json:"request"`
	State     string          `json:"state"`
	DecidedBy string          `json:"decided_by,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	Remember  bool            `json:"remember,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	Deadline  time.Time       `json:"deadline"`
}

// ApprovalDecision answers a held request (POST /v1/approvals/{id}).
type ApprovalDecision struct {
	// Decision is "allow" or "deny".
	Decision string `json:"decision"`
	// Remember turns the decision into a rule for the rest of the session.
	Remember bool   `json:"remember,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// FreezeRequest names what POST /v1/freeze and /v1/thaw apply to: one
// sandbox, a tenant's sandboxes (a tenant its own; the admin any), or all
// (admin). A freeze belongs to whoever made it: only they or the admin
// thaw it (403 otherwise).
type FreezeRequest struct {
	Sandbox string `json:"sandbox,omitempty"`
	Tenant  string `json:"tenant,omitempty"`
	All     bool   `json:"all,omitempty"`
}

// FreezeResult lists the sandboxes a freeze or thaw applied to.
type FreezeResult struct {
	Sandboxes []string `json:"sandboxes"`
	// StillFrozen (thaw): sandboxes of the scope that stay frozen because
	// another principal (the admin) froze them one by one; only it (or
	// the admin) thaws them.
	StillFrozen []string `json:"still_frozen,omitempty"`
}

// PoolStatus is one warm pool (GET /v1/pools).
type PoolStatus struct {
	// Class is RUNTIME:IMAGE[:MEMORY]: what makes its sandboxes
	// interchangeable.
	Class       string `json:"class"`
	Runtime     string `json:"runtime"`
	Image       string `json:"image"`
	MemoryBytes int64  `json:"memory_bytes"`
	// Target is how many sandboxes the daemon keeps ready; Ready how many
	// are; Filling whether one is being made.
	Target  int  `json:"target"`
	Ready   int  `json:"ready"`
	Filling bool `json:"filling"`
	// Claims and Misses count creates of the class served from the pool
	// and made cold; Fills and Failures count the pool's own creates.
	Claims   uint64 `json:"claims"`
	Misses   uint64 `json:"misses"`
	Fills    uint64 `json:"fills"`
	Failures uint64 `json:"failures"`
	// LastError is why the last fill failed (empty after a success).
	LastError string `json:"last_error,omitempty"`
	// LastFillMs is how long the last successful fill took.
	LastFillMs int64 `json:"last_fill_ms"`
	// Sandboxes are the ready sandboxes' IDs (each a store row of status
	// pooled that belongs to no tenant until a create claims it).
	Sandboxes []string `json:"sandboxes,omitempty"`
}

// PoolTarget is one warm pool: keep Size sandboxes of runtime, image and
// memory ready.
type PoolTarget struct {
	Runtime     string `json:"runtime"`
	Image       string `json:"image"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	Size        int    `json:"size"`
}

// SetPoolsRequest is the body of PUT /v1/pools (admin): the pools the
// daemon keeps from now on, replacing its earlier targets (a class left
// out keeps none; its ready sandboxes are destroyed).
type SetPoolsRequest struct {
	Targets []PoolTarget `json:"targets"`
}

// Pools is the answer of GET /v1/pools.
type Pools struct {
	Pools []PoolStatus `json:"pools"`
	// MemoryBudget bounds the memory of all pooled sandboxes together;
	// MemoryUsed is what the ready ones hold (their classes' limits).
	MemoryBudget int64 `json:"memory_budget"`
	MemoryUsed   int64 `json:"memory_used"`
}

// Tool is a named, registered command that callers run with an input
// (POST /v1/tools/{name}/execute) without knowing where it runs: each
// execute is a fresh sandbox (a warm-pool claim where a pool holds the
// class), gone when the result is back.
type Tool struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Argv is the command; the input arrives on its stdin, or as the
	// file InputFile names.
	Argv      []string `json:"argv"`
	InputFile string   `json:"input_file,omitempty"`
	// Image, Runtime ("" or "auto": the strongest available) and
	// RuntimeFloor (an isolation class: namespaces, app-kernel,
	// hypervisor) choose where it runs; the tenant's floor applies too.
	Image        string `json:"image,omitempty"`
	Runtime      string `json:"runtime,omitempty"`
	RuntimeFloor string `json:"runtime_floor,omitempty"`
	// Egress: Allow hosts and/or PolicyRef (a named policy); none: deny.
	Allow     []string `json:"allow,omitempty"`
	PolicyRef string   `json:"policy_ref,omitempty"`
	// Secrets bind stored secrets (by reference only: inline values are
	// refused) as placeholders, as for a sandbox.
	Secrets []SecretBinding `json:"secrets,omitempty"`
	Env     []string        `json:"env,omitempty"`
	// Timeout bounds one execute (default 60s, at most 1h).
	Timeout     string  `json:"timeout,omitempty"`
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	// InputSchema is the JSON Schema of the input (MCP clients show it);
	// default: a string.
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	CreatedAt   time.Time       `json:"created_at"`
}

// ExecuteRequest runs a tool once.
type ExecuteRequest struct {
	// Input is given to the tool's command (stdin, or its InputFile).
	Input string `json:"input"`
	// MaxOutput bounds stdout and stderr each (default and at most 1 MiB);
	// beyond it the output is cut and marked truncated.
	MaxOutput int64 `json:"max_output,omitempty"`
}

// ExecuteResult is how one execute went.
type ExecuteResult struct {
	Tool    string `json:"tool"`
	Sandbox string `json:"sandbox"`
	Runtime string `json:"runtime"`
	// Pooled: the sandbox came from a warm pool.
	Pooled          bool   `json:"pooled"`
	ExitCode        int    `json:"exit_code"`
	TimedOut        bool   `json:"timed_out,omitempty"`
	OOMKilled       bool   `json:"oom_killed,omitempty"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	DurationMs      int64  `json:"duration_ms"`
	// Egress lists the gateway's decisions on the tool's requests.
	Egress []EgressDecision `json:"egress"`
}

// EgressDecision is one request the gateway decided during an execute.
type EgressDecision struct {
	Host    string `json:"host"`
	Method  string `json:"method,omitempty"`
	Path    string `json:"path,omitempty"`
	Allowed bool   `json:"allowed"`
	Rule    string `json:"rule,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// AccessRequest asks an operator to let a sandbox reach a host (POST
// /v1/sandboxes/{id}/access): a pending approval the operator decides.
type AccessRequest struct {
	Host   string `json:"host"`
	Reason string `json:"reason,omitempty"`
	// Timeout is how long to wait for the decision (default and at most
	// 10m).
	Timeout string `json:"timeout,omitempty"`
}

// AccessResult is how an access request was decided; allowed, the host
// is allowed for the rest of the session.
type AccessResult struct {
	Approval string `json:"approval"`
	Allowed  bool   `json:"allowed"`
	By       string `json:"by,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// WebhookRequest adds a webhook to a sandbox (POST
// /v1/sandboxes/{id}/webhooks): deliveries to its URL, verified with the
// vault secret Secret by the scheme Verify, go to the guest's Port and Path.
type WebhookRequest struct {
	Name   string `json:"name"`
	Port   int    `json:"port"`
	Path   string `json:"path,omitempty"`
	Verify string `json:"verify"`
	Secret string `json:"secret"`
}

// Webhook is a sandbox's webhook. URL and Token are in the answer to its
// creation only.
type Webhook struct {
	Name      string    `json:"name"`
	SandboxID string    `json:"sandbox_id"`
	Port      int       `json:"port"`
	Path      string    `json:"path"`
	Verify    string    `json:"verify"`
	Secret    string    `json:"secret"`
	URL       string    `json:"url,omitempty"`
	Token     string    `json:"token,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// Pending counts deliveries not yet delivered.
	Pending int `json:"pending"`
}

// RelayRequest adds a relay to a sandbox (POST
// /v1/sandboxes/{id}/relays): the host holds a connection on the guest's
// behalf and delivers what arrives to the guest's Port and Path. Kind
// "discord": a bot's Gateway connection, its token the vault secret
// TokenSecret, Intents its gateway intents. Kind "websocket": URL, with
// Headers ("Name: value", {secret} standing for TokenSecret's value).
type RelayRequest struct {
	Name        string   `json:"name"`
	Kind        string   `json:"kind"`
	Port        int      `json:"port"`
	Path        string   `json:"path,omitempty"`
	TokenSecret string   `json:"token_secret,omitempty"`
	Intents     int      `json:"intents,omitempty"`
	URL         string   `json:"url,omitempty"`
	Headers     []string `json:"headers,omitempty"`
}

// Relay is a sandbox's relay and its connection's state.
type Relay struct {
	Name        string `json:"name"`
	SandboxID   string `json:"sandbox_id"`
	Kind        string `json:"kind"`
	Port        int    `json:"port"`
	Path        string `json:"path"`
	TokenSecret string `json:"token_secret,omitempty"`
	Intents     int    `json:"intents,omitempty"`
	URL         string `json:"url,omitempty"`
	// Headers are as given: {secret} stays a placeholder.
	Headers   []string   `json:"headers,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	State     RelayState `json:"state"`
	// Pending counts events queued for the guest, not yet delivered.
	Pending int `json:"pending"`
}

// RelayState is a relay's connection.
type RelayState struct {
	Connected  bool   `json:"connected"`
	Failed     bool   `json:"failed,omitempty"`
	SessionID  string `json:"session_id,omitempty"`
	Seq        int64  `json:"seq"`
	Reconnects int    `json:"reconnects"`
	Resumes    int    `json:"resumes"`
	// Received counts events queued for the guest; Dropped those that
	// could not be (queue full).
	Received  int64  `json:"received"`
	Dropped   int64  `json:"dropped"`
	LastError string `json:"last_error,omitempty"`
}

// ConsoleSession is a one-time link to the web console (POST
// /v1/console/sessions, admin over the unix socket): opening URL in a
// browser before ExpiresAt logs it in as the admin, once.
type ConsoleSession struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// PtyControl is a text (JSON) message on the pty WebSocket
// (GET /v1/sandboxes/{id}/pty). Client → server: {"type":"resize","rows":N,
// "cols":M}. Server → client, once, just before a normal close (1000):
// {"type":"exit","exit_code":N,"signal":"SIGX"} (signal only when a signal
// ended the command; timed_out, oom_killed and error as on an exec's exit
// frame). Binary messages, both ways, are the terminal's bytes.
type PtyControl struct {
	Type      string `json:"type"`
	Rows      int    `json:"rows,omitempty"`
	Cols      int    `json:"cols,omitempty"`
	ExitCode  *int   `json:"exit_code,omitempty"`
	Signal    string `json:"signal,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	Error     string `json:"error,omitempty"`
}

// Mount is a host path (type "bind": a directory or regular file below one
// of the daemon's --mount-root directories) or a tenant's volume (type
// "volume") mounted in the guest at Dst. Every mount is nosuid and nodev;
// it is read-only unless RW and noexec unless Exec. The --mount syntax:
// type=bind|volume,src=…,dst=…[,ro|rw][,exec].
type Mount struct {
	Type string `json:"type"`
	Src  string `json:"src"`
	Dst  string `json:"dst"`
	RW   bool   `json:"rw,omitempty"`
	Exec bool   `json:"exec,omitempty"`
}

// CreateVolumeRequest makes a named volume (an empty ext4 filesystem).
type CreateVolumeRequest struct {
	// Name: 1-63 of a-z 0-9 _ . - starting with a letter or digit.
	Name string `json:"name"`
	// SizeBytes is the filesystem's size (0: 1 GiB; 16 MiB to 64 GiB).
	// The image is sparse: the host's disk holds only what is written.
	SizeBytes int64 `json:"size_bytes,omitempty"`
}

// Volume is a tenant's named volume.
type Volume struct {
	Name      string    `json:"name"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// VMOnly: a microVM has written the volume's block device, so only
	// microVM sandboxes may mount it (the host kernel never mounts a
	// filesystem a guest could have crafted).
	VMOnly bool `json:"vm_only,omitempty"`
	// AttachedTo are the sandboxes (not yet removed) that mount it.
	AttachedTo []VolumeAttachment `json:"attached_to,omitempty"`
}

// VolumeAttachment is a sandbox mounting a volume.
type VolumeAttachment struct {
	Sandbox string `json:"sandbox"`
	RW      bool   `json:"rw,omitempty"`
}
