package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// mcpReport is what test/mcp/client.mjs prints.
type mcpReport struct {
	Server *struct{ Name, Version string } `json:"server"`
	Tools  []struct {
		Name        string         `json:"name"`
		Description string         `json:"description"`
		InputSchema map[string]any `json:"inputSchema"`
	} `json:"tools"`
	Calls []struct {
		Name          string          `json:"name"`
		IsError       bool            `json:"isError"`
		Text          string          `json:"text"`
		Structured    json.RawMessage `json:"structured"`
		ProtocolError string          `json:"protocolError"`
	} `json:"calls"`
	Fatal string `json:"fatal"`
}

// mcpClientDir prepares test/mcp (the official TypeScript SDK from npm).
func mcpClientDir(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed (scripts/setup.sh installs nodejs)")
	}
	dir, err := filepath.Abs("../mcp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in test/mcp: %v\n%s", err, out)
		}
	}
	return dir
}

func runMCPClient(t *testing.T, dir string, env []string, calls []map[string]any) mcpReport {
	t.Helper()
	b, _ := json.Marshal(calls)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, "client.mjs"))
	cmd.Env = append(append(os.Environ(), env...), "MCP_CALLS="+string(b), "CAGEBOX_AGENT="+filepath.Join(binDir, "cagebox-agent"))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	runErr := cmd.Run()
	var r mcpReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("MCP client: %v (%v)\nstdout (%d bytes): %.2000s\nstderr: %.4000s", err, runErr, out.Len(), out.String(), errb.String())
	}
	if r.Fatal != "" {
		t.Fatalf("MCP client failed: %s\nstderr: %s", r.Fatal, errb.String())
	}
	return r
}

