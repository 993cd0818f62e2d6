// Package mcpserver is cagebox's Model Context Protocol server (with the
// official Go SDK, github.com/modelcontextprotocol/go-sdk): every tool the
// tenant registered (execute(name, input)) as an MCP tool of its own, and
// sandbox tools — create (also from a snapshot), exec (bounded output,
// timeout), read, write and list files, list, remove, snapshot and fork,
// and the snapshots' list and removal — plus request_access, which asks an operator
// for a host. It serves over stdio (`cagebox mcp`, through the API client)
// and streamable HTTP (the daemon's /mcp, through the sandbox manager as
// the caller's tenant); both reach cagebox through a Backend.
//
// Nothing a tool returns holds a real secret: guests only ever hold
// placeholders, and results carry what the guest printed.
package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cagebox/cagebox/api"
)

// Backend is what the MCP tools do, as the caller's tenant.
type Backend interface {
	Tools(ctx context.Context) ([]api.Tool, error)
	Execute(ctx context.Context, name string, req *api.ExecuteRequest) (*api.ExecuteResult, error)
	Create(ctx context.Context, req *api.CreateSandboxRequest) (*api.Sandbox, error)
	List(ctx context.Context) ([]api.Sandbox, error)
	Remove(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, req *api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*api.ExecFrame, error)
	ReadFile(ctx context.Context, id, path string) ([]byte, error)
	WriteFile(ctx context.Context, id, path string, data []byte) error
	ListDir(ctx context.Context, id, path string) ([]api.FileInfo, error)
	RequestAccess(ctx context.Context, id string, req *api.AccessRequest) (*api.AccessResult, error)
	Snapshot(ctx context.Context, id, name string) (*api.Snapshot, error)
	Snapshots(ctx context.Context) ([]api.Snapshot, error)
	RemoveSnapshot(ctx context.Context, name string) error
	Fork(ctx context.Context, id string, req *api.ForkRequest) (*api.ForkResponse, error)
}

// Limits of tool results.
const (
	// DefaultMaxOutput and MaxOutput bound what an exec or execute
	// returns of stdout and of stderr (the rest is cut, with a note).
	DefaultMaxOutput = 64 << 10
	MaxOutput        = 1 << 20
	// MaxFileRead bounds read_file.
	MaxFileRead = 1 << 20
	// DefaultExecTimeout and MaxExecTimeout bound sandbox_exec.
	DefaultExecTimeout = 60 * time.Second
	MaxExecTimeout     = 10 * time.Minute
)

// Names of the built-in tools; a registered tool with one of these names
// is not offered over MCP.
var builtins = []string{"sandbox_create", "sandbox_exec", "sandbox_read_file", "sandbox_write_file",
	"sandbox_list_files", "sandbox_list", "sandbox_remove", "request_access",
	"sandbox_snapshot", "sandbox_fork", "snapshot_list", "snapshot_remove"}

// Version is reported to clients.
var Version = "dev"

// New returns an MCP server offering b's registered tools (as they are
// now) and the built-in sandbox tools.
func New(ctx context.Context, b Backend, log *slog.Logger) (*mcp.Server, error) {
	if log == nil {
		log = slog.Default()
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "cagebox", Version: Version}, &mcp.ServerOptions{
		Instructions: "cagebox runs code in isolated sandboxes. Registered tools run in a fresh sandbox per call. " +
			"sandbox_* tools manage long-lived sandboxes; their network is deny-by-default: request_access asks an operator for a host. " +
			"Credentials inside sandboxes are placeholders that the egress gateway swaps for real values.",
	})
	addBuiltins(s, b)
	tools, err := b.Tools(ctx)
	if err != nil {
		return nil, fmt.Errorf("list tools: %w", err)
	}
	for _, t := range tools {
		if isBuiltin(t.Name) {
			log.Warn("a registered tool has a built-in's name and is not offered over MCP", "tool", t.Name)
			continue
		}
		addRegistered(s, b, t)
	}
	return s, nil
}

func isBuiltin(name string) bool {
	for _, n := range builtins {
		if n == name {
			return true
		}
	}
	return false
}

