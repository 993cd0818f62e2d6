package daemon

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/console"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/hooks"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/isolation"
)

// Version is the daemon's version.
const Version = "0.1.0"

// Request limits.
const (
	maxJSONBody   = 1 << 20
	maxFileRead   = 64 << 20
	maxFileWrite  = 256 << 20
	defaultGrace  = 5 * time.Second
	adminTenantID = "admin"
)

// Route is one API endpoint. The table is the single source the mux and
// the OpenAPI consistency test read.
type Route struct {
	Method, Path string
	Admin        bool // only the admin tenant may call it
	handler      func(*Server, http.ResponseWriter, *http.Request, *store.Tenant) error
}

// Routes lists every endpoint of the API.
func Routes() []Route {
	return []Route{
		{Method: "GET", Path: "/v1/health", handler: (*Server).health},
		{Method: "GET", Path: "/v1/runtimes", handler: (*Server).runtimes},
		{Method: "GET", Path: "/v1/images", handler: (*Server).listImages},
		{Method: "POST", Path: "/v1/images/pull", Admin: true, handler: (*Server).pullImage},
		{Method: "POST", Path: "/v1/images/import", Admin: true, handler: (*Server).importImage},
		{Method: "POST", Path: "/v1/sandboxes", handler: (*Server).createSandbox},
		{Method: "GET", Path: "/v1/sandboxes", handler: (*Server).listSandboxes},
		{Method: "GET", Path: "/v1/sandboxes/{id}", handler: (*Server).getSandbox},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}", handler: (*Server).removeSandbox},
		{Method: "POST", Path: "/v1/sandboxes/{id}/exec", handler: (*Server).exec},
		{Method: "POST", Path: "/v1/sandboxes/{id}/stop", handler: (*Server).stop},
		{Method: "POST", Path: "/v1/sandboxes/{id}/pause", handler: (*Server).pause},
		{Method: "POST", Path: "/v1/sandboxes/{id}/resume", handler: (*Server).resume},
		{Method: "GET", Path: "/v1/sandboxes/{id}/files", handler: (*Server).readFile},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/files", handler: (*Server).writeFile},
		{Method: "GET", Path: "/v1/sandboxes/{id}/dir", handler: (*Server).listDir},
		{Method: "GET", Path: "/v1/sandboxes/{id}/pty", handler: (*Server).pty},
		{Method: "GET", Path: "/v1/sandboxes/{id}/archive", handler: (*Server).getArchive},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/archive", handler: (*Server).putArchive},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/secrets/{name}", handler: (*Server).unbindSecret},
		{Method: "GET", Path: "/v1/sandboxes/{id}/policy", handler: (*Server).getPolicy},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/policy", handler: (*Server).putPolicy},
		{Method: "PATCH", Path: "/v1/sandboxes/{id}/policy", handler: (*Server).patchPolicy},
		{Method: "GET", Path: "/v1/sandboxes/{id}/policy/history", handler: (*Server).policyHistory},
		{Method: "GET", Path: "/v1/sandboxes/{id}/policy/usage", handler: (*Server).policyUsage},
		{Method: "POST", Path: "/v1/policies", handler: (*Server).createNamedPolicy},
		{Method: "GET", Path: "/v1/policies", handler: (*Server).listNamedPolicies},
		{Method: "GET", Path: "/v1/policies/{name}", handler: (*Server).getNamedPolicy},
		{Method: "PUT", Path: "/v1/policies/{name}", handler: (*Server).updateNamedPolicy},
		{Method: "DELETE", Path: "/v1/policies/{name}", handler: (*Server).deleteNamedPolicy},
		{Method: "GET", Path: "/v1/approvals", handler: (*Server).listApprovals},
		{Method: "POST", Path: "/v1/approvals/{id}", handler: (*Server).decideApproval},
		{Method: "GET", Path: "/v1/approvals/webhook-key", handler: (*Server).approvalWebhookKey},
		{Method: "POST", Path: "/v1/freeze", handler: (*Server).freeze},
		{Method: "POST", Path: "/v1/thaw", handler: (*Server).thaw},
		{Method: "GET", Path: "/v1/events", handler: (*Server).listEvents},
		{Method: "POST", Path: "/v1/secrets", handler: (*Server).putSecret},
		{Method: "GET", Path: "/v1/secrets", handler: (*Server).listSecrets},
		{Method: "GET", Path: "/v1/secrets/{name}", handler: (*Server).getSecret},
		{Method: "PUT", Path: "/v1/secrets/{name}", handler: (*Server).rotateSecret},
		{Method: "DELETE", Path: "/v1/secrets/{name}", handler: (*Server).deleteSecret},
		{Method: "POST", Path: "/v1/secrets/{name}/revoke", handler: (*Server).revokeSecret},
		{Method: "POST", Path: "/v1/tenants", Admin: true, handler: (*Server).createTenant},
		{Method: "GET", Path: "/v1/tenants", Admin: true, handler: (*Server).listTenants},
		{Method: "POST", Path: "/v1/tenants/{id}/keys", Admin: true, handler: (*Server).createKey},
		{Method: "GET", Path: "/v1/pools", Admin: true, handler: (*Server).listPools},
		{Method: "PUT", Path: "/v1/pools", Admin: true, handler: (*Server).setPools},
		{Method: "GET", Path: "/metrics", Admin: true, handler: (*Server).serveMetrics},
		{Method: "POST", Path: "/v1/sandboxes/{id}/access", handler: (*Server).requestAccess},
		{Method: "POST", Path: "/v1/tools", handler: (*Server).putTool},
		{Method: "GET", Path: "/v1/tools", handler: (*Server).listTools},
		{Method: "GET", Path: "/v1/tools/{name}", handler: (*Server).getTool},
		{Method: "DELETE", Path: "/v1/tools/{name}", handler: (*Server).deleteTool},
		{Method: "POST", Path: "/v1/tools/{name}/execute", handler: (*Server).executeTool},
		{Method: "POST", Path: "/v1/console/sessions", Admin: true, handler: (*Server).createConsoleSession},
		{Method: "POST", Path: "/v1/volumes", handler: (*Server).createVolume},
		{Method: "GET", Path: "/v1/volumes", handler: (*Server).listVolumes},
		{Method: "DELETE", Path: "/v1/volumes/{name}", handler: (*Server).removeVolume},
		{Method: "POST", Path: "/v1/sandboxes/{id}/snapshots", handler: (*Server).createSnapshot},
		{Method: "GET", Path: "/v1/snapshots", handler: (*Server).listSnapshots},
		{Method: "GET", Path: "/v1/snapshots/{name}", handler: (*Server).getSnapshot},
		{Method: "DELETE", Path: "/v1/snapshots/{name}", handler: (*Server).removeSnapshot},
		{Method: "POST", Path: "/v1/sandboxes/{id}/fork", handler: (*Server).forkSandbox},
		{Method: "POST", Path: "/v1/sandboxes/{id}/ports", handler: (*Server).addPort},
		{Method: "GET", Path: "/v1/sandboxes/{id}/ports", handler: (*Server).listPorts},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/ports/{port}", handler: (*Server).removePort},
		{Method: "POST", Path: "/v1/sandboxes/{id}/ports/{port}/url", handler: (*Server).portURL},
		{Method: "POST", Path: "/v1/sandboxes/{id}/webhooks", handler: (*Server).addWebhook},
		{Method: "GET", Path: "/v1/sandboxes/{id}/webhooks", handler: (*Server).listWebhooks},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/webhooks/{name}", handler: (*Server).removeWebhook},
		{Method: "POST", Path: "/v1/sandboxes/{id}/relays", handler: (*Server).addRelay},
		{Method: "GET", Path: "/v1/sandboxes/{id}/relays", handler: (*Server).listRelays},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/relays/{name}", handler: (*Server).removeRelay},
	}
}

