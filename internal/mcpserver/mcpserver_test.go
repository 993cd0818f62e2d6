package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cagebox/cagebox/api"
)

// fake is a Backend in memory.
type fake struct {
	tools    []api.Tool
	executed []string
	files    map[string][]byte
	access   *api.AccessRequest
	created  *api.CreateSandboxRequest
	snaps    []api.Snapshot
}

func (f *fake) Tools(context.Context) ([]api.Tool, error) { return f.tools, nil }
func (f *fake) Execute(_ context.Context, name string, req *api.ExecuteRequest) (*api.ExecuteResult, error) {
	f.executed = append(f.executed, name+":"+req.Input)
	switch name {
	case "echo":
		return &api.ExecuteResult{Tool: name, Stdout: "got " + req.Input, Egress: []api.EgressDecision{}}, nil
	case "leaky":
		return &api.ExecuteResult{Tool: name, ExitCode: 7, Stdout: "x", Egress: []api.EgressDecision{{Host: "evil.example", Method: "POST", Path: "/", Rule: "default", Reason: "no rule allows it"}}}, nil
	}
	return nil, fmt.Errorf("no tool %q", name)
}
func (f *fake) Create(_ context.Context, req *api.CreateSandboxRequest) (*api.Sandbox, error) {
	f.created = req
	return &api.Sandbox{ID: "sb-1", Runtime: "container", Image: "default", Status: "running"}, nil
}
func (f *fake) List(context.Context) ([]api.Sandbox, error) {
	return []api.Sandbox{{ID: "sb-1", Status: "running", Runtime: "container", Image: "default"}}, nil
}
func (f *fake) Remove(_ context.Context, id string) error {
	if id != "sb-1" {
		return errors.New("no sandbox")
	}
	return nil
}
func (f *fake) Exec(_ context.Context, id string, req *api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*api.ExecFrame, error) {
	if id != "sb-1" {
		return nil, fmt.Errorf("no sandbox %q", id)
	}
	code := 0
	switch req.Argv[len(req.Argv)-1] {
	case "big":
		stdout.Write([]byte(strings.Repeat("x", 100<<10)))
	case "fail":
		stderr.Write([]byte("boom"))
		code = 2
	case "slow":
		return &api.ExecFrame{ExitCode: &code, TimedOut: true}, nil
	default:
		if stdin != nil {
			b, _ := io.ReadAll(stdin)
			stdout.Write(b)
		}
	}
	return &api.ExecFrame{ExitCode: &code}, nil
}
func (f *fake) ReadFile(_ context.Context, id, path string) ([]byte, error) {
	if b, ok := f.files[path]; ok {
		return b, nil
	}
	return nil, errors.New("not found")
}
func (f *fake) WriteFile(_ context.Context, id, path string, data []byte) error {
	f.files[path] = data
	return nil
}
func (f *fake) ListDir(context.Context, string, string) ([]api.FileInfo, error) {
	return []api.FileInfo{{Name: "a.txt", Size: 3, Mode: "-rw-r--r--"}}, nil
}
func (f *fake) RequestAccess(_ context.Context, id string, req *api.AccessRequest) (*api.AccessResult, error) {
	f.access = req
	return &api.AccessResult{Approval: "ap-1", Allowed: req.Host == "ok.example", By: "api:admin", Reason: "no"}, nil
}