// defaultInputSchema is a registered tool's input when it declares none.
var defaultInputSchema = json.RawMessage(`{"type":"object","properties":{"input":{"type":"string","description":"the tool's input (its stdin)"}},"required":["input"]}`)

func addRegistered(s *mcp.Server, b Backend, t api.Tool) {
	schema, declared := defaultInputSchema, len(t.InputSchema) > 0
	if declared {
		schema = t.InputSchema
	}
	desc := t.Description
	if desc == "" {
		desc = "Runs `" + strings.Join(t.Argv, " ") + "` in a fresh sandbox."
	}
	if declared {
		desc += " The arguments are given to it as JSON."
	}
	name := t.Name
	s.AddTool(&mcp.Tool{Name: name, Description: desc, InputSchema: schema}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var input string
		if declared {
			input = string(req.Params.Arguments)
		} else {
			var args struct {
				Input string `json:"input"`
			}
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
				return toolError("arguments: want {\"input\": \"…\"}: %v", err), nil
			}
			input = args.Input
		}
		res, err := b.Execute(ctx, name, &api.ExecuteRequest{Input: input, MaxOutput: DefaultMaxOutput})
		if err != nil {
			return toolError("%s: %v", name, err), nil
		}
		return executeResult(res), nil
	})
}

// executeResult is an execute's result for a model: the output as text,
// notes for truncation, timeouts and refused requests, and the whole
// result as structured content. A non-zero exit, a timeout or a refused
// request is a tool error.
func executeResult(res *api.ExecuteResult) *mcp.CallToolResult {
	var notes []string
	for _, d := range res.Egress {
		if !d.Allowed {
			host := d.Host
			if host == "" {
				host = "(an address, not a name)"
			}
			notes = append(notes, fmt.Sprintf("egress denied: %s %s%s — rule %s: %s", d.Method, host, d.Path, d.Rule, d.Reason))
		}
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: outputText(res.Stdout, res.Stderr, res.StdoutTruncated, res.StderrTruncated, res.ExitCode, res.TimedOut, notes)}},
		StructuredContent: res,
		IsError:           res.ExitCode != 0 || res.TimedOut || len(notes) > 0,
	}
}

func outputText(stdout, stderr string, cutOut, cutErr bool, exit int, timedOut bool, notes []string) string {
	var b strings.Builder
	b.WriteString(stdout)
	if cutOut {
		b.WriteString("\n[stdout truncated at the output limit]")
	}
	if stderr != "" || cutErr {
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteString("\n")
		}
		b.WriteString("[stderr]\n")
		b.WriteString(stderr)
		if cutErr {
			b.WriteString("\n[stderr truncated at the output limit]")
		}
	}
	if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
		b.WriteString("\n")
	}
	if timedOut {
		b.WriteString("[the command ran out of time and was killed]\n")
	}
	for _, n := range notes {
		b.WriteString("[" + n + "]\n")
	}
	fmt.Fprintf(&b, "[exit code %d]", exit)
	return b.String()
}

func toolError(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}, IsError: true}
}

