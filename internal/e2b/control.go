package e2b

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
)

// Labels the front keeps on the sandboxes it makes: the E2B template id
// as asked for (its image part; a runtime part in labelRuntime), and each
// metadata pair under a prefix.
const (
	labelTemplate = "e2b.template"
	labelRuntime  = "e2b.runtime"
	labelMeta     = "e2b.meta/"
)

// defaultTimeout is E2B's default sandbox lifetime (NewSandbox.timeout).
const defaultTimeout = 15 * time.Second

// maxTimeout bounds a timeout in seconds (30 days).
const maxTimeout = 30 * 24 * 3600

func (s *Server) controlMux() http.Handler {
	mux := http.NewServeMux()
	handle := func(pattern string, h func(http.ResponseWriter, *http.Request, *store.Tenant) error) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get("X-API-KEY")
			if key == "" {
				s.fail(w, r, fmt.Errorf("%w: send a cagebox tenant API key as X-API-KEY (E2B_API_KEY; docs/e2b.md)", errdefs.ErrUnauthorized))
				return
			}
			t, err := s.cfg.Authenticate(r.Context(), key)
			if err == nil {
				err = h(w, r, t)
			}
			if err != nil {
				s.fail(w, r, err)
			}
		})
	}
	handle("POST /sandboxes", s.create)
	handle("POST /v2/sandboxes", s.create)
	handle("GET /sandboxes/{id}", s.info)
	handle("DELETE /sandboxes/{id}", s.kill)
	handle("POST /sandboxes/{id}/connect", s.connect)
	handle("POST /v2/sandboxes/{id}/connect", s.connect)
	handle("POST /sandboxes/{id}/pause", s.pause)
	handle("POST /sandboxes/{id}/timeout", s.setTimeout)
	handle("POST /sandboxes/{id}/resume", s.connect)
	handle("GET /v2/sandboxes", s.list)
	handle("PUT /sandboxes/{id}/network", s.updateNetwork)
	handle("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	handle("GET /snapshots", s.listSnapshots)
	handle("DELETE /templates/{id}", s.deleteTemplate)
	handle("POST /sandboxes/{id}/fork", s.fork)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, apiError{Code: http.StatusNotFound,
			Message: fmt.Sprintf("%s %s is not implemented by cagebox's E2B front (docs/e2b.md lists what is)", r.Method, r.URL.Path)})
	})
	return mux
}

// newSandbox is E2B's NewSandbox. Fields cagebox does not implement yet
// are decoded so that a request using them is refused, not half-served.
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AutoPause           *bool             `json:"autoPause"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Secure              *bool             `json:"secure"`
	Network             json.RawMessage   `json:"network"`
	MCP                 json.RawMessage   `json:"mcp"`
	IAM                 json.RawMessage   `json:"iam"`
	VolumeMounts        json.RawMessage   `json:"volumeMounts"`
	AutoResume          json.RawMessage   `json:"autoResume"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
}

// sandboxResp is E2B's Sandbox (the answer of create and connect).
type sandboxResp struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken"`
	// TrafficAccessToken opens the sandbox's ports (getHost) unless it
	// was created with network.allowPublicTraffic true.
	TrafficAccessToken *string `json:"trafficAccessToken,omitempty"`
	Domain             *string `json:"domain"`
}

// listedSandbox is E2B's ListedSandbox and (with the access token)
// SandboxDetail.
type listedSandbox struct {
	TemplateID      string            `json:"templateID"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain,omitempty"`
	Network         *networkInfo      `json:"network,omitempty"`
}

func isSet(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null"))
}

