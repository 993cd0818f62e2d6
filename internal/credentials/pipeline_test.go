package credentials

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/resign"
	"github.com/cagebox/cagebox/internal/vault"
)

// The pipeline from the vault to the request, without root and without a
// proxy: secrets stored in an in-memory vault, bound with Bind, built with
// Build, installed in a Pipeline, and requests handed to Request as the
// egress proxy hands them over (intercepted TLS, Host as the guest sent it).

const (
	tenant     = "tenant-a"
	sandboxID  = "sb-1"
	ghReal     = "ghp_realrealrealrealrealrealrealreal0001"
	ghHost     = "api.example.test"
	otherHost  = "other.example.test"
	hmacReal   = "the-real-hmac-key-0001"
	awsRealKey = "AKIAREALREALREAL0001:real/secret/key/00000000000000000000000"
)

type pipelineEnv struct {
	t     *testing.T
	v     *vault.Vault
	p     *Pipeline
	bound []Binding
	env   map[string]string

	// mu guards events.
	mu     sync.Mutex
	events []gwEvent
}

// newPipelineEnv stores GH (proxy mode, bound to api.example.test), AWS
// (sigv4) and HOOK (hmac) in an in-memory vault and binds all three.
func newPipelineEnv(t *testing.T, cfg Config) *pipelineEnv {
	t.Helper()
	return newPipelineEnvHosts(t, cfg, ghHost)
}

// newPipelineEnvHosts is newPipelineEnv with the secrets stored (and so
// bound) for hosts.
func newPipelineEnvHosts(t *testing.T, cfg Config, hosts ...string) *pipelineEnv {
	t.Helper()
	key, err := vault.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	e := &pipelineEnv{t: t, v: vault.New(vault.NewMemBackend(), key), env: map[string]string{}}
	ctx := context.Background()
	for name, val := range map[string]string{"GH": ghReal, "AWS": awsRealKey, "HOOK": hmacReal} {
		if _, err := e.v.Put(ctx, tenant, name, []byte(val), hosts, ""); err != nil {
			t.Fatal(err)
		}
	}
	var env []string
	var undo func()
	e.bound, env, undo, err = Bind(ctx, e.v, tenant, sandboxID, []api.SecretBinding{
		{Name: "GH"},
		{Name: "AWS", Mode: ModeSigV4},
		{Name: "HOOK", Mode: ModeHMAC, HMAC: &api.HMACSigning{Algorithm: "sha256", Header: "X-Signature", Prefix: "sha256=", Encoding: "hex", Sign: []string{"method", "path", "body"}}},
	})
	if err != nil {
		undo()
		t.Fatal(err)
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		e.env[k] = v
	}
	for _, k := range []string{"GH", "HOOK", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
		if e.env[k] == "" {
			t.Fatalf("no %s in the guest env %q", k, env)
		}
	}
	if strings.Contains(strings.Join(env, "\n"), "real") {
		t.Fatalf("a real value in the guest env: %q", env)
	}
	if err := cfg.Check(); err != nil {
		t.Fatal(err)
	}
	e.p = New(cfg, func(ev api.EventPayload) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.events = append(e.events, gwEventOf(t, ev))
	})
	e.build()
	return e
}

// build rebuilds the bindings from the stored record, as a daemon does
// after a restart.
func (e *pipelineEnv) build() {
	e.t.Helper()
	b, err := Build(e.v, tenant, e.bound)
	if err != nil {
		e.t.Fatal(err)
	}
	e.p.Install(b)
}

func (e *pipelineEnv) take(kind string) []gwEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out, rest []gwEvent
	for _, ev := range e.events {
		if ev.Kind == kind {
			out = append(out, ev)
		} else {
			rest = append(rest, ev)
		}
	}
	e.events = rest
	return out
}

// request is a request the guest sent to host over intercepted TLS.
func request(method, host, path string, body []byte) *http.Request {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	r := httptest.NewRequest(method, "https://"+host+path, rd)
	r.TLS = &tls.ConnectionState{ServerName: host}
	r.RequestURI = ""
	return r
}

func (e *pipelineEnv) ghRequest(host string) *http.Request {
	r := request("GET", host, "/user", nil)
	r.Header.Set("Authorization", "Bearer "+e.env["GH"])
	return r
}

