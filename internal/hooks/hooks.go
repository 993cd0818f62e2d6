// Package hooks serves webhook URLs and delivers what they receive to
// sandboxes: `https://hooks.DOMAIN/w/TOKEN` takes a sender's request,
// verifies its signature at the edge with the shared secret from the
// vault (package webhook), refuses forgeries, stale timestamps and
// replays, stores the delivery in a bounded persisted queue and answers
// 202 at once; a dispatcher then delivers it to the sandbox's endpoint
// (PORT/PATH on its link, waking a sleeping sandbox first) at least once,
// retrying with backoff. The guest never needs the webhook secret.
//
// How a delivery reaches a guest is the Deliver function the daemon gives
// (the ingress path); this package owns the URL, verification, the queue
// and the retries.
package hooks

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/reserved"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/webhook"
)

// Defaults.
const (
	DefaultMaxBody    = 5 << 20 // larger than Slack's and Stripe's, GitHub caps at 25 MiB: raise with Config.MaxBody
	DefaultMaxPending = 1000
	// ReplayWindow is how long a delivered delivery's key (scheme and
	// MAC, webhook.Verifier) is kept to refuse its replay (GitHub signs no
	// timestamp; its redelivery of a delivery cagebox accepted has the
	// same body and is refused too, which is right: cagebox already has
	// it).
	ReplayWindow   = 72 * time.Hour
	maxAttempts    = 15
	firstBackoff   = time.Second
	maxBackoff     = 10 * time.Minute
	deliverTimeout = 30 * time.Second
)

// Deliver sends one delivery to a sandbox's port and path, waking the
// sandbox if it sleeps, and returns the guest's status code.
type Deliver func(ctx context.Context, sandboxID string, port int, req *http.Request) (status int, err error)

// Secret returns a tenant's secret value for as long as wipe is not called.
type Secret func(ctx context.Context, tenant, name string) (value []byte, wipe func(), err error)

// Config configures a Service.
type Config struct {
	Store store.Store
	// BaseURL is the hooks origin ("https://hooks.example.com"); URLs are
	// BaseURL + "/w/" + token. Empty: webhooks cannot be added.
	BaseURL string
	Secret  Secret
	Deliver Deliver
	Emit    func(tenant, sandbox string, ev api.EventPayload)
	// SandboxExists reports whether a tenant has the sandbox (for Add).
	SandboxExists func(ctx context.Context, tenant, id string) error
	MaxBody       int64
	MaxPending    int
	Now           func() time.Time
	Log           *slog.Logger

	// Gone reports a sandbox that takes no more deliveries, ever — one
	// that is stopped or failed, which cannot run again — by its status
	// ("stopped", "failed"); "" for one that takes them (running or
	// asleep). Its webhook URLs answer 410 and its queued deliveries give
	// up at once. Nil: every sandbox takes them.
	Gone func(ctx context.Context, sandboxID string) (status string, err error)
}

// Service is the webhook endpoint and dispatcher.
type Service struct {
	cfg  Config
	kick chan struct{}

	// mu guards busy (sandboxes with a delivery under way: one at a time
	// per sandbox keeps their order).
	mu   sync.Mutex
	busy map[string]bool
}

// New returns a Service; call Run to deliver.
func New(cfg Config) *Service {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Emit == nil {
		cfg.Emit = func(string, string, api.EventPayload) {}
	}
	return &Service{cfg: cfg, kick: make(chan struct{}, 1), busy: map[string]bool{}}
}

// SetBaseURL sets Config.BaseURL (the daemon knows the ingress port only
// once its listener exists); call it before serving.
func (s *Service) SetBaseURL(u string) { s.cfg.BaseURL = u }

var (
	nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	pathRE = regexp.MustCompile(`^/[A-Za-z0-9._~!$&'()*+,;=:@/%-]{0,1000}$`)
)

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrInvalid, fmt.Sprintf(format, a...))
}

