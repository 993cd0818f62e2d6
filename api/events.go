package api

import (
	"strings"
	"time"
)

// The event catalog: every kind of audit event the daemon emits, with the
// shape of its data. Event.Kind is one of the EventKind constants and
// Event.Data is the JSON of the kind's payload struct (absent for the
// kinds whose payload has no fields). docs/events.md describes each kind
// and field; a test keeps it, this file and the emitters in step.
//
// Adding a kind is one change here: a constant, a payload struct with its
// EventKind method, an entry in eventCatalog — and its row in
// docs/events.md, which the test asks for.
//
// No field of any payload ever holds a secret value: secrets appear by
// name, and at most as a preview (an ellipsis and the last 4 characters).

// EventKind names an event ("egress.allow"). The prefix before the first
// dot is its area, and the area decides its class.
type EventKind string

// The event kinds.
const (
	// Sandbox lifecycle (the sandbox manager).
	EventSandboxCreated    EventKind = "sandbox.created"
	EventSandboxFailed     EventKind = "sandbox.failed"
	EventSandboxExec       EventKind = "sandbox.exec"
	EventSandboxPaused     EventKind = "sandbox.paused"
	EventSandboxResumed    EventKind = "sandbox.resumed"
	EventSandboxStopped    EventKind = "sandbox.stopped"
	EventSandboxDestroyed  EventKind = "sandbox.destroyed"
	EventSandboxLost       EventKind = "sandbox.lost"
	EventSandboxReattached EventKind = "sandbox.reattached"
	// Snapshots (the sandbox manager): the event's sandbox is the one
	// snapshotted.
	EventSandboxSnapshotted  EventKind = "sandbox.snapshotted"
	EventSandboxSnapshotGone EventKind = "sandbox.snapshot_removed"

	// Credentials (the vault API, the sandbox manager and the gateway's
	// credential pipeline).
	EventSecretPut            EventKind = "secret.put"
	EventSecretRotated        EventKind = "secret.rotated"
	EventSecretDeleted        EventKind = "secret.deleted"
	EventSecretRevoked        EventKind = "secret.revoked"
	EventSecretUnbound        EventKind = "secret.unbound"
	EventSecretEnvDelivered   EventKind = "secret.env_delivered"
	EventSecretUsed           EventKind = "secret.used"
	EventSecretRefused        EventKind = "secret.refused"
	EventSecretAlert          EventKind = "secret.alert"
	EventSecretError          EventKind = "secret.error"
	EventSecretExfilSuspect   EventKind = "secret.exfil_suspect"
	EventSecretExfilUnscanned EventKind = "secret.exfil_unscanned"
	EventSecretReflected      EventKind = "secret.reflected"

	// Traffic (the gateway's proxy and resolver).
	EventEgressAllow EventKind = "egress.allow"
	EventEgressDeny  EventKind = "egress.deny"
	EventEgressError EventKind = "egress.error"
	EventDNSQuery    EventKind = "dns.query"

	// EventDropped reports events the daemon dropped under load.
	EventDropped EventKind = "events.dropped"

	// Live policy (package livepolicy).
	EventPolicyChanged         EventKind = "policy.changed"
	EventPolicyTrigger         EventKind = "policy.trigger"
	EventPolicyBudgetExhausted EventKind = "policy.budget_exhausted"
	EventPolicyFrozen          EventKind = "policy.frozen"
	EventPolicyThawed          EventKind = "policy.thawed"
	EventApprovalPending       EventKind = "approval.pending"
	EventApprovalDecided       EventKind = "approval.decided"

	// Warm pools (package pool and the sandbox manager).
	EventPoolClaimed    EventKind = "pool.claimed"
	EventPoolMissed     EventKind = "pool.missed"
	EventPoolFilled     EventKind = "pool.filled"
	EventPoolFillFailed EventKind = "pool.fill_failed"

	// Webhooks (package hooks).
	EventWebhookReceived  EventKind = "webhook.received"
	EventWebhookRejected  EventKind = "webhook.rejected"
	EventWebhookDelivered EventKind = "webhook.delivered"
	EventWebhookFailed    EventKind = "webhook.failed"
	// Inbound (package ingress).
	EventIngressRequest EventKind = "ingress.request"

	// Relays (package relay).
	EventRelayConnected    EventKind = "relay.connected"
	EventRelayDisconnected EventKind = "relay.disconnected"
	EventRelayFailed       EventKind = "relay.failed"
	EventRelayDropped      EventKind = "relay.dropped"
	// Syscall audit (`--audit`; the runtimes, through the sandbox
	// manager's per-sandbox rate limit).
	EventSyscallExec    EventKind = "syscall.exec"
	EventSyscallConnect EventKind = "syscall.connect"
	EventSyscallOpen    EventKind = "syscall.open"
	EventSyscallPriv    EventKind = "syscall.priv"
	EventSyscallDropped EventKind = "syscall.dropped"
)