// createRequest translates NewSandbox into cagebox's create request.
func createRequest(n *newSandbox) (*api.CreateSandboxRequest, error) {
	// allow_internet_access opens nothing (see network): it is accepted
	// either way.
	switch {
	case isSet(n.MCP), isSet(n.IAM), isSet(n.VolumeMounts), isSet(n.AutoResume):
		return nil, invalid("mcp, iam, volumeMounts and autoResume are not supported by cagebox's E2B front; leave them unset")
	case n.AutoPause != nil && *n.AutoPause:
		return nil, invalid("autoPause is not supported yet: a sandbox is removed when its timeout passes")
	}
	netw, err := decodeNetwork(n.Network)
	if err != nil {
		return nil, err
	}
	allow, err := netw.allowHosts()
	if err != nil {
		return nil, err
	}
	// templateID is IMAGE or IMAGE:RUNTIME (E2B's NAME:TAG shape): the
	// runtime a cagebox runtime name, picked within the tenant's floor by
	// the manager as for any create (else the daemon's --default-runtime).
	tmpl, rt, _ := strings.Cut(n.TemplateID, ":")
	if tmpl == "" {
		return nil, invalid("templateID: give a template (a cagebox image name, optionally :RUNTIME; %q is the default image)", "base")
	}
	if strings.Contains(n.TemplateID, ":") && rt == "" {
		return nil, invalid("templateID: %q names no runtime after ':' (write IMAGE or IMAGE:RUNTIME, e.g. base:gvisor)", n.TemplateID)
	}
	img := tmpl
	if img == "base" {
		img = "default"
	}
	timeout := defaultTimeout
	if n.Timeout != nil {
		if *n.Timeout <= 0 || *n.Timeout > maxTimeout {
			return nil, invalid("timeout: %d is not a number of seconds between 1 and %d", *n.Timeout, maxTimeout)
		}
		timeout = time.Duration(*n.Timeout) * time.Second
	}
	labels := map[string]string{labelTemplate: tmpl}
	if rt != "" {
		labels[labelRuntime] = rt
	}
	if netw.AllowPublicTraffic != nil && *netw.AllowPublicTraffic {
		labels[labelPublic] = "true"
	}
	for k, v := range n.Metadata {
		labels[labelMeta+k] = v
	}
	if err := sandbox.ValidateLabels(labels); err != nil {
		return nil, fmt.Errorf("templateID or metadata (kept as cagebox labels: keys [A-Za-z0-9._/-], values up to 63 of [A-Za-z0-9._-]): %w", err)
	}
	req := &api.CreateSandboxRequest{Runtime: rt, Image: img, Timeout: timeout.String(), Labels: labels, Allow: allow}
	keys := make([]string, 0, len(n.EnvVars))
	for k := range n.EnvVars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := n.EnvVars[k]
		// "vault:NAME" binds the tenant's secret NAME as cagebox's
		// --secret K=vault:NAME does: the guest sees a placeholder, the
		// egress gateway swaps in the real value only toward its hosts.
		if name, ok := strings.CutPrefix(v, "vault:"); ok {
			if name == "" {
				return nil, invalid("envVars[%s]: %q names no secret: write vault:NAME", k, v)
			}
			req.Secrets = append(req.Secrets, api.SecretBinding{Name: k, Secret: name})
			continue
		}
		req.Env = append(req.Env, k+"="+v)
	}
	return req, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var n newSandbox
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	if err := dec.Decode(&n); err != nil {
		return invalid("body: want a JSON NewSandbox object: %v", err)
	}
	req, err := createRequest(&n)
	if err != nil {
		return err
	}
	// A template that names one of the tenant's snapshots starts from it
	// (its image and runtime are the snapshot's).
	if name := snapshotName(n.TemplateID); name != "" {
		if _, err := s.cfg.Manager.Snapshots().Get(r.Context(), t.ID, name); err == nil {
			req.FromSnapshot, req.Image, req.Runtime = name, "", ""
			delete(req.Labels, labelRuntime)
		}
	}
	sb, err := s.cfg.Manager.Create(r.Context(), t, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, s.sandboxResp(sb))
	return nil
}

func (s *Server) domain() *string {
	if s.cfg.Domain == "" {
		return nil
	}
	d := s.cfg.Domain
	return &d
}

