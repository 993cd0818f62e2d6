package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// e2bClientDir prepares test/e2b: the official E2B SDK from npm, pinned
// by its package-lock (npm ci once; node_modules is not committed).
func e2bClientDir(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed (scripts/setup.sh installs nodejs)")
	}
	dir, err := filepath.Abs("../e2b")
	if err != nil {
		t.Fatal(err)
	}
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	// npm ci again whenever the lock changed since the last install.
	stamp := filepath.Join(dir, "node_modules", ".cagebox-lock")
	if b, err := os.ReadFile(stamp); err != nil || !bytes.Equal(b, lock) {
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in test/e2b: %v\n%s", err, out)
		}
		if err := os.WriteFile(stamp, lock, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

type e2bReport struct {
	Checks []struct {
		Name   string `json:"name"`
		OK     bool   `json:"ok"`
		Detail string `json:"detail"`
	} `json:"checks"`
	Fatal string `json:"fatal"`
}

// TestE2BSDK drives the daemon's E2B front (--e2b-listen) with the
// official E2B JavaScript SDK, unchanged, configured only by its
// environment variables: create, commands (output, exit codes, streaming,
// stdin, list, kill), files (text, 20 MiB binary, list, mkdir, rename,
// remove, exists), a terminal, list with a metadata filter, connect, kill
// twice, setTimeout, paging, a vault secret in envVars is a placeholder; on SDK lines 2.51.0 and 2.45.0; a wrong key and another tenant's sandbox are refused as the SDK
// expects, and egress stays deny-by-default (test/e2b/sdk.mjs).
func TestE2BSDK(t *testing.T) {
	dir := e2bClientDir(t)
	e := newDebianEnv(t)
	addr := freePort(t)
	apiAddr := freePort(t)
	e.startDaemon("--e2b-listen", addr, "--listen", apiAddr)
	if r := e.cli("", "tenant", "create", "e2bt"); r.code != 0 {
		t.Fatalf("tenant create: %+v", r)
	}
	key := strings.TrimSpace(e.cli("", "tenant", "key", "e2bt").stdout)
	hexKey, ok := strings.CutPrefix(key, "cbk_")
	if !ok {
		t.Fatalf("tenant key: %q", key)
	}
	// A secret of the tenant, bound to a host: an E2B envVars value
	// "vault:E2B_TEST_TOKEN" is its placeholder in the guest.
	const real = "ghp_E2BRealValueNeverInTheGuest0000abcd"
	tenantCLI := []string{"CAGEBOX_HOST=http://" + apiAddr, "CAGEBOX_API_KEY=" + key, "CBX_E2B_SECRET=" + real}
	if r := e.cliEnv(tenantCLI, "", "secret", "add", "E2B_TEST_TOKEN", "--host", "api.example.test", "--from-env", "CBX_E2B_SECRET"); r.code != 0 {
		t.Fatalf("secret add: %+v", r)
	}
	// Another tenant's sandbox (the admin's).
	other := strings.TrimSpace(e.createCLI("--image", "busybox"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// Two SDK lines: 2.51 creates with POST /v2/sandboxes, 2.45 with POST
	// /sandboxes and checks the key's shape.
	for _, line := range []string{"e2b", "e2b-2.45"} {
		t.Run(line, func(t *testing.T) {
			b := make([]byte, 6)
			_, _ = rand.Read(b)
			cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, "sdk.mjs"))
			cmd.Env = append(os.Environ(), "E2B_MODULE="+line,
				"E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr,
				// The E2B form of the tenant's key (^e2b_[0-9a-f]+$).
				"E2B_API_KEY=e2b_"+hexKey,
				"OTHER_ID="+strings.Replace(other, "sb-", "sb", 1), "RUN=r"+hex.EncodeToString(b), "SECRET_REAL="+real)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			runErr := cmd.Run()
			var rep e2bReport
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
				t.Fatalf("E2B SDK script: %v (%v)\nstdout: %.2000s\nstderr: %.4000s", err, runErr, out.String(), errb.String())
			}
			for _, c := range rep.Checks {
				if !c.OK {
					t.Errorf("%s: %s", c.Name, c.Detail)
				} else {
					t.Logf("ok: %s", c.Name)
				}
			}
			if rep.Fatal != "" {
				t.Fatalf("E2B SDK script failed: %s\nstderr: %s", rep.Fatal, errb.String())
			}
			if len(rep.Checks) < 45 {
				t.Errorf("only %d checks ran", len(rep.Checks))
			}
		})
	}
	// Nothing of the tenant's is left: the script killed what it made.
	l, err := e.client().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range l {
		if s.Tenant != "admin" && s.Status != "destroyed" {
			t.Errorf("left behind: %s (%s, %s)", s.ID, s.Tenant, s.Status)
		}
	}
}