// Server is the HTTP API.
type Server struct {
	vault   *vault.Vault
	store   store.Store
	mgr     *sandbox.Manager
	images  *image.Cache
	log     *slog.Logger
	handler http.Handler
	// metrics serves /metrics (nil: none).
	metrics http.Handler
	// hooks serves the webhook routes (nil: no ingress, 503).
	hooks *hooks.Service
	// relays serves the relay routes (nil: no ingress, 503).
	relays *relays
	// webhookKey is the daemon's approval-webhook key, from which each
	// tenant's is derived (livepolicy.WebhookKey); shown to nobody.
	webhookKey []byte
	// imageOps holds a token per pull or import under way: at most
	// cap(imageOps) at once, each downloads, unpacks and hashes a tree.
	imageOps chan struct{}
	// console is the web console's sessions and pages (console.go).
	console *console.Console
	// consoleMu guards consoleLn, the loopback listener `cagebox console`
	// opens (nil until then).
	consoleMu sync.Mutex
	consoleLn *consoleListener
	// adminKey is the SHA-256 digest of the fleet admin key
	// (--admin-key-file; nil: none): over TCP it is the admin.
	adminKey []byte
	// tenants caches the tenants' records by id (tenant).
	tenants sync.Map
	// ingressDomain is --ingress-domain, lower case ("" none): the
	// console answers on none of its names. Set before serving.
	ingressDomain string
}