func (s *Server) sandboxResp(sb *api.Sandbox) sandboxResp {
	r := sandboxResp{TemplateID: templateOf(sb), SandboxID: ToE2BID(sb.ID), ClientID: "cagebox",
		EnvdVersion: EnvdVersion, EnvdAccessToken: s.AccessToken(sb.ID), Domain: s.domain()}
	if sb.Labels[labelPublic] != "true" {
		t := s.TrafficToken(sb.ID)
		r.TrafficAccessToken = &t
	}
	return r
}

func templateOf(sb *api.Sandbox) string {
	t := sb.Labels[labelTemplate]
	if t == "" {
		return sb.Image
	}
	if rt := sb.Labels[labelRuntime]; rt != "" {
		return t + ":" + rt
	}
	return t
}

// state is E2B's state of a cagebox sandbox ("" for one E2B would not list).
func state(status string) string {
	switch status {
	case sandbox.StatusRunning:
		return "running"
	case sandbox.StatusPaused, sandbox.StatusHibernated:
		return "paused"
	}
	return ""
}

func (s *Server) listed(sb *api.Sandbox) listedSandbox {
	md := map[string]string{}
	for k, v := range sb.Labels {
		if name, ok := strings.CutPrefix(k, labelMeta); ok {
			md[name] = v
		}
	}
	end := time.Time{}
	if sb.ExpiresAt != nil {
		end = *sb.ExpiresAt
	}
	cpus := int(sb.Resources.CPUs + 0.999)
	if cpus < 1 {
		cpus = 1
	}
	return listedSandbox{TemplateID: templateOf(sb), SandboxID: ToE2BID(sb.ID), ClientID: "cagebox",
		StartedAt: sb.CreatedAt, EndAt: end, CPUCount: cpus, MemoryMB: sb.Resources.MemoryBytes >> 20,
		DiskSizeMB: sb.Resources.DiskBytes >> 20, Metadata: md, State: state(sb.Status), EnvdVersion: EnvdVersion}
}

// lookup finds tenant t's sandbox by its E2B id: errdefs.ErrNotFound for
// an id that is not one of t's sandboxes.
func (s *Server) lookup(r *http.Request, t *store.Tenant) (*api.Sandbox, error) {
	e := r.PathValue("id")
	id := FromE2BID(e)
	if id == "" {
		return nil, fmt.Errorf("%w: sandbox %q not found", errdefs.ErrNotFound, e)
	}
	sb, err := s.cfg.Manager.Get(r.Context(), t.ID, id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("%w: sandbox %q not found", errdefs.ErrNotFound, e)
		}
		return nil, err
	}
	if state(sb.Status) == "" {
		return nil, fmt.Errorf("%w: sandbox %q not found (it is %s)", errdefs.ErrNotFound, e, sb.Status)
	}
	return sb, nil
}

