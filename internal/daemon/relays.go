package daemon

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/hooks"
	"github.com/cagebox/cagebox/internal/relay"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/vault"
)

// relayConfig is a relay's stored settings (store.Relay.Config): no
// secret value, only the vault key's name (the webhook row's Secret).
type relayConfig struct {
	Intents int      `json:"intents,omitempty"`
	URL     string   `json:"url,omitempty"`
	Headers []string `json:"headers,omitempty"`
}

// relayRunner is a running relay of either kind.
type relayRunner interface {
	Run(ctx context.Context) error
	Snapshot() relay.State
}

// relays runs every relay in the store: each is a goroutine holding its
// connection while its sandbox is running or asleep (not once it is
// stopped or failed); its events become deliveries of the relay's webhook
// row (package hooks queues, orders, wakes and retries them).
type relays struct {
	st         store.Store
	hooks      *hooks.Service
	v          *vault.Vault
	emit       func(string, string, api.EventPayload)
	log        *slog.Logger
	discordURL string
	// client dials every relay's URL: the tenants' (package safedial's
	// guarded dialer, loopback and private addresses only with
	// --tenant-urls-allow-private) and the Discord gateway's.
	client *http.Client
	// bound returns the hosts a sandbox's bindings of a vault secret
	// allow (nil: it binds none; sandbox.Manager.Secrets().Hosts).
	bound func(ctx context.Context, tenant, sandboxID, secret string) ([]string, error)
	// gone reports a sandbox whose relays do not run (sandboxGone).
	gone func(ctx context.Context, sandboxID string) (string, error)

	// mu guards ctx and running, and is held through each sync (its store
	// reads and what it makes of them), so that a sync that read a
	// sandbox as running cannot restart a relay a later sync stopped.
	mu      sync.Mutex
	ctx     context.Context
	running map[string]*runningRelay // by webhook ID
	wg      sync.WaitGroup

	// kick asks run for a sync (cap 1): a sandbox's lifecycle event
	// (lifecycle) — relays never poll the store.
	kick chan struct{}
}

type runningRelay struct {
	cancel  context.CancelCauseFunc
	d       relayRunner
	sandbox string
}

// sandboxStopped ends a relay whose sandbox stopped or failed (its
// context's cause): the relay closes its connection, says so in a
// relay.disconnected event, and is not started again.
type sandboxStopped struct {
	status string // "stopped", "failed"
	code   int    // the close code sent, 0 when not connected
}

func (e *sandboxStopped) Error() string {
	if e.code == 0 {
		return "the sandbox " + e.status + ": the relay stopped and does not reconnect"
	}
	return "the sandbox " + e.status + ": the relay closed its connection and does not reconnect"
}

func newRelays(st store.Store, h *hooks.Service, v *vault.Vault, emit func(string, string, api.EventPayload), log *slog.Logger, discordURL string,
	client *http.Client, bound func(ctx context.Context, tenant, sandboxID, secret string) ([]string, error)) *relays {
	if h == nil {
		return nil
	}
	if discordURL == "" {
		discordURL = relay.DefaultDiscordURL
	}
	return &relays{st: st, hooks: h, v: v, emit: emit, log: log, discordURL: discordURL, client: client, bound: bound, gone: sandboxGone(st),
		running: map[string]*runningRelay{}, kick: make(chan struct{}, 1)}
}

// relayLifecycle are the sandbox events after which a sandbox's relays may
// have to stop: it stopped, failed, was lost or was destroyed (its relay
// rows go with its webhooks).
var relayLifecycle = []api.EventKind{api.EventSandboxStopped, api.EventSandboxFailed, api.EventSandboxDestroyed, api.EventSandboxLost}

// lifecycle is the audit log's watcher of relayLifecycle (audit.Log.Watch):
// it asks for a sync without waiting for it.
func (rs *relays) lifecycle(string, string, api.EventPayload) {
	select {
	case rs.kick <- struct{}{}:
	default: // a sync is already asked for; it reads the store afresh
	}
}

// toward is where a relay's token goes: dest, under the secret's hosts
// and the sandbox's binding of it, if any.
func (rs *relays) toward(ctx context.Context, tenant, sandboxID, secret, dest string) (credentials.Toward, error) {
	t := credentials.Toward{URL: dest}
	if rs.bound != nil {
		b, err := rs.bound(ctx, tenant, sandboxID, secret)
		if err != nil {
			return t, err
		}
		t.Bound = b
	}
	return t, nil
}

