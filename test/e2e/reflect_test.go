package e2e

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/andybalholm/brotli"
	"golang.org/x/net/websocket"

	"github.com/cagebox/cagebox/internal/testpki"
)

// reflectUpstream is a loopback HTTPS server (HTTP/1.1 and HTTP/2) that
// hands back what it received in every way an upstream might: echo
// bodies, a redirect keeping the query, a cookie, a status reason, JSONP,
// SSE, chunked, gzip and br bodies, a WebSocket that says what the
// upgrade carried.
func reflectUpstream(t *testing.T, names ...string) *upstream {
	t.Helper()
	pki, err := testpki.New(time.Hour, names...)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		auth := r.Header.Get("Authorization")
		key := r.URL.Query().Get("access_token")
		var js strings.Builder
		for _, c := range key {
			fmt.Fprintf(&js, `\u%04x`, c)
		}
		echo := fmt.Sprintf("auth=%s\nkey=%s\nquery=%s\nbody=%s\nb64=%s\nbasic=%s\nhex=%s\npct=%s\njson={\"k\":\"%s\"}\n",
			auth, key, r.URL.RawQuery, body, base64.StdEncoding.EncodeToString([]byte(auth)),
			base64.StdEncoding.EncodeToString([]byte("user:"+key)), hex.EncodeToString([]byte(key)),
			strings.ReplaceAll(url.QueryEscape(key), "_", "%5F"), js.String())
		half := len(echo) / 2
		if i := strings.Index(echo, key); i > 0 && key != "" {
			half = i + 5
		}
		flush := func() { http.NewResponseController(w).Flush() }
		switch strings.TrimPrefix(r.URL.Path, "/") {
		case "echo":
			io.WriteString(w, echo)
		case "chunked":
			io.WriteString(w, echo[:half])
			flush()
			io.WriteString(w, echo[half:])
		case "redirect":
			http.Redirect(w, r, "/next?"+r.URL.RawQuery, http.StatusFound)
		case "cookie":
			http.SetCookie(w, &http.Cookie{Name: "sid", Value: base64.RawURLEncoding.EncodeToString([]byte("u:" + key))})
			w.Header().Set("X-Debug-Auth", auth)
		case "jsonp":
			w.Header().Set("Content-Type", "application/javascript")
			fmt.Fprintf(w, "%s({\"key\":\"%s\",\"echo\":%q});\n", r.URL.Query().Get("callback"), js.String(), auth)
		case "sse":
			w.Header().Set("Content-Type", "text/event-stream")
			for range 3 {
				fmt.Fprintf(w, "data: {\"auth\":%q}\n\n", auth)
				flush()
			}
		case "status":
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				io.WriteString(w, "HTTP/2: no raw status line\n")
				return
			}
			defer c.Close()
			fmt.Fprintf(brw, "HTTP/1.1 401 Bad key %s\r\nContent-Length: 3\r\nConnection: close\r\n\r\nno\n", key)
			brw.Flush()
		case "gzip":
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			io.WriteString(zw, echo[:half])
			zw.Flush()
			io.WriteString(zw, echo[half:])
			zw.Close()
		case "br":
			w.Header().Set("Content-Encoding", "br")
			zw := brotli.NewWriter(w)
			io.WriteString(zw, echo[:half])
			zw.Flush()
			io.WriteString(zw, echo[half:])
			zw.Close()
		default:
			http.NotFound(w, r)
		}
	})
	mux.Handle("/ws", websocket.Server{Handler: func(ws *websocket.Conn) {
		websocket.Message.Send(ws, "auth="+ws.Request().Header.Get("Authorization")+" ext="+ws.Request().Header.Get("Sec-WebSocket-Extensions"))
		for {
			var m string
			if err := websocket.Message.Receive(ws, &m); err != nil {
				return
			}
			websocket.Message.Send(ws, "echo:"+m)
		}
	}})
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	u := &upstream{srv: srv, port: srv.Listener.Addr().(*net.TCPAddr).Port}
	u.caFile = filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(u.caFile, pki.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return u
}

