package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/cagebox/cagebox/api"
)

// guestServer is the python server the ingress tests run in the guest:
// JSON echo of path and headers, SSE, uploads (sha256), a WebSocket echo
// and a redirect with a cookie.
const guestServer = `
import http.server, socketserver, json, hashlib, base64, time, struct, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def reply(self, code, body, ctype="application/json", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra: self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path.startswith("/sse"):
            self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.send_header("Connection", "close"); self.end_headers()
            self.wfile.write(b"data: first\n\n"); self.wfile.flush(); time.sleep(2)
            self.wfile.write(b"data: second\n\n"); self.wfile.flush(); self.close_connection = True; return
        if self.path.startswith("/ws"):
            key = self.headers["Sec-WebSocket-Key"]
            acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101); self.send_header("Upgrade", "websocket"); self.send_header("Connection", "Upgrade"); self.send_header("Sec-WebSocket-Accept", acc); self.end_headers(); self.wfile.flush()
            while True:
                h = self.rfile.read(2)
                if len(h) < 2: return
                op, n = h[0] & 15, h[1] & 127
                if n == 126: n = struct.unpack(">H", self.rfile.read(2))[0]
                elif n == 127: n = struct.unpack(">Q", self.rfile.read(8))[0]
                mask = self.rfile.read(4) if h[1] & 128 else b"\0\0\0\0"
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
                if op == 8: return
                out = b"echo:" + data
                self.wfile.write(bytes([0x80 | op, len(out)]) + out); self.wfile.flush()
        if self.path.startswith("/redirect"):
            return self.reply(302, b"", extra=[("Location", "/target"), ("Set-Cookie", "k=v; Path=/app")])
        if self.path.startswith("/setcookie"):
            return self.reply(200, b"{}", extra=[("Set-Cookie", "tossed=1; Domain=sbx.test; Path=/"), ("Set-Cookie", "cagebox_session=evil; Path=/"), ("Set-Cookie", "own=1")])
        self.reply(200, json.dumps({"path": self.path, "port": self.server.server_address[1], "headers": dict(self.headers.items())}).encode())
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0")); h = hashlib.sha256(); left = n
        while left > 0:
            b = self.rfile.read(min(left, 1 << 20))
            if not b: break
            h.update(b); left -= len(b)
        self.reply(200, json.dumps({"n": n - left, "sha256": h.hexdigest()}).encode())
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
for p in sys.argv[1:]:
    import threading
    threading.Thread(target=S(("0.0.0.0", int(p)), H).serve_forever, daemon=True).start()
while True: time.sleep(3600)
`

const ingressDomain = "sbx.test"

// ingressEnv is a daemon with an ingress listener and a client that
// trusts its CA and sends every host to it.
type ingressEnv struct {
	*env
	addr string // 127.0.0.1:PORT of the listener
	tls  *tls.Config
	hc   *http.Client
}

// newIngressEnv starts a daemon with an ingress listener (and the daemon
// flags extra).
func newIngressEnv(t *testing.T, extra ...string) *ingressEnv {
	e := newDebianEnv(t)
	addr := freePort(t)
	e.startDaemon(append([]string{"--ingress", addr, "--ingress-domain", ingressDomain}, extra...)...)
	ie := &ingressEnv{env: e, addr: addr}
	ie.reloadCA(t)
	return ie
}

func (ie *ingressEnv) reloadCA(t *testing.T) {
	pem, err := os.ReadFile(filepath.Join(ie.home, "ingress", "ca.pem"))
	if err != nil {
		t.Fatalf("ingress CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("ingress CA: no certificate")
	}
	ie.tls = &tls.Config{RootCAs: pool, ServerName: ingressDomain}
	ie.hc = ie.client2(false)
}

// client2 is an HTTP client to the listener (h2: HTTP/2 allowed).
func (ie *ingressEnv) client2(h2 bool) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "tcp", ie.addr) },
		TLSClientConfig: ie.tls.Clone(), ForceAttemptHTTP2: h2,
	}
	tr.TLSClientConfig.ServerName = ""
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr, Timeout: 60 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

type ingressReply struct {
	code   int
	body   string
	header http.Header
	proto  int
	guest  struct {
		Path    string
		Port    int
		Headers map[string]string
	}
}

func (ie *ingressEnv) do(t *testing.T, hc *http.Client, method, u string, hdr map[string]string, body io.Reader) ingressReply {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := ingressReply{code: resp.StatusCode, body: string(b), header: resp.Header, proto: resp.ProtoMajor}
	_ = json.Unmarshal(b, &r.guest)
	return r
}