// EventClass is how the daemon treats an event under load.
type EventClass string

const (
	// ClassBulk events (egress.*, dns.query and any area not named below)
	// are one per request or query: they are rate-limited per sandbox and
	// the first to be dropped; an events.dropped event counts them.
	ClassBulk EventClass = "bulk"
	// ClassPriority events (sandbox.*, secret.*) are lifecycle and
	// security records, with a per-sandbox budget of their own that no
	// flood of bulk events uses up.
	ClassPriority EventClass = "priority"
	// ClassReport is events.dropped: at most one a second per sandbox,
	// never rate-limited.
	ClassReport EventClass = "report"
	// ClassSyscall events (syscall.*, but syscall.dropped) are a
	// sandbox's audited system calls: the sandbox manager rate-limits
	// them per sandbox first (counting drops), and the event log gives
	// them a budget of their own, so a guest's flood of execs never uses
	// up its egress or lifecycle budgets.
	ClassSyscall EventClass = "syscall"
)

// Class returns the class of k, from its area.
func (k EventKind) Class() EventClass {
	area, _, _ := strings.Cut(string(k), ".")
	switch area {
	case "sandbox", "secret", "policy", "approval", "pool":
		return ClassPriority
	case "events":
		return ClassReport
	case "syscall":
		if k == EventSyscallDropped {
			return ClassPriority
		}
		return ClassSyscall
	}
	return ClassBulk
}

// EventPayload is the data of one kind of event: every payload struct
// below is one, and says which kind it is. A payload with no fields is
// stored and streamed with no data.
type EventPayload interface {
	EventKind() EventKind
}

// EventPayloads returns a zero value of every kind's payload, in the
// order of docs/events.md.
func EventPayloads() []EventPayload {
	return append([]EventPayload(nil), eventCatalog...)
}

var eventCatalog = []EventPayload{
	SandboxCreated{}, SandboxFailed{}, SandboxExec{}, SandboxPaused{}, SandboxResumed{},
	SandboxStopped{}, SandboxDestroyed{}, SandboxLost{}, SandboxReattached{},
	SandboxSnapshotted{}, SandboxSnapshotRemoved{},
	SecretPut{}, SecretRotated{}, SecretDeleted{}, SecretRevoked{}, SecretUnbound{},
	SecretEnvDelivered{}, SecretUsed{}, SecretRefused{}, SecretAlert{}, SecretError{},
	SecretExfilSuspect{}, SecretExfilUnscanned{}, SecretReflected{},
	EgressAllow{}, EgressDeny{}, EgressError{}, DNSQuery{},
	PolicyChanged{}, PolicyTrigger{}, PolicyBudgetExhausted{}, PolicyFrozen{}, PolicyThawed{},
	ApprovalPending{}, ApprovalDecided{},
	PoolClaimed{}, PoolMissed{}, PoolFilled{}, PoolFillFailed{},
	WebhookReceived{}, WebhookRejected{}, WebhookDelivered{}, WebhookFailed{},
	IngressRequest{},
	RelayConnected{}, RelayDisconnected{}, RelayFailed{}, RelayDropped{},
	SyscallExec{}, SyscallConnect{}, SyscallOpen{}, SyscallPriv{}, SyscallDropped{},
	EventsDropped{},
}

// WebhookReceived: a verified delivery was queued for the sandbox.
type WebhookReceived struct {
	Webhook  string `json:"webhook"`
	Delivery int64  `json:"delivery"`
	Bytes    int64  `json:"bytes"`
}