type ctxKey int

const viaUnixKey ctxKey = 1

// NewServer builds the API handler.
func NewServer(st store.Store, mgr *sandbox.Manager, images *image.Cache, v *vault.Vault, log *slog.Logger) *Server {
	s := &Server{store: st, mgr: mgr, images: images, vault: v, log: log, imageOps: make(chan struct{}, 2)}
	mux := http.NewServeMux()
	for _, r := range Routes() {
		r := r
		mux.HandleFunc(r.Method+" "+r.Path, func(w http.ResponseWriter, req *http.Request) {
			tenant, err := s.authenticate(req)
			if err == nil && r.Admin && tenant.ID != adminTenantID {
				err = fmt.Errorf("%w: %s %s is for the admin only", errdefs.ErrDenied, r.Method, r.Path)
			}
			if err == nil {
				err = r.handler(s, w, req, tenant)
			}
			if err != nil {
				s.writeError(w, req, err)
			}
		})
	}
	// MCP over streamable HTTP (not a REST route: the protocol's own
	// endpoint, documented in docs/operator.md).
	mux.Handle("/mcp", &mcpHandler{s: s, byTenant: map[string]*mcp.StreamableHTTPHandler{}})
	s.initConsole(mux)
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(api.OpenAPI)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		s.writeError(w, req, fmt.Errorf("%w: no endpoint %s %s (see /openapi.json)", errdefs.ErrNotFound, req.Method, req.URL.Path))
	})
	s.handler = mux
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// ViaUnix marks a connection's context as coming over the unix socket (the
// admin tenant; the socket's 0600 mode is the access control).
func ViaUnix(ctx context.Context) context.Context { return context.WithValue(ctx, viaUnixKey, true) }

// HashKey is how API keys are stored: sha256 of the whole key. Keys are 32
// random bytes, so a fast hash is enough (no dictionary to guess from).
func HashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

func (s *Server) authenticate(r *http.Request) (*store.Tenant, error) {
	if v, _ := r.Context().Value(viaUnixKey).(bool); v {
		return s.tenant(r.Context(), adminTenantID)
	}
	if t, ok, err := s.consoleAuth(r); ok {
		return t, err
	}
	auth := r.Header.Get("Authorization")
	key, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || key == "" {
		return nil, fmt.Errorf("%w: send an API key as 'Authorization: Bearer cbk_…' (cagebox tenant key creates one)", errdefs.ErrUnauthorized)
	}
	return s.tenantOfKey(r.Context(), key)
}

// tenant returns tenant id's record. Tenants are never changed once made
// (the store has no update or delete of one), so each is read from the
// store once: authentication costs no store read per request.
func (s *Server) tenant(ctx context.Context, id string) (*store.Tenant, error) {
	if t, ok := s.tenants.Load(id); ok {
		return t.(*store.Tenant), nil
	}
	t, err := s.store.GetTenant(ctx, id)
	if err != nil {
		return nil, err
	}
	s.tenants.Store(id, t)
	return t, nil
}