// Arguments of the built-in tools (their JSON Schemas are inferred).
type (
	createArgs struct {
		Runtime   string   `json:"runtime,omitempty" jsonschema:"runtime name (container, gvisor, qemu) or auto; default: the daemon's"`
		Image     string   `json:"image,omitempty" jsonschema:"guest image; default: default"`
		Allow     []string `json:"allow,omitempty" jsonschema:"hosts the sandbox may reach over HTTP(S); default: none"`
		PolicyRef string   `json:"policy_ref,omitempty" jsonschema:"a named egress policy to follow"`
		Memory    int64    `json:"memory_mb,omitempty" jsonschema:"memory limit in MiB"`
		Timeout   string   `json:"timeout,omitempty" jsonschema:"maximum lifetime, e.g. 30m"`
		Idle      string   `json:"idle_timeout,omitempty" jsonschema:"destroy after this long without use, e.g. 10m"`
		From      string   `json:"from_snapshot,omitempty" jsonschema:"start from this snapshot (sandbox_snapshot); its runtime, image, policy and secrets come with it"`
	}
	snapshotArgs struct {
		Sandbox string `json:"sandbox" jsonschema:"the sandbox id"`
		Name    string `json:"name,omitempty" jsonschema:"the snapshot's name: 1-63 of a-z, 0-9 and -; default: one is picked"`
	}
	snapshotNameArg struct {
		Name string `json:"name" jsonschema:"the snapshot's name (from sandbox_snapshot or snapshot_list)"`
	}
	forkArgs struct {
		Sandbox string `json:"sandbox" jsonschema:"the sandbox id"`
		Count   int    `json:"count,omitempty" jsonschema:"how many copies, 1-16 (default 1)"`
		Timeout string `json:"timeout,omitempty" jsonschema:"each copy's maximum lifetime, e.g. 30m"`
	}
	sandboxArg struct {
		Sandbox string `json:"sandbox" jsonschema:"the sandbox id (from sandbox_create or sandbox_list)"`
	}
	execArgs struct {
		Sandbox   string   `json:"sandbox" jsonschema:"the sandbox id"`
		Command   []string `json:"command,omitempty" jsonschema:"program and arguments, e.g. [\"ls\",\"-l\"]"`
		Shell     string   `json:"shell,omitempty" jsonschema:"a shell command line run with sh -c (instead of command)"`
		Stdin     string   `json:"stdin,omitempty" jsonschema:"standard input"`
		Timeout   string   `json:"timeout,omitempty" jsonschema:"time limit, e.g. 30s (default 60s, at most 10m)"`
		MaxOutput int      `json:"max_output,omitempty" jsonschema:"bytes of stdout and of stderr returned (default 65536, at most 1048576)"`
		Cwd       string   `json:"cwd,omitempty" jsonschema:"working directory"`
	}
	pathArgs struct {
		Sandbox string `json:"sandbox" jsonschema:"the sandbox id"`
		Path    string `json:"path" jsonschema:"absolute path in the sandbox"`
	}
	writeArgs struct {
		Sandbox string `json:"sandbox" jsonschema:"the sandbox id"`
		Path    string `json:"path" jsonschema:"absolute path in the sandbox"`
		Content string `json:"content" jsonschema:"the file's content (text)"`
	}
	accessArgs struct {
		Sandbox string `json:"sandbox" jsonschema:"the sandbox id"`
		Host    string `json:"host" jsonschema:"the host name to reach, e.g. api.github.com"`
		Reason  string `json:"reason" jsonschema:"why, for the operator who decides"`
		Timeout string `json:"timeout,omitempty" jsonschema:"how long to wait for the decision (default and at most 10m)"`
	}
)

type none struct{}

// forked is sandbox_fork's structured result.
type forked struct {
	Sandboxes []string `json:"sandboxes" jsonschema:"the copies' ids"`
	Snapshot  string   `json:"snapshot" jsonschema:"the fork's snapshot (removed with its last copy)"`
}

// created is sandbox_create's structured result.
type created struct {
	ID      string `json:"id" jsonschema:"the new sandbox's id"`
	Runtime string `json:"runtime"`
	Image   string `json:"image"`
	Status  string `json:"status"`
}

