package e2e

import (
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestIngressPlain: --ingress-plain serves the same routing and access
// rules over plain HTTP on loopback (for a TLS-terminating proxy on the
// host), tells the guest the client's scheme was https, and is refused on
// anything but loopback.
func TestIngressPlain(t *testing.T) {
	e := newDebianEnv(t)
	addr, plain := freePort(t), freePort(t)
	// Refused off loopback, with what to do.
	out, err := exec.Command(filepath.Join(binDir, "cagebox"), "--home", t.TempDir(), "daemon",
		"--agent", filepath.Join(binDir, "cagebox-agent"), "--ingress", addr, "--ingress-domain", ingressDomain, "--ingress-plain", "0.0.0.0:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "loopback") {
		t.Fatalf("--ingress-plain on every address: %v %s", err, out)
	}
	e.startDaemon("--ingress", addr, "--ingress-domain", ingressDomain, "--ingress-plain", plain)
	ie := &ingressEnv{env: e, addr: addr}
	ie.reloadCA(t)
	r := ie.cli("", "create", "--publish", "8080")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.Fields(r.stdout)[0]
	tok := tokenRE.FindStringSubmatch(r.stderr + r.stdout)
	if tok == nil {
		t.Fatalf("no token in %+v", r)
	}
	ie.startGuestServer(t, id, tok[1], "8080")
	hc := &http.Client{Timeout: 20 * time.Second}
	get := func(token string) ingressReply {
		h := map[string]string{"Host": strings.TrimPrefix(hostURL(id, 8080, ""), "https://")}
		if token != "" {
			h["X-Cagebox-Access"] = token
		}
		return ie.do(t, hc, "GET", "http://"+plain+"/plain", h, nil)
	}
	rep := get(tok[1])
	if rep.code != 200 || rep.guest.Path != "/plain" || rep.guest.Headers["X-Forwarded-Proto"] != "https" {
		t.Fatalf("through the plain listener: %d %+v", rep.code, rep.guest)
	}
	if rep := get(""); rep.code != 401 {
		t.Errorf("no token on the plain listener: %d, want 401", rep.code)
	}
	if rep := ie.do(t, hc, "GET", "http://"+plain+"/v1/health", nil, nil); rep.code != 404 {
		t.Errorf("the daemon API through the plain listener: %d, want 404", rep.code)
	}
}