func hashToken(tok string) []byte {
	h := sha256.Sum256([]byte(tok))
	return h[:]
}

// Add registers a webhook on a tenant's sandbox and returns it with its
// URL and token (shown this once).
func (s *Service) Add(ctx context.Context, tenant, sandboxID string, req *api.WebhookRequest) (*api.Webhook, error) {
	if s.cfg.BaseURL == "" {
		return nil, fmt.Errorf("%w: this daemon serves no webhook URLs: start it with --ingress ADDR --ingress-domain DOMAIN", errdefs.ErrUnavailable)
	}
	switch {
	case !nameRE.MatchString(req.Name):
		return nil, invalid("name %q: use 1-63 of a-z 0-9 _ -, starting with a letter or digit", req.Name)
	case req.Port < 1 || req.Port > 65535:
		return nil, invalid("port %d: the guest's port, 1-65535", req.Port)
	}
	if req.Path == "" {
		req.Path = "/"
	}
	if !pathRE.MatchString(req.Path) || strings.Contains(req.Path, "/../") || strings.HasSuffix(req.Path, "/..") {
		return nil, invalid("path %q: an absolute URL path such as /hook", req.Path)
	}
	if req.Verify == "" {
		return nil, invalid("verify: say how deliveries are signed (github, stripe, slack or hmac:header=NAME,…); unsigned webhooks are not accepted")
	}
	if req.Secret == "" {
		return nil, invalid("secret: name the vault secret holding the shared signing secret (cagebox secret add NAME)")
	}
	if s.cfg.SandboxExists != nil {
		if err := s.cfg.SandboxExists(ctx, tenant, sandboxID); err != nil {
			return nil, err
		}
	}
	if status, err := s.gone(ctx, sandboxID); err != nil {
		return nil, err
	} else if status != "" {
		return nil, fmt.Errorf("%w: sandbox %s is %s and takes no deliveries: add the webhook to a running sandbox", errdefs.ErrConflict, sandboxID, status)
	}
	// The scheme must parse and the secret must open now, not at the first
	// delivery.
	val, wipe, err := s.cfg.Secret(ctx, tenant, req.Secret)
	if err != nil {
		return nil, fmt.Errorf("%w: secret %s: %v", errdefs.ErrInvalid, req.Secret, err)
	}
	_, verr := webhook.New(req.Verify, val)
	wipe()
	if verr != nil {
		return nil, fmt.Errorf("%w: verify: %v", errdefs.ErrInvalid, verr)
	}
	tb := make([]byte, 24)
	if _, err := rand.Read(tb); err != nil {
		return nil, err
	}
	tok := "cbw_" + base64.RawURLEncoding.EncodeToString(tb)
	ib := make([]byte, 8)
	_, _ = rand.Read(ib)
	w := &store.Webhook{ID: fmt.Sprintf("wh-%x", ib), TenantID: tenant, SandboxID: sandboxID, Name: req.Name, Port: req.Port, Path: req.Path,
		Verify: req.Verify, Secret: req.Secret, TokenHash: hashToken(tok)}
	if err := s.cfg.Store.CreateWebhook(ctx, w); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: sandbox %s already has a webhook %q (cagebox webhook rm %s %s)", errdefs.ErrConflict, sandboxID, req.Name, sandboxID, req.Name)
		}
		return nil, err
	}
	v := s.view(w, 0)
	v.Token = tok
	v.URL = strings.TrimSuffix(s.cfg.BaseURL, "/") + "/w/" + tok
	return v, nil
}

func (s *Service) view(w *store.Webhook, pending int) *api.Webhook {
	return &api.Webhook{Name: w.Name, SandboxID: w.SandboxID, Port: w.Port, Path: w.Path, Verify: w.Verify, Secret: w.Secret, CreatedAt: w.CreatedAt, Pending: pending}
}