func hostURL(id string, port int, rest string) string {
	return fmt.Sprintf("https://%d-%s.%s%s", port, id, ingressDomain, rest)
}

// startGuestServer runs the python server on ports in the sandbox and
// waits until ingress reaches it (public or with token).
func (ie *ingressEnv) startGuestServer(t *testing.T, id string, token string, ports ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ie.client().WriteFile(ctx, id, "/tmp/srv.py", 0o644, strings.NewReader(guestServer)); err != nil {
		t.Fatal(err)
	}
	r := ie.cli("", "exec", id, "--", "sh", "-c", "setsid python3 /tmp/srv.py "+strings.Join(ports, " ")+" >/tmp/srv.log 2>&1 </dev/null &")
	if r.code != 0 {
		t.Fatalf("start guest server: %+v", r)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		rep := ie.do(t, ie.hc, "GET", hostURL(id, atoi(ports[0]), "/ready"), map[string]string{"X-Cagebox-Access": token}, nil)
		if rep.code == 200 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("guest server not reachable through ingress: %d %s", rep.code, rep.body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func atoi(s string) int {
	var n int
	fmt.Sscanf(s, "%d", &n)
	return n
}

var tokenRE = regexp.MustCompile(`token: (cbp_[A-Za-z0-9_-]+)`)

func TestIngress(t *testing.T) {
	ie := newIngressEnv(t)
	// A: a token port 8080 (8081 also listens, unpublished); idle-pauses after 4 s.
	r := ie.cli("", "create", "--publish", "8080", "--idle-timeout", "4s", "--idle-action", "pause")
	if r.code != 0 {
		t.Fatalf("create --publish: %+v", r)
	}
	a := strings.TrimSpace(r.stdout)
	m := tokenRE.FindStringSubmatch(r.stderr)
	if m == nil || !strings.Contains(r.stderr, hostURL(a, 8080, "")) {
		t.Fatalf("create --publish printed no token or URL: %q", r.stderr)
	}
	token := m[1]
	// B: a public port.
	r = ie.cli("", "create", "--publish", "8080:public")
	if r.code != 0 {
		t.Fatalf("create --publish :public: %+v", r)
	}
	b := strings.TrimSpace(r.stdout)
	ie.startGuestServer(t, a, token, "8080", "8081")
	ie.startGuestServer(t, b, "", "8080")
	auth := map[string]string{"X-Cagebox-Access": token}

	t.Run("http1 with token, headers", func(t *testing.T) {
		rep := ie.do(t, ie.hc, "GET", hostURL(a, 8080, "/hello?x=1"), map[string]string{
			"X-Cagebox-Access": token, "X-Cagebox-Tenant": "admin", "X-Forwarded-For": "6.6.6.6", "X-Forwarded-Host": "evil"}, nil)
		if rep.code != 200 || rep.guest.Path != "/hello?x=1" || rep.proto != 1 {
			t.Fatalf("GET: %d %q", rep.code, rep.body)
		}
		h := rep.guest.Headers
		for k := range h {
			if strings.HasPrefix(strings.ToLower(k), "x-cagebox") {
				t.Errorf("guest got %s", k)
			}
		}
		if h["X-Forwarded-For"] != "127.0.0.1" || h["X-Forwarded-Proto"] != "https" || h["X-Forwarded-Host"] != fmt.Sprintf("8080-%s.%s", a, ingressDomain) {
			t.Errorf("X-Forwarded-*: %v", h)
		}
		if strings.Contains(rep.body, token) {
			t.Error("the access token reached the guest")
		}
	})
	t.Run("http2", func(t *testing.T) {
		rep := ie.do(t, ie.client2(true), "GET", hostURL(a, 8080, "/h2"), auth, nil)
		if rep.code != 200 || rep.proto != 2 || rep.guest.Path != "/h2" {
			t.Fatalf("h2: %d proto %d %q", rep.code, rep.proto, rep.body)
		}
	})
	t.Run("path form", func(t *testing.T) {
		base := fmt.Sprintf("https://%s/s/%s/8080", ingressDomain, a)
		rep := ie.do(t, ie.hc, "GET", base+"/deep/x?y=2", auth, nil)
		if rep.code != 200 || rep.guest.Path != "/deep/x?y=2" {
			t.Fatalf("path form: %d %q", rep.code, rep.body)
		}
		rep = ie.do(t, ie.hc, "GET", base+"/redirect", auth, nil)
		if rep.code != 302 || rep.header.Get("Location") != "/s/"+a+"/8080/target" || !strings.Contains(rep.header.Get("Set-Cookie"), "Path=/s/"+a+"/8080/app") {
			t.Fatalf("redirect in the path form: %d %v", rep.code, rep.header)
		}
	})
	t.Run("access refused", func(t *testing.T) {
		if rep := ie.do(t, ie.hc, "GET", hostURL(a, 8080, "/"), nil, nil); rep.code != 401 {
			t.Errorf("no token: %d %s", rep.code, rep.body)
		}
		if rep := ie.do(t, ie.hc, "GET", hostURL(a, 8080, "/"), map[string]string{"X-Cagebox-Access": token + "x"}, nil); rep.code != 401 {
			t.Errorf("wrong token: %d %s", rep.code, rep.body)
		}
		if rep := ie.do(t, ie.hc, "GET", hostURL(a, 8080, "/?cbx_sig=1.AAAA"), nil, nil); rep.code != 401 {
			t.Errorf("forged signature: %d %s", rep.code, rep.body)
		}
		// Unpublished port, unknown sandbox, the proxy's and DNS ports, a
		// port of another sandbox: one 404 for all.
		var first string
		for _, u := range []string{hostURL(a, 8081, "/"), hostURL("sb-0123456789abcdef", 8080, "/"), hostURL(a, 15001, "/"),
			hostURL(a, 15053, "/"), hostURL(b, 8081, "/"), "https://" + ingressDomain + "/v1/sandboxes", "https://" + ingressDomain + "/s/" + b + "/8081/"} {
			rep := ie.do(t, ie.hc, "GET", u, auth, nil)
			if rep.code != 404 {
				t.Errorf("%s: %d %s", u, rep.code, rep.body)
			}
			if first == "" {
				first = rep.body
			} else if rep.body != first {
				t.Errorf("%s: a different 404 (%q vs %q) tells sandboxes apart", u, rep.body, first)
			}
		}
		// B is public: no token needed.
		if rep := ie.do(t, ie.hc, "GET", hostURL(b, 8080, "/"), nil, nil); rep.code != 200 || rep.guest.Port != 8080 {
			t.Errorf("public port: %d %s", rep.code, rep.body)
		}
	})
	t.Run("signed url, cookie, expiry, rotation", func(t *testing.T) {
		r := ie.cli("", "port", "url", a, "8080", "--ttl", "10m")
		su := strings.TrimSpace(r.stdout)
		if r.code != 0 || !strings.HasPrefix(su, hostURL(a, 8080, ":"+ie.addr[strings.LastIndex(ie.addr, ":")+1:]+"/?cbx_sig=")) {
			t.Fatalf("port url: %+v", r)
		}
		rep := ie.do(t, ie.hc, "GET", su, nil, nil)
		if rep.code != 200 || strings.Contains(rep.guest.Path, "cbx_sig") {
			t.Fatalf("signed URL: %d %q", rep.code, rep.body)
		}
		var cookie string
		for _, c := range (&http.Response{Header: rep.header}).Cookies() {
			if c.Name == "cbx_access" {
				cookie = c.Name + "=" + c.Value
			}
		}
		if cookie == "" {
			t.Fatalf("no access cookie: %v", rep.header)
		}
		rep = ie.do(t, ie.hc, "GET", hostURL(a, 8080, "/page"), map[string]string{"Cookie": cookie + "; app=1"}, nil)
		if rep.code != 200 || strings.Contains(rep.guest.Headers["Cookie"], "cbx_access") || rep.guest.Headers["Cookie"] != "app=1" {
			t.Fatalf("cookie: %d %q", rep.code, rep.body)
		}
		r = ie.cli("", "port", "url", a, "8080", "--ttl", "1s")
		short := strings.TrimSpace(r.stdout)
		time.Sleep(2100 * time.Millisecond)
		if rep := ie.do(t, ie.hc, "GET", short, nil, nil); rep.code != 403 {
			t.Errorf("expired signed URL: %d %s", rep.code, rep.body)
		}
		// Publishing again rotates the token: the old token and URL stop.
		r = ie.cli("", "port", "add", a, "8080", "--print-token")
		newTok := strings.TrimSpace(r.stdout)
		if r.code != 0 || !strings.HasPrefix(newTok, "cbp_") {
			t.Fatalf("port add again: %+v", r)
		}
		if rep := ie.do(t, ie.hc, "GET", hostURL(a, 8080, "/"), auth, nil); rep.code != 401 {
			t.Errorf("old token after rotation: %d", rep.code)
		}
		if rep := ie.do(t, ie.hc, "GET", su, nil, nil); rep.code != 401 {
			t.Errorf("old signed URL after rotation: %d", rep.code)
		}
		token = newTok
		auth["X-Cagebox-Access"] = token
		if rep := ie.do(t, ie.hc, "GET", hostURL(a, 8080, "/"), auth, nil); rep.code != 200 {
			t.Errorf("new token: %d", rep.code)
		}
	})
	t.Run("nothing of cagebox's reaches the guest", func(t *testing.T) {
		// A real console session: its cookie is host-only for 127.0.0.1,
		// and browsers send a host's cookies to every port of it.
		link := ie.cli("", "console")
		if link.code != 0 || !strings.HasPrefix(link.stdout, "http://127.0.0.1:") {
			t.Fatalf("cagebox console: %+v", link)
		}
		noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := noRedirect.Get(strings.TrimSpace(link.stdout))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		var session string
		for _, c := range resp.Cookies() {
			if c.Name == "cagebox_session" {
				session = c.Name + "=" + c.Value
			}
		}
		if session == "" {
			t.Fatalf("console login gave no session cookie: %d %v", resp.StatusCode, resp.Header)
		}
		r := ie.cli("", "port", "url", a, "8080", "--ttl", "10m")
		su := strings.TrimSpace(r.stdout)
		if r.code != 0 || !strings.Contains(su, "?cbx_sig=") {
			t.Fatalf("port url: %+v", r)
		}
		sigValue := su[strings.Index(su, "cbx_sig=")+len("cbx_sig="):]
		hdr := map[string]string{
			"Cookie":           session + "; cbx_access=" + sigValue + "; app=1; __Host-cagebox_session=x",
			"X_Cagebox_Tenant": "admin",
		}
		port := ie.addr[strings.LastIndex(ie.addr, ":")+1:]
		for _, u := range []string{
			// The signature with its name encoded: still the signature,
			// and still removed.
			strings.Replace(su, "?cbx_sig=", "c?x=1&cbx%5Fsig=", 1),
			fmt.Sprintf("https://%s:%s/s/%s/8080/c?x=1&cbx%%5Fsig=%s", ingressDomain, port, a, sigValue),
		} {
			rep := ie.do(t, ie.hc, "GET", u, hdr, nil)
			if rep.code != 200 || rep.guest.Path != "/c?x=1" {
				t.Fatalf("%s: %d %q", u, rep.code, rep.body)
			}
			for k, v := range rep.guest.Headers {
				if strings.Contains(strings.ToLower(strings.ReplaceAll(k, "_", "-")), "cagebox") {
					t.Errorf("%s: the guest got header %s: %s", u, k, v)
				}
			}
			if c := rep.guest.Headers["Cookie"]; c != "app=1" {
				t.Errorf("%s: the guest got Cookie %q, want only app=1", u, c)
			}
			if strings.Contains(rep.body, sigValue) || strings.Contains(rep.body, strings.TrimPrefix(session, "cagebox_session=")) {
				t.Errorf("%s: a signature or session reached the guest: %s", u, rep.body)
			}
		}
		// The path form is not served under the console's host name.
		// (TLS still names D: the listener's certificate is for D and *.D.)
		tr := &http.Transport{TLSClientConfig: ie.tls.Clone(), DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", ie.addr)
		}}
		defer tr.CloseIdleConnections()
		rep := ie.do(t, &http.Client{Transport: tr, Timeout: 60 * time.Second}, "GET", fmt.Sprintf("https://127.0.0.1:%s/s/%s/8080/c", port, a),
			map[string]string{"X-Cagebox-Access": token, "Cookie": session}, nil)
		if rep.code != 404 {
			t.Errorf("path form on the console's host name: %d %q, want 404", rep.code, rep.body)
		}
		// The guest's cookies stay with its port: no Domain, none of
		// cagebox's names.
		rep = ie.do(t, ie.hc, "GET", hostURL(a, 8080, "/setcookie"), map[string]string{"X-Cagebox-Access": token}, nil)
		if got := strings.Join(rep.header.Values("Set-Cookie"), " | "); rep.code != 200 || got != "tossed=1; Path=/ | own=1" {
			t.Errorf("guest's Set-Cookie: %d %q, want %q", rep.code, got, "tossed=1; Path=/ | own=1")
		}
	})
	t.Run("sse streamed", func(t *testing.T) {
		req, _ := http.NewRequest("GET", hostURL(a, 8080, "/sse"), nil)
		req.Header.Set("X-Cagebox-Access", token)
		t0 := time.Now()
		resp, err := ie.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 64)
		n, err := resp.Body.Read(buf)
		first := time.Since(t0)
		if err != nil || !strings.Contains(string(buf[:n]), "data: first") {
			t.Fatalf("first event: %q %v", buf[:n], err)
		}
		if first > 1500*time.Millisecond {
			t.Errorf("first event after %s: buffered until the stream ended", first)
		}
		rest, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(rest), "data: second") {
			t.Errorf("second event: %q", rest)
		}
		t.Logf("SSE first event after %s, stream %s", first, time.Since(t0))
	})
	t.Run("upload 50MB", func(t *testing.T) {
		data := make([]byte, 50<<20)
		_, _ = rand.Read(data)
		sum := sha256.Sum256(data)
		t0 := time.Now()
		rep := ie.do(t, ie.hc, "POST", hostURL(a, 8080, "/upload"), auth, bytes.NewReader(data))
		var got struct {
			N      int    `json:"n"`
			SHA256 string `json:"sha256"`
		}
		_ = json.Unmarshal([]byte(rep.body), &got)
		if rep.code != 200 || got.N != len(data) || got.SHA256 != hex.EncodeToString(sum[:]) {
			t.Fatalf("upload: %d %q", rep.code, rep.body)
		}
		t.Logf("50 MiB upload through ingress in %s", time.Since(t0))
	})
	t.Run("websocket echo", func(t *testing.T) {
		ws := ie.openWS(t, a, 8080, token)
		defer ws.Close()
		for _, msg := range []string{"one", "two"} {
			wsEcho(t, ws, msg)
		}
	})
	t.Run("host cannot reach guest ports directly", func(t *testing.T) {
		sb, err := ie.client().Get(context.Background(), a)
		if err != nil || sb.Network == nil {
			t.Fatalf("inspect: %v", err)
		}
		for _, p := range []string{"8080", "8081"} {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(sb.Network.Address, p), 500*time.Millisecond)
			if err == nil {
				c.Close()
				t.Errorf("an unmarked host connection reached the guest's port %s", p)
			}
		}
	})
	t.Run("ports ls and events", func(t *testing.T) {
		r := ie.cli("", "port", "ls", a, "--json")
		var ps []api.Port
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &ps) != nil || len(ps) != 1 || ps[0].Port != 8080 || ps[0].Token != "" {
			t.Fatalf("port ls: %+v", r)
		}
		r = ie.cli("", "events", a, "--json")
		if !strings.Contains(r.stdout, `"ingress.request"`) || strings.Contains(r.stdout, token) || strings.Contains(r.stdout, "cbx_sig=") {
			t.Errorf("events: ingress.request missing, or a token/signature in them: %.2000s", r.stdout)
		}
	})
	t.Run("idle pause, woken by a request", func(t *testing.T) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			sb, err := ie.client().Get(context.Background(), a)
			if err == nil && sb.Status == "paused" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not idle-paused: %+v %v", sb, err)
			}
			time.Sleep(300 * time.Millisecond)
		}
		t0 := time.Now()
		rep := ie.do(t, ie.hc, "GET", hostURL(a, 8080, "/wake"), auth, nil)
		if rep.code != 200 || rep.guest.Path != "/wake" {
			t.Fatalf("request to a paused sandbox: %d %q", rep.code, rep.body)
		}
		t.Logf("request to the paused sandbox answered in %s", time.Since(t0))
		sb, err := ie.client().Get(context.Background(), a)
		if err != nil || sb.Status != "running" || sb.LastWake == nil || sb.LastWake.Reason != "ingress 8080" {
			t.Fatalf("inspect after wake: %+v %v", sb, err)
		}
	})
	t.Run("ports survive a daemon restart", func(t *testing.T) {
		ie.stopDaemon(syscall.SIGTERM)
		ie.startDaemon("--ingress", ie.addr, "--ingress-domain", ingressDomain)
		ie.reloadCA(t)
		deadline := time.Now().Add(15 * time.Second)
		for {
			rep := ie.do(t, ie.hc, "GET", hostURL(a, 8080, "/again"), auth, nil)
			if rep.code == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after restart: %d %s", rep.code, rep.body)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if r := ie.cli("", "port", "rm", a, "8080"); r.code != 0 {
			t.Fatalf("port rm: %+v", r)
		}
		if rep := ie.do(t, ie.hc, "GET", hostURL(a, 8080, "/"), auth, nil); rep.code != 404 {
			t.Errorf("after port rm: %d", rep.code)
		}
		if r := ie.cli("", "port", "rm", a, "8080"); r.code == 0 || !strings.Contains(r.stderr, "not published") {
			t.Errorf("port rm twice: %+v", r)
		}
	})
	t.Run("port rm closes open websockets, counted both ways", func(t *testing.T) {
		// A WebSocket to B's public 8080, which goes; one to A's 8081,
		// published now, which stays.
		r := ie.cli("", "port", "add", a, "8081", "--print-token")
		tok81 := strings.TrimSpace(r.stdout)
		if r.code != 0 || !strings.HasPrefix(tok81, "cbp_") {
			t.Fatalf("port add %s 8081: %+v", a, r)
		}
		gone := ie.openWS(t, b, 8080, "")
		defer gone.Close()
		stays := ie.openWS(t, a, 8081, tok81)
		defer stays.Close()
		msg := strings.Repeat("x", 100) // the guest echoes frames under 126 bytes
		for _, ws := range []*websocket.Conn{gone, stays} {
			wsEcho(t, ws, msg)
		}
		t0 := time.Now()
		if r := ie.cli("", "port", "rm", b, "8080"); r.code != 0 {
			t.Fatalf("port rm: %+v", r)
		}
		rm := time.Since(t0)
		_ = gone.SetReadDeadline(time.Now().Add(2 * time.Second))
		var got string
		err := websocket.Message.Receive(gone, &got)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the WebSocket to the unpublished port is still open 2s after port rm returned (in %s)", rm)
		}
		if err == nil {
			t.Fatalf("the WebSocket to the unpublished port sent %q after port rm", got)
		}
		t.Logf("port rm took %s; the client's WebSocket ended (%v) %s after port rm returned, %s after it started", rm, err, time.Since(t0)-rm, time.Since(t0))
		if rep := ie.do(t, ie.hc, "GET", hostURL(b, 8080, "/"), nil, nil); rep.code != 404 {
			t.Errorf("a new request after port rm: %d %s", rep.code, rep.body)
		}
		wsEcho(t, stays, "still here")
		// The WebSocket's ingress.request event counts what went through
		// it after the upgrade (the 100-byte message each way).
		deadline := time.Now().Add(30 * time.Second)
		for {
			var ir *api.IngressRequest
			for _, ev := range ie.eventsOf(b) {
				var d api.IngressRequest
				if ev.Kind == api.EventIngressRequest && json.Unmarshal(dataOf(ev), &d) == nil && d.Path == "/ws" && d.Status == 101 {
					ir = &d
				}
			}
			if ir != nil {
				if ir.BytesIn < int64(len(msg)) || ir.BytesOut < int64(len(msg)) {
					t.Errorf("the WebSocket's ingress.request counts %d bytes in, %d out; want ≥ %d each way", ir.BytesIn, ir.BytesOut, len(msg))
				}
				t.Logf("websocket event: %d bytes in, %d out", ir.BytesIn, ir.BytesOut)
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no ingress.request event of the cut WebSocket")
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
}

// openWS opens a WebSocket to /ws on port of sandbox id through the
// listener (token "": a public port).
func (ie *ingressEnv) openWS(t *testing.T, id string, port int, token string) *websocket.Conn {
	t.Helper()
	host := fmt.Sprintf("%d-%s.%s", port, id, ingressDomain)
	conf, err := websocket.NewConfig("wss://"+host+"/ws", "https://"+ingressDomain)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		conf.Header = http.Header{"X-Cagebox-Access": {token}}
	}
	tc := ie.tls.Clone()
	tc.ServerName = host
	tc.NextProtos = []string{"http/1.1"}
	raw, err := tls.Dial("tcp", ie.addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := websocket.NewClient(conf, raw)
	if err != nil {
		raw.Close()
		t.Fatalf("websocket handshake to %s: %v", host, err)
	}
	return ws
}

// wsEcho sends msg and expects the guest server's echo of it.
func wsEcho(t *testing.T, ws *websocket.Conn, msg string) {
	t.Helper()
	if err := websocket.Message.Send(ws, msg); err != nil {
		t.Fatalf("websocket send: %v", err)
	}
	var got string
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := websocket.Message.Receive(ws, &got); err != nil || got != "echo:"+msg {
		t.Fatalf("websocket echo: %.40q %v", got, err)
	}
}
