package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
)

// hookServer records every POST it gets as a line: path, the GitHub
// event and delivery headers, cagebox's verification header, and the body.
const hookServer = `
import http.server, sys, json
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n).decode()
        rec = {"path": self.path, "event": self.headers.get("X-GitHub-Event"), "delivery": self.headers.get("X-GitHub-Delivery"),
               "verified": self.headers.get("X-Cagebox-Webhook-Verified"), "auth": self.headers.get("Authorization"), "body": body}
        with open("/tmp/hooks.log", "a") as f: f.write(json.dumps(rec) + "\n")
        self.send_response(204); self.end_headers()
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
`

const hookSecretValue = "whsec_e2e_0123456789abcdef0123456789abcdef"

func signGitHub(body string) string {
	m := hmac.New(sha256.New, []byte(hookSecretValue))
	m.Write([]byte(body))
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// TestWebhook: a webhook's URL takes a GitHub delivery on the ingress
// listener, verifies it with the vault's secret, and delivers it to the
// guest's server; forgeries and replays are refused (401, events); a
// delivery to an idle-paused sandbox wakes it; the secret never enters
// the guest.
func TestWebhook(t *testing.T) {
	ie := newIngressEnv(t)
	ctx := context.Background()
	c := ie.client()
	if _, err := c.PutSecret(ctx, &api.PutSecretRequest{Name: "GH_HOOK", Value: hookSecretValue, Hosts: []string{"api.github.com"}}); err != nil {
		t.Fatal(err)
	}
	r := ie.cli("", "create", "--runtime", e2eRuntime(), "--idle-timeout", "4s", "--idle-action", "pause")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	if err := c.WriteFile(ctx, id, "/tmp/hook.py", 0o644, strings.NewReader(hookServer)); err != nil {
		t.Fatal(err)
	}
	if r := ie.cli("", "exec", id, "--", "sh", "-c", "setsid python3 /tmp/hook.py 8080 >/tmp/hook.out 2>&1 </dev/null &"); r.code != 0 {
		t.Fatalf("start the guest's server: %+v", r)
	}
	r = ie.cli("", "webhook", "add", id, "gh", "--port", "8080", "--path", "/hook", "--verify", "github", "--secret", "GH_HOOK")
	url := strings.TrimSpace(r.stdout)
	if r.code != 0 || !strings.HasPrefix(url, "https://hooks."+ingressDomain) || !strings.Contains(url, "/w/cbw_") {
		t.Fatalf("webhook add: %+v", r)
	}
	if r := ie.cli("", "webhook", "add", id, "gh2", "--port", "8080", "--verify", "github", "--secret", "NOPE"); r.code == 0 || !strings.Contains(r.stderr, "NOPE") {
		t.Fatalf("webhook add with an unknown secret: %+v", r)
	}
	post := func(body, sig, delivery string) ingressReply {
		h := map[string]string{"X-GitHub-Event": "push", "X-GitHub-Delivery": delivery, "Content-Type": "application/json"}
		if sig != "" {
			h["X-Hub-Signature-256"] = sig
		}
		return ie.do(t, ie.hc, "POST", url, h, strings.NewReader(body))
	}
	guestLog := func() string {
		r := ie.cli("", "exec", id, "--", "sh", "-c", "cat /tmp/hooks.log 2>/dev/null; true")
		return r.stdout
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}

	// The guest's server may take a moment to listen: the delivery is
	// retried until it does.
	body := `{"ref":"refs/heads/main","n":1}`
	if rep := post(body, signGitHub(body), "d-1"); rep.code != 202 {
		t.Fatalf("a signed delivery: %d %s", rep.code, rep.body)
	}
	waitFor("the first delivery in the guest", func() bool { return strings.Contains(guestLog(), `"delivery": "d-1"`) })
	log := guestLog()
	if !strings.Contains(log, `"path": "/hook"`) || !strings.Contains(log, `"verified": "github"`) || !strings.Contains(log, `\"n\":1`) || !strings.Contains(log, `"auth": null`) {
		t.Errorf("what the guest got: %s", log)
	}

	// Forged, tampered, unsigned and replayed deliveries are refused.
	for name, rep := range map[string]ingressReply{
		"forged":   post(body, "sha256="+strings.Repeat("ab", 32), "d-2"),
		"tampered": post(body+" ", signGitHub(body), "d-3"),
		"unsigned": post(body, "", "d-4"),
		"replayed": post(body, signGitHub(body), "d-1"),
	} {
		if rep.code != 401 {
			t.Errorf("%s delivery: %d %s, want 401", name, rep.code, rep.body)
		}
	}
	if rep := ie.do(t, ie.hc, "POST", "https://hooks."+ingressDomain+"/w/cbw_unknown", nil, strings.NewReader(body)); rep.code != 404 {
		t.Errorf("unknown webhook token: %d", rep.code)
	}

	// Idle pause, then a delivery wakes the sandbox and reaches it.
	waitFor("the idle pause", func() bool {
		sb, err := c.Get(ctx, id)
		return err == nil && sb.Status == "paused"
	})
	body2 := `{"ref":"refs/heads/main","n":2}`
	if rep := post(body2, signGitHub(body2), "d-5"); rep.code != 202 {
		t.Fatalf("a delivery to a paused sandbox: %d %s", rep.code, rep.body)
	}
	waitFor("the delivery to the woken sandbox", func() bool {
		evs, _ := c.Events(ctx, id, 0)
		n := 0
		for _, e := range evs {
			if e.Kind == api.EventWebhookDelivered {
				n++
			}
		}
		return n == 2
	})
	sb, err := c.Get(ctx, id)
	if err != nil || sb.LastWake == nil || !strings.Contains(sb.LastWake.Reason, "delivery") {
		t.Errorf("inspect after the wake: %+v %v", sb.LastWake, err)
	}
	if !strings.Contains(guestLog(), `"delivery": "d-5"`) {
		t.Errorf("the woken sandbox did not get d-5: %s", guestLog())
	}

	// Events: received, delivered, rejected; never the secret.
	evs, err := c.Events(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[api.EventKind]int{}
	for _, e := range evs {
		kinds[e.Kind]++
		if strings.Contains(fmt.Sprint(e.Data), hookSecretValue) {
			t.Errorf("event %s carries the secret", e.Kind)
		}
	}
	if kinds[api.EventWebhookReceived] != 2 || kinds[api.EventWebhookDelivered] != 2 || kinds[api.EventWebhookRejected] != 4 {
		t.Errorf("webhook events: %v", kinds)
	}
	// The secret is nowhere in the guest: not in its environment, not in
	// what it received.
	if r := ie.cli("", "exec", id, "--", "sh", "-c", "cat /proc/*/environ /tmp/hooks.log 2>/dev/null | grep -c "+hookSecretValue+"; true"); strings.TrimSpace(r.stdout) != "0" {
		t.Errorf("the webhook secret reached the guest: %+v", r)
	}
	if r := ie.cli("", "webhook", "ls", id); r.code != 0 || !strings.Contains(r.stdout, "gh") || strings.Contains(r.stdout, "cbw_") {
		t.Errorf("webhook ls: %+v", r)
	}
	if r := ie.cli("", "webhook", "rm", id, "gh"); r.code != 0 {
		t.Fatalf("webhook rm: %+v", r)
	}
	if rep := post(body2, signGitHub(body2), "d-6"); rep.code != 404 {
		t.Errorf("a removed webhook's URL: %d, want 404", rep.code)
	}
}