// openToken opens a relay's secret for a write on a connection to dest,
// checked at every dial and reconnect (credentials.OpenToward): a secret
// re-bound away from dest's host, revoked or removed stops the relay.
func (rs *relays) openToken(ctx context.Context, tenant, sandboxID, secret, dest string) ([]byte, func(), error) {
	t, err := rs.toward(ctx, tenant, sandboxID, secret, dest)
	if err != nil {
		return nil, nil, err
	}
	sec, err := credentials.OpenToward(ctx, rs.v, tenant, secret, t)
	if err != nil {
		return nil, nil, err
	}
	return sec.Bytes(), sec.Wipe, nil
}

// run starts the stored relays and keeps the running set equal to the
// store's (a destroyed sandbox's relays go with its webhooks), less those
// of stopped or failed sandboxes, until ctx ends: it syncs at start, when
// a relay is added or removed (the handlers sync) and after each sandbox
// lifecycle event that can end relays (lifecycle).
func (rs *relays) run(ctx context.Context) {
	rs.mu.Lock()
	rs.ctx = ctx
	rs.mu.Unlock()
	for {
		rs.sync(ctx)
		select {
		case <-ctx.Done():
			rs.wg.Wait()
			return
		case <-rs.kick:
		}
	}
}

func (rs *relays) sync(ctx context.Context) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.ctx == nil || rs.ctx.Err() != nil {
		return
	}
	l, err := rs.st.ListRelays(ctx, "", "")
	if err != nil {
		if ctx.Err() == nil {
			rs.log.Warn("list relays", "err", err)
		}
		return
	}
	// Sandboxes that stopped or failed: their relays do not run. One whose
	// status cannot be read keeps its relays as they are.
	gone := map[string]string{}
	keep := map[string]bool{}
	for _, r := range l {
		sb := r.Hook.SandboxID
		if _, seen := gone[sb]; seen || keep[sb] {
			continue
		}
		status, err := rs.gone(ctx, sb)
		if err != nil {
			if ctx.Err() == nil {
				rs.log.Warn("relays: sandbox status", "sandbox", sb, "err", err)
			}
			keep[sb] = true
			continue
		}
		gone[sb] = status
	}
	want := map[string]bool{}
	for _, r := range l {
		id, sb := r.Hook.ID, r.Hook.SandboxID
		if gone[sb] != "" {
			continue
		}
		want[id] = true
		if rs.running[id] == nil && !keep[sb] {
			rs.startLocked(r)
		}
	}
	for id, r := range rs.running {
		if want[id] {
			continue
		}
		if status := gone[r.sandbox]; status != "" {
			code := 0
			if r.d.Snapshot().Connected {
				code = int(websocket.StatusNormalClosure)
			}
			r.cancel(&sandboxStopped{status: status, code: code})
		} else {
			r.cancel(errRelayRemoved)
		}
		delete(rs.running, id)
	}
}

// errRelayRemoved ends a relay that is no longer in the store.
var errRelayRemoved = errors.New("relay removed")

func (rs *relays) startLocked(r *store.Relay) {
	var cfg relayConfig
	_ = json.Unmarshal([]byte(r.Config), &cfg)
	hook := r.Hook
	name := strings.TrimPrefix(hook.Name, hooks.RelayPrefix)
	tenant, sb := hook.TenantID, hook.SandboxID
	event := func(kind string, st relay.State, detail string, code int) {
		switch kind {
		case "connected":
			rs.emit(tenant, sb, api.RelayConnected{Relay: name, Resumed: detail == "resumed", Seq: st.Seq})
		case "disconnected":
			rs.emit(tenant, sb, api.RelayDisconnected{Relay: name, Code: max(code, 0), Reason: detail})
		case "failed":
			rs.emit(tenant, sb, api.RelayFailed{Relay: name, Error: detail})
		}
	}
	secret := func(ctx context.Context, dest string) ([]byte, func(), error) {
		return rs.openToken(ctx, tenant, sb, hook.Secret, dest)
	}
	drops := &relay.Drops{Report: func(n int64, reason string) {
		rs.emit(tenant, sb, api.RelayDropped{Relay: name, Dropped: n, Reason: reason})
	}}
	enqueue := func(ctx context.Context, key, ctype string, h http.Header, body []byte) error {
		h.Set("Content-Type", ctype)
		h.Set("X-Cagebox-Relay", name)
		err := rs.hooks.Enqueue(ctx, &hook, key, h, body)
		if err != nil && ctx.Err() == nil {
			drops.Add(err.Error())
		}
		return err
	}
	var d relayRunner
	switch r.Kind {
	case "websocket":
		wc := relay.WebSocketConfig{URL: cfg.URL, Headers: cfg.Headers, HTTPClient: rs.client, Event: event,
			Deliver: func(ctx context.Context, key, typ string, msg []byte) error {
				h := http.Header{}
				h.Set("X-Cagebox-Relay-Message", typ)
				ct := "text/plain; charset=utf-8"
				if typ == "binary" {
					ct = "application/octet-stream"
				}
				return enqueue(ctx, key, ct, h, msg)
			},
			Log: rs.log.With("relay", name, "sandbox", sb)}
		if hook.Secret != "" {
			wc.Secret = secret
		}
		d = relay.NewWebSocket(wc)
	default:
		d = relay.NewDiscord(relay.DiscordConfig{
			URL:        rs.discordURL,
			Intents:    cfg.Intents,
			Token:      secret,
			HTTPClient: rs.client,
			Deliver: func(ctx context.Context, key, t string, ev []byte) error {
				h := http.Header{}
				h.Set("X-Discord-Event", t)
				return enqueue(ctx, key, "application/json", h, ev)
			},
			Event: event,
			Log:   rs.log.With("relay", name, "sandbox", sb),
		})
	}
	ctx, cancel := context.WithCancelCause(rs.ctx)
	rs.running[hook.ID] = &runningRelay{cancel: cancel, d: d, sandbox: sb}
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		if err := d.Run(ctx); err != nil {
			rs.log.Warn("relay stopped", "relay", name, "sandbox", sb, "err", err)
		}
		drops.Flush()
		// Run returns once the connection is closed.
		var stopped *sandboxStopped
		if errors.As(context.Cause(ctx), &stopped) {
			rs.log.Info("relay stopped with its sandbox", "relay", name, "sandbox", sb, "status", stopped.status)
			rs.emit(tenant, sb, api.RelayDisconnected{Relay: name, Code: stopped.code, Reason: stopped.Error()})
		}
	}()
}