// List returns a sandbox's webhooks (without their URLs: the token is
// shown once).
func (s *Service) List(ctx context.Context, tenant, sandboxID string) ([]*api.Webhook, error) {
	ws, err := s.cfg.Store.ListWebhooks(ctx, tenant, sandboxID)
	if err != nil {
		return nil, err
	}
	out := []*api.Webhook{}
	for _, w := range ws {
		if IsRelay(w) {
			continue // `relay ls` shows it
		}
		n, _ := s.cfg.Store.PendingDeliveries(ctx, w.ID)
		out = append(out, s.view(w, n))
	}
	return out, nil
}

// gone is Config.Gone, or "" when there is none.
func (s *Service) gone(ctx context.Context, sandboxID string) (string, error) {
	if s.cfg.Gone == nil {
		return "", nil
	}
	status, err := s.cfg.Gone(ctx, sandboxID)
	if err != nil {
		return "", fmt.Errorf("status of sandbox %s: %w", sandboxID, err)
	}
	return status, nil
}

// goneWhat says a sandbox is status (Config.Gone): "the sandbox is
// stopped", "the sandbox failed".
func goneWhat(status string) string {
	if status == "failed" {
		return "the sandbox failed"
	}
	return "the sandbox is " + status
}

// goneReason is what the sender of a delivery for a sandbox that is
// status is told (410, webhook.rejected).
func goneReason(status string) string {
	return goneWhat(status) + " and takes no more deliveries: remove the webhook, or point the sender at a new sandbox"
}

// RelayPrefix starts the name and Verify of a webhook row a relay owns
// (package relay): its deliveries are the relay's events; it has no
// usable URL (its token was never shown) and `webhook ls|rm` skip it.
const RelayPrefix = "relay:"

// CheckTarget validates a name, a guest port and path (defaulting "" to
// "/") as Add does; relays use it for theirs.
func CheckTarget(name string, port int, path *string) error {
	switch {
	case !nameRE.MatchString(name):
		return invalid("name %q: use 1-63 of a-z 0-9 _ -, starting with a letter or digit", name)
	case port < 1 || port > 65535:
		return invalid("port %d: the guest's port, 1-65535", port)
	}
	if *path == "" {
		*path = "/"
	}
	if !pathRE.MatchString(*path) || strings.Contains(*path, "/../") || strings.HasSuffix(*path, "/..") {
		return invalid("path %q: an absolute URL path such as /hook", *path)
	}
	return nil
}

// IsRelay reports whether a webhook row is a relay's.
func IsRelay(w *store.Webhook) bool { return strings.HasPrefix(w.Verify, RelayPrefix) }

// Enqueue queues one event of a relay's for its sandbox (in order, at
// least once, waking it): a key already queued is not queued again (nil).
func (s *Service) Enqueue(ctx context.Context, hook *store.Webhook, key string, header http.Header, body []byte) error {
	d := &store.Delivery{WebhookID: hook.ID, SandboxID: hook.SandboxID, Key: key, Method: http.MethodPost, Header: header, Body: body, ReceivedAt: s.cfg.Now()}
	switch err := s.cfg.Store.EnqueueDelivery(ctx, d, s.cfg.MaxPending); {
	case errors.Is(err, store.ErrConflict):
		return nil
	case errors.Is(err, store.ErrFull):
		return fmt.Errorf("queue full (%d undelivered): %w", s.cfg.MaxPending, err)
	case err != nil:
		return fmt.Errorf("queue relay event: %w", err)
	}
	s.Kick()
	return nil
}

// Remove deletes a webhook and its queue.
func (s *Service) Remove(ctx context.Context, tenant, sandboxID, name string) error {
	if strings.HasPrefix(name, RelayPrefix) {
		return fmt.Errorf("%w: sandbox %s has no webhook %q", errdefs.ErrNotFound, sandboxID, name)
	}
	if err := s.cfg.Store.DeleteWebhook(ctx, tenant, sandboxID, name); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: sandbox %s has no webhook %q", errdefs.ErrNotFound, sandboxID, name)
		}
		return err
	}
	return nil
}