// scope is the tenant filter for store queries: the admin sees every tenant.
func scope(t *store.Tenant) string {
	if t.ID == adminTenantID {
		return ""
	}
	return t.ID
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code, kind := httpError(err)
	if code >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, code, api.Error{Error: err.Error(), Kind: kind})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// decode reads a bounded JSON body, rejecting unknown fields and trailing data.
func decode(r *http.Request, v any) error {
	body := http.MaxBytesReader(nil, r.Body, maxJSONBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: empty body: send a JSON object", errdefs.ErrInvalid)
		}
		return fmt.Errorf("%w: invalid JSON: %v", errdefs.ErrInvalid, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: invalid JSON: data after the object", errdefs.ErrInvalid)
	}
	return nil
}

// decodeOptional is decode for a body that may be empty (all its fields
// optional): an empty body leaves v as it is.
func decodeOptional(r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxJSONBody))
	if err != nil {
		return fmt.Errorf("%w: body: %v", errdefs.ErrInvalid, err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return decode(r, v)
}

func (s *Server) health(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	writeJSON(w, 200, api.Health{Version: Version, Tenant: t.ID, Sandboxes: s.mgr.Count()})
	return nil
}

func (s *Server) runtimes(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	def, _ := s.mgr.PickRuntime("", t)
	writeJSON(w, 200, RuntimeList(s.mgr.Floor(t), def))
	return nil
}

// RuntimeList describes every registered runtime; def is the one a request
// naming none gets (nil: none).
func RuntimeList(floor isolation.Class, def isolation.Runtime) []api.Runtime {
	var out []api.Runtime
	for _, rt := range isolation.All() {
		a := api.Runtime{Name: rt.Name(), Class: rt.Class().String(), Available: true}
		if err := rt.Available(); err != nil {
			a.Available, a.Reason = false, err.Error()
		} else if rt.Class() < floor {
			a.Reason = fmt.Sprintf("below the isolation floor %s", floor)
		}
		if d, ok := rt.(isolation.Describer); ok {
			a.Detail = d.Detail()
		}
		a.Default = def != nil && def.Name() == rt.Name()
		out = append(out, a)
	}
	return out
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	imgs, err := s.images.List()
	if err != nil {
		return err
	}
	out := []api.Image{}
	for _, i := range imgs {
		out = append(out, apiImage(i))
	}
	writeJSON(w, 200, out)
	return nil
}

func apiImage(i *image.Image) api.Image {
	a := api.Image{Name: i.Name, SizeBytes: i.SizeBytes, CreatedAt: i.CreatedAt, Digest: i.Digest, Source: i.Source,
		ManifestDigest: i.ManifestDigest, PlatformDigest: i.PlatformDigest}
	if c := i.Config; c != nil {
		a.Config = &api.ImageConfig{Env: c.Env, Entrypoint: c.Entrypoint, Cmd: c.Cmd, WorkingDir: c.WorkingDir, User: c.User}
	}
	return a
}

// imageSlot waits for one of the image operation tokens.
func (s *Server) imageSlot(ctx context.Context) (release func(), err error) {
	select {
	case s.imageOps <- struct{}{}:
		return func() { <-s.imageOps }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// pullImage pulls an OCI image and answers when it is installed (or not):
// one JSON answer rather than streamed progress, so that a failure — no
// such image, no linux/amd64, a limit, a digest mismatch, an unsafe layer —
// is a 4xx status the client can act on, not an error line after a 200.
// The pull runs under the request's context: a client that hangs up
// cancels it, and a cancelled pull leaves nothing behind.
func (s *Server) pullImage(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.PullImageRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.MaxBytes < 0 || req.MaxFiles < 0 {
		return fmt.Errorf("%w: max_bytes and max_files must not be negative", errdefs.ErrInvalid)
	}
	release, err := s.imageSlot(r.Context())
	if err != nil {
		return err
	}
	defer release()
	img, err := s.images.Pull(r.Context(), image.PullOptions{
		Ref: req.Ref, Name: req.Name, Force: req.Force,
		Limits: image.Limits{MaxBytes: req.MaxBytes, MaxFiles: req.MaxFiles},
		Log:    s.log,
	})
	if err != nil {
		return err
	}
	writeJSON(w, 200, apiImage(img))
	return nil
}

// importImage installs the image archive in the request body (`docker save`
// output or a tar of an OCI layout); query: name, force, max_bytes,
// max_files. Like a pull it answers once, when done.
func (s *Server) importImage(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	q := r.URL.Query()
	opts := image.ImportOptions{Name: q.Get("name"), Log: s.log}
	if v := q.Get("force"); v != "" {
		f, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%w: force=%q: want true or false", errdefs.ErrInvalid, v)
		}
		opts.Force = f
	}
	for k, dst := range map[string]*int64{"max_bytes": &opts.MaxBytes, "max_files": &opts.MaxFiles} {
		if v := q.Get(k); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return fmt.Errorf("%w: %s=%q: want a non-negative integer", errdefs.ErrInvalid, k, v)
			}
			*dst = n
		}
	}
	release, err := s.imageSlot(r.Context())
	if err != nil {
		return err
	}
	defer release()
	img, err := s.images.Import(r.Context(), r.Body, opts)
	if err != nil {
		return err
	}
	writeJSON(w, 200, apiImage(img))
	return nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.CreateSandboxRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	sb, err := s.mgr.Create(r.Context(), t, &req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, sb)
	return nil
}

