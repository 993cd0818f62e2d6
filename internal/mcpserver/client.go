package mcpserver

import (
	"bytes"
	"context"
	"io"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// ClientBackend is a Backend over the API client (`cagebox mcp`): the
// caller's tenant is the client's (the unix socket's admin, or an API
// key's).
type ClientBackend struct{ C *client.Client }

var _ Backend = ClientBackend{}

func (b ClientBackend) Tools(ctx context.Context) ([]api.Tool, error) { return b.C.Tools(ctx) }
func (b ClientBackend) Execute(ctx context.Context, name string, req *api.ExecuteRequest) (*api.ExecuteResult, error) {
	return b.C.Execute(ctx, name, req)
}
func (b ClientBackend) Create(ctx context.Context, req *api.CreateSandboxRequest) (*api.Sandbox, error) {
	return b.C.Create(ctx, req)
}
func (b ClientBackend) List(ctx context.Context) ([]api.Sandbox, error) { return b.C.List(ctx) }
func (b ClientBackend) Remove(ctx context.Context, id string) error     { return b.C.Remove(ctx, id) }
func (b ClientBackend) Exec(ctx context.Context, id string, req *api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*api.ExecFrame, error) {
	return b.C.Exec(ctx, id, req, stdin, stdout, stderr)
}
func (b ClientBackend) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	return b.C.ReadFile(ctx, id, path)
}
func (b ClientBackend) WriteFile(ctx context.Context, id, path string, data []byte) error {
	return b.C.WriteFile(ctx, id, path, 0o644, bytes.NewReader(data))
}
func (b ClientBackend) ListDir(ctx context.Context, id, path string) ([]api.FileInfo, error) {
	return b.C.ListDir(ctx, id, path)
}
func (b ClientBackend) RequestAccess(ctx context.Context, id string, req *api.AccessRequest) (*api.AccessResult, error) {
	return b.C.RequestAccess(ctx, id, req)
}
func (b ClientBackend) Snapshot(ctx context.Context, id, name string) (*api.Snapshot, error) {
	return b.C.CreateSnapshot(ctx, id, name)
}
func (b ClientBackend) Snapshots(ctx context.Context) ([]api.Snapshot, error) {
	return b.C.Snapshots(ctx)
}
func (b ClientBackend) RemoveSnapshot(ctx context.Context, name string) error {
	return b.C.RemoveSnapshot(ctx, name)
}
func (b ClientBackend) Fork(ctx context.Context, id string, req *api.ForkRequest) (*api.ForkResponse, error) {
	return b.C.Fork(ctx, id, req)
}
