// Package runtimeapi is cagebox's drop-in for the agent-sandbox project's
// sandbox-router together with the legacy python-runtime API behind it:
// plain HTTP requests that name a Sandbox with the X-Sandbox-ID and
// X-Sandbox-Namespace headers (what the official clients send in Direct
// URL and Gateway mode) are answered by the controller itself, which
// resolves the Sandbox to its node and node sandbox and drives the node's
// own API (exec, files) with the fleet admin key. Nothing runs in the
// guest for it: any image works.
//
// The routes are the legacy runtime's: POST /execute {"command"} →
// {"stdout","stderr","exit_code"} (the command split like Python's
// shlex.split and run without a shell, in the base directory), POST
// /upload (multipart "file"), GET /download/PATH, /list/PATH,
// /exists/PATH, and GET / (health). Paths are relative to the base
// directory (/app by default, created on first use) and may not leave it.
//
// Every request must carry "Authorization: Bearer TOKEN", a Kubernetes
// token the Authorizer checks (TokenReview, then a SubjectAccessReview:
// may the caller create SandboxClaims in the Sandbox's namespace).
package runtimeapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// The headers the official clients send.
const (
	HeaderSandboxID        = "X-Sandbox-ID"
	HeaderSandboxNamespace = "X-Sandbox-Namespace"
	HeaderSandboxPort      = "X-Sandbox-Port"
	HeaderSandboxTimeout   = "X-Sandbox-Timeout"
)

// Node is what the server needs of a node's API (*client.Client).
type Node interface {
	Exec(ctx context.Context, id string, req *api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*api.ExecFrame, error)
	WriteFile(ctx context.Context, id, path string, mode uint32, data io.Reader) error
	ReadFile(ctx context.Context, id, path string) ([]byte, error)
	ListDir(ctx context.Context, id, path string) ([]api.FileInfo, error)
}

var _ Node = (*client.Client)(nil)

// ErrNoSandbox is a Resolve answer for a name that is not a running
// Sandbox.
var ErrNoSandbox = errors.New("no such running sandbox")

// Config configures a Server.
type Config struct {
	// Resolve returns the node and node sandbox id of Sandbox ns/name
	// (ErrNoSandbox when it is not placed and running).
	Resolve func(ctx context.Context, ns, name string) (Node, string, error)
	// Authorize checks the request's bearer token for Sandbox ns/name; an
	// error is a 401 (ErrUnauthenticated) or 403.
	Authorize func(ctx context.Context, token, ns, name string) error
	// BaseDir is where relative paths start and commands run ("/app").
	BaseDir string
	// ExecTimeout bounds a command without X-Sandbox-Timeout (5 min).
	ExecTimeout time.Duration
	// MaxUpload bounds an upload (256 MiB).
	MaxUpload int64
	Log       *slog.Logger
}

// ErrUnauthenticated is an Authorize answer for a missing or invalid
// token.
var ErrUnauthenticated = errors.New("unauthenticated")

// Server serves the runtime API.
type Server struct {
	cfg Config
	log *slog.Logger

	// mu guards made.
	mu sync.Mutex
	// made holds the "NODE-SANDBOX-ID" whose base directory exists.
	made map[string]bool
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.BaseDir == "" {
		cfg.BaseDir = "/app"
	}
	if cfg.ExecTimeout <= 0 {
		cfg.ExecTimeout = 5 * time.Minute
	}
	if cfg.MaxUpload <= 0 {
		cfg.MaxUpload = 256 << 20
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	return &Server{cfg: cfg, log: log, made: map[string]bool{}}
}

type target struct {
	node Node
	id   string
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]string{"message": fmt.Sprintf(format, args...)})
}