func (f *fake) Snapshot(_ context.Context, id, name string) (*api.Snapshot, error) {
	if id != "sb-1" {
		return nil, fmt.Errorf("no sandbox %q", id)
	}
	if name == "" {
		name = "snap-1"
	}
	sn := api.Snapshot{Name: name, Sandbox: id, Kind: "filesystem", Runtime: "container", SizeBytes: 4096}
	f.snaps = append(f.snaps, sn)
	return &sn, nil
}
func (f *fake) Snapshots(context.Context) ([]api.Snapshot, error) { return f.snaps, nil }
func (f *fake) RemoveSnapshot(_ context.Context, name string) error {
	for i, sn := range f.snaps {
		if sn.Name == name {
			f.snaps = append(f.snaps[:i], f.snaps[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("no snapshot %q", name)
}
func (f *fake) Fork(_ context.Context, id string, req *api.ForkRequest) (*api.ForkResponse, error) {
	if id != "sb-1" {
		return nil, fmt.Errorf("no sandbox %q", id)
	}
	res := &api.ForkResponse{Snapshot: api.Snapshot{Name: "fork-1", Fork: true}}
	for i := 0; i < max(req.Count, 1); i++ {
		res.Sandboxes = append(res.Sandboxes, api.Sandbox{ID: fmt.Sprintf("sb-f%d", i)})
	}
	return res, nil
}

func session(t *testing.T, b Backend) *mcp.ClientSession {
	t.Helper()
	s, err := New(context.Background(), b, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	c := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil)
	cs, err := c.Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res.IsError
}

func TestTools(t *testing.T) {
	f := &fake{files: map[string][]byte{}, tools: []api.Tool{
		{Name: "echo", Argv: []string{"cat"}},
		{Name: "leaky", Argv: []string{"curl"}, Description: "posts things", InputSchema: []byte(`{"type":"object","properties":{"url":{"type":"string"}}}`)},
		{Name: "sandbox_exec", Argv: []string{"true"}}, // shadowed by the built-in
	}}
	cs := session(t, f)
	lt, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]*mcp.Tool{}
	for _, tl := range lt.Tools {
		names[tl.Name] = tl
	}
	for _, n := range append([]string{"echo", "leaky"}, builtins...) {
		if names[n] == nil {
			t.Errorf("tool %s not listed", n)
		}
	}
	if len(lt.Tools) != 2+len(builtins) {
		t.Errorf("%d tools listed", len(lt.Tools))
	}
	if d := names["leaky"].Description; !strings.Contains(d, "posts things") || !strings.Contains(d, "JSON") {
		t.Errorf("leaky's description %q", d)
	}

	if out, isErr := call(t, cs, "echo", map[string]any{"input": "hi"}); isErr || !strings.HasPrefix(out, "got hi") || !strings.Contains(out, "[exit code 0]") {
		t.Errorf("echo: %q %v", out, isErr)
	}
	// A declared schema: the arguments go in as JSON; a refused request
	// and a non-zero exit are tool errors the model sees.
	out, isErr := call(t, cs, "leaky", map[string]any{"url": "https://evil.example"})
	if !isErr || !strings.Contains(out, "egress denied: POST evil.example/") || !strings.Contains(out, "[exit code 7]") {
		t.Errorf("leaky: %q %v", out, isErr)
	}
	if f.executed[1] != `leaky:{"url":"https://evil.example"}` {
		t.Errorf("leaky's input %q", f.executed[1])
	}
	// Unknown tool: a protocol error.
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "nosuch", Arguments: map[string]any{}}); err == nil {
		t.Error("unknown tool: no error")
	}
}

func TestSandboxTools(t *testing.T) {
	f := &fake{files: map[string][]byte{}}
	cs := session(t, f)
	if out, isErr := call(t, cs, "sandbox_create", map[string]any{"allow": []string{"api.example.com"}}); isErr || !strings.Contains(out, "sb-1") {
		t.Errorf("create: %q", out)
	}
	if out, isErr := call(t, cs, "sandbox_exec", map[string]any{"sandbox": "sb-1", "command": []string{"cat"}, "stdin": "hello"}); isErr || !strings.HasPrefix(out, "hello") {
		t.Errorf("exec: %q %v", out, isErr)
	}
	out, isErr := call(t, cs, "sandbox_exec", map[string]any{"sandbox": "sb-1", "shell": "big"})
	if isErr || !strings.Contains(out, "[stdout truncated at the output limit]") || len(out) > DefaultMaxOutput+200 {
		t.Errorf("big output: %d bytes, error %v", len(out), isErr)
	}
	if out, isErr := call(t, cs, "sandbox_exec", map[string]any{"sandbox": "sb-1", "command": []string{"fail"}}); !isErr || !strings.Contains(out, "[stderr]\nboom") || !strings.Contains(out, "[exit code 2]") {
		t.Errorf("failing command: %q %v", out, isErr)
	}
	if out, isErr := call(t, cs, "sandbox_exec", map[string]any{"sandbox": "sb-1", "command": []string{"slow"}}); !isErr || !strings.Contains(out, "ran out of time") {
		t.Errorf("timeout: %q %v", out, isErr)
	}
	for _, bad := range []map[string]any{
		{"sandbox": "sb-1"},
		{"sandbox": "sb-1", "shell": "x", "command": []string{"y"}},
		{"sandbox": "sb-1", "shell": "x", "timeout": "forever"},
		{"sandbox": "sb-9", "shell": "x"},
	} {
		if _, isErr := call(t, cs, "sandbox_exec", bad); !isErr {
			t.Errorf("exec %v: not an error", bad)
		}
	}
	if _, isErr := call(t, cs, "sandbox_write_file", map[string]any{"sandbox": "sb-1", "path": "/a.txt", "content": "abc"}); isErr {
		t.Error("write")
	}
	if out, isErr := call(t, cs, "sandbox_read_file", map[string]any{"sandbox": "sb-1", "path": "/a.txt"}); isErr || out != "abc" {
		t.Errorf("read: %q", out)
	}
	f.files["/bin"] = []byte{0xff, 0xfe, 0}
	if out, isErr := call(t, cs, "sandbox_read_file", map[string]any{"sandbox": "sb-1", "path": "/bin"}); !isErr || !strings.Contains(out, "not text") {
		t.Errorf("binary read: %q", out)
	}
	if out, _ := call(t, cs, "sandbox_list_files", map[string]any{"sandbox": "sb-1", "path": "/"}); !strings.Contains(out, "a.txt") {
		t.Errorf("list files: %q", out)
	}
	if out, _ := call(t, cs, "sandbox_list", map[string]any{}); !strings.Contains(out, "sb-1\trunning") {
		t.Errorf("list: %q", out)
	}
	if out, isErr := call(t, cs, "request_access", map[string]any{"sandbox": "sb-1", "host": "ok.example", "reason": "docs"}); isErr || !strings.Contains(out, "granted") || f.access.Reason != "docs" {
		t.Errorf("access granted: %q", out)
	}
	if out, isErr := call(t, cs, "request_access", map[string]any{"sandbox": "sb-1", "host": "no.example", "reason": "x"}); !isErr || !strings.Contains(out, "not granted") {
		t.Errorf("access denied: %q", out)
	}
	if _, isErr := call(t, cs, "sandbox_remove", map[string]any{"sandbox": "sb-1"}); isErr {
		t.Error("remove")
	}
}

// TestSnapshotTools: sandbox_snapshot, sandbox_fork, snapshot_list and
// snapshot_remove reach the backend with what the model gave, and
// sandbox_create passes from_snapshot on.
func TestSnapshotTools(t *testing.T) {
	f := &fake{files: map[string][]byte{}}
	cs := session(t, f)
	if out, isErr := call(t, cs, "sandbox_snapshot", map[string]any{"sandbox": "sb-1", "name": "before-risk"}); isErr || !strings.Contains(out, "snapshot before-risk of sb-1 saved (filesystem, 4096 bytes)") {
		t.Errorf("snapshot: %q %v", out, isErr)
	}
	if out, isErr := call(t, cs, "sandbox_snapshot", map[string]any{"sandbox": "sb-9"}); !isErr || !strings.Contains(out, "no sandbox") {
		t.Errorf("snapshot of an unknown sandbox: %q %v", out, isErr)
	}
	if out, _ := call(t, cs, "snapshot_list", map[string]any{}); !strings.Contains(out, "before-risk\tfilesystem\tcontainer\t4096 bytes") {
		t.Errorf("snapshot_list: %q", out)
	}
	if _, isErr := call(t, cs, "sandbox_create", map[string]any{"from_snapshot": "before-risk"}); isErr || f.created.FromSnapshot != "before-risk" {
		t.Errorf("create from a snapshot: %+v", f.created)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sandbox_fork", Arguments: map[string]any{"sandbox": "sb-1", "count": 2}})
	if err != nil || res.IsError {
		t.Fatalf("fork: %v %+v", err, res)
	}
	if tc := res.Content[0].(*mcp.TextContent); tc.Text != "forked sb-1 into sb-f0, sb-f1" {
		t.Errorf("fork's text %q", tc.Text)
	}
	if b, _ := json.Marshal(res.StructuredContent); string(b) != `{"sandboxes":["sb-f0","sb-f1"],"snapshot":"fork-1"}` {
		t.Errorf("fork's structured result %s", b)
	}
	if _, isErr := call(t, cs, "snapshot_remove", map[string]any{"name": "before-risk"}); isErr || len(f.snaps) != 0 {
		t.Errorf("snapshot_remove: %v", f.snaps)
	}
	if out, isErr := call(t, cs, "snapshot_remove", map[string]any{"name": "before-risk"}); !isErr || !strings.Contains(out, "no snapshot") {
		t.Errorf("snapshot_remove again: %q %v", out, isErr)
	}
}