// TestPipelineSwapsOnlyForBoundHosts: the placeholder becomes the real value
// on a request to the bound host over intercepted TLS (secret.used), and the
// same request to any other host, or in clear text, is refused with an
// alert and keeps its placeholder.
func TestPipelineSwapsOnlyForBoundHosts(t *testing.T) {
	e := newPipelineEnv(t, Config{Exfil: ExfilOff})
	for _, host := range []string{ghHost, "API.Example.Test.", ghHost + ":443"} {
		r := e.ghRequest(host)
		ref, filter := e.p.Request(r)
		if ref != nil {
			t.Fatalf("%s: refused: %+v", host, ref)
		}
		if got := r.Header.Get("Authorization"); got != "Bearer "+ghReal {
			t.Fatalf("%s: Authorization %q, want the real value", host, got)
		}
		if filter == nil {
			t.Fatalf("%s: no response scrub on a request carrying a real value", host)
		}
		if used := e.take("secret.used"); len(used) != 1 {
			t.Fatalf("%s: secret.used events %+v", host, used)
		}
	}

	for _, host := range []string{otherHost, "api.example.test.evil.example", "example.test"} {
		r := e.ghRequest(host)
		ref, _ := e.p.Request(r)
		if ref == nil || ref.Rule != "secret:GH" {
			t.Fatalf("%s: %+v, want refused by secret:GH", host, ref)
		}
		if got := r.Header.Get("Authorization"); got != "Bearer "+e.env["GH"] {
			t.Fatalf("%s: Authorization changed to %q", host, got)
		}
		if al := e.take("secret.alert"); len(al) != 1 || al[0].Data["host"] != host {
			t.Fatalf("%s: alerts %+v", host, al)
		}
	}

	// Not intercepted (plain HTTP to the bound host): never swapped.
	r := e.ghRequest(ghHost)
	r.TLS = nil
	if ref, _ := e.p.Request(r); ref == nil || strings.Contains(r.Header.Get("Authorization"), ghReal) {
		t.Fatalf("plain HTTP: %+v, Authorization %q", ref, r.Header.Get("Authorization"))
	}
}

// TestPipelineDeniedAlert: a request the policy refused that carries a
// placeholder raises secret.alert naming the binding.
func TestPipelineDeniedAlert(t *testing.T) {
	e := newPipelineEnv(t, Config{Exfil: ExfilOff})
	e.p.Denied(e.ghRequest("denied.example.test"), "denied.example.test")
	if al := e.take("secret.alert"); len(al) != 1 || al[0].Data["rule"] != "secret:GH" {
		t.Fatalf("alerts %+v", al)
	}
	r := request("GET", "denied.example.test", "/", nil)
	r.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+e.env["AWS_ACCESS_KEY_ID"]+"/x")
	e.p.Denied(r, "denied.example.test")
	if al := e.take("secret.alert"); len(al) != 1 || al[0].Data["rule"] != "secret:AWS" {
		t.Fatalf("alerts %+v", al)
	}
	e.p.Denied(request("GET", "denied.example.test", "/", nil), "denied.example.test")
	if al := e.take("secret.alert"); len(al) != 0 {
		t.Fatalf("alert without a placeholder: %+v", al)
	}
}

func signAWSAt(t testing.TB, r *http.Request, creds resign.AWSCreds, at time.Time) {
	t.Helper()
	const payload = "UNSIGNED-PAYLOAD"
	r.Header.Set("X-Amz-Content-Sha256", payload)
	if err := v4.NewSigner().SignHTTP(context.Background(), creds.Credentials(), r, payload, "s3", "eu-west-1", at); err != nil {
		t.Fatal(err)
	}
}