func (rs *relays) state(id string) api.RelayState {
	rs.mu.Lock()
	r := rs.running[id]
	rs.mu.Unlock()
	if r == nil {
		return api.RelayState{}
	}
	s := r.d.Snapshot()
	return api.RelayState{Connected: s.Connected, Failed: s.Failed, SessionID: s.SessionID, Seq: s.Seq, Reconnects: s.Reconnects,
		Resumes: s.Resumes, Received: s.Received, Dropped: s.Dropped, LastError: s.LastError}
}

func (rs *relays) view(ctx context.Context, r *store.Relay) *api.Relay {
	var cfg relayConfig
	_ = json.Unmarshal([]byte(r.Config), &cfg)
	n, _ := rs.st.PendingDeliveries(ctx, r.Hook.ID)
	st := rs.state(r.Hook.ID)
	if st == (api.RelayState{}) {
		if status, err := rs.gone(ctx, r.Hook.SandboxID); err == nil && status != "" {
			st = api.RelayState{Failed: true, LastError: "the sandbox " + status + ": its relays do not run"}
		}
	}
	return &api.Relay{Name: strings.TrimPrefix(r.Hook.Name, hooks.RelayPrefix), SandboxID: r.Hook.SandboxID, Kind: r.Kind, Port: r.Hook.Port, Path: r.Hook.Path,
		TokenSecret: r.Hook.Secret, Intents: cfg.Intents, URL: cfg.URL, Headers: cfg.Headers, CreatedAt: r.Hook.CreatedAt, State: st, Pending: n}
}

// The relay routes: a sandbox's tenant owns its relays, and their
// secrets are that tenant's.

func (s *Server) relaySandbox(r *http.Request, t *store.Tenant) (*api.Sandbox, error) {
	if s.relays == nil {
		return nil, fmt.Errorf("%w: relays deliver through the ingress path: start the daemon with --ingress ADDR --ingress-domain DOMAIN", errdefs.ErrUnavailable)
	}
	return s.mgr.Get(r.Context(), scope(t), r.PathValue("id"))
}

