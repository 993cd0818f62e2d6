package gateway

import (
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/egress"
	"github.com/cagebox/cagebox/internal/resign"
)

// failingReader fails its first read with err.
type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }

// TestCredentialsHook: the proxy's hook runs the sandbox's pipeline and
// hands its refusals to the proxy as egress refusals, status included,
// also when the pipeline refuses a body as it streams; a sandbox that is
// detaching refuses everything.
func TestCredentialsHook(t *testing.T) {
	g := &Gateway{atts: map[string]*Attachment{}}
	p := credentials.New(credentials.Config{Exfil: credentials.ExfilOff}, nil)
	p.Install(&credentials.Bindings{HMAC: []*credentials.HMACBinding{{Name: "HOOK", Hosts: []string{"api.example.test"},
		Signer: &resign.HMAC{Algorithm: "sha256", Header: "X-Signature", Prefix: "sha256=", Encoding: "hex",
			Canonical: []string{"method", "path", "body"}, Placeholder: []byte("placeholder-hmac-key"), MaxBody: 16},
		Real: func(string) ([]byte, error) { return []byte("real"), nil }}}})
	g.atts["sb-1"] = &Attachment{ID: "sb-1", Credentials: p}
	sb := &egress.Sandbox{ID: "sb-1"}

	// A signed body over the binding's limit: 413, by name.
	r := httptest.NewRequest("POST", "https://api.example.test/hook", strings.NewReader(strings.Repeat("b", 64)))
	r.TLS = &tls.ConnectionState{}
	r.Header.Set("X-Signature", "sha256=00")
	ref, _ := g.credentialsHook(sb, r)
	if ref == nil || ref.Rule != "secret:HOOK" || ref.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("over the limit: %+v", ref)
	}

	// A clean request passes, its body wrapped so that a refusal the
	// pipeline raises while it streams reaches the proxy as its own.
	r = httptest.NewRequest("POST", "https://api.example.test/x", strings.NewReader("hello"))
	r.TLS = &tls.ConnectionState{}
	if ref, _ := g.credentialsHook(sb, r); ref != nil {
		t.Fatalf("clean request refused: %+v", ref)
	}
	if b, err := io.ReadAll(r.Body); err != nil || string(b) != "hello" {
		t.Fatalf("body %q, %v", b, err)
	}
	_, err := refusalBody{io.NopCloser(failingReader{&credentials.Refusal{Rule: "secret:AWS", Reason: "bad chunk"}})}.Read(make([]byte, 1))
	var eref *egress.Refusal
	if !errors.As(err, &eref) || eref.Rule != "secret:AWS" || eref.Reason != "bad chunk" {
		t.Fatalf("streamed refusal: %v", err)
	}

	if ref, _ := g.credentialsHook(&egress.Sandbox{ID: "sb-gone"}, r); ref == nil || ref.Rule != "secret" {
		t.Fatalf("detached sandbox: %+v", ref)
	}
}