// TestPipelineResignsSigV4: a request the guest signed with its placeholder
// AWS key leaves signed with the real key — exactly as if the guest had
// signed it with the real one — and one sent to another host is refused.
func TestPipelineResignsSigV4(t *testing.T) {
	e := newPipelineEnv(t, Config{Exfil: ExfilOff})
	ph := resign.AWSCreds{AccessKeyID: e.env["AWS_ACCESS_KEY_ID"], SecretAccessKey: e.env["AWS_SECRET_ACCESS_KEY"]}
	real, ok := parseAWS([]byte(awsRealKey))
	if !ok {
		t.Fatal("parseAWS")
	}
	at := time.Now().UTC()
	r := request("GET", ghHost, "/bucket/key", nil)
	signAWSAt(t, r, ph, at)
	want := request("GET", ghHost, "/bucket/key", nil)
	signAWSAt(t, want, real, at)

	ref, filter := e.p.Request(r)
	if ref != nil {
		t.Fatalf("refused: %+v", ref)
	}
	if got := r.Header.Get("Authorization"); got != want.Header.Get("Authorization") {
		t.Fatalf("Authorization\n %q\nwant\n %q", got, want.Header.Get("Authorization"))
	}
	if filter == nil {
		t.Fatal("no response scrub after re-signing")
	}
	if used := e.take("secret.used"); len(used) != 1 || used[0].Data["resigned"] != "sigv4" {
		t.Fatalf("secret.used %+v", used)
	}

	// The response carrying the real key id gets the placeholder back.
	res := &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("id=" + real.AccessKeyID)), ContentLength: -1, Request: r}
	if err := filter(res); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(res.Body); strings.Contains(string(b), real.AccessKeyID) {
		t.Fatalf("response kept the real key id: %q", b)
	}
	if refl := e.take("secret.reflected"); len(refl) == 0 {
		t.Fatal("no secret.reflected")
	}

	r = request("GET", otherHost, "/bucket/key", nil)
	signAWSAt(t, r, ph, at)
	if ref, _ := e.p.Request(r); ref == nil || ref.Rule != "secret:AWS" || !strings.Contains(ref.Reason, "sent to "+otherHost) {
		t.Fatalf("to another host: %+v", ref)
	}
	// The placeholder secret key itself is a guard: refused anywhere.
	r = request("GET", ghHost, "/", nil)
	r.Header.Set("X-Leak", ph.SecretAccessKey)
	if ref, _ := e.p.Request(r); ref == nil || ref.Rule != "secret:AWS" {
		t.Fatalf("placeholder secret key sent: %+v", ref)
	}
}

// TestPipelineResignsHMAC: a body signed with the placeholder HMAC key
// leaves signed with the real key; a tampered one is refused; a
// placeholder-signed request to another host is refused with an alert.
func TestPipelineResignsHMAC(t *testing.T) {
	e := newPipelineEnv(t, Config{Exfil: ExfilOff})
	ph := []byte(e.env["HOOK"])
	body := []byte(`{"event":"push"}`)
	r := request("POST", ghHost, "/hook", body)
	r.Header.Set("X-Signature", hmacSign(ph, "POST", "/hook", body))
	if ref, _ := e.p.Request(r); ref != nil {
		t.Fatalf("refused: %+v", ref)
	}
	if got, want := r.Header.Get("X-Signature"), hmacSign([]byte(hmacReal), "POST", "/hook", body); got != want {
		t.Fatalf("X-Signature %q, want %q", got, want)
	}
	if got, _ := io.ReadAll(r.Body); !bytes.Equal(got, body) {
		t.Fatalf("body %q", got)
	}
	if used := e.take("secret.used"); len(used) != 1 || used[0].Data["resigned"] != "hmac" {
		t.Fatalf("secret.used %+v", used)
	}

	r = request("POST", ghHost, "/hook", []byte(`{"event":"tampered"}`))
	r.Header.Set("X-Signature", hmacSign(ph, "POST", "/hook", body))
	if ref, _ := e.p.Request(r); ref == nil || ref.Rule != "secret:HOOK" {
		t.Fatalf("tampered: %+v", ref)
	}
	if n := len(e.take("secret.refused")); n != 1 {
		t.Fatalf("%d secret.refused", n)
	}

	r = request("POST", otherHost, "/hook", body)
	r.Header.Set("X-Signature", hmacSign(ph, "POST", "/hook", body))
	if ref, _ := e.p.Request(r); ref == nil || ref.Rule != "secret:HOOK" || !strings.Contains(ref.Reason, "sent to "+otherHost) {
		t.Fatalf("to another host: %+v", ref)
	}
	if n := len(e.take("secret.alert")); n != 1 {
		t.Fatalf("%d secret.alert", n)
	}
}