// ServeHTTP answers one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, ns := r.Header.Get(HeaderSandboxID), r.Header.Get(HeaderSandboxNamespace)
	if ns == "" {
		ns = "default"
	}
	if name == "" {
		fail(w, http.StatusBadRequest, "missing %s header: name the Sandbox", HeaderSandboxID)
		return
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		fail(w, http.StatusUnauthorized, "missing Authorization: Bearer token (a Kubernetes token of a user who may create SandboxClaims in %s)", ns)
		return
	}
	if err := s.cfg.Authorize(r.Context(), strings.TrimSpace(token), ns, name); err != nil {
		status := http.StatusForbidden
		switch {
		case errors.Is(err, ErrUnauthenticated):
			status = http.StatusUnauthorized
		case errors.Is(err, ErrAuthUnavailable):
			status = http.StatusServiceUnavailable
		}
		fail(w, status, "%v", err)
		return
	}
	node, id, err := s.cfg.Resolve(r.Context(), ns, name)
	if err != nil {
		if errors.Is(err, ErrNoSandbox) {
			fail(w, http.StatusNotFound, "sandbox %s/%s: %v", ns, name, err)
			return
		}
		fail(w, http.StatusBadGateway, "sandbox %s/%s: %v", ns, name, err)
		return
	}
	t := target{node: node, id: id}
	ctx := r.Context()
	route, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	switch {
	case route == "" && r.Method == http.MethodGet:
		writeJSON(w, 200, map[string]string{"status": "ok", "message": "Sandbox Runtime is active."})
	case route == "execute" && r.Method == http.MethodPost:
		s.execute(ctx, w, r, t)
	case route == "upload" && r.Method == http.MethodPost:
		s.upload(ctx, w, r, t)
	case route == "download" && r.Method == http.MethodGet:
		s.download(ctx, w, rest, t)
	case route == "list" && r.Method == http.MethodGet:
		s.list(ctx, w, rest, t)
	case route == "exists" && r.Method == http.MethodGet:
		s.exists(ctx, w, rest, t)
	default:
		fail(w, http.StatusNotFound, "no route %s %s", r.Method, r.URL.Path)
	}
}

// safePath is base/p cleaned, refused if it leaves base.
func (s *Server) safePath(p string) (string, error) {
	full := path.Clean(path.Join(s.cfg.BaseDir, p))
	if path.IsAbs(p) || (full != s.cfg.BaseDir && !strings.HasPrefix(full, strings.TrimRight(s.cfg.BaseDir, "/")+"/")) {
		return "", errors.New("access denied")
	}
	return full, nil
}

// ensureBase makes the base directory on the node sandbox once.
func (s *Server) ensureBase(ctx context.Context, t target) error {
	key := fmt.Sprintf("%p-%s", t.node, t.id)
	s.mu.Lock()
	done := s.made[key]
	s.mu.Unlock()
	if done {
		return nil
	}
	f, err := t.node.Exec(ctx, t.id, &api.ExecRequest{Argv: []string{"mkdir", "-p", s.cfg.BaseDir}, Timeout: "30s"}, nil, io.Discard, io.Discard)
	if err != nil {
		return fmt.Errorf("make %s: %w", s.cfg.BaseDir, err)
	}
	if f.ExitCode == nil || *f.ExitCode != 0 {
		return fmt.Errorf("make %s: mkdir failed", s.cfg.BaseDir)
	}
	s.mu.Lock()
	s.made[key] = true
	s.mu.Unlock()
	return nil
}