// RemoveSandbox deletes every webhook of a sandbox (when it is removed).
func (s *Service) RemoveSandbox(ctx context.Context, sandboxID string) {
	ws, err := s.cfg.Store.ListWebhooks(ctx, "", sandboxID)
	if err != nil {
		return
	}
	for _, w := range ws {
		_ = s.cfg.Store.DeleteWebhook(ctx, "", sandboxID, w.Name)
	}
}

// ServeHTTP serves /w/TOKEN.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tok, ok := strings.CutPrefix(r.URL.Path, "/w/")
	if !ok || tok == "" || strings.Contains(tok, "/") {
		http.Error(w, "no such webhook", http.StatusNotFound)
		return
	}
	if r.Method != http.MethodPost && r.Method != http.MethodPut {
		w.Header().Set("Allow", "POST, PUT")
		http.Error(w, "webhooks take POST", http.StatusMethodNotAllowed)
		return
	}
	ctx := r.Context()
	hook, err := s.cfg.Store.WebhookByToken(ctx, hashToken(tok))
	if err != nil {
		// The same answer for every unknown token: no oracle.
		http.Error(w, "no such webhook", http.StatusNotFound)
		return
	}
	if r.ContentLength > s.cfg.MaxBody {
		s.reject(w, hook, http.StatusRequestEntityTooLarge, "body too large")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.MaxBody+1))
	if err != nil {
		http.Error(w, "reading the body failed", http.StatusBadRequest)
		return
	}
	if int64(len(body)) > s.cfg.MaxBody {
		s.reject(w, hook, http.StatusRequestEntityTooLarge, "body too large")
		return
	}
	val, wipe, err := s.cfg.Secret(ctx, hook.TenantID, hook.Secret)
	if err != nil {
		s.cfg.Log.Warn("webhook secret unavailable", "webhook", hook.Name, "sandbox", hook.SandboxID, "err", err)
		s.reject(w, hook, http.StatusServiceUnavailable, "the webhook's secret cannot be opened (revoked or deleted?)")
		return
	}
	v, err := webhook.New(hook.Verify, val)
	wipe()
	if err != nil {
		s.reject(w, hook, http.StatusServiceUnavailable, "the webhook's verification scheme is unusable")
		return
	}
	now := s.cfg.Now()
	key, err := v.Verify(r.Header, body, now)
	if err != nil {
		reason := "forged"
		if errors.Is(err, webhook.ErrStale) {
			reason = "stale"
		}
		s.reject(w, hook, http.StatusUnauthorized, reason+": "+err.Error())
		return
	}
	// Only a verified sender learns that the sandbox is gone. Should its
	// status not be readable, the delivery is queued as before: the
	// dispatcher asks again.
	if status, err := s.gone(ctx, hook.SandboxID); err != nil {
		s.cfg.Log.Warn("webhook delivery", "webhook", hook.Name, "sandbox", hook.SandboxID, "err", err)
	} else if status != "" {
		s.reject(w, hook, http.StatusGone, goneReason(status))
		return
	}
	d := &store.Delivery{WebhookID: hook.ID, SandboxID: hook.SandboxID, Key: key, Method: r.Method, Header: deliveryHeader(r.Header, hook.Verify), Body: body, ReceivedAt: now}
	switch err := s.cfg.Store.EnqueueDelivery(ctx, d, s.cfg.MaxPending); {
	case errors.Is(err, store.ErrConflict):
		s.reject(w, hook, http.StatusUnauthorized, "replayed: this delivery was already accepted")
		return
	case errors.Is(err, store.ErrFull):
		w.Header().Set("Retry-After", "60")
		s.reject(w, hook, http.StatusServiceUnavailable, fmt.Sprintf("queue full (%d undelivered)", s.cfg.MaxPending))
		return
	case err != nil:
		s.cfg.Log.Error("enqueue webhook delivery", "webhook", hook.Name, "err", err)
		http.Error(w, "could not queue the delivery", http.StatusInternalServerError)
		return
	}
	s.cfg.Emit(hook.TenantID, hook.SandboxID, api.WebhookReceived{Webhook: hook.Name, Delivery: d.ID, Bytes: int64(len(body))})
	s.Kick()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	fmt.Fprintf(w, "{\"accepted\":true,\"delivery\":%d}\n", d.ID)
}

