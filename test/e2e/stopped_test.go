package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
)

// TestRelayAndWebhookOfStoppedSandbox: once `cagebox stop` has stopped a
// sandbox, a signed delivery to its webhook is refused with 410 and what
// to do, the deliveries it had queued give up at once instead of being
// retried for hours, and its Discord relay closes the gateway connection
// (a close frame, so the bot goes offline) and does not reconnect.
func TestRelayAndWebhookOfStoppedSandbox(t *testing.T) {
	g, flags := startGateway(t)
	ie := newIngressEnv(t, flags...)
	ctx := context.Background()
	c := ie.client()
	for name, val := range map[string]string{"GH_HOOK": hookSecretValue, "DISCORD_BOT": relayBotToken} {
		if _, err := c.PutSecret(ctx, &api.PutSecretRequest{Name: name, Value: val, Hosts: []string{"example.com", discordGatewayHost}}); err != nil {
			t.Fatal(err)
		}
	}
	r := ie.cli("", "create", "--runtime", e2eRuntime())
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	// No server listens in the guest: deliveries fail and wait to be
	// retried (the relay's READY first, the webhook's delivery behind it).
	r = ie.cli("", "webhook", "add", id, "gh", "--port", "8080", "--path", "/hook", "--verify", "github", "--secret", "GH_HOOK")
	url := strings.TrimSpace(r.stdout)
	if r.code != 0 || !strings.Contains(url, "/w/cbw_") {
		t.Fatalf("webhook add: %+v", r)
	}
	if r := ie.cli("", "relay", "add", id, "discord", "--token-secret", "DISCORD_BOT", "--port", "8080", "--path", "/discord"); r.code != 0 {
		t.Fatalf("relay add: %+v", r)
	}
	waitFor(t, 60*time.Second, "the relay to identify", g.Connected)
	post := func(body, sig, delivery string) ingressReply {
		h := map[string]string{"X-GitHub-Event": "push", "X-GitHub-Delivery": delivery, "Content-Type": "application/json"}
		if sig != "" {
			h["X-Hub-Signature-256"] = sig
		}
		return ie.do(t, ie.hc, "POST", url, h, strings.NewReader(body))
	}
	failed := func() (retried, gaveUp []api.WebhookFailed) {
		evs, err := c.Events(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Kind != api.EventWebhookFailed {
				continue
			}
			var f api.WebhookFailed
			b, _ := json.Marshal(e.Data)
			if err := json.Unmarshal(b, &f); err != nil {
				t.Fatal(err)
			}
			if f.GaveUp {
				gaveUp = append(gaveUp, f)
			} else {
				retried = append(retried, f)
			}
		}
		return retried, gaveUp
	}
	body := `{"ref":"refs/heads/main","n":1}`
	if rep := post(body, signGitHub(body), "d-1"); rep.code != 202 {
		t.Fatalf("a signed delivery to the running sandbox: %d %s", rep.code, rep.body)
	}
	waitFor(t, 30*time.Second, "a first attempt to fail", func() bool { r, _ := failed(); return len(r) >= 1 })

	if r := ie.cli("", "stop", id); r.code != 0 {
		t.Fatalf("stop: %+v", r)
	}
	stopped := time.Now()

	// The webhook: 410 with what to do, for a verified sender only.
	body2 := `{"ref":"refs/heads/main","n":2}`
	if rep := post(body2, signGitHub(body2), "d-2"); rep.code != 410 || !strings.Contains(rep.body, "stopped") || !strings.Contains(rep.body, "remove the webhook") {
		t.Errorf("a signed delivery to the stopped sandbox: %d %q, want 410 saying what to do", rep.code, rep.body)
	}
	if rep := post(body2, "", "d-3"); rep.code != 401 || strings.Contains(rep.body, "stopped") {
		t.Errorf("an unsigned delivery to the stopped sandbox: %d %q, want 401 and no word of the sandbox", rep.code, rep.body)
	}
	// The queued deliveries give up at once (at the first's next attempt),
	// naming the stop.
	waitFor(t, 30*time.Second, "the queued deliveries to give up", func() bool { _, g := failed(); return len(g) == 2 })
	retried, gaveUp := failed()
	hooks := map[string]bool{}
	for _, f := range gaveUp {
		hooks[f.Webhook] = true
		if !strings.Contains(f.Error, "sandbox is stopped") {
			t.Errorf("webhook.failed: %+v, want gave_up naming the stop", f)
		}
	}
	if !hooks["gh"] || !hooks["relay:discord"] {
		t.Errorf("gave up: %+v, want the webhook's delivery and the relay's READY", gaveUp)
	}
	t.Logf("the queued deliveries gave up %v after the stop, after %d failed attempts", time.Since(stopped).Round(time.Millisecond), len(retried))

	// The relay: its gateway connection closes with a close frame, and is
	// not opened again.
	waitFor(t, 15*time.Second, "the stopped sandbox's relay to close its connection", func() bool { return !g.Connected() && len(g.Ends()) >= 1 })
	t.Logf("the relay's connection closed %v after the stop", time.Since(stopped).Round(time.Millisecond))
	if ends := g.Ends(); ends[len(ends)-1].Code != 1000 {
		t.Errorf("the gateway saw the relay's connection end with %+v, want a close frame 1000", ends[len(ends)-1])
	}
	n := g.Conns()
	time.Sleep(7 * time.Second) // two of the daemon's relay syncs
	if g.Conns() != n || g.Connected() {
		t.Errorf("the stopped sandbox's relay reconnected (%d connections, was %d)", g.Conns(), n)
	}
	r = ie.cli("", "relay", "ls", id)
	if r.code != 0 || !strings.Contains(r.stdout, "the sandbox stopped") {
		t.Errorf("relay ls of the stopped sandbox: %+v", r)
	}

	// The events say so.
	evs, err := c.Events(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	var disc []api.RelayDisconnected
	gone := 0
	for _, e := range evs {
		b, _ := json.Marshal(e.Data)
		switch e.Kind {
		case api.EventRelayDisconnected:
			var d api.RelayDisconnected
			_ = json.Unmarshal(b, &d)
			disc = append(disc, d)
		case api.EventWebhookRejected:
			var rj api.WebhookRejected
			_ = json.Unmarshal(b, &rj)
			if rj.Status == 410 {
				gone++
			}
		}
	}
	if len(disc) != 1 || !strings.Contains(disc[0].Reason, "sandbox stopped") || disc[0].Code != 1000 {
		t.Errorf("relay.disconnected: %+v, want one, code 1000, saying the sandbox stopped", disc)
	}
	if gone != 1 {
		t.Errorf("%d webhook.rejected events with status 410, want 1", gone)
	}

	// Nothing new is hung on the stopped sandbox.
	if r := ie.cli("", "webhook", "add", id, "gh2", "--port", "8080", "--verify", "github", "--secret", "GH_HOOK"); r.code == 0 || !strings.Contains(r.stderr, "stopped") {
		t.Errorf("webhook add to a stopped sandbox: %+v", r)
	}
	if r := ie.cli("", "relay", "add", id, "discord", "--name", "again", "--token-secret", "DISCORD_BOT", "--port", "8080"); r.code == 0 || !strings.Contains(r.stderr, "stopped") {
		t.Errorf("relay add to a stopped sandbox: %+v", r)
	}
	if r := ie.cli("", "rm", id); r.code != 0 {
		t.Errorf("rm: %+v", r)
	}
	if rep := post(body2, signGitHub(body2), "d-4"); rep.code != 404 {
		t.Errorf("the removed sandbox's webhook: %d, want 404", rep.code)
	}
}
