package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
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
	// Alt is the sandbox made from the template base:ALT_RUNTIME.
	Alt string `json:"alt"`
	// Bound counts the forks' copies' requests that reached the bound
	// host with the real value.
	Bound int `json:"bound"`
}

// TestE2BSDK drives the daemon's E2B front (--e2b-listen) with the
// official E2B JavaScript SDK, unchanged, configured only by its
// environment variables: create, commands (output, exit codes, streaming,
// stdin, list, kill), files (text, 20 MiB binary, list, mkdir, rename,
// remove, exists), a terminal, list with a metadata filter, connect, kill
// twice, setTimeout, paging, a vault secret in envVars is a placeholder
// inside and the real value only at its bound host, network.allowOut and
// updateNetwork on the live policy (IPs and CIDRs refused), getHost(port)
// to a guest server through the ingress (trafficAccessToken, or a public
// sandbox); on SDK lines
// 2.51.0 and 2.45.0; a wrong key and another tenant's sandbox are refused
// as the SDK expects, and egress stays deny-by-default (test/e2b/sdk.mjs). Malformed
// and refused requests get a 4xx with E2B's {code, message}; none makes a
// sandbox.
func TestE2BSDK(t *testing.T) {
	dir := e2bClientDir(t)
	e := newDebianEnv(t)
	addr := freePort(t)
	apiAddr := freePort(t)
	// One HTTPS stand-in upstream for three names; it refuses any
	// Authorization but the secret's real value, so a 200 to a request
	// that carried the placeholder means the gateway swapped it in.
	const real = "ghp_E2BRealValueNeverInTheGuest0000abcd"
	up := newUpstream(t, "api.example.test", "other.example.test", "third.example.test")
	up.validate = func(r *http.Request) error {
		if a := r.Header.Get("Authorization"); a != "" && a != "Bearer "+real {
			return errors.New("not the real value")
		}
		return nil
	}
	// --e2b-domain: the front serves PORT-ID.e2b.test (getHost), guest
	// ports on through the ingress.
	e.startDaemon(append(up.daemonArgs("api.example.test", "other.example.test", "third.example.test"), "--e2b-listen", addr, "--listen", apiAddr,
		"--e2b-domain", "e2b.test", "--ingress", freePort(t), "--ingress-domain", "ingress.e2b.test")...)
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
	tenantCLI := []string{"CAGEBOX_HOST=http://" + apiAddr, "CAGEBOX_API_KEY=" + key, "CBX_E2B_SECRET=" + real}
	if r := e.cliEnv(tenantCLI, "", "secret", "add", "E2B_TEST_TOKEN", "--host", "api.example.test", "--from-env", "CBX_E2B_SECRET"); r.code != 0 {
		t.Fatalf("secret add: %+v", r)
	}
	// A template IMAGE:RUNTIME picks the runtime: one other than the
	// suite's, where one is available here (container or gVisor).
	alt := ""
	rts, err := e.client().Runtimes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range rts {
		if (rt.Name == "container" || rt.Name == "gvisor") && rt.Name != e2eRuntime() && rt.Available {
			alt = rt.Name
		}
	}
	if alt == "" {
		t.Logf("no second runtime here: the IMAGE:RUNTIME template is not tried")
	}
	// A tenant whose floor is above the namespaces class: base:container
	// is refused for it.
	if r := e.cli("", "tenant", "create", "e2bfloor", "--min-isolation", "app-kernel"); r.code != 0 {
		t.Fatalf("tenant create: %+v", r)
	}
	floorKey := "e2b_" + strings.TrimPrefix(strings.TrimSpace(e.cli("", "tenant", "key", "e2bfloor").stdout), "cbk_")
	// Another tenant's sandbox (the admin's).
	other := strings.TrimSpace(e.createCLI("--image", "busybox"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// Two SDK lines: 2.51 creates with POST /v2/sandboxes, 2.45 with POST
	// /sandboxes and checks the key's shape.
	var alts []string
	forkBound := 0 // requests of forks' copies that reached the bound host
	snapshots := "0"
	if rt := e2eRuntime(); rt == "container" || rt == "gvisor" {
		snapshots = "1"
	}
	for _, line := range []string{"e2b", "e2b-2.45"} {
		t.Run(line, func(t *testing.T) {
			b := make([]byte, 6)
			_, _ = rand.Read(b)
			cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, "sdk.mjs"))
			cmd.Env = append(os.Environ(), "E2B_MODULE="+line,
				"E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr,
				// The E2B form of the tenant's key (^e2b_[0-9a-f]+$).
				"E2B_API_KEY=e2b_"+hexKey,
				"OTHER_ID="+strings.Replace(other, "sb-", "sb", 1), "RUN=r"+hex.EncodeToString(b), "SECRET_REAL="+real, "E2B_DOMAIN_WANT=e2b.test", "ALT_RUNTIME="+alt,
				// Containers and gVisor snapshot their filesystem: the
				// snapshot and fork checks run there; elsewhere the
				// SDK's createSnapshot must get a clear refusal.
				"SNAPSHOTS="+snapshots)
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
			if rep.Alt != "" {
				alts = append(alts, strings.Replace(rep.Alt, "sb", "sb-", 1))
			}
			forkBound += rep.Bound
			if rep.Fatal != "" {
				t.Fatalf("E2B SDK script failed: %s\nstderr: %s", rep.Fatal, errb.String())
			}
			want := 76
			if alt != "" {
				want += 2
			}
			if len(rep.Checks) < want {
				t.Errorf("only %d checks ran", len(rep.Checks))
			}
		})
	}
	// The IMAGE:RUNTIME sandboxes ran on that runtime (their
	// sandbox.created events say).
	if alt != "" {
		if len(alts) != 2 {
			t.Errorf("%d sandboxes of template base:%s, want 2 (one per SDK line)", len(alts), alt)
		}
		evs := e.allEvents("")
		for _, id := range alts {
			var ran any
			for _, ev := range evs {
				if d, ok := ev.Data.(map[string]any); ok && ev.Sandbox == id && ev.Kind == "sandbox.created" {
					ran = d["runtime"]
				}
			}
			if ran != alt {
				t.Errorf("template base:%s: %s ran on %v", alt, id, ran)
			}
		}
	}
	// The upstream saw the real value only at the secret's host, and
	// never the placeholder there (one request for each SDK line).
	var bound int
	for _, req := range up.requests() {
		host := strings.Fields(req)[1]
		switch {
		case strings.Contains(req, "auth=Bearer "+real) && host == "api.example.test":
			bound++
		case strings.Contains(req, real):
			t.Errorf("the real value reached %s: %s", host, req)
		case host == "api.example.test" && strings.Contains(req, "auth=Bearer "):
			t.Errorf("the bound host got the placeholder, not the real value: %s", req)
		}
	}
	if bound != 2+forkBound {
		t.Errorf("the bound host received the real value %d times, want %d (one per SDK line, one per fork's copy): %q", bound, 2+forkBound, up.requests())
	}
	// Malformed and refused requests: a 4xx with E2B's {code, message},
	// and nothing made.
	before, err := e.client().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e2bKey := "e2b_" + hexKey
	for _, tc := range []struct {
		name, method, path, body string
		header                   map[string]string
		code                     int
	}{
		{"no key", "POST", "/v2/sandboxes", `{"templateID":"base"}`, nil, 401},
		{"not JSON", "POST", "/v2/sandboxes", `{"templateID":`, map[string]string{"X-API-KEY": e2bKey}, 400},
		{"no template", "POST", "/v2/sandboxes", `{}`, map[string]string{"X-API-KEY": e2bKey}, 400},
		{"network IP", "POST", "/sandboxes", `{"templateID":"base","network":{"allowOut":["1.1.1.1"]}}`, map[string]string{"X-API-KEY": e2bKey}, 400},
		{"network CIDR", "POST", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["api.example.test","10.0.0.0/8"]}}`, map[string]string{"X-API-KEY": e2bKey}, 400},
		{"network rules", "POST", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["api.example.test"],"rules":{"api.example.test":[{}]}}}`, map[string]string{"X-API-KEY": e2bKey}, 400},
		{"updateNetwork, another tenant's", "PUT", "/sandboxes/" + strings.Replace(other, "sb-", "sb", 1) + "/network", `{"allowOut":["api.example.test"]}`, map[string]string{"X-API-KEY": e2bKey}, 404},
		{"unknown image", "POST", "/sandboxes", `{"templateID":"no-such-image"}`, map[string]string{"X-API-KEY": e2bKey}, 404},
		{"metadata value", "POST", "/v2/sandboxes", `{"templateID":"base","metadata":{"k":"a b"}}`, map[string]string{"X-API-KEY": e2bKey}, 400},
		{"runtime below the tenant's floor", "POST", "/v2/sandboxes", `{"templateID":"base:container"}`, map[string]string{"X-API-KEY": floorKey}, 400},
		{"unknown runtime", "POST", "/v2/sandboxes", `{"templateID":"base:nosuch"}`, map[string]string{"X-API-KEY": e2bKey}, 400},
		{"bad page token", "GET", "/v2/sandboxes?nextToken=xyz", "", map[string]string{"X-API-KEY": e2bKey}, 400},
		{"envd, wrong access token", "GET", "/health", "", map[string]string{"E2b-Sandbox-Id": strings.Replace(other, "sb-", "sb", 1), "E2b-Sandbox-Port": "49983", "X-Access-Token": "ea_wrong"}, 401},
		{"envd, unknown sandbox", "GET", "/health", "", map[string]string{"E2b-Sandbox-Id": "nosuchsandbox", "E2b-Sandbox-Port": "49983"}, 502},
		{"envd, another port", "GET", "/", "", map[string]string{"E2b-Sandbox-Id": strings.Replace(other, "sb-", "sb", 1), "E2b-Sandbox-Port": "8080"}, 404},
	} {
		req, _ := http.NewRequestWithContext(ctx, tc.method, "http://"+addr+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		derr := json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || derr != nil || body.Code != tc.code || body.Message == "" {
			t.Errorf("%s: %d %+v (%v), want %d with a message", tc.name, resp.StatusCode, body, derr, tc.code)
		}
	}
	after, err := e.client().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("refused requests made sandboxes: %d before, %d after", len(before), len(after))
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
