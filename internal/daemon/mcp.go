package daemon

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/mcpserver"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
)

// The MCP server over streamable HTTP at /mcp: the caller authenticates as
// for the API (an API key over TCP; the unix socket is the admin), and its
// MCP session works as its tenant through the sandbox manager.

// mcpMaxRead bounds a file an MCP client reads.
const mcpMaxRead = mcpserver.MaxFileRead + 1

// managerBackend is an mcpserver.Backend over the sandbox manager, as
// tenant t.
type managerBackend struct {
	mgr *sandbox.Manager
	t   *store.Tenant
}

var _ mcpserver.Backend = managerBackend{}

func (b managerBackend) Tools(ctx context.Context) ([]api.Tool, error) {
	l, err := b.mgr.Tools().ListTools(ctx, b.t.ID)
	if err != nil {
		return nil, err
	}
	out := make([]api.Tool, 0, len(l))
	for _, t := range l {
		out = append(out, *t)
	}
	return out, nil
}
func (b managerBackend) Execute(ctx context.Context, name string, req *api.ExecuteRequest) (*api.ExecuteResult, error) {
	return b.mgr.Tools().Execute(ctx, b.t, name, req)
}
func (b managerBackend) Create(ctx context.Context, req *api.CreateSandboxRequest) (*api.Sandbox, error) {
	return b.mgr.Create(ctx, b.t, req)
}
func (b managerBackend) List(ctx context.Context) ([]api.Sandbox, error) {
	l, err := b.mgr.List(ctx, scope(b.t))
	if err != nil {
		return nil, err
	}
	out := make([]api.Sandbox, 0, len(l))
	for _, s := range l {
		out = append(out, *s)
	}
	return out, nil
}
func (b managerBackend) Remove(ctx context.Context, id string) error {
	return b.mgr.RemoveAsync(ctx, scope(b.t), id)
}
func (b managerBackend) Exec(ctx context.Context, id string, req *api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*api.ExecFrame, error) {
	return b.mgr.Guest().Exec(ctx, scope(b.t), id, req, stdin, sandbox.ExecOutput{Stdout: stdout, Stderr: stderr})
}
func (b managerBackend) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	var buf bytes.Buffer
	if err := b.mgr.Guest().ReadFile(ctx, scope(b.t), id, path, &buf, mcpMaxRead); err != nil {
		return nil, agentErr(err)
	}
	return buf.Bytes(), nil
}
func (b managerBackend) WriteFile(ctx context.Context, id, path string, data []byte) error {
	return b.mgr.Guest().WriteFile(ctx, scope(b.t), id, path, 0o644, bytes.NewReader(data))
}
func (b managerBackend) ListDir(ctx context.Context, id, path string) ([]api.FileInfo, error) {
	l, err := b.mgr.Guest().ListDir(ctx, scope(b.t), id, path)
	if err != nil {
		return nil, agentErr(err)
	}
	out := make([]api.FileInfo, 0, len(l))
	for _, f := range l {
		out = append(out, api.FileInfo{Name: f.Name, Size: f.Size, Mode: f.Mode.String(), ModTime: f.ModTime, IsDir: f.IsDir})
	}
	return out, nil
}
func (b managerBackend) RequestAccess(ctx context.Context, id string, req *api.AccessRequest) (*api.AccessResult, error) {
	wait, err := accessWait(req.Timeout)
	if err != nil {
		return nil, err
	}
	return b.mgr.RequestAccess(ctx, scope(b.t), id, req.Host, req.Reason, wait)
}

func (b managerBackend) Snapshot(ctx context.Context, id, name string) (*api.Snapshot, error) {
	return b.mgr.Snapshots().Create(ctx, scope(b.t), id, name)
}
func (b managerBackend) Snapshots(ctx context.Context) ([]api.Snapshot, error) {
	l, err := b.mgr.Snapshots().List(ctx, scope(b.t))
	if err != nil {
		return nil, err
	}
	out := make([]api.Snapshot, 0, len(l))
	for _, sn := range l {
		out = append(out, *sn)
	}
	return out, nil
}
func (b managerBackend) RemoveSnapshot(ctx context.Context, name string) error {
	return b.mgr.Snapshots().Remove(ctx, scope(b.t), name)
}
func (b managerBackend) Fork(ctx context.Context, id string, req *api.ForkRequest) (*api.ForkResponse, error) {
	return b.mgr.Snapshots().Fork(ctx, scope(b.t), id, req)
}

// mcpHandler serves /mcp. Each tenant has its own streamable-HTTP handler,
// so a session id is only ever found by the tenant that made it.
type mcpHandler struct {
	s *Server

	// mu guards byTenant.
	mu       sync.Mutex
	byTenant map[string]*mcp.StreamableHTTPHandler
}

func (h *mcpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, err := h.s.authenticate(r)
	if err != nil {
		h.s.writeError(w, r, err)
		return
	}
	h.mu.Lock()
	sh := h.byTenant[t.ID]
	if sh == nil {
		sh = mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
			// A session's tools are the tenant's when it starts.
			srv, err := mcpserver.New(r.Context(), managerBackend{mgr: h.s.mgr, t: t}, h.s.log.With("part", "mcp", "tenant", t.ID))
			if err != nil {
				h.s.log.Error("mcp session", "tenant", t.ID, "err", err)
				return nil
			}
			return srv
		}, &mcp.StreamableHTTPOptions{Logger: h.s.log.With("part", "mcp")})
		h.byTenant[t.ID] = sh
	}
	h.mu.Unlock()
	sh.ServeHTTP(w, r)
}