// TestMCP drives the MCP server with the official TypeScript SDK client,
// over stdio (`cagebox mcp`) and over streamable HTTP (/mcp with a
// tenant's API key): the registered tools and the built-ins are listed;
// execute and exec run for real; a refused request, a failing command, a
// timeout and oversized output come back as tool errors or notes; an
// unknown tool is a protocol error; no real secret is in any result; and a
// tenant sees only its own tools.
func TestMCP(t *testing.T) {
	dir := mcpClientDir(t)
	e := newEnv(t)
	addr := freePort(t)
	e.startDaemon("--listen", addr)
	const real = "sk_live_MCPRealValueNeverInAResult0000abcd"
	os.Setenv("CBX_MCP_SECRET", real)
	defer os.Unsetenv("CBX_MCP_SECRET")
	if r := e.cli("", "secret", "add", "API_KEY", "--host", "api.example.test", "--from-env", "CBX_MCP_SECRET"); r.code != 0 {
		t.Fatalf("secret add: %+v", r)
	}
	for _, add := range [][]string{
		{"greet", "--image", "busybox", "--description", "says hello", "--secret", "API_KEY=vault:API_KEY", "--", "sh", "-c", `read n; echo "hello $n"; echo "key=$API_KEY"`},
		{"leak", "--image", "busybox", "--", "sh", "-c", `wget -q -O- http://203.0.113.7/x; echo done`},
	} {
		if r := e.cli("", append([]string{"tool", "add"}, add...)...); r.code != 0 {
			t.Fatalf("tool add: %+v", r)
		}
	}
	calls := []map[string]any{
		{"name": "greet", "arguments": map[string]any{"input": "mcp"}},
		{"name": "leak", "arguments": map[string]any{"input": ""}},
		{"name": "sandbox_create", "arguments": map[string]any{"image": "busybox"}},
		{"name": "sandbox_exec", "arguments": map[string]any{"sandbox": "$SANDBOX", "shell": "echo hi; exit 3"}},
		{"name": "sandbox_exec", "arguments": map[string]any{"sandbox": "$SANDBOX", "shell": "head -c 200000 /dev/zero | tr '\\000' x"}},
		{"name": "sandbox_exec", "arguments": map[string]any{"sandbox": "$SANDBOX", "command": []string{"sleep", "30"}, "timeout": "1s"}},
		{"name": "sandbox_write_file", "arguments": map[string]any{"sandbox": "$SANDBOX", "path": "/tmp/n.txt", "content": "notes"}},
		{"name": "sandbox_read_file", "arguments": map[string]any{"sandbox": "$SANDBOX", "path": "/tmp/n.txt"}},
		{"name": "sandbox_list_files", "arguments": map[string]any{"sandbox": "$SANDBOX", "path": "/tmp"}},
		{"name": "sandbox_exec", "arguments": map[string]any{"sandbox": "sb-nosuch", "shell": "true"}},
		{"name": "nosuch_tool", "arguments": map[string]any{}},
		{"name": "sandbox_remove", "arguments": map[string]any{"sandbox": "$SANDBOX"}},
	}
	check := func(t *testing.T, r mcpReport) {
		names := map[string]bool{}
		for _, tl := range r.Tools {
			names[tl.Name] = true
		}
		for _, n := range []string{"greet", "leak", "sandbox_create", "sandbox_exec", "sandbox_read_file", "sandbox_write_file", "sandbox_list_files", "sandbox_list", "sandbox_remove", "request_access",
			"sandbox_snapshot", "sandbox_fork", "snapshot_list", "snapshot_remove"} {
			if !names[n] {
				t.Errorf("tool %s not listed (got %v)", n, names)
			}
		}
		if r.Server == nil || r.Server.Name != "cagebox" {
			t.Errorf("server info %+v", r.Server)
		}
		c := r.Calls
		if len(c) != len(calls) {
			t.Fatalf("%d results for %d calls: %+v", len(c), len(calls), c)
		}
		if c[0].IsError || !strings.HasPrefix(c[0].Text, "hello mcp\nkey=sk_live_") || strings.Contains(c[0].Text, real) {
			t.Errorf("greet: %+v", c[0])
		}
		var er api.ExecuteResult
		if err := json.Unmarshal(c[0].Structured, &er); err != nil || er.Tool != "greet" || er.ExitCode != 0 {
			t.Errorf("greet's structured result: %s (%v)", c[0].Structured, err)
		}
		if !c[1].IsError || !strings.Contains(c[1].Text, "egress denied") || !strings.Contains(c[1].Text, "literal-ip") {
			t.Errorf("leak: %+v", c[1])
		}
		if c[2].IsError || !strings.Contains(c[2].Text, "is running") {
			t.Fatalf("sandbox_create: %+v", c[2])
		}
		if !c[3].IsError || !strings.HasPrefix(c[3].Text, "hi\n") || !strings.Contains(c[3].Text, "[exit code 3]") {
			t.Errorf("exec exit 3: %+v", c[3])
		}
		if c[4].IsError || !strings.Contains(c[4].Text, "[stdout truncated at the output limit]") || len(c[4].Text) > 70000 {
			t.Errorf("big output: error %v, %d bytes", c[4].IsError, len(c[4].Text))
		}
		if !c[5].IsError || !strings.Contains(c[5].Text, "ran out of time") {
			t.Errorf("timeout: %+v", c[5])
		}
		if c[6].IsError || c[7].IsError || c[7].Text != "notes" {
			t.Errorf("write/read: %+v / %+v", c[6], c[7])
		}
		if !strings.Contains(c[8].Text, "n.txt") {
			t.Errorf("list files: %+v", c[8])
		}
		if !c[9].IsError || !strings.Contains(c[9].Text, "no sandbox") {
			t.Errorf("exec in an unknown sandbox: %+v", c[9])
		}
		if c[10].ProtocolError == "" && !c[10].IsError {
			t.Errorf("unknown tool: %+v", c[10])
		}
		if c[11].IsError {
			t.Errorf("remove: %+v", c[11])
		}
		for _, call := range c {
			if strings.Contains(call.Text, real) || strings.Contains(string(call.Structured), real) {
				t.Errorf("%s: a real secret in an MCP result", call.Name)
			}
		}
	}
	t.Run("stdio", func(t *testing.T) {
		// request_access waits for an operator: approve it as one would
		// (the approvals API), then the host is in the sandbox's policy.
		withAccess := append(append([]map[string]any(nil), calls[:len(calls)-1]...),
			map[string]any{"name": "request_access", "arguments": map[string]any{"sandbox": "$SANDBOX", "host": "api.example.test", "reason": "read the docs", "timeout": "60s"}},
			map[string]any{"name": "sandbox_exec", "arguments": map[string]any{"sandbox": "$SANDBOX", "shell": "nslookup api.example.test >/dev/null 2>&1 && echo resolved"}},
			calls[len(calls)-1])
		done := make(chan struct{})
		approved := make(chan string, 1)
		go func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(100 * time.Millisecond):
				}
				as, err := e.client().Approvals(context.Background(), "pending", "")
				if err != nil {
					continue
				}
				for _, a := range as {
					if a.Rule == "request_access" && strings.Contains(string(a.Request), "read the docs") {
						_, _ = e.client().DecideApproval(context.Background(), a.ID, &api.ApprovalDecision{Decision: "allow"})
						approved <- a.Sandbox
						return
					}
				}
			}
		}()
		r := runMCPClient(t, dir, []string{"MCP_MODE=stdio", "CAGEBOX_BIN=" + filepath.Join(binDir, "cagebox"), "CAGEBOX_HOME=" + e.home}, withAccess)
		close(done)
		n := len(r.Calls)
		access := r.Calls[n-3]
		if access.IsError || !strings.Contains(access.Text, "access to api.example.test granted") {
			t.Errorf("request_access: %+v", access)
		}
		select {
		case <-approved:
		default:
			t.Error("the access request never reached the approvals list")
		}
		// The approved host is in the sandbox's policy: its name resolves.
		if after := r.Calls[n-2]; after.IsError || !strings.HasPrefix(after.Text, "resolved") {
			t.Errorf("after the approval, the host does not resolve: %+v", after)
		}
		// Judge the shared calls as for HTTP.
		r.Calls = append(r.Calls[:n-3], r.Calls[n-1])
		check(t, r)
	})
	t.Run("http", func(t *testing.T) {
		// A tenant with a key of its own: its tools are its own.
		if r := e.cli("", "tenant", "create", "mcpt"); r.code != 0 {
			t.Fatalf("tenant create: %+v", r)
		}
		k := e.cli("", "tenant", "key", "mcpt")
		key := strings.TrimSpace(k.stdout)
		tcp := []string{"CAGEBOX_HOST=http://" + addr, "CAGEBOX_API_KEY=" + key}
		// The tenant registers its own tools (the admin's are not its).
		for _, add := range [][]string{
			{"greet", "--image", "busybox", "--description", "says hello", "--", "sh", "-c", `read n; echo "hello $n"; echo "key=sk_live_placeholder"`},
			{"leak", "--image", "busybox", "--", "sh", "-c", `wget -q -O- http://203.0.113.7/x; echo done`},
		} {
			r := e.cliEnv(tcp, "", append([]string{"tool", "add"}, add...)...)
			if r.code != 0 {
				t.Fatalf("tenant tool add: %+v", r)
			}
		}
		check(t, runMCPClient(t, dir, []string{"MCP_MODE=http", "MCP_URL=http://" + addr + "/mcp", "MCP_API_KEY=" + key}, calls))
		// Without a key: 401.
		r := runMCPClientRaw(t, dir, []string{"MCP_MODE=http", "MCP_URL=http://" + addr + "/mcp", "MCP_API_KEY=cbk_wrong"})
		if r.Fatal == "" || !strings.Contains(r.Fatal, "unauthorized") {
			t.Errorf("a wrong key: %+v", r)
		}
	})
}