// realForms lists the forms of real that text carries: raw, percent- or
// JSON-escaped, hex, base64 at any alignment.
func realForms(text, real string) []string {
	var out []string
	dec := text
	for range 2 {
		if d, err := url.PathUnescape(strings.ReplaceAll(dec, "+", "%2B")); err == nil {
			dec = d
		}
	}
	var js strings.Builder
	for _, c := range real {
		fmt.Fprintf(&js, `\u%04x`, c)
	}
	lower := strings.ToLower(text)
	for name, found := range map[string]bool{
		"raw": strings.Contains(text, real), "percent": strings.Contains(dec, real),
		"json": strings.Contains(lower, js.String()), "hex": strings.Contains(lower, hex.EncodeToString([]byte(real))),
	} {
		if found {
			out = append(out, name)
		}
	}
	for k := range 3 {
		buf := append(bytes.Repeat([]byte{0}, k), real...)
		for _, e := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			s := e.EncodeToString(buf)
			if strings.Contains(text, s[(8*k+5)/6:8*(k+len(real))/6]) {
				out = append(out, fmt.Sprintf("base64@%d", k))
			}
		}
	}
	return out
}

// wsScript speaks WebSocket from the guest with nothing but python3: the
// upgrade carries $TOKEN in Authorization and offers permessage-deflate;
// it prints the first frame, sends SEND (a masked text frame) and prints
// the answer, or CLOSED when the gateway closed the connection.
const wsScript = `
import base64, os, socket, ssl, struct, sys
send = sys.argv[1] if len(sys.argv) > 1 else "hello"
ctx = ssl.create_default_context()
s = ctx.wrap_socket(socket.create_connection(("api.example.test", 443), timeout=10), server_hostname="api.example.test")
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET /ws HTTP/1.1\r\nHost: api.example.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
  "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nOrigin: https://api.example.test\r\n"
  "Sec-WebSocket-Extensions: permessage-deflate\r\nAuthorization: Bearer %s\r\n\r\n" % (key, os.environ["TOKEN"])).encode())
buf = b""
while b"\r\n\r\n" not in buf:
    buf += s.recv(4096)
head, buf = buf.split(b"\r\n\r\n", 1)
print(head.split(b"\r\n")[0].decode())
def frame():
    global buf
    while True:
        if len(buf) >= 2:
            n, h = buf[1] & 0x7f, 2
            if n == 126: n, h = struct.unpack(">H", buf[2:4])[0], 4
            elif n == 127: n, h = struct.unpack(">Q", buf[2:10])[0], 10
            if len(buf) >= h + n:
                p, buf = buf[h:h+n], buf[h+n:]
                return p
        d = s.recv(65536)
        if not d: return None
        buf += d
print("frame:", frame().decode())
data = send.encode()
mask = os.urandom(4)
hdr = bytes([0x81]) + (bytes([0x80 | len(data)]) if len(data) < 126 else bytes([0x80 | 126]) + struct.pack(">H", len(data)))
s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
try:
    p = frame()
except OSError:
    p = None
print("answer:", p.decode() if p is not None else "CLOSED")
`