// listSandboxes: GET /v1/sandboxes[?label=KEY=VALUE…] (every label given
// must match).
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sel, err := sandbox.ParseLabelSelector(r.URL.Query()["label"])
	if err != nil {
		return err
	}
	l, err := s.mgr.ListLabeled(r.Context(), scope(t), sel)
	if err != nil {
		return err
	}
	if l == nil {
		l = []*api.Sandbox{}
	}
	writeJSON(w, 200, l)
	return nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.mgr.Get(r.Context(), scope(t), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, sb)
	return nil
}

func (s *Server) removeSandbox(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	switch r.URL.Query().Get("wait") {
	case "", "true", "1":
	case "false", "0":
		// Off the caller's path: 202 once the removal is recorded.
		if err := s.mgr.RemoveAsync(r.Context(), scope(t), r.PathValue("id")); err != nil {
			return err
		}
		w.WriteHeader(http.StatusAccepted)
		return nil
	default:
		return fmt.Errorf("%w: wait=%q: write true (the default) or false", errdefs.ErrInvalid, r.URL.Query().Get("wait"))
	}
	if err := s.mgr.Remove(r.Context(), scope(t), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func graceOf(r *http.Request) (time.Duration, error) {
	g := r.URL.Query().Get("grace")
	if g == "" {
		return defaultGrace, nil
	}
	d, err := time.ParseDuration(g)
	if err != nil || d < 0 || d > 10*time.Minute {
		return 0, fmt.Errorf("%w: grace: %q is not a duration between 0 and 10m", errdefs.ErrInvalid, g)
	}
	return d, nil
}

func (s *Server) stop(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	grace, err := graceOf(r)
	if err != nil {
		return err
	}
	sb, err := s.mgr.Stop(r.Context(), scope(t), r.PathValue("id"), grace)
	if err != nil {
		return err
	}
	writeJSON(w, 200, sb)
	return nil
}

// pause: POST /v1/sandboxes/{id}/pause freezes a sandbox in memory;
// ?to_disk=true hibernates it (saved whole to disk, its VMM ended).
func (s *Server) pause(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	pause := s.mgr.Pause
	if r.URL.Query().Get("to_disk") == "true" {
		pause = s.mgr.Hibernate
	}
	sb, err := pause(r.Context(), scope(t), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, sb)
	return nil
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.mgr.Resume(r.Context(), scope(t), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, sb)
	return nil
}

// frameWriter turns writes into ExecFrames on a shared, flushed ndjson
// stream.
type frameWriter struct {
	stream string
	out    *ndjson
}

func (f *frameWriter) Write(p []byte) (int, error) {
	if err := f.out.send(&api.ExecFrame{Stream: f.stream, Data: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

type ndjson struct {
	// mu serialises frames from stdout and stderr.
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (n *ndjson) send(f *api.ExecFrame) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, err := n.w.Write(b); err != nil {
		return err
	}
	return n.rc.Flush()
}

// exec: the body's first line is an api.ExecRequest; with stdin the rest
// of the body is the process's input. The answer is a stream of
// api.ExecFrame lines, the last one "exit" (or "error").
func (s *Server) exec(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	br := bufio.NewReaderSize(r.Body, 64<<10)
	line, err := readLine(br, maxJSONBody)
	if err != nil {
		return fmt.Errorf("%w: exec: read request line: %v", errdefs.ErrInvalid, err)
	}
	var req api.ExecRequest
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return fmt.Errorf("%w: exec: invalid JSON: %v", errdefs.ErrInvalid, err)
	}
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex()
	out := &ndjson{w: w, rc: rc}
	started := false
	stdout := &lazyHeader{fw: &frameWriter{stream: "stdout", out: out}, start: func() { startStream(w, &started, out) }}
	stderr := &lazyHeader{fw: &frameWriter{stream: "stderr", out: out}, start: func() { startStream(w, &started, out) }}
	res, err := s.mgr.Guest().Exec(r.Context(), scope(t), r.PathValue("id"), &req, br, sandbox.ExecOutput{Stdout: stdout, Stderr: stderr})
	out.mu.Lock()
	headerSent := started
	out.mu.Unlock()
	if err != nil {
		if !headerSent {
			return err
		}
		return out.send(&api.ExecFrame{Stream: "error", Error: err.Error()})
	}
	startStream(w, &started, out)
	return out.send(res)
}

// lazyHeader sends the 200 header only with the first output, so an exec
// that fails before starting still gets a proper 4xx.
type lazyHeader struct {
	fw    *frameWriter
	start func()
}

func (l *lazyHeader) Write(p []byte) (int, error) {
	l.start()
	return l.fw.Write(p)
}

func startStream(w http.ResponseWriter, started *bool, out *ndjson) {
	out.mu.Lock()
	defer out.mu.Unlock()
	if *started {
		return
	}
	*started = true
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
}

func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > max {
			return nil, fmt.Errorf("request line longer than %d bytes", max)
		}
		if err == nil {
			return line, nil
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) && len(line) > 0 {
			return line, nil
		}
		return nil, err
	}
}

func pathParam(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" || !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%w: path: give an absolute path in the sandbox (?path=/work/file)", errdefs.ErrInvalid)
	}
	return p, nil
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	// Buffer so an error (not found, too big) still gets its status code.
	var buf bytes.Buffer
	if err := s.mgr.Guest().ReadFile(r.Context(), scope(t), r.PathValue("id"), p, &buf, maxFileRead); err != nil {
		return agentErr(err)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	_, _ = w.Write(buf.Bytes())
	return nil
}

// agentErr classifies errors the agent reports about the guest's files.
func agentErr(err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "no such file or directory"):
		return fmt.Errorf("%w: %v", errdefs.ErrNotFound, err)
	case strings.Contains(msg, "is a directory"), strings.Contains(msg, "not a directory"),
		strings.Contains(msg, "exceeds"), strings.Contains(msg, "too large"), strings.Contains(msg, "permission denied"):
		return fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	return err
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	mode := os.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o7777 {
			return fmt.Errorf("%w: mode: %q is not an octal file mode such as 0644", errdefs.ErrInvalid, m)
		}
		mode = os.FileMode(v)
	}
	body := http.MaxBytesReader(w, r.Body, maxFileWrite)
	if err := s.mgr.Guest().WriteFile(r.Context(), scope(t), r.PathValue("id"), p, mode, body); err != nil {
		return agentErr(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) listDir(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	l, err := s.mgr.Guest().ListDir(r.Context(), scope(t), r.PathValue("id"), p)
	if err != nil {
		return agentErr(err)
	}
	out := []api.FileInfo{}
	for _, f := range l {
		out = append(out, api.FileInfo{Name: f.Name, Size: f.Size, Mode: f.Mode.String(), ModTime: f.ModTime, IsDir: f.IsDir})
	}
	writeJSON(w, 200, out)
	return nil
}

func toAPIEvent(e *store.Event) api.Event {
	ev := api.Event{Seq: e.Seq, Time: e.Time, Tenant: e.TenantID, Sandbox: e.SandboxID, Kind: api.EventKind(e.Kind)}
	if len(e.Data) > 0 {
		ev.Data = json.RawMessage(e.Data)
	}
	return ev
}

// listEvents: ?sandbox=ID&after=SEQ&follow=1. With follow the answer is an
// ndjson stream that stays open.
func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	q := r.URL.Query()
	var after int64
	if a := q.Get("after"); a != "" {
		v, err := strconv.ParseInt(a, 10, 64)
		if err != nil || v < 0 {
			return fmt.Errorf("%w: after: %q is not an event sequence number", errdefs.ErrInvalid, a)
		}
		after = v
	}
	sbID := q.Get("sandbox")
	if sbID != "" {
		if _, err := s.mgr.Get(r.Context(), scope(t), sbID); err != nil {
			return err
		}
	}
	follow := q.Get("follow") == "1" || q.Get("follow") == "true"
	var ch <-chan *store.Event
	if follow {
		var cancel func()
		ch, cancel = s.mgr.Events().Broker().Subscribe(scope(t))
		defer cancel()
	}
	// Read your writes: what was emitted before this request (a secret
	// removed, a denial the guest just saw) is stored before it is listed.
	if err := s.mgr.Events().Sync(r.Context()); err != nil {
		return err
	}
	evs, err := s.store.ListEvents(r.Context(), scope(t), sbID, after, 1000)
	if err != nil {
		return err
	}
	if !follow {
		out := make([]api.Event, 0, len(evs))
		for _, e := range evs {
			out = append(out, toAPIEvent(e))
		}
		writeJSON(w, 200, out)
		return nil
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(200)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	for _, e := range evs {
		_ = enc.Encode(toAPIEvent(e))
		after = e.Seq
	}
	_ = rc.Flush()
	for {
		select {
		case <-r.Context().Done():
			return nil
		case e, ok := <-ch:
			if !ok {
				return nil // too slow; the client resumes with ?after=
			}
			if e.Seq <= after || (sbID != "" && e.SandboxID != sbID) {
				continue
			}
			if err := enc.Encode(toAPIEvent(e)); err != nil {
				return nil
			}
			_ = rc.Flush()
		}
	}
}

func (s *Server) createTenant(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.CreateTenantRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if !validName(req.Name) {
		return fmt.Errorf("%w: name: %q must be 1-63 characters of a-z, 0-9, '-' or '_'", errdefs.ErrInvalid, req.Name)
	}
	if req.MinIsolation != "" {
		c, err := isolation.ParseClass(req.MinIsolation)
		if err != nil {
			return fmt.Errorf("%w: min_isolation: %v", errdefs.ErrInvalid, err)
		}
		if req.Untrusted && c < isolation.Hypervisor {
			return fmt.Errorf("%w: min_isolation: an untrusted tenant's floor is hypervisor; drop min_isolation or set it to hypervisor", errdefs.ErrInvalid)
		}
	}
	tn := &store.Tenant{ID: req.Name, Name: req.Name, MinIsolation: req.MinIsolation, Untrusted: req.Untrusted, CreatedAt: time.Now().UTC()}
	if err := s.store.CreateTenant(r.Context(), tn); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("%w: tenant %q exists", errdefs.ErrConflict, req.Name)
		}
		return err
	}
	writeJSON(w, http.StatusCreated, s.tenantView(tn))
	return nil
}