func addBuiltins(s *mcp.Server, b Backend) {
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_create", Description: "Create a long-lived sandbox; returns its id. Its network reaches only the allowed hosts."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a createArgs) (*mcp.CallToolResult, *created, error) {
			sb, err := b.Create(ctx, &api.CreateSandboxRequest{Runtime: a.Runtime, Image: a.Image, Allow: a.Allow, PolicyRef: a.PolicyRef,
				MemoryBytes: a.Memory << 20, Timeout: a.Timeout, IdleTimeout: a.Idle, FromSnapshot: a.From})
			if err != nil {
				return toolError("create: %v", err), nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("sandbox %s is running (%s, %s)", sb.ID, sb.Runtime, sb.Image)}}},
				&created{ID: sb.ID, Runtime: sb.Runtime, Image: sb.Image, Status: sb.Status}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_exec", Description: "Run a command in a sandbox; returns its output (bounded) and exit code."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a execArgs) (*mcp.CallToolResult, any, error) {
			argv := a.Command
			switch {
			case a.Shell != "" && len(argv) > 0:
				return toolError("give command or shell, not both"), nil, nil
			case a.Shell != "":
				argv = []string{"sh", "-c", a.Shell}
			case len(argv) == 0:
				return toolError("give command (program and arguments) or shell"), nil, nil
			}
			timeout := DefaultExecTimeout
			if a.Timeout != "" {
				d, err := time.ParseDuration(a.Timeout)
				if err != nil || d <= 0 || d > MaxExecTimeout {
					return toolError("timeout: %q is not a duration up to %s, such as 30s", a.Timeout, MaxExecTimeout), nil, nil
				}
				timeout = d
			}
			max := a.MaxOutput
			if max <= 0 {
				max = DefaultMaxOutput
			}
			if max > MaxOutput {
				max = MaxOutput
			}
			stdout, stderr := &capped{max: max}, &capped{max: max}
			var in io.Reader
			if a.Stdin != "" {
				in = strings.NewReader(a.Stdin)
			}
			f, err := b.Exec(ctx, a.Sandbox, &api.ExecRequest{Argv: argv, Timeout: timeout.String(), Cwd: a.Cwd, Stdin: in != nil}, in, stdout, stderr)
			if err != nil {
				return toolError("exec in %s: %v", a.Sandbox, err), nil, nil
			}
			exit := 0
			if f.ExitCode != nil {
				exit = *f.ExitCode
			}
			var notes []string
			if f.OOMKilled {
				notes = append(notes, "killed: the sandbox's memory limit was reached")
			}
			if f.Error != "" {
				notes = append(notes, f.Error)
			}
			text := outputText(stdout.String(), stderr.String(), stdout.cut, stderr.cut, exit, f.TimedOut, notes)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, IsError: exit != 0 || f.TimedOut}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_read_file", Description: "Read a text file from a sandbox (at most 1 MiB)."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a pathArgs) (*mcp.CallToolResult, any, error) {
			data, err := b.ReadFile(ctx, a.Sandbox, a.Path)
			if err != nil {
				return toolError("read %s: %v", a.Path, err), nil, nil
			}
			note := ""
			if len(data) > MaxFileRead {
				data, note = data[:MaxFileRead], "\n[truncated at 1 MiB]"
			}
			if !utf8.Valid(data) {
				return toolError("%s is not text (%d bytes); read it with sandbox_exec, e.g. base64 %s", a.Path, len(data), a.Path), nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(data) + note}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_write_file", Description: "Write a text file into a sandbox (replacing it)."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a writeArgs) (*mcp.CallToolResult, any, error) {
			if err := b.WriteFile(ctx, a.Sandbox, a.Path, []byte(a.Content)); err != nil {
				return toolError("write %s: %v", a.Path, err), nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("wrote %d bytes to %s", len(a.Content), a.Path)}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_list_files", Description: "List a directory in a sandbox."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a pathArgs) (*mcp.CallToolResult, any, error) {
			l, err := b.ListDir(ctx, a.Sandbox, a.Path)
			if err != nil {
				return toolError("list %s: %v", a.Path, err), nil, nil
			}
			var buf bytes.Buffer
			for _, f := range l {
				kind := "file"
				if f.IsDir {
					kind = "dir"
				}
				fmt.Fprintf(&buf, "%s\t%s\t%d\t%s\n", f.Mode, kind, f.Size, f.Name)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: buf.String()}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_list", Description: "List your sandboxes."},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ none) (*mcp.CallToolResult, any, error) {
			l, err := b.List(ctx)
			if err != nil {
				return toolError("list: %v", err), nil, nil
			}
			var buf bytes.Buffer
			for _, sb := range l {
				fmt.Fprintf(&buf, "%s\t%s\t%s\t%s\n", sb.ID, sb.Status, sb.Runtime, sb.Image)
			}
			if buf.Len() == 0 {
				buf.WriteString("no sandboxes\n")
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: buf.String()}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_remove", Description: "Remove a sandbox and everything in it."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a sandboxArg) (*mcp.CallToolResult, any, error) {
			if err := b.Remove(ctx, a.Sandbox); err != nil {
				return toolError("remove %s: %v", a.Sandbox, err), nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "removed " + a.Sandbox}}}, nil, nil
		})
	addSnapshotTools(s, b)
	mcp.AddTool(s, &mcp.Tool{Name: "request_access", Description: "Ask an operator to let a sandbox reach a host. Waits for the decision; approved, the host is reachable for the rest of the session."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a accessArgs) (*mcp.CallToolResult, any, error) {
			r, err := b.RequestAccess(ctx, a.Sandbox, &api.AccessRequest{Host: a.Host, Reason: a.Reason, Timeout: a.Timeout})
			if err != nil {
				return toolError("request access to %s: %v", a.Host, err), nil, nil
			}
			if !r.Allowed {
				why := r.Reason
				if why == "" {
					why = "denied by " + r.By
				}
				return toolError("access to %s was not granted (%s): %s", a.Host, r.Approval, why), nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("access to %s granted by %s (%s)", a.Host, r.By, r.Approval)}}}, nil, nil
		})
}