// TestMCPSnapshots: an agent checkpoints and branches through MCP with the
// official TypeScript SDK client: sandbox_snapshot saves a prepared
// sandbox, sandbox_fork copies it twice, sandbox_create from_snapshot
// starts from the checkpoint; every copy sees the prepared files and none
// sees another's writes; a snapshot in use cannot be removed, and once its
// sandbox is gone snapshot_remove takes it.
func TestMCPSnapshots(t *testing.T) {
	dir := mcpClientDir(t)
	e := newEnv(t)
	e.startDaemon()
	exec := func(sb, shell string) map[string]any {
		return map[string]any{"name": "sandbox_exec", "arguments": map[string]any{"sandbox": sb, "shell": shell}}
	}
	calls := []map[string]any{
		{"name": "sandbox_create", "arguments": map[string]any{"image": "busybox"}},
		exec("$SANDBOX", "mkdir -p /work && echo prepared > /work/state"),
		{"name": "sandbox_snapshot", "arguments": map[string]any{"sandbox": "$SANDBOX", "name": "mcp-prepared"}},
		{"name": "sandbox_fork", "arguments": map[string]any{"sandbox": "$SANDBOX", "count": 2}},
		exec("$FORK0", "cat /work/state; echo zero > /work/mine"),
		exec("$FORK1", "cat /work/state; cat /work/mine 2>/dev/null || echo none"),
		{"name": "snapshot_list", "arguments": map[string]any{}},
		{"name": "sandbox_create", "arguments": map[string]any{"from_snapshot": "mcp-prepared"}},
		exec("$SANDBOX", "cat /work/state"),
		{"name": "snapshot_remove", "arguments": map[string]any{"name": "mcp-prepared"}},
		{"name": "sandbox_snapshot", "arguments": map[string]any{"sandbox": "sb-nosuch"}},
		{"name": "sandbox_remove", "arguments": map[string]any{"sandbox": "$SANDBOX"}},
	}
	r := runMCPClient(t, dir, []string{"MCP_MODE=stdio", "CAGEBOX_BIN=" + filepath.Join(binDir, "cagebox"), "CAGEBOX_HOME=" + e.home}, calls)
	c := r.Calls
	if len(c) != len(calls) {
		t.Fatalf("%d results for %d calls: %+v", len(c), len(calls), c)
	}
	for i, call := range c {
		if call.ProtocolError != "" {
			t.Fatalf("call %d (%s): protocol error %s", i, call.Name, call.ProtocolError)
		}
	}
	if c[2].IsError || !strings.Contains(c[2].Text, "snapshot mcp-prepared of sb-") {
		t.Fatalf("sandbox_snapshot: %+v", c[2])
	}
	var sn api.Snapshot
	if err := json.Unmarshal(c[2].Structured, &sn); err != nil || sn.Name != "mcp-prepared" || sn.Kind != "filesystem" || sn.Digest == "" {
		t.Errorf("sandbox_snapshot's structured result: %s (%v)", c[2].Structured, err)
	}
	var fk struct {
		Sandboxes []string `json:"sandboxes"`
		Snapshot  string   `json:"snapshot"`
	}
	if err := json.Unmarshal(c[3].Structured, &fk); c[3].IsError || err != nil || len(fk.Sandboxes) != 2 || fk.Snapshot == "" {
		t.Fatalf("sandbox_fork: %+v (%v)", c[3], err)
	}
	if c[4].IsError || !strings.HasPrefix(c[4].Text, "prepared\n") {
		t.Errorf("fork 0 does not see the prepared state: %+v", c[4])
	}
	if c[5].IsError || !strings.HasPrefix(c[5].Text, "prepared\nnone\n") {
		t.Errorf("fork 1: %+v; want the prepared state and not fork 0's write", c[5])
	}
	if !strings.Contains(c[6].Text, "mcp-prepared\tfilesystem") || !strings.Contains(c[6].Text, fk.Snapshot+"\t") {
		t.Errorf("snapshot_list: %q; want the named snapshot and the fork's", c[6].Text)
	}
	if c[7].IsError || c[8].IsError || !strings.HasPrefix(c[8].Text, "prepared\n") {
		t.Errorf("a sandbox created from the snapshot: %+v / %+v", c[7], c[8])
	}
	if !c[9].IsError || !strings.Contains(c[9].Text, "in use") {
		t.Errorf("snapshot_remove while in use: %+v; want a refusal", c[9])
	}
	if !c[10].IsError || !strings.Contains(c[10].Text, "no sandbox") {
		t.Errorf("sandbox_snapshot of an unknown sandbox: %+v", c[10])
	}
	if c[11].IsError {
		t.Errorf("sandbox_remove: %+v", c[11])
	}
	// Once the sandbox started from it is gone, the snapshot can go.
	var restored struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(c[7].Structured, &restored)
	waitFor(t, 60*time.Second, "the sandbox started from the snapshot to be gone", func() bool {
		_, err := e.client().Get(context.Background(), restored.ID)
		return client.IsNotFound(err)
	})
	removed := []map[string]any{{"name": "snapshot_remove", "arguments": map[string]any{"name": "mcp-prepared"}}}
	if rc := runMCPClient(t, dir, []string{"MCP_MODE=stdio", "CAGEBOX_BIN=" + filepath.Join(binDir, "cagebox"), "CAGEBOX_HOME=" + e.home}, removed).Calls[0]; rc.IsError {
		t.Errorf("snapshot_remove once unused: %+v", rc)
	}
	if l, err := e.client().Snapshots(context.Background()); err != nil || len(l) != 1 || l[0].Name != fk.Snapshot {
		t.Errorf("snapshots left: %+v %v; want only the fork's (its copies still run)", l, err)
	}
}

// runMCPClientRaw runs the client and returns its report even when it failed.
func runMCPClientRaw(t *testing.T, dir string, env []string) mcpReport {
	t.Helper()
	cmd := exec.Command("node", filepath.Join(dir, "client.mjs"))
	cmd.Env = append(os.Environ(), env...)
	out, _ := cmd.Output()
	var r mcpReport
	_ = json.Unmarshal(out, &r)
	return r
}