// TestResponseScrub: from inside a sandbox, an upstream that reflects the
// request in every way (echo, chunked, redirect, cookie, status reason,
// JSONP, SSE, gzip, br, HTTP/2, WebSocket) never hands the guest the real
// value in any form; it gets its placeholder back, and each reflection
// raises secret.reflected. A placeholder in a guest WebSocket frame closes
// the connection with an alert.
func TestResponseScrub(t *testing.T) {
	e := newDebianEnv(t)
	up := reflectUpstream(t, "api.example.test")
	e.startDaemon(up.daemonArgs("api.example.test")...)
	const real = "ghp_R3flect3dT0kenThatMustNeverComeBack01"
	t.Setenv("TOKEN", real)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("version: 1\nrules:\n  - {name: ws, host: api.example.test, protocol: websocket, action: allow}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.cli("", "create", "--policy", pol, "--allow", "api.example.test", "--secret", "TOKEN@api.example.test",
		"--secret-query", "TOKEN:access_token", "--secret-in-body", "TOKEN")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	sh := func(script string) result { t.Helper(); return e.cli("", "exec", id, "--", "sh", "-c", script) }
	ph := sh(`printf %s "$TOKEN"`).stdout
	if ph == real || !strings.HasPrefix(ph, "ghp_") {
		t.Fatalf("guest TOKEN %q", ph)
	}
	q := `?callback=cb&access_token=$TOKEN`
	curl := `curl -sS -i -H "Authorization: Bearer $TOKEN" -d "{\"t\":\"$TOKEN\"}" `
	var guest strings.Builder
	for _, c := range []struct{ name, script string }{
		{"echo h1", curl + `--http1.1 "https://api.example.test/echo` + q + `"`},
		{"echo h2", curl + `--http2 "https://api.example.test/echo` + q + `"`},
		{"chunked", curl + `--http1.1 "https://api.example.test/chunked` + q + `"`},
		{"redirect", curl + `"https://api.example.test/redirect` + q + `"`},
		{"cookie", curl + `"https://api.example.test/cookie` + q + `"`},
		{"status", curl + `--http1.1 "https://api.example.test/status` + q + `"`},
		{"jsonp", curl + `"https://api.example.test/jsonp` + q + `"`},
		{"sse", curl + `-N "https://api.example.test/sse` + q + `"`},
		{"gzip", curl + `--compressed "https://api.example.test/gzip` + q + `"`},
		{"gzip raw", strings.Replace(curl, " -i ", " ", 1) + `-H "Accept-Encoding: gzip" "https://api.example.test/gzip` + q + `" | gzip -dc`},
		{"br", curl + `--compressed -H "Accept-Encoding: br" "https://api.example.test/br` + q + `"`},
	} {
		r := sh(c.script)
		out := r.stdout + r.stderr
		guest.WriteString(out)
		if r.code != 0 {
			t.Errorf("%s: %+v", c.name, r)
		}
		if f := realForms(out, real); len(f) > 0 {
			t.Errorf("%s: the guest got the real value (%v):\n%s", c.name, f, out)
		}
		if c.name != "status" && !strings.Contains(out, ph) && !strings.Contains(out, base64.RawURLEncoding.EncodeToString([]byte("u:"+ph))) {
			t.Errorf("%s: the placeholder did not come back:\n%s", c.name, out)
		}
	}
	if r := e.cli(wsScript, "exec", id, "--", "sh", "-c", "cat > /tmp/ws.py"); r.code != 0 {
		t.Fatal(r)
	}
	r = sh(`python3 /tmp/ws.py hello`)
	guest.WriteString(r.stdout + r.stderr)
	if !strings.Contains(r.stdout, "101") || !strings.Contains(r.stdout, "frame: auth=Bearer "+ph+" ext=\n") || !strings.Contains(r.stdout, "answer: echo:hello") {
		t.Errorf("websocket: %+v", r)
	}
	r = sh(`python3 /tmp/ws.py "leak $(printf %s "$TOKEN" | base64 -w0)"`)
	guest.WriteString(r.stdout + r.stderr)
	if !strings.Contains(r.stdout, "answer: CLOSED") {
		t.Errorf("websocket frame with the placeholder: %+v", r)
	}
	if f := realForms(guest.String(), real); len(f) > 0 {
		t.Errorf("the guest saw the real value (%v)", f)
	}
	// The event path is asynchronous: wait for the last one (the
	// WebSocket alert) before reading them all.
	var ev string
	waitFor(t, time.Minute, "the WebSocket alert among the events", func() bool {
		ev = e.cli("", "events", "--json", id).stdout
		return strings.Contains(ev, "WebSocket frame") && strings.Contains(ev, `"where":"websocket"`)
	})
	for _, where := range []string{`"where":"body"`, `"where":"header:Location"`, `"where":"header:Set-Cookie"`, `"where":"websocket"`} {
		if !strings.Contains(ev, where) {
			t.Errorf("no secret.reflected event %s", where)
		}
	}
	if !strings.Contains(ev, `"secret.reflected"`) || !strings.Contains(ev, "WebSocket frame") {
		t.Errorf("events lack secret.reflected or the WebSocket alert")
	}
	if strings.Contains(ev, real) || strings.Contains(e.logBuf.String(), real) {
		t.Error("real value in events or the daemon log")
	}
}