func addSnapshotTools(s *mcp.Server, b Backend) {
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_snapshot", Description: "Save a running sandbox's state (its files; a microVM's memory too) as a snapshot that new sandboxes start from (sandbox_create with from_snapshot). The sandbox runs on."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a snapshotArgs) (*mcp.CallToolResult, *api.Snapshot, error) {
			sn, err := b.Snapshot(ctx, a.Sandbox, a.Name)
			if err != nil {
				return toolError("snapshot %s: %v", a.Sandbox, err), nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("snapshot %s of %s saved (%s, %d bytes)", sn.Name, a.Sandbox, sn.Kind, sn.SizeBytes)}}}, sn, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_fork", Description: "Copy a running sandbox into new sandboxes, each its own, starting from its current files (and a microVM's memory); each copy gets fresh credential placeholders and the same network policy. The sandbox runs on."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a forkArgs) (*mcp.CallToolResult, *forked, error) {
			res, err := b.Fork(ctx, a.Sandbox, &api.ForkRequest{Count: a.Count, Timeout: a.Timeout})
			if err != nil {
				return toolError("fork %s: %v", a.Sandbox, err), nil, nil
			}
			out := &forked{Snapshot: res.Snapshot.Name, Sandboxes: make([]string, 0, len(res.Sandboxes))}
			for _, sb := range res.Sandboxes {
				out.Sandboxes = append(out.Sandboxes, sb.ID)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("forked %s into %s", a.Sandbox, strings.Join(out.Sandboxes, ", "))}}}, out, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "snapshot_list", Description: "List your snapshots."},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ none) (*mcp.CallToolResult, any, error) {
			l, err := b.Snapshots(ctx)
			if err != nil {
				return toolError("list snapshots: %v", err), nil, nil
			}
			var buf bytes.Buffer
			for _, sn := range l {
				fmt.Fprintf(&buf, "%s\t%s\t%s\t%d bytes\tin use by %d\tof %s\n", sn.Name, sn.Kind, sn.Runtime, sn.SizeBytes, sn.InUse, sn.Sandbox)
			}
			if buf.Len() == 0 {
				buf.WriteString("no snapshots\n")
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: buf.String()}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "snapshot_remove", Description: "Remove a snapshot (refused while a sandbox started from it exists)."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a snapshotNameArg) (*mcp.CallToolResult, any, error) {
			if err := b.RemoveSnapshot(ctx, a.Name); err != nil {
				return toolError("remove snapshot %s: %v", a.Name, err), nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "removed snapshot " + a.Name}}}, nil, nil
		})
}

// capped keeps the first max bytes written and whether more came.
type capped struct {
	bytes.Buffer
	max int
	cut bool
}

func (c *capped) Write(p []byte) (int, error) {
	n := len(p)
	if room := c.max - c.Len(); len(p) > room {
		c.cut = true
		if room <= 0 {
			return n, nil
		}
		p = p[:room]
	}
	c.Buffer.Write(p)
	return n, nil
}