func (s *Server) tenantView(tn *store.Tenant) api.Tenant {
	return api.Tenant{ID: tn.ID, Name: tn.Name, MinIsolation: tn.MinIsolation, Untrusted: tn.Untrusted, Floor: s.mgr.Floor(tn).String(), CreatedAt: tn.CreatedAt}
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// serveMetrics: GET /metrics, Prometheus's text format (admin only:
// scrape with an admin API key as a bearer token, or over the socket).
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	if s.metrics == nil {
		return fmt.Errorf("%w: this server has no metrics", errdefs.ErrNotFound)
	}
	s.metrics.ServeHTTP(w, r)
	return nil
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	writeJSON(w, 200, s.mgr.Pools().Status())
	return nil
}

// setPools: PUT /v1/pools replaces the warm pool targets (the fleet
// controller's SandboxWarmPool replicas).
func (s *Server) setPools(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.SetPoolsRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	p, err := s.mgr.Pools().Set(&req)
	if err != nil {
		return err
	}
	writeJSON(w, 200, p)
	return nil
}

func (s *Server) listTenants(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	ts, err := s.store.ListTenants(r.Context())
	if err != nil {
		return err
	}
	out := []api.Tenant{}
	for _, tn := range ts {
		out = append(out, s.tenantView(tn))
	}
	writeJSON(w, 200, out)
	return nil
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	tid := r.PathValue("id")
	if _, err := s.store.GetTenant(r.Context(), tid); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: no tenant %q", errdefs.ErrNotFound, tid)
		}
		return err
	}
	key, rec := NewAPIKey(tid)
	if err := s.store.CreateAPIKey(r.Context(), rec); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, api.APIKey{ID: rec.ID, Tenant: tid, Prefix: rec.Prefix, Key: key, CreatedAt: rec.CreatedAt})
	return nil
}