func (s *Server) addRelay(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.relaySandbox(r, t)
	if err != nil {
		return err
	}
	var req api.RelayRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Name == "" {
		req.Name = req.Kind
	}
	switch req.Kind {
	case "discord":
		if req.URL != "" || len(req.Headers) > 0 {
			return fmt.Errorf("%w: url and headers are for kind websocket; a discord relay connects to the daemon's Discord gateway", errdefs.ErrInvalid)
		}
		if req.Intents < 0 || req.Intents >= 1<<26 {
			return fmt.Errorf("%w: intents %d: a bitfield of Discord gateway intents, e.g. 513 (GUILDS|GUILD_MESSAGES)", errdefs.ErrInvalid, req.Intents)
		}
		if req.TokenSecret == "" {
			return fmt.Errorf("%w: token_secret: name the vault secret holding the bot token (cagebox secret add NAME)", errdefs.ErrInvalid)
		}
	case "websocket":
		if err := relay.ValidateWebSocketURL(req.URL); err != nil {
			return fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
		}
		if err := relay.ParseHeaders(req.Headers); err != nil {
			return fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
		}
		uses := false
		for _, h := range req.Headers {
			uses = uses || strings.Contains(h, relay.SecretPlaceholder)
		}
		if uses && req.TokenSecret == "" {
			return fmt.Errorf("%w: a header uses {secret}: name the vault secret (--secret NAME)", errdefs.ErrInvalid)
		}
		if req.Intents != 0 {
			return fmt.Errorf("%w: intents are for kind discord", errdefs.ErrInvalid)
		}
	default:
		return fmt.Errorf("%w: kind %q: use discord or websocket", errdefs.ErrInvalid, req.Kind)
	}
	if err := hooks.CheckTarget(req.Name, req.Port, &req.Path); err != nil {
		return err
	}
	if status, err := s.relays.gone(r.Context(), sb.ID); err != nil {
		return err
	} else if status != "" {
		return fmt.Errorf("%w: sandbox %s is %s and runs no relays: add the relay to a running sandbox", errdefs.ErrConflict, sb.ID, status)
	}
	// The secret must be one this relay may send, now, not only at the
	// first connection: to the relay's URL (websocket) or the Discord
	// gateway (discord), under the secret's hosts and the sandbox's binding.
	if req.TokenSecret != "" {
		dest := req.URL
		if req.Kind == "discord" {
			dest = s.relays.discordURL
		}
		t, err := s.relays.toward(r.Context(), sb.Tenant, sb.ID, req.TokenSecret, dest)
		if err != nil {
			return err
		}
		if err := credentials.CheckToward(r.Context(), s.relays.v, sb.Tenant, req.TokenSecret, t); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				// The request names a secret that is not there: a bad
				// request (400), as it always was, not a missing route.
				return fmt.Errorf("%w: relay %s: token_secret: %v", errdefs.ErrInvalid, req.Name, err)
			}
			return fmt.Errorf("relay %s: %w", req.Name, err)
		}
	}
	ib := make([]byte, 8)
	_, _ = rand.Read(ib)
	tb := make([]byte, 32)
	_, _ = rand.Read(tb)
	th := sha256.Sum256(tb) // a hash of a token nobody is shown: the row has no usable URL
	cfg, _ := json.Marshal(relayConfig{Intents: req.Intents, URL: req.URL, Headers: req.Headers})
	rel := &store.Relay{Hook: store.Webhook{ID: fmt.Sprintf("wh-%x", ib), TenantID: sb.Tenant, SandboxID: sb.ID, Name: hooks.RelayPrefix + req.Name,
		Port: req.Port, Path: req.Path, Verify: hooks.RelayPrefix + req.Kind, Secret: req.TokenSecret, TokenHash: th[:]}, Kind: req.Kind, Config: string(cfg)}
	if err := s.relays.st.CreateRelay(r.Context(), rel); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("%w: sandbox %s already has a relay %q (cagebox relay rm %s %s)", errdefs.ErrConflict, sb.ID, req.Name, sb.ID, req.Name)
		}
		return err
	}
	if err := s.mgr.Ports().SyncPublished(r.Context(), sb.ID); err != nil {
		_ = s.relays.st.DeleteWebhook(context.WithoutCancel(r.Context()), sb.Tenant, sb.ID, rel.Hook.Name)
		return fmt.Errorf("admit port %d: %w", req.Port, err)
	}
	s.relays.sync(r.Context())
	writeJSON(w, http.StatusCreated, s.relays.view(r.Context(), rel))
	return nil
}

func (s *Server) listRelays(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.relaySandbox(r, t)
	if err != nil {
		return err
	}
	l, err := s.relays.st.ListRelays(r.Context(), sb.Tenant, sb.ID)
	if err != nil {
		return err
	}
	out := []*api.Relay{}
	for _, x := range l {
		out = append(out, s.relays.view(r.Context(), x))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) removeRelay(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.relaySandbox(r, t)
	if err != nil {
		return err
	}
	name := r.PathValue("name")
	l, err := s.relays.st.ListRelays(r.Context(), sb.Tenant, sb.ID)
	if err != nil {
		return err
	}
	found := false
	for _, x := range l {
		found = found || x.Hook.Name == hooks.RelayPrefix+name
	}
	if !found {
		return fmt.Errorf("%w: sandbox %s has no relay %q", errdefs.ErrNotFound, sb.ID, name)
	}
	if err := s.relays.st.DeleteWebhook(r.Context(), sb.Tenant, sb.ID, hooks.RelayPrefix+name); err != nil {
		return err
	}
	s.relays.sync(r.Context())
	if err := s.mgr.Ports().SyncPublished(r.Context(), sb.ID); err != nil {
		s.log.Warn("unadmit relay port", "sandbox", sb.ID, "err", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