func (s *Service) reject(w http.ResponseWriter, hook *store.Webhook, code int, reason string) {
	s.cfg.Emit(hook.TenantID, hook.SandboxID, api.WebhookRejected{Webhook: hook.Name, Status: code, Reason: reason})
	http.Error(w, "webhook refused: "+reason, code)
}

// deliveryHeader is what the guest gets of the sender's headers: all but
// hop-by-hop ones, cookies, and any of cagebox's own (reserved.Header,
// also spelt with '_'); plus
// X-Cagebox-Webhook (the name's scheme, verified).
func deliveryHeader(in http.Header, scheme string) http.Header {
	out := http.Header{}
	for k, vs := range in {
		switch http.CanonicalHeaderKey(k) {
		case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te", "Trailer", "Upgrade",
			"Proxy-Authorization", "Authorization", "Cookie", "Host", "Content-Length":
			continue
		}
		if reserved.Header(k) {
			continue
		}
		out[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
	}
	kind, _, _ := strings.Cut(scheme, ":")
	out.Set("X-Cagebox-Webhook-Verified", kind)
	return out
}

// Kick makes the dispatcher look for due deliveries now.
func (s *Service) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run delivers due deliveries until ctx ends: at every Kick and every
// second; one delivery at a time per sandbox (their order kept), up to
// four sandboxes at once. Finished deliveries past the replay window are
// pruned hourly.
func (s *Service) Run(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	defer wg.Wait()
	lastPrune := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.kick:
		}
		now := s.cfg.Now()
		if now.Sub(lastPrune) > time.Hour {
			lastPrune = now
			if _, err := s.cfg.Store.PruneDeliveries(ctx, now.Add(-ReplayWindow), 1000); err != nil && ctx.Err() == nil {
				s.cfg.Log.Warn("prune webhook deliveries", "err", err)
			}
		}
		due, err := s.cfg.Store.DueDeliveries(ctx, "", now, 100)
		if err != nil {
			if ctx.Err() == nil {
				s.cfg.Log.Warn("webhook deliveries", "err", err)
			}
			continue
		}
		// The first due delivery of each idle sandbox.
		seen := map[string]bool{}
		for _, d := range due {
			if seen[d.SandboxID] {
				continue
			}
			seen[d.SandboxID] = true
			s.mu.Lock()
			if s.busy[d.SandboxID] {
				s.mu.Unlock()
				continue
			}
			s.busy[d.SandboxID] = true
			s.mu.Unlock()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func(d *store.Delivery) {
				defer wg.Done()
				defer func() { <-sem }()
				// due was read before this sandbox was marked busy: the
				// delivery that was under way then may have finished
				// since, and d be that one. Read the sandbox's next due
				// delivery again now that no other can finish meanwhile.
				if fresh, err := s.cfg.Store.DueDeliveries(ctx, d.SandboxID, s.cfg.Now(), 1); err == nil && len(fresh) == 1 {
					s.deliver(ctx, fresh[0])
				} else if err != nil && ctx.Err() == nil {
					s.cfg.Log.Warn("webhook deliveries", "sandbox", d.SandboxID, "err", err)
				}
				s.mu.Lock()
				delete(s.busy, d.SandboxID)
				s.mu.Unlock()
				s.Kick() // its next one, at once
			}(d)
		}
	}
}

// Backoff is the wait before attempt n+1 after n failed attempts.
func Backoff(n int) time.Duration {
	d := firstBackoff
	for i := 1; i < n && d < maxBackoff; i++ {
		d *= 2
	}
	return min(d, maxBackoff)
}