func secretView(in *vault.Info) api.Secret {
	return api.Secret{Name: in.Name, Tenant: in.Tenant, Hosts: in.Hosts, Inject: in.Inject, Preview: in.Preview,
		Version: in.Version, CreatedAt: in.CreatedAt, UpdatedAt: in.UpdatedAt, RevokedAt: in.RevokedAt, AllowEnv: in.AllowEnv}
}

// Secrets live in the caller's own tenant; the admin manages the admin
// tenant's (a secret is never shared across tenants).
func (s *Server) putSecret(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.PutSecretRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	in, err := s.vault.PutWith(r.Context(), t.ID, req.Name, []byte(req.Value), vault.PutOptions{Hosts: req.Hosts, Inject: req.Inject, AllowEnv: req.AllowEnv})
	if err != nil {
		return err
	}
	s.mgr.Emit(t.ID, "", api.SecretPut{Name: in.Name, Hosts: in.Hosts, Version: in.Version, Preview: in.Preview, AllowEnv: in.AllowEnv})
	writeJSON(w, http.StatusCreated, secretView(in))
	return nil
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	l, err := s.vault.List(r.Context(), t.ID)
	if err != nil {
		return err
	}
	out := []api.Secret{}
	for _, in := range l {
		out = append(out, secretView(in))
	}
	writeJSON(w, 200, out)
	return nil
}