// TestPipelineExfilScan: a credential-shaped string that is not one of the
// sandbox's placeholders is refused under block and an event under flag;
// the sandbox's own placeholders are not findings.
func TestPipelineExfilScan(t *testing.T) {
	const stolen = "ghp_" + "Zq3xW9vT2mK8pL5nR7sY4bC6dF1gH0jA2eU8"
	for _, mode := range []string{ExfilBlock, ExfilFlag} {
		e := newPipelineEnv(t, Config{Exfil: mode})
		r := request("POST", otherHost, "/paste", []byte("token="+stolen))
		ref, _ := e.p.Request(r)
		sus := e.take("secret.exfil_suspect")
		if len(sus) == 0 {
			t.Fatalf("%s: no secret.exfil_suspect", mode)
		}
		for _, ev := range sus {
			if ev.Data["mode"] != mode || strings.Contains(ev.Data["preview"].(string), stolen) {
				t.Fatalf("%s: exfil_suspect events %+v", mode, sus)
			}
		}
		switch mode {
		case ExfilBlock:
			if ref == nil || !strings.Contains(ref.Reason, "credential-shaped") || strings.Contains(ref.Reason, stolen) {
				t.Fatalf("block: %+v", ref)
			}
		case ExfilFlag:
			if ref != nil {
				t.Fatalf("flag: refused %+v", ref)
			}
		}
		// Our own placeholder, to its bound host: no finding.
		if ref, _ := e.p.Request(e.ghRequest(ghHost)); ref != nil {
			t.Fatalf("%s: own placeholder refused: %+v", mode, ref)
		}
		if sus := e.take("secret.exfil_suspect"); len(sus) != 0 {
			t.Fatalf("%s: own placeholder flagged: %+v", mode, sus)
		}
	}
}

// TestPipelineRevocation: a revoke or rotate in the vault applies to the
// very next request, swap and re-sign alike, without rebuilding anything;
// Unbind refuses the placeholder from the next request on.
func TestPipelineRevocation(t *testing.T) {
	e := newPipelineEnv(t, Config{Exfil: ExfilOff})
	ctx := context.Background()
	if _, err := e.v.Rotate(ctx, tenant, "GH", []byte("ghp_rotatedrotatedrotatedrotatedrotat01")); err != nil {
		t.Fatal(err)
	}
	r := e.ghRequest(ghHost)
	if ref, _ := e.p.Request(r); ref != nil || r.Header.Get("Authorization") != "Bearer ghp_rotatedrotatedrotatedrotatedrotat01" {
		t.Fatalf("after rotate: %+v, %q", ref, r.Header.Get("Authorization"))
	}
	for _, name := range []string{"GH", "AWS", "HOOK"} {
		if err := e.v.Revoke(ctx, tenant, name); err != nil {
			t.Fatal(err)
		}
	}
	r = e.ghRequest(ghHost)
	if ref, _ := e.p.Request(r); ref == nil || ref.Rule != "secret:GH" || strings.Contains(r.Header.Get("Authorization"), "ghp_rotated") {
		t.Fatalf("after revoke: %+v, %q", ref, r.Header.Get("Authorization"))
	}
	r = request("GET", ghHost, "/bucket/key", nil)
	signAWSAt(t, r, resign.AWSCreds{AccessKeyID: e.env["AWS_ACCESS_KEY_ID"], SecretAccessKey: e.env["AWS_SECRET_ACCESS_KEY"]}, time.Now())
	if ref, _ := e.p.Request(r); ref == nil || ref.Rule != "secret:AWS" || !strings.Contains(ref.Reason, "cannot be used") {
		t.Fatalf("sigv4 after revoke: %+v", ref)
	}
	body := []byte("x")
	r = request("POST", ghHost, "/hook", body)
	r.Header.Set("X-Signature", hmacSign([]byte(e.env["HOOK"]), "POST", "/hook", body))
	if ref, _ := e.p.Request(r); ref == nil || ref.Rule != "secret:HOOK" || !strings.Contains(ref.Reason, "cannot be used") {
		t.Fatalf("hmac after revoke: %+v", ref)
	}
	if n := len(e.take("secret.refused")); n < 3 {
		t.Fatalf("%d secret.refused, want one per request", n)
	}
}