func (s *Service) deliver(ctx context.Context, d *store.Delivery) {
	hooks, err := s.cfg.Store.ListWebhooks(ctx, "", d.SandboxID)
	var hook *store.Webhook
	for _, h := range hooks {
		if h.ID == d.WebhookID {
			hook = h
		}
	}
	if err != nil || hook == nil {
		return // deleted meanwhile: its deliveries went with it
	}
	// A sandbox that is gone for good gives up its deliveries at once,
	// without waking anything or waiting out retries.
	if status, err := s.gone(ctx, d.SandboxID); err != nil {
		if ctx.Err() == nil {
			s.cfg.Log.Warn("webhook delivery", "webhook", hook.Name, "sandbox", d.SandboxID, "err", err)
		}
	} else if status != "" {
		s.giveUp(ctx, hook, d, d.Attempts, goneWhat(status)+": it takes no more deliveries")
		return
	}
	dctx, cancel := context.WithTimeout(ctx, deliverTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(dctx, d.Method, "http://guest"+hook.Path, bytes.NewReader(d.Body))
	if err != nil {
		_ = s.cfg.Store.FinishDelivery(ctx, d.ID, false, "bad request: "+err.Error(), s.cfg.Now())
		return
	}
	req.Header = d.Header.Clone()
	req.Header.Set("X-Cagebox-Delivery", strconv.FormatInt(d.ID, 10))
	req.Header.Set("X-Cagebox-Attempt", strconv.Itoa(d.Attempts+1))
	req.ContentLength = int64(len(d.Body))
	start := s.cfg.Now()
	code, err := s.cfg.Deliver(dctx, d.SandboxID, hook.Port, req)
	took := s.cfg.Now().Sub(start)
	if ctx.Err() != nil {
		return // shutting down: the delivery stays pending
	}
	result := strconv.Itoa(code)
	if err != nil {
		result = err.Error()
	}
	if err == nil && code >= 200 && code < 300 {
		_ = s.cfg.Store.FinishDelivery(ctx, d.ID, true, result, s.cfg.Now())
		s.cfg.Emit(hook.TenantID, hook.SandboxID, api.WebhookDelivered{Webhook: hook.Name, Delivery: d.ID, Status: code, Attempts: d.Attempts + 1, DurationMs: took.Milliseconds()})
		return
	}
	if d.Attempts+1 >= maxAttempts {
		s.giveUp(ctx, hook, d, d.Attempts+1, result)
		return
	}
	// The sandbox stopped while this attempt was under way: there is no
	// next one.
	if status, err := s.gone(ctx, d.SandboxID); err == nil && status != "" {
		s.giveUp(ctx, hook, d, d.Attempts+1, goneWhat(status)+": it takes no more deliveries (this attempt: "+clip(result, 100)+")")
		return
	}
	next := s.cfg.Now().Add(Backoff(d.Attempts + 1))
	_ = s.cfg.Store.RetryDelivery(ctx, d.ID, result, next)
	s.cfg.Emit(hook.TenantID, hook.SandboxID, api.WebhookFailed{Webhook: hook.Name, Delivery: d.ID, Attempts: d.Attempts + 1, Error: clip(result, 200)})
}

// giveUp finishes a delivery as failed after attempts attempts, saying
// why (webhook.failed, gave_up).
func (s *Service) giveUp(ctx context.Context, hook *store.Webhook, d *store.Delivery, attempts int, why string) {
	if err := s.cfg.Store.FinishDelivery(ctx, d.ID, false, why, s.cfg.Now()); err != nil {
		s.cfg.Log.Warn("finish webhook delivery", "webhook", hook.Name, "sandbox", d.SandboxID, "delivery", d.ID, "err", err)
	}
	s.cfg.Emit(hook.TenantID, hook.SandboxID, api.WebhookFailed{Webhook: hook.Name, Delivery: d.ID, Attempts: attempts, Error: clip(why, 200), GaveUp: true})
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
