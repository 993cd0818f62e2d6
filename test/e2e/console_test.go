package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// consoleReport is what test/console/console.mjs prints.
type consoleReport struct {
	Checks []struct {
		Name   string `json:"name"`
		OK     bool   `json:"ok"`
		Detail string `json:"detail"`
	} `json:"checks"`
	Skipped []struct{ Name, Why string } `json:"skipped"`
	Fatal   string                       `json:"fatal"`
}

// consoleDir prepares test/console (playwright-core from npm) and finds
// Debian's Chromium.
func consoleDir(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed (scripts/setup.sh installs nodejs)")
	}
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		t.Skip("/usr/bin/chromium is not installed (scripts/setup.sh installs Debian's chromium)")
	}
	dir, err := filepath.Abs("../console")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core")); err != nil {
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in test/console: %v\n%s", err, out)
		}
	}
	return dir
}

// TestConsole drives the web console in headless Chromium: a tenant logs
// in with its API key on the --listen address, sees only its sandboxes,
// reads a sandbox's runtime, class and limits, watches its egress log,
// edits its policy (an invalid document's error shown in place, then a
// valid one saved), approves a waiting access request, adds, rotates and
// revokes a secret whose value never reaches the page, uses a terminal
// over the pty WebSocket, pauses, resumes, stops and removes the sandbox
// with buttons; the CSP holds (no violation; injected inline script does
// not run); a request without the CSRF token is refused; logout ends the
// session. Then the admin opens `cagebox console`'s one-time link (it
// works once), sees every tenant's sandboxes and makes a key shown once.
func TestConsole(t *testing.T) {
	dir := consoleDir(t)
	e := newEnv(t)
	addr := freePort(t)
	e.startDaemon("--listen", addr)
	ctx := context.Background()
	admin := e.client()
	const tenant = "webco"
	if _, err := admin.CreateTenant(ctx, &api.CreateTenantRequest{Name: tenant}); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateKey(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	tc := client.TCP("http://"+addr, k.Key)
	sb, err := tc.Create(ctx, &api.CreateSandboxRequest{Image: "busybox",
		Policy: json.RawMessage(`{"version":1,"default":"deny","rules":[{"name":"no-blocked","host":"blocked.example.test","action":"deny"}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	other, err := admin.Create(ctx, &api.CreateSandboxRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	// An egress denial for the sandbox's log (the proxy answers 403).
	if r := e.cliEnv([]string{"CAGEBOX_HOST=http://" + addr, "CAGEBOX_API_KEY=" + k.Key}, "", "exec", sb.ID, "--", "sh", "-c",
		`printf 'GET /x HTTP/1.1\r\nHost: blocked.example.test\r\nConnection: close\r\n\r\n' | nc blocked.example.test 80 | head -1`); !strings.Contains(r.stdout, "403") {
		t.Fatalf("a denied request for the egress log: %+v", r)
	}

	const secret1 = "sk_live_ConsoleE2eFirstValue000000000a1b2"
	const secret2 = "sk_live_ConsoleE2eSecondValue00000000c3d4"
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, "node", filepath.Join(dir, "console.mjs"))
	cmd.Env = append(os.Environ(),
		"CONSOLE_BASE=http://"+addr, "TENANT_KEY="+k.Key, "TENANT="+tenant, "TENANT_SANDBOX="+sb.ID, "OTHER_SANDBOX="+other.ID,
		"SECRET_VALUE="+secret1, "SECRET_VALUE2="+secret2,
		"CAGEBOX_BIN="+filepath.Join(binDir, "cagebox"), "CAGEBOX_HOME="+e.home)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("browser run: %s", time.Since(start).Round(time.Millisecond))
	var r consoleReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("console.mjs: %v (%v)\nstdout: %.2000s\nstderr: %.4000s", err, runErr, out.String(), errb.String())
	}
	if r.Fatal != "" {
		t.Errorf("console.mjs failed: %s\nstderr: %.4000s", r.Fatal, errb.String())
	}
	for _, c := range r.Checks {
		if !c.OK {
			t.Errorf("FAIL %s: %s", c.Name, c.Detail)
		} else {
			t.Logf("ok   %s", c.Name)
		}
	}
	for _, s := range r.Skipped {
		t.Logf("SKIP %s: %s", s.Name, s.Why)
	}
	if len(r.Checks) < 25 {
		t.Errorf("only %d checks ran", len(r.Checks))
	}

	// The daemon side of what the browser did.
	sec, err := tc.Raw(ctx, "GET", "/v1/secrets/CONSOLE_TOKEN", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(sec.Body)
	sec.Body.Close()
	if sec.StatusCode != 200 || !strings.Contains(string(b), `"revoked_at"`) || strings.Contains(string(b), secret1) || strings.Contains(string(b), secret2) {
		t.Errorf("secret after the console: %d %s", sec.StatusCode, b)
	}
	if _, err := tc.Get(ctx, sb.ID); err == nil {
		t.Errorf("sandbox %s still exists after the console's Remove", sb.ID)
	}
	// The console listener takes console sessions only: an API key is
	// refused there.
	link := e.cli("", "console")
	if link.code != 0 || !strings.HasPrefix(link.stdout, "http://127.0.0.1:") {
		t.Fatalf("cagebox console: %+v", link)
	}
	base := strings.SplitN(strings.TrimSpace(link.stdout), "/ui/", 2)[0]
	req, _ := http.NewRequest("GET", base+"/v1/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+k.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("an API key on the console listener: %d, want 401", resp.StatusCode)
	}
	// DNS rebinding: a request for another name on that port gets nothing.
	req, _ = http.NewRequest("GET", base+"/ui/login", nil)
	req.Host = "rebound.example.test:" + strings.TrimPrefix(base, "http://127.0.0.1:")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("console listener under another Host: %d, want 421", resp.StatusCode)
	}
	// And a console link is made over the unix socket only.
	resp2, err := tc.Raw(ctx, "POST", "/v1/console/sessions", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != 403 {
		t.Errorf("POST /v1/console/sessions over TCP: %d, want 403", resp2.StatusCode)
	}
}