// TestPipelineHostsNarrowed: a sandbox bound a secret toward two hosts;
// the secret is stored again with one of them (`cagebox secret add NAME
// --host …` replaces its hosts). From the very next request, without a
// rebuild, the host taken away gets no real value — placeholder swap,
// SigV4 and HMAC re-signing alike — and is refused as a host the binding
// does not name (403 by the binding's rule, secret.alert); the remaining
// host still gets the real value. Neither a refusal nor an event carries
// a real value.
func TestPipelineHostsNarrowed(t *testing.T) {
	e := newPipelineEnvHosts(t, Config{Exfil: ExfilOff}, ghHost, otherHost)
	ctx := context.Background()
	ph := resign.AWSCreds{AccessKeyID: e.env["AWS_ACCESS_KEY_ID"], SecretAccessKey: e.env["AWS_SECRET_ACCESS_KEY"]}
	real, _ := parseAWS([]byte(awsRealKey))
	body := []byte(`{"event":"push"}`)
	gh := func(host string) (*http.Request, *Refusal) {
		r := e.ghRequest(host)
		ref, _ := e.p.Request(r)
		return r, ref
	}
	aws := func(host string) (*http.Request, *Refusal) {
		r := request("GET", host, "/bucket/key", nil)
		signAWSAt(t, r, ph, time.Now().UTC())
		ref, _ := e.p.Request(r)
		return r, ref
	}
	hook := func(host string) (*http.Request, *Refusal) {
		r := request("POST", host, "/hook", body)
		r.Header.Set("X-Signature", hmacSign([]byte(e.env["HOOK"]), "POST", "/hook", body))
		ref, _ := e.p.Request(r)
		return r, ref
	}
	swapped := func(what, host string, r *http.Request, ref *Refusal) {
		t.Helper()
		switch {
		case ref != nil:
			t.Errorf("%s to %s: refused: %+v", what, host, ref)
		case what == "GH" && r.Header.Get("Authorization") != "Bearer "+ghReal,
			what == "AWS" && !strings.Contains(r.Header.Get("Authorization"), real.AccessKeyID),
			what == "HOOK" && r.Header.Get("X-Signature") != hmacSign([]byte(hmacReal), "POST", "/hook", body):
			t.Errorf("%s to %s: no real value put in", what, host)
		}
	}
	for _, host := range []string{ghHost, otherHost} {
		r, ref := gh(host)
		swapped("GH", host, r, ref)
		r, ref = aws(host)
		swapped("AWS", host, r, ref)
		r, ref = hook(host)
		swapped("HOOK", host, r, ref)
	}
	e.take("secret.used")

	// Narrowed to ghHost, the way `cagebox secret add` does it: same value,
	// fewer hosts.
	for name, val := range map[string]string{"GH": ghReal, "AWS": awsRealKey, "HOOK": hmacReal} {
		if _, err := e.v.Put(ctx, tenant, name, []byte(val), []string{ghHost}, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		send func(string) (*http.Request, *Refusal)
		kept func(*http.Request) bool // the guest's own credential left as it was
	}{
		{"GH", gh, func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+e.env["GH"] }},
		{"AWS", aws, func(r *http.Request) bool {
			return strings.Contains(r.Header.Get("Authorization"), ph.AccessKeyID) && !strings.Contains(r.Header.Get("Authorization"), real.AccessKeyID)
		}},
		{"HOOK", hook, func(r *http.Request) bool {
			return r.Header.Get("X-Signature") == hmacSign([]byte(e.env["HOOK"]), "POST", "/hook", body)
		}},
	} {
		r, ref := c.send(otherHost)
		if ref == nil || ref.Rule != "secret:"+c.name || ref.Status != 0 || !strings.Contains(ref.Reason, "sent to "+otherHost) || !strings.Contains(ref.Reason, "bound to hosts "+ghHost) {
			t.Errorf("%s to the host taken away: %+v, want a 403 by secret:%s naming the secret's hosts", c.name, ref, c.name)
		}
		if !c.kept(r) {
			t.Errorf("%s to the host taken away: the request was changed: %q", c.name, r.Header)
		}
		if al := e.take("secret.alert"); len(al) != 1 || al[0].Data["rule"] != "secret:"+c.name || al[0].Data["host"] != otherHost {
			t.Errorf("%s to the host taken away: alerts %+v", c.name, al)
		}
		if used := e.take("secret.used"); len(used) != 0 {
			t.Errorf("%s to the host taken away: secret.used %+v", c.name, used)
		}
		if ref != nil {
			for _, v := range []string{ghReal, hmacReal, real.AccessKeyID, real.SecretAccessKey} {
				if strings.Contains(ref.Reason, v) {
					t.Errorf("%s: a real value in the refusal %q", c.name, ref.Reason)
				}
			}
		}
		// The host it keeps still gets it.
		r, ref = c.send(ghHost)
		swapped(c.name, ghHost, r, ref)
		if used := e.take("secret.used"); len(used) != 1 {
			t.Errorf("%s to the host kept: secret.used %+v", c.name, used)
		}
	}
	e.mu.Lock()
	all := fmt.Sprint(e.events)
	e.mu.Unlock()
	for _, v := range []string{ghReal, hmacReal, real.AccessKeyID, real.SecretAccessKey} {
		if strings.Contains(all, v) {
			t.Errorf("a real value in an event: %s", all)
		}
	}
}