func (s *Server) execute(ctx context.Context, w http.ResponseWriter, r *http.Request, t target) {
	var req struct {
		Command string `json:"command"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		fail(w, http.StatusUnprocessableEntity, "body: want {\"command\": \"...\"}: %v", err)
		return
	}
	timeout := s.cfg.ExecTimeout
	if v := r.Header.Get(HeaderSandboxTimeout); v != "" {
		var secs float64
		if _, err := fmt.Sscanf(v, "%g", &secs); err == nil && secs > 0 {
			timeout = time.Duration(secs * float64(time.Second))
		}
	}
	argv, err := SplitCommand(req.Command)
	if err != nil || len(argv) == 0 {
		// As the legacy runtime: a command that does not split is exit 1.
		msg := "empty command"
		if err != nil {
			msg = err.Error()
		}
		writeJSON(w, 200, map[string]any{"stdout": "", "stderr": "Failed to execute command: " + msg, "exit_code": 1})
		return
	}
	if err := s.ensureBase(ctx, t); err != nil {
		fail(w, http.StatusBadGateway, "%v", err)
		return
	}
	var stdout, stderr bytes.Buffer
	f, err := t.node.Exec(ctx, t.id, &api.ExecRequest{Argv: argv, Cwd: s.cfg.BaseDir, Timeout: timeout.String()}, nil, &stdout, &stderr)
	if err != nil {
		// A command the guest cannot start (not found) is the legacy
		// runtime's exit 1 with the reason on stderr.
		var ce *client.Error
		if errors.As(err, &ce) && ce.Status < 500 {
			writeJSON(w, 200, map[string]any{"stdout": "", "stderr": "Failed to execute command: " + ce.Msg, "exit_code": 1})
			return
		}
		fail(w, http.StatusBadGateway, "exec: %v", err)
		return
	}
	code := -1
	if f.ExitCode != nil {
		code = *f.ExitCode
	}
	if f.Error != "" && f.ExitCode == nil {
		stderr.WriteString("Failed to execute command: " + f.Error)
		code = 1
	}
	writeJSON(w, 200, map[string]any{"stdout": stdout.String(), "stderr": stderr.String(), "exit_code": code})
}

func (s *Server) upload(ctx context.Context, w http.ResponseWriter, r *http.Request, t target) {
	mr, err := r.MultipartReader()
	if err != nil {
		fail(w, http.StatusUnprocessableEntity, "want a multipart/form-data body with a \"file\" part: %v", err)
		return
	}
	for {
		part, err := mr.NextPart()
		if err != nil {
			fail(w, http.StatusUnprocessableEntity, "no \"file\" part: %v", err)
			return
		}
		if part.FormName() != "file" {
			continue
		}
		name := part.FileName()
		full, err := s.safePath(name)
		if err != nil || name == "" {
			fail(w, http.StatusForbidden, "Access denied")
			return
		}
		if err := s.ensureBase(ctx, t); err != nil {
			fail(w, http.StatusBadGateway, "%v", err)
			return
		}
		if dir := path.Dir(full); dir != s.cfg.BaseDir {
			f, err := t.node.Exec(ctx, t.id, &api.ExecRequest{Argv: []string{"mkdir", "-p", dir}, Timeout: "30s"}, nil, io.Discard, io.Discard)
			if err != nil || f.ExitCode == nil || *f.ExitCode != 0 {
				fail(w, http.StatusInternalServerError, "File upload failed: cannot make %s", dir)
				return
			}
		}
		lr := &io.LimitedReader{R: part, N: s.cfg.MaxUpload + 1}
		if err := t.node.WriteFile(ctx, t.id, full, 0o644, lr); err != nil {
			fail(w, http.StatusInternalServerError, "File upload failed: %v", err)
			return
		}
		if lr.N <= 0 {
			fail(w, http.StatusRequestEntityTooLarge, "File upload failed: larger than %d bytes", s.cfg.MaxUpload)
			return
		}
		writeJSON(w, 200, map[string]string{"message": fmt.Sprintf("File '%s' uploaded successfully.", name)})
		return
	}
}

// decoded is an escaped path of the URL, unescaped.
// requestPath is the path a route's rest names (percent-decoded) and that
// file beneath the base directory (safePath).
func (s *Server) requestPath(rest string) (rel, full string, err error) {
	if rel, err = url.PathUnescape(rest); err != nil {
		return "", "", err
	}
	full, err = s.safePath(rel)
	return rel, full, err
}

func (s *Server) download(ctx context.Context, w http.ResponseWriter, rest string, t target) {
	_, full, err := s.requestPath(rest)
	if err != nil {
		fail(w, http.StatusForbidden, "Access denied")
		return
	}
	b, err := t.node.ReadFile(ctx, t.id, full)
	if err != nil {
		if client.IsNotFound(err) {
			fail(w, http.StatusNotFound, "File not found")
			return
		}
		var ce *client.Error
		if errors.As(err, &ce) && ce.Status < 500 {
			fail(w, http.StatusNotFound, "File not found")
			return
		}
		fail(w, http.StatusBadGateway, "read: %v", err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(200)
	_, _ = w.Write(b)
}

func (s *Server) list(ctx context.Context, w http.ResponseWriter, rest string, t target) {
	_, full, err := s.requestPath(rest)
	if err != nil {
		fail(w, http.StatusForbidden, "Access denied")
		return
	}
	if err := s.ensureBase(ctx, t); err != nil {
		fail(w, http.StatusBadGateway, "%v", err)
		return
	}
	l, err := t.node.ListDir(ctx, t.id, full)
	if err != nil {
		var ce *client.Error
		if errors.As(err, &ce) && ce.Status < 500 {
			fail(w, http.StatusNotFound, "Path is not a directory")
			return
		}
		fail(w, http.StatusBadGateway, "list: %v", err)
		return
	}
	type entry struct {
		Name    string  `json:"name"`
		Size    int64   `json:"size"`
		Type    string  `json:"type"`
		ModTime float64 `json:"mod_time"`
	}
	out := make([]entry, 0, len(l))
	for _, fi := range l {
		typ := "file"
		if fi.IsDir {
			typ = "directory"
		}
		out = append(out, entry{Name: fi.Name, Size: fi.Size, Type: typ, ModTime: float64(fi.ModTime.UnixNano()) / 1e9})
	}
	writeJSON(w, 200, out)
}

func (s *Server) exists(ctx context.Context, w http.ResponseWriter, rest string, t target) {
	p, full, err := s.requestPath(rest)
	if err != nil {
		fail(w, http.StatusForbidden, "Access denied")
		return
	}
	f, err := t.node.Exec(ctx, t.id, &api.ExecRequest{Argv: []string{"test", "-e", full}, Timeout: "30s"}, nil, io.Discard, io.Discard)
	if err != nil || f.ExitCode == nil {
		fail(w, http.StatusBadGateway, "exists: %v", err)
		return
	}
	writeJSON(w, 200, map[string]any{"path": p, "exists": *f.ExitCode == 0})
}

// SplitCommand splits a command line as Python's shlex.split does in
// POSIX mode (the legacy runtime's): whitespace separates words, single
// quotes keep everything, double quotes keep all but \" \\ \$ \` and
// newline escapes, a backslash outside quotes escapes the next character,
// and # at the start of a word begins a comment.
func SplitCommand(s string) ([]string, error) {
	var (
		out    []string
		cur    strings.Builder
		inWord bool
	)
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			for i < len(rs) && rs[i] != '\n' {
				i++
			}
		case c == '\\':
			inWord = true
			if i+1 >= len(rs) {
				return nil, errors.New("No escaped character")
			}
			i++
			cur.WriteRune(rs[i])
		case c == '\'':
			inWord = true
			j := i + 1
			for j < len(rs) && rs[j] != '\'' {
				cur.WriteRune(rs[j])
				j++
			}
			if j >= len(rs) {
				return nil, errors.New("No closing quotation")
			}
			i = j
		case c == '"':
			inWord = true
			j := i + 1
			for ; j < len(rs) && rs[j] != '"'; j++ {
				if rs[j] == '\\' && j+1 < len(rs) && strings.ContainsRune("\"\\$`\n", rs[j+1]) {
					j++
				}
				cur.WriteRune(rs[j])
			}
			if j >= len(rs) {
				return nil, errors.New("No closing quotation")
			}
			i = j
		default:
			inWord = true
			cur.WriteRune(c)
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}