func (s *Server) getSecret(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	in, err := s.vault.Info(r.Context(), t.ID, r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, secretView(in))
	return nil
}

func (s *Server) rotateSecret(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.RotateSecretRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	in, err := s.vault.RotateWith(r.Context(), t.ID, r.PathValue("name"), []byte(req.Value), req.AllowEnv)
	if err != nil {
		return err
	}
	s.mgr.Emit(t.ID, "", api.SecretRotated{Name: in.Name, Version: in.Version, Preview: in.Preview, AllowEnv: in.AllowEnv})
	writeJSON(w, 200, secretView(in))
	return nil
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	name := r.PathValue("name")
	if err := s.vault.Delete(r.Context(), t.ID, name); err != nil {
		return err
	}
	s.mgr.Emit(t.ID, "", api.SecretDeleted{Name: name})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) revokeSecret(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	name := r.PathValue("name")
	if err := s.vault.Revoke(r.Context(), t.ID, name); err != nil {
		return err
	}
	in, err := s.vault.Info(r.Context(), t.ID, name)
	if err != nil {
		return err
	}
	s.mgr.Emit(t.ID, "", api.SecretRevoked{Name: name})
	writeJSON(w, 200, secretView(in))
	return nil
}

func (s *Server) unbindSecret(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.mgr.Secrets().Unbind(r.Context(), scope(t), r.PathValue("id"), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, sb)
	return nil
}