func (s *Server) info(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.lookup(r, t)
	if err != nil {
		return err
	}
	d := s.listed(sb)
	d.EnvdAccessToken = s.AccessToken(sb.ID)
	d.Domain = s.domain()
	d.Network = s.networkOf(sb)
	writeJSON(w, http.StatusOK, d)
	return nil
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.lookup(r, t)
	if err != nil {
		return err
	}
	if err := s.cfg.Manager.Remove(r.Context(), t.ID, sb.ID); err != nil {
		return err
	}
	s.procs.drop(sb.ID)
	s.ports.drop(sb.ID)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect resumes a paused sandbox and answers as create does. A timeout
// in the body is ignored for now: the lifetime stays (setTimeout moves it).
func (s *Server) connect(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.lookup(r, t)
	if err != nil {
		return err
	}
	if sb.Status == sandbox.StatusPaused || sb.Status == sandbox.StatusHibernated {
		if sb, err = s.cfg.Manager.Resume(r.Context(), t.ID, sb.ID); err != nil {
			return err
		}
	}
	code := http.StatusOK
	if r.URL.Path != "" && strings.HasSuffix(r.URL.Path, "/resume") {
		code = http.StatusCreated
	}
	writeJSON(w, code, s.sandboxResp(sb))
	return nil
}

// setTimeout: POST /sandboxes/{id}/timeout {"timeout": SECONDS} ends the
// sandbox's lifetime that many seconds from now.
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil || body.Timeout == nil {
		return invalid("body: want {\"timeout\": SECONDS}")
	}
	if *body.Timeout <= 0 || *body.Timeout > maxTimeout {
		return invalid("timeout: %d is not a number of seconds between 1 and %d", *body.Timeout, maxTimeout)
	}
	sb, err := s.lookup(r, t)
	if err != nil {
		return err
	}
	if _, err := s.cfg.Manager.SetTimeout(r.Context(), t.ID, sb.ID, time.Duration(*body.Timeout)*time.Second); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.lookup(r, t)
	if err != nil {
		return err
	}
	if sb.Status != sandbox.StatusRunning {
		return fmt.Errorf("%w: sandbox %s is already paused", errdefs.ErrConflict, ToE2BID(sb.ID))
	}
	if _, err := s.cfg.Manager.Pause(r.Context(), t.ID, sb.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// list: GET /v2/sandboxes?metadata=…&state=…&limit=…&nextToken=…, newest
// first, paged with the x-next-token header.
func (s *Server) list(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	q := r.URL.Query()
	want := map[string]string{}
	if m := q.Get("metadata"); m != "" {
		pairs, err := url.ParseQuery(m)
		if err != nil {
			return invalid("metadata: %q is not key=value pairs joined by &: %v", m, err)
		}
		for k, vs := range pairs {
			// The SDK encodes each key and value before joining them.
			key, kerr := url.QueryUnescape(k)
			val, verr := url.QueryUnescape(vs[0])
			if kerr != nil || verr != nil {
				return invalid("metadata: %q is not URL-encoded", m)
			}
			want[labelMeta+key] = val
		}
	}
	states := map[string]bool{"running": true, "paused": true}
	if st := q.Get("state"); st != "" {
		states = map[string]bool{}
		for _, v := range strings.Split(st, ",") {
			if v != "running" && v != "paused" {
				return invalid("state: %q is not running or paused", v)
			}
			states[v] = true
		}
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			return invalid("limit: %q is not a number between 1 and 100", l)
		}
		limit = n
	}
	var after *cursor
	if nt := q.Get("nextToken"); nt != "" {
		c, err := parseCursor(nt)
		if err != nil {
			return err
		}
		after = c
	}
	all, err := s.cfg.Manager.ListLabeled(r.Context(), t.ID, want)
	if err != nil {
		return err
	}
	sort.Slice(all, func(i, j int) bool { return cursorOf(all[i]).before(cursorOf(all[j])) })
	out := []listedSandbox{}
	var last *api.Sandbox
	more := false
	for _, sb := range all {
		if after != nil && !after.before(cursorOf(sb)) {
			continue
		}
		if !states[state(sb.Status)] {
			continue
		}
		if len(out) == limit {
			more = true
			break
		}
		out = append(out, s.listed(sb))
		last = sb
	}
	if more && last != nil {
		w.Header().Set("X-Next-Token", cursorOf(last).String())
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// cursor orders listed sandboxes: newest first, then by id.
type cursor struct {
	created int64
	id      string
}

func cursorOf(sb *api.Sandbox) cursor { return cursor{sb.CreatedAt.UnixNano(), sb.ID} }

func (c cursor) before(o cursor) bool {
	if c.created != o.created {
		return c.created > o.created
	}
	return c.id < o.id
}

func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.created, 10) + ":" + c.id))
}

var cursorID = regexp.MustCompile(`^sb-[0-9a-f]{16}$`)

func parseCursor(s string) (*cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		n, id, ok := strings.Cut(string(b), ":")
		if ts, perr := strconv.ParseInt(n, 10, 64); ok && perr == nil && cursorID.MatchString(id) {
			return &cursor{ts, id}, nil
		}
	}
	return nil, invalid("nextToken: %q is not a token this server gave (x-next-token)", s)
}