// TestPipelineHostsNarrowedInject: a secret with an inject header, bound
// toward two hosts and narrowed to one, is no longer injected into
// requests to the other (which go on without it, as to any host its
// binding does not name), and still is into requests to the one it keeps.
func TestPipelineHostsNarrowedInject(t *testing.T) {
	key, err := vault.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	v := vault.New(vault.NewMemBackend(), key)
	ctx := context.Background()
	const inject = "Authorization: Bearer {value}"
	if _, err := v.Put(ctx, tenant, "INJ", []byte(ghReal), []string{ghHost, otherHost}, inject); err != nil {
		t.Fatal(err)
	}
	bound, _, undo, err := Bind(ctx, v, tenant, sandboxID, []api.SecretBinding{{Name: "INJ"}})
	if err != nil {
		undo()
		t.Fatal(err)
	}
	b, err := Build(v, tenant, bound)
	if err != nil {
		t.Fatal(err)
	}
	p := New(Config{Exfil: ExfilOff}, nil)
	p.Install(b)
	send := func(host string) string {
		r := request("GET", host, "/", nil)
		if ref, _ := p.Request(r); ref != nil {
			t.Fatalf("%s: refused %+v", host, ref)
		}
		return r.Header.Get("Authorization")
	}
	if got := send(otherHost); got != "Bearer "+ghReal {
		t.Fatalf("before narrowing: %q injected", got)
	}
	if _, err := v.Put(ctx, tenant, "INJ", []byte(ghReal), []string{ghHost}, inject); err != nil {
		t.Fatal(err)
	}
	if got := send(otherHost); got != "" {
		t.Errorf("to the host taken away: Authorization %q injected", got)
	}
	if got := send(ghHost); got != "Bearer "+ghReal {
		t.Errorf("to the host kept: Authorization %q", got)
	}
}

// TestPipelineUnbind: an unbound binding's placeholder is refused with an
// alert from the next request on, even to its old host; the others keep
// working.
func TestPipelineUnbind(t *testing.T) {
	e := newPipelineEnv(t, Config{Exfil: ExfilOff})
	e.p.Unbind("GH")
	if ref, _ := e.p.Request(e.ghRequest(ghHost)); ref == nil || ref.Rule != "secret:GH" {
		t.Fatalf("unbound GH: %+v", ref)
	}
	if al := e.take("secret.alert"); len(al) != 1 {
		t.Fatalf("alerts %+v", al)
	}
	e.p.Unbind("AWS")
	r := request("GET", ghHost, "/bucket/key", nil)
	signAWSAt(t, r, resign.AWSCreds{AccessKeyID: e.env["AWS_ACCESS_KEY_ID"], SecretAccessKey: e.env["AWS_SECRET_ACCESS_KEY"]}, time.Now())
	if ref, _ := e.p.Request(r); ref == nil || ref.Rule != "secret:AWS" || strings.Contains(r.Header.Get("Authorization"), "AKIAREAL") {
		t.Fatalf("unbound AWS: %+v, %q", ref, r.Header.Get("Authorization"))
	}
	body := []byte("x")
	r = request("POST", ghHost, "/hook", body)
	r.Header.Set("X-Signature", hmacSign([]byte(e.env["HOOK"]), "POST", "/hook", body))
	if ref, _ := e.p.Request(r); ref != nil {
		t.Fatalf("HOOK after unbinding others: %+v", ref)
	}
}

