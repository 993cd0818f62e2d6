package e2e

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
)

// validateHMAC recomputes a webhook-style signature with the REAL key:
// X-Signature: sha256=hex(HMAC(key, method\npath\nX-Timestamp\nbody)).
func validateHMAC(real string) func(*http.Request) error {
	return func(r *http.Request) error {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		m := hmac.New(sha256.New, []byte(real))
		fmt.Fprintf(m, "%s\n%s\n%s\n", r.Method, r.URL.EscapedPath(), r.Header.Get("X-Timestamp"))
		m.Write(body)
		if want := "sha256=" + hex.EncodeToString(m.Sum(nil)); r.Header.Get("X-Signature") != want {
			return fmt.Errorf("hmac signature does not verify with the real key")
		}
		return nil
	}
}

// hmacScript signs and sends a request from the guest with python3, using
// the placeholder key in $HOOK. SEND_BODY, when set, replaces the body after
// signing (a tampered request).
const hmacScript = `
import hmac, hashlib, os, sys, time, urllib.request, urllib.error
url, body = sys.argv[1], sys.argv[2].encode()
path = urllib.request.urlparse(url).path
ts = str(int(time.time()))
msg = b"\n".join([b"POST", path.encode(), ts.encode(), body])
sig = "sha256=" + hmac.new(os.environ["HOOK"].encode(), msg, hashlib.sha256).hexdigest()
send = os.environ.get("SEND_BODY", sys.argv[2]).encode()
req = urllib.request.Request(url, data=send, method="POST", headers={"X-Timestamp": ts, "X-Signature": sig, "Content-Type": "application/json"})
try:
    print(urllib.request.urlopen(req).read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
`

// TestHMACResign: the guest signs webhook-style requests with a placeholder
// key; an upstream that validates with the REAL key accepts the re-signed
// request (path with a space, JSON body); a request changed after signing
// is refused; a placeholder-signed request to another host is refused with
// an alert; the placeholder key itself is refused wherever it is sent; the
// real key is never in the guest.
func TestHMACResign(t *testing.T) {
	e := newDebianEnv(t)
	const real = "whsec_REALsigningKEY_0123456789abcdefABCDEF"
	up := newUpstream(t, "hooks.example.test", "other.example.test")
	up.validate = validateHMAC(real)
	up.reflect = true // the answer echoes the X-Signature it got
	e.startDaemon(up.daemonArgs("hooks.example.test", "other.example.test")...)
	os.Setenv("CBX_HOOK", real)
	defer os.Unsetenv("CBX_HOOK")
	if r := e.cli("", "secret", "add", "HOOK", "--host", "hooks.example.test", "--from-env", "CBX_HOOK"); r.code != 0 {
		t.Fatal(r)
	}
	// Bad configurations are refused up front and leave nothing behind.
	for _, bad := range []string{"HOOK:header=X-Signature,sign=method+nonsense", "HOOK:header=X-Signature,sign=body,algorithm=md5", "HOOK:sign=body"} {
		if r := e.cli("", "create", "--secret", "HOOK=vault:HOOK", "--secret-hmac", bad); r.code == 0 || !strings.Contains(r.stderr, "hmac") {
			t.Errorf("--secret-hmac %s: %+v", bad, r)
		}
	}
	if r := e.cli("", "ls", "--json"); r.code != 0 || strings.Contains(r.stdout, `"id"`) {
		t.Fatalf("refused creates left sandboxes: %+v", r)
	}
	r := e.cli("", "create", "--allow", "hooks.example.test", "--allow", "other.example.test",
		"--secret", "HOOK=vault:HOOK", "--secret-hmac", "HOOK:header=X-Signature,prefix=sha256=,sign=method+path+header:X-Timestamp+body")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	if r := e.cli(hmacScript, "exec", id, "--", "sh", "-c", "cat > /tmp/sign.py"); r.code != 0 {
		t.Fatalf("write script: %+v", r)
	}
	sh := func(env, args string) result {
		t.Helper()
		return e.cli("", "exec", id, "--", "sh", "-c", env+" python3 /tmp/sign.py "+args)
	}
	r = e.cli("", "exec", id, "--", "sh", "-c", `printf %s "$HOOK"`)
	if !strings.HasPrefix(r.stdout, "whsec_") || strings.Contains(r.stdout, real) || len(r.stdout) != len(real) {
		t.Fatalf("guest's HOOK: %q", r.stdout)
	}
	r = sh("", `"https://hooks.example.test/hooks/a%20b" '{"event":"push"}'`)
	if !strings.Contains(r.stdout, "hello from upstream") {
		t.Fatalf("re-signed webhook: %+v", r)
	}
	// The upstream echoed the real-key signature: the guest sees its own.
	seen := up.requests()
	_, realSig, _ := strings.Cut(seen[len(seen)-1], " sig=sha256=")
	if len(realSig) != 64 || strings.Contains(r.stdout, realSig) || !strings.Contains(r.stdout, "x-signature=sha256=") {
		t.Errorf("the guest got the real-key signature back: %q (upstream saw %q)", r.stdout, realSig)
	}
	n := len(up.requests())
	r = sh(`SEND_BODY='{"event":"delete-everything"}'`, `https://hooks.example.test/hooks/x '{"event":"push"}'`)
	if !strings.Contains(r.stdout, "403") || !strings.Contains(r.stdout, "signature") {
		t.Errorf("tampered after signing: %+v", r)
	}
	r = sh("", `https://other.example.test/hooks/x '{"event":"push"}'`)
	if !strings.Contains(r.stdout, "403") || !strings.Contains(r.stdout, "secret:HOOK") {
		t.Errorf("placeholder-signed request to another host: %+v", r)
	}
	r = e.cli("", "exec", id, "--", "sh", "-c", `curl -sS -H "X-Key: $HOOK" https://hooks.example.test/`)
	if !strings.Contains(r.stdout, "denied") || !strings.Contains(r.stdout, "signing key") {
		t.Errorf("placeholder key sent in a header: %+v", r)
	}
	if got := up.requests(); len(got) != n {
		t.Errorf("refused requests reached the upstream: %v", got[n:])
	}
	ev := e.cli("", "events", "--json", id)
	if !strings.Contains(ev.stdout, `"resigned":"hmac"`) || !strings.Contains(ev.stdout, "secret.alert") {
		t.Errorf("events lack the re-sign or the alert: %s", ev.stdout)
	}
	if strings.Contains(e.logBuf.String(), real) || strings.Contains(ev.stdout, real) {
		t.Error("real key in the daemon log or events")
	}
	r = e.cli("", "inspect", id)
	if strings.Contains(r.stdout, real) || !strings.Contains(r.stdout, "hmac") {
		t.Errorf("inspect: %s", r.stdout)
	}
}