// WebhookRejected: a request to a webhook URL was refused (forged,
// stale, replayed, the sandbox stopped or failed, too large, queue full,
// secret unavailable).
type WebhookRejected struct {
	Webhook string `json:"webhook"`
	Status  int    `json:"status"`
	Reason  string `json:"reason"`
}

// WebhookDelivered: the guest answered a delivery with a 2xx.
type WebhookDelivered struct {
	Webhook    string `json:"webhook"`
	Delivery   int64  `json:"delivery"`
	Status     int    `json:"status"`
	Attempts   int    `json:"attempts"`
	DurationMs int64  `json:"duration_ms"`
}

// WebhookFailed: a delivery attempt failed, or a delivery was given up
// untried (its sandbox stopped or failed); GaveUp when it will not be
// tried again.
type WebhookFailed struct {
	Webhook  string `json:"webhook"`
	Delivery int64  `json:"delivery"`
	Attempts int    `json:"attempts"`
	Error    string `json:"error"`
	GaveUp   bool   `json:"gave_up,omitempty"`
}

// PoolClaimed: a create was served from a warm pool (the event's
// sandbox is the new sandbox).
type PoolClaimed struct {
	Class string `json:"class"`
	// SetupMs is how long binding the pooled sandbox took.
	SetupMs int64 `json:"setup_ms"`
}

// PoolMissed: a create of a pooled class found no ready sandbox, or the
// one it claimed could not be bound, and was made cold.
type PoolMissed struct {
	Class  string `json:"class"`
	Reason string `json:"reason"`
}

// PoolFilled: the daemon added a sandbox to a pool (the event's sandbox is
// the pooled one's future id; it has no tenant).
type PoolFilled struct {
	Class      string `json:"class"`
	Ready      int    `json:"ready"`
	DurationMs int64  `json:"duration_ms"`
}

// PoolFillFailed: making a pooled sandbox failed; the pool backs off.
type PoolFillFailed struct {
	Class string `json:"class"`
	Error string `json:"error"`
}

// SandboxCreated: a sandbox is running.
type SandboxCreated struct {
	Runtime string `json:"runtime"`
	Image   string `json:"image"`
}

