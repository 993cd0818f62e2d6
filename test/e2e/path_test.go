package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/testpki"
)

// TestEgressPathAttacks attacks a policy's path and method rules from
// inside a sandbox, with curl sending paths byte for byte (--path-as-is):
// each attack is refused and never reaches the upstream, and an allowed
// request reaches it with exactly the path the policy decided on. Before,
// the proxy decoded the path once and the policy again, so
// "/admin/%252e%252e/public/x" was allowed as "/public/x".
func TestEgressPathAttacks(t *testing.T) {
	e := newDebianEnv(t)
	pki, err := testpki.New(time.Hour, "api.example.test")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string // "METHOD request-target"
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.RequestURI)
		mu.Unlock()
		fmt.Fprintf(w, "upstream got %s %s\n", r.Method, r.RequestURI)
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pki.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	e.startDaemon("--upstream-ca", caFile, "--resolve", fmt.Sprintf("api.example.test:443=127.0.0.1:%d", port))

	pol := `{"version":1,"rules":[
	  {"name":"no-admin","host":"api.example.test","paths":["/admin/**"],"action":"deny"},
	  {"name":"public","host":"api.example.test","paths":["/public/**"],"methods":["GET","POST"],"action":"allow"},
	  {"name":"read-only","host":"api.example.test","methods":["GET"],"action":"allow"}]}`
	sb, err := e.client().Create(context.Background(), &api.CreateSandboxRequest{Policy: json.RawMessage(pol)})
	if err != nil {
		t.Fatal(err)
	}
	sh := func(script string) result {
		t.Helper()
		return e.cli("", "exec", sb.ID, "--", "sh", "-c", script)
	}
	curl := "curl -sS -m 10 --path-as-is -w '\\n%{http_code}' "

	// Allowed, and sent exactly as decided: escapes of unreserved
	// characters decoded, the others upper-cased.
	r := sh(curl + "'https://api.example.test/public/a%2fb%7e'")
	if !strings.HasSuffix(r.stdout, "\n200") || !strings.Contains(r.stdout, "upstream got GET /public/a%2Fb~") {
		t.Errorf("allowed request: %+v", r)
	}
	mu.Lock()
	before := len(seen)
	mu.Unlock()

	for _, a := range []struct{ name, args, rule string }{
		{"double-encoded dot segments into an allowed path", "'https://api.example.test/admin/%252e%252e/public/x'", "builtin:path"},
		{"encoded dot segments", "'https://api.example.test/public/%2e%2e/admin/x'", "builtin:path"},
		{"double-encoded slash and dots", "'https://api.example.test/admin%252F..%252Fpublic/x'", "no-admin"},
		{"encoded slash", "'https://api.example.test/admin%2Fusers'", "no-admin"},
		{"path parameter", "'https://api.example.test/admin;jsessionid=1/users'", "no-admin"},
		{"letter case", "'https://api.example.test/ADMIN/users'", "no-admin"},
		{"escaped letter case", "'https://api.example.test/%41dmin/users'", "no-admin"},
		{"lower-case method", "-X delete 'https://api.example.test/public/x'", "default"},
		{"method override header", "-H 'X-HTTP-Method-Override: DELETE' 'https://api.example.test/public/x'", "default"},
		{"method override query", "'https://api.example.test/x?_method=DELETE'", "default"},
	} {
		r := sh(curl + a.args)
		if !strings.HasSuffix(r.stdout, "\n403") || !strings.Contains(r.stdout, `"rule":"`+a.rule+`"`) {
			t.Errorf("%s: not refused by %s: %+v", a.name, a.rule, r)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != before {
		t.Errorf("upstream received attacks: %v", seen[before:])
	}
}