// TestBindRefuses: what Bind refuses before anything is made, with the
// error kind the API maps to a status.
func TestBindRefuses(t *testing.T) {
	key, _ := vault.GenerateKey()
	v := vault.New(vault.NewMemBackend(), key)
	ctx := context.Background()
	mustPut := func(name, val string, allowEnv bool) {
		if _, err := v.PutWith(ctx, tenant, name, []byte(val), vault.PutOptions{Hosts: []string{"*.example.test"}, AllowEnv: allowEnv}); err != nil {
			t.Fatal(err)
		}
	}
	mustPut("NOCOLON", "AKIAONLYTHEKEYID", false)
	mustPut("EMPTYHALF", "AKIAX:", false)
	mustPut("TOKEN", "tok_0123456789abcdef", false)
	mustPut("ENVOK", "tok_0123456789abcdef", true)
	for _, tc := range []struct {
		name string
		b    api.SecretBinding
		kind error
		says string
	}{
		{"sigv4 without a colon", api.SecretBinding{Name: "NOCOLON", Mode: ModeSigV4}, errdefs.ErrInvalid, "ACCESS_KEY_ID:SECRET_ACCESS_KEY"},
		{"sigv4 empty half", api.SecretBinding{Name: "EMPTYHALF", Mode: ModeSigV4}, errdefs.ErrInvalid, "ACCESS_KEY_ID:SECRET_ACCESS_KEY"},
		{"env not allowed", api.SecretBinding{Name: "TOKEN", Mode: ModeEnv}, errdefs.ErrDenied, "--allow-env"},
		{"hmac without config", api.SecretBinding{Name: "TOKEN", Mode: ModeHMAC}, errdefs.ErrInvalid, "signing configuration"},
		{"config without hmac", api.SecretBinding{Name: "TOKEN", HMAC: &api.HMACSigning{Algorithm: "sha256", Header: "X-Sig"}}, errdefs.ErrInvalid, "signing configuration"},
		{"bad mode", api.SecretBinding{Name: "TOKEN", Mode: "magic"}, errdefs.ErrInvalid, "is not proxy"},
		{"bad name", api.SecretBinding{Name: "1TOKEN"}, errdefs.ErrInvalid, "environment variable"},
		{"no such secret", api.SecretBinding{Name: "NOPE"}, errdefs.ErrNotFound, "cagebox secret add"},
		{"narrowed outside", api.SecretBinding{Name: "TOKEN", Hosts: []string{"api.other.test"}}, errdefs.ErrInvalid, "not one of the secret's hosts"},
		{"inline without hosts", api.SecretBinding{Name: "INL", Value: "v_0123456789abcdef"}, errdefs.ErrInvalid, "NAME@HOST"},
		{"inline wildcard over a public suffix", api.SecretBinding{Name: "INL", Value: "v_0123456789abcdef", Hosts: []string{"*.herokuapp.com"}}, errdefs.ErrInvalid, "public suffix"},
		{"headers outside proxy mode", api.SecretBinding{Name: "ENVOK", Mode: ModeEnv, Headers: []string{"X-Api-Key"}}, errdefs.ErrInvalid, "only mode proxy"},
	} {
		_, _, undo, err := Bind(ctx, v, tenant, sandboxID, []api.SecretBinding{tc.b})
		undo()
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, tc.kind, tc.says)
		}
	}
	// Allowed env mode delivers the value; an inline secret is sealed and
	// undo removes it.
	bound, env, undo, err := Bind(ctx, v, tenant, sandboxID, []api.SecretBinding{
		{Name: "ENVOK", Mode: ModeEnv},
		{Name: "INL", Value: "v_0123456789abcdef", Hosts: []string{"API.Example.Test."}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if env[0] != "ENVOK=tok_0123456789abcdef" || !strings.HasPrefix(env[1], "INL=") || strings.Contains(env[1], "v_0123456789abcdef") {
		t.Fatalf("env %q", env)
	}
	if !bound[1].Inline || bound[1].Secret != InlineName(sandboxID, "INL") || bound[1].Hosts[0] != "api.example.test" {
		t.Fatalf("inline binding %+v", bound[1])
	}
	undo()
	if _, err := v.Info(ctx, tenant, bound[1].Secret); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("inline secret after undo: %v", err)
	}
}