// SandboxFailed: a sandbox failed to start, or its memory limit killed it
// whole.
type SandboxFailed struct {
	Error     string `json:"error"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
}

// SandboxExec: a command run in a sandbox finished. Its arguments are
// counted, never recorded.
type SandboxExec struct {
	Command   string `json:"command"`
	Args      int    `json:"args"`
	ExitCode  int    `json:"exit_code"`
	OOMKilled bool   `json:"oom_killed"`
	TimedOut  bool   `json:"timed_out"`
}

// SandboxPaused: a sandbox was frozen; Reason says why when it was not
// an API call (the idle timeout).
type SandboxPaused struct {
	Reason string `json:"reason,omitempty"`
	// ToDisk: hibernated — saved whole to disk, its VMM ended.
	ToDisk bool `json:"to_disk,omitempty"`
}

// SandboxResumed: a sandbox was thawed; Reason says why when it was not
// an API call (an exec or file operation woke it from an idle pause).
type SandboxResumed struct {
	Reason string `json:"reason,omitempty"`
}

// SandboxStopped and SandboxReattached carry no data.
type (
	SandboxStopped    struct{}
	SandboxReattached struct{}
)

// SandboxDestroyed: a sandbox was torn down.
type SandboxDestroyed struct {
	// Reason is "removed", or why the daemon destroyed it (its maximum
	// lifetime, its idle timeout).
	Reason string `json:"reason"`
}

// SandboxSnapshotted: a snapshot of the sandbox was taken (also the
// snapshot of a fork).
type SandboxSnapshotted struct {
	Snapshot   string `json:"snapshot"`
	Kind       string `json:"kind"`
	SizeBytes  int64  `json:"size_bytes"`
	Fork       bool   `json:"fork,omitempty"`
	DurationMs int64  `json:"duration_ms"`
}

// SandboxSnapshotRemoved: a snapshot of the sandbox was removed (a fork's:
// with the last sandbox started from it).
type SandboxSnapshotRemoved struct {
	Snapshot string `json:"snapshot"`
}

// SandboxLost: a sandbox could not be recovered after a daemon restart
// and was cleaned up.
type SandboxLost struct {
	Error string `json:"error"`
}

// SecretPut: a secret was stored (or replaced) in the vault.
type SecretPut struct {
	Name     string   `json:"name"`
	Hosts    []string `json:"hosts"`
	Version  int64    `json:"version"`
	Preview  string   `json:"preview"`
	AllowEnv bool     `json:"allow_env"`
}

// SecretRotated: a secret's value was replaced.
type SecretRotated struct {
	Name     string `json:"name"`
	Version  int64  `json:"version"`
	Preview  string `json:"preview"`
	AllowEnv bool   `json:"allow_env"`
}

// SecretDeleted: a secret was deleted from the vault.
type SecretDeleted struct {
	Name string `json:"name"`
}

// SecretRevoked: a secret was revoked; sandboxes can no longer use it.
type SecretRevoked struct {
	Name string `json:"name"`
	// By is "trigger:NAME" when a policy trigger revoked it.
	By string `json:"by,omitempty"`
}

// SecretUnbound: a secret binding was removed from a running sandbox.
type SecretUnbound struct {
	Name string `json:"name"`
}

// SecretEnvDelivered: secrets bound in mode "env" were put, real values,
// into a sandbox's environment.
type SecretEnvDelivered struct {
	Names   []string `json:"names"`
	Warning string   `json:"warning"`
}

// SecretUsed: the gateway put real values into a request, or re-signed it.
type SecretUsed struct {
	Host   string   `json:"host"`
	Method string   `json:"method"`
	Path   string   `json:"path"`
	Names  []string `json:"names"`
	// Resigned is "hmac" or "sigv4" when the request was re-signed.
	Resigned string `json:"resigned,omitempty"`
}

// SecretVerdict is the data of secret.refused and secret.alert: a request
// (or a response, or a WebSocket frame) the credential pipeline stopped.
type SecretVerdict struct {
	Host   string `json:"host"`
	Method string `json:"method"`
	Path   string `json:"path"`
	Rule   string `json:"rule"`
	Reason string `json:"reason"`
}

// SecretRefused: a request using a secret was refused (it cannot be used,
// a signature did not verify, a body was too large to check).
type SecretRefused SecretVerdict

// SecretAlert: one of a sandbox's placeholders, or a request signed with
// one, headed somewhere its secret is not bound to.
type SecretAlert SecretVerdict

// SecretError: the placeholder swap failed; the request was refused.
type SecretError struct {
	Host  string `json:"host"`
	Error string `json:"error"`
}

// SecretExfilSuspect: a request carries a credential-shaped string that is
// none of the sandbox's placeholders.
type SecretExfilSuspect struct {
	Host    string `json:"host"`
	Method  string `json:"method"`
	Path    string `json:"path"`
	Rule    string `json:"rule"`
	Where   string `json:"where"`
	Preview string `json:"preview"`
	Mode    string `json:"mode"`
}

// SecretExfilUnscanned: the exfil scan could not cover all of a request.
type SecretExfilUnscanned struct {
	Host         string `json:"host"`
	Method       string `json:"method"`
	Path         string `json:"path"`
	Limit        string `json:"limit"`
	Unscanned    string `json:"unscanned"`
	ScannedBytes int64  `json:"scanned_bytes"`
	Mode         string `json:"mode"`
}

// SecretReflected: an upstream's response carried a real value the
// gateway had put in; the gateway replaced it with the placeholder.
type SecretReflected struct {
	Host     string `json:"host"`
	Method   string `json:"method"`
	Path     string `json:"path"`
	Name     string `json:"name"`
	Where    string `json:"where"`
	Encoding string `json:"encoding"`
}

// Egress is the data of egress.allow, egress.deny and egress.error: one
// request or connection through the gateway's proxy.
type Egress struct {
	Host       string  `json:"host"`
	Port       int     `json:"port"`
	Protocol   string  `json:"protocol"`
	Method     string  `json:"method"`
	Path       string  `json:"path"`
	Rule       string  `json:"rule"`
	Verdict    string  `json:"verdict"`
	Reason     string  `json:"reason"`
	Status     int     `json:"status"`
	BytesUp    int64   `json:"bytes_up"`
	BytesDown  int64   `json:"bytes_down"`
	DurationMS float64 `json:"duration_ms"`
}

// EgressAllow, EgressDeny and EgressError: the proxy allowed, refused, or
// failed to carry a request or connection.
type (
	EgressAllow Egress
	EgressDeny  Egress
	EgressError Egress
)

// DNSQuery: the sandbox's resolver answered (or dropped) a query.
type DNSQuery struct {
	Name   string `json:"name"`
	Type   string `json:"type"`
	Rcode  string `json:"rcode"`
	Answer string `json:"answer"`
	Reason string `json:"reason"`
}

// EventsDropped: events about one sandbox (or tenant) the daemon dropped
// since the last such report.
type EventsDropped struct {
	Count       int64               `json:"count"`
	Kinds       map[EventKind]int64 `json:"kinds"`
	RateLimited int64               `json:"rate_limited"`
	QueueFull   int64               `json:"queue_full"`
	StoreFailed int64               `json:"store_failed"`
	Window      DroppedWindow       `json:"window"`
	// Limit is absent when the daemon does not rate-limit events.
	Limit *DroppedLimit `json:"limit,omitempty"`
}

// DroppedWindow is when the events of an events.dropped were dropped.
type DroppedWindow struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

// DroppedLimit is the rate limit in force: events a second per sandbox
// and class, and the bucket's size.
type DroppedLimit struct {
	Rate  float64 `json:"rate"`
	Burst int     `json:"burst"`
}

func (SandboxCreated) EventKind() EventKind         { return EventSandboxCreated }
func (SandboxFailed) EventKind() EventKind          { return EventSandboxFailed }
func (SandboxExec) EventKind() EventKind            { return EventSandboxExec }
func (SandboxPaused) EventKind() EventKind          { return EventSandboxPaused }
func (SandboxResumed) EventKind() EventKind         { return EventSandboxResumed }
func (SandboxStopped) EventKind() EventKind         { return EventSandboxStopped }
func (SandboxDestroyed) EventKind() EventKind       { return EventSandboxDestroyed }
func (SandboxLost) EventKind() EventKind            { return EventSandboxLost }
func (SandboxReattached) EventKind() EventKind      { return EventSandboxReattached }
func (SandboxSnapshotted) EventKind() EventKind     { return EventSandboxSnapshotted }
func (SandboxSnapshotRemoved) EventKind() EventKind { return EventSandboxSnapshotGone }
func (SecretPut) EventKind() EventKind              { return EventSecretPut }
func (SecretRotated) EventKind() EventKind          { return EventSecretRotated }
func (SecretDeleted) EventKind() EventKind          { return EventSecretDeleted }
func (SecretRevoked) EventKind() EventKind          { return EventSecretRevoked }
func (SecretUnbound) EventKind() EventKind          { return EventSecretUnbound }
func (SecretEnvDelivered) EventKind() EventKind     { return EventSecretEnvDelivered }
func (SecretUsed) EventKind() EventKind             { return EventSecretUsed }
func (SecretRefused) EventKind() EventKind          { return EventSecretRefused }
func (SecretAlert) EventKind() EventKind            { return EventSecretAlert }
func (SecretError) EventKind() EventKind            { return EventSecretError }
func (SecretExfilSuspect) EventKind() EventKind     { return EventSecretExfilSuspect }
func (SecretExfilUnscanned) EventKind() EventKind   { return EventSecretExfilUnscanned }
func (SecretReflected) EventKind() EventKind        { return EventSecretReflected }
func (EgressAllow) EventKind() EventKind            { return EventEgressAllow }
func (EgressDeny) EventKind() EventKind             { return EventEgressDeny }
func (EgressError) EventKind() EventKind            { return EventEgressError }
func (DNSQuery) EventKind() EventKind               { return EventDNSQuery }
func (EventsDropped) EventKind() EventKind          { return EventDropped }

// PolicyChanged: a sandbox's live policy got a new generation.
type PolicyChanged struct {
	Generation int64  `json:"generation"`
	Actor      string `json:"actor"`
	Reason     string `json:"reason"`
	Rules      int    `json:"rules"`
}

// PolicyTrigger: a policy trigger fired.
type PolicyTrigger struct {
	Trigger string   `json:"trigger"`
	After   string   `json:"after"`
	Host    string   `json:"host"`
	Method  string   `json:"method"`
	Path    string   `json:"path"`
	Actions []string `json:"actions"`
}

// PolicyBudgetExhausted: a budget was spent (once per budget).
type PolicyBudgetExhausted struct {
	Budget string `json:"budget"`
	Reason string `json:"reason"`
	Host   string `json:"host"`
	Rule   string `json:"rule"`
}

// PolicyFrozen: a sandbox was cut off the network.
type PolicyFrozen struct {
	By    string `json:"by"`
	Scope string `json:"scope"`
}

// PolicyThawed: a freeze was lifted.
type PolicyThawed PolicyFrozen

// ApprovalPending: a request is held for a decision.
type ApprovalPending struct {
	ID        string `json:"id"`
	Rule      string `json:"rule"`
	Method    string `json:"method"`
	Host      string `json:"host"`
	Path      string `json:"path"`
	TimeoutMS int64  `json:"timeout_ms"`
}

// ApprovalDecided: a held request was decided, timed out or abandoned.
type ApprovalDecided struct {
	ID       string `json:"id"`
	Rule     string `json:"rule"`
	State    string `json:"state"`
	By       string `json:"by"`
	Reason   string `json:"reason"`
	Remember bool   `json:"remember"`
}

func (PolicyChanged) EventKind() EventKind         { return EventPolicyChanged }
func (PolicyTrigger) EventKind() EventKind         { return EventPolicyTrigger }
func (PolicyBudgetExhausted) EventKind() EventKind { return EventPolicyBudgetExhausted }
func (PolicyFrozen) EventKind() EventKind          { return EventPolicyFrozen }
func (PolicyThawed) EventKind() EventKind          { return EventPolicyThawed }
func (ApprovalPending) EventKind() EventKind       { return EventApprovalPending }
func (ApprovalDecided) EventKind() EventKind       { return EventApprovalDecided }
func (PoolClaimed) EventKind() EventKind           { return EventPoolClaimed }
func (PoolMissed) EventKind() EventKind            { return EventPoolMissed }
func (PoolFilled) EventKind() EventKind            { return EventPoolFilled }
func (PoolFillFailed) EventKind() EventKind        { return EventPoolFillFailed }
func (WebhookReceived) EventKind() EventKind       { return EventWebhookReceived }
func (WebhookRejected) EventKind() EventKind       { return EventWebhookRejected }
func (WebhookDelivered) EventKind() EventKind      { return EventWebhookDelivered }
func (WebhookFailed) EventKind() EventKind         { return EventWebhookFailed }

// IngressRequest: one request through the ingress listener to a
// published port (refused ones too: Status says how it ended).
type IngressRequest struct {
	Method string `json:"method"`
	Host   string `json:"host"`
	// Path is without the query (which may carry a signature).
	Path       string  `json:"path"`
	Port       int     `json:"port"`
	Status     int     `json:"status"`
	BytesIn    int64   `json:"bytes_in"`
	BytesOut   int64   `json:"bytes_out"`
	DurationMS float64 `json:"duration_ms"`
}

func (IngressRequest) EventKind() EventKind { return EventIngressRequest }

func (RelayConnected) EventKind() EventKind    { return EventRelayConnected }
func (RelayDisconnected) EventKind() EventKind { return EventRelayDisconnected }
func (RelayFailed) EventKind() EventKind       { return EventRelayFailed }
func (RelayDropped) EventKind() EventKind      { return EventRelayDropped }

// RelayConnected: a relay's connection is up (identified afresh or
// resumed).
type RelayConnected struct {
	Relay   string `json:"relay"`
	Resumed bool   `json:"resumed"`
	Seq     int64  `json:"seq"`
}

// RelayDisconnected: a relay's connection ended; it reconnects, unless
// its sandbox stopped or failed (then the relay closed it and stays
// stopped).
type RelayDisconnected struct {
	Relay  string `json:"relay"`
	Code   int    `json:"code,omitempty"`
	Reason string `json:"reason"`
}

// RelayFailed: the service refused the relay (a bad token, disallowed
// intents); it stopped and does not retry.
type RelayFailed struct {
	Relay string `json:"relay"`
	Error string `json:"error"`
}

// RelayDropped: events a relay received but could not queue for the
// guest (its queue was full); at most one a second per relay, counting
// the drops since the last.
type RelayDropped struct {
	Relay   string `json:"relay"`
	Dropped int64  `json:"dropped"`
	Reason  string `json:"reason"`
}
