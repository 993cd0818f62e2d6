package credentials

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/hostname/hostnametest"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/resign"
	"github.com/cagebox/cagebox/internal/vault"
)

// TestResignHostsAgree runs the shared match table (package hostnametest)
// through the pipeline's re-signing decision, with hosts as the vault
// stores them: a placeholder-signed AWS request is taken up for re-signing
// exactly where the policy, the vault and the substitution say the host
// matches, and refused as sent elsewhere everywhere else.
func TestResignHostsAgree(t *testing.T) {
	p := New(Config{}, nil)
	ph := resign.AWSCreds{AccessKeyID: "AKIAPLACEHOLDER0TEST", SecretAccessKey: "placeholder-secret"}
	for _, tc := range hostnametest.Matches {
		hosts, err := vault.NormalizeHosts([]string{tc.Pattern})
		if err != nil {
			t.Fatalf("%q: %v", tc.Pattern, err)
		}
		b := &Bindings{SigV4: []*SigV4Binding{{Name: "AWS", Hosts: hosts, Placeholder: ph,
			Real: func(string) (resign.AWSCreds, error) {
				return resign.AWSCreds{AccessKeyID: "AKIAREAL", SecretAccessKey: "real"}, nil
			}}}}
		r, _ := http.NewRequest("GET", "https://example.com/", nil)
		r.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+ph.AccessKeyID+"/20250101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00")
		r.TLS = &tls.ConnectionState{}
		ref := p.resignSigV4(b, r, tc.Host, nil, true)
		sentElsewhere := ref != nil && strings.Contains(ref.Reason, "sent to")
		if sentElsewhere == tc.Want {
			t.Errorf("%q ~ %q: refusal %+v; want bound=%v", tc.Pattern, tc.Host, ref, tc.Want)
		}
	}
}

// TestHostsAgreeAcrossPackages puts the policy, the vault and a credential
// binding (Bind, then Build into the request path) side by side on the
// same inputs: every pattern one accepts the others accept, in the same
// canonical form, except the wildcards over the public suffix list's
// private section, which a policy rule may name and a credential may not;
// and a request host matches a policy rule exactly where a credential
// bound to the same pattern is swapped or re-signed.
func TestHostsAgreeAcrossPackages(t *testing.T) {
	ctx := context.Background()
	key, err := vault.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	v := vault.New(vault.NewMemBackend(), key)
	// policyHost is the rule's canonical host, or "" when refused.
	policyHost := func(in string) string {
		p, err := policy.Compile(&policy.Document{Rules: []policy.Rule{{Host: in, Action: policy.ActionAllow}}})
		if err != nil {
			return ""
		}
		return p.Document().Rules[0].Host
	}
	vaultHost := func(in string) string {
		hs, err := vault.NormalizeHosts([]string{in})
		if err != nil {
			return ""
		}
		return hs[0]
	}
	// credentialHost binds an inline secret to in and builds the request
	// path's bindings of it.
	credentialHost := func(in string) string {
		bound, _, undo, err := Bind(ctx, v, tenant, sandboxID, []api.SecretBinding{{Name: "TOKEN", Value: "tok_0123456789abcdef", Hosts: []string{in}}})
		defer undo()
		if err != nil {
			return ""
		}
		if _, err := Build(v, tenant, bound); err != nil {
			t.Errorf("%q: bound but not built: %v", in, err)
			return ""
		}
		return bound[0].Hosts[0]
	}

	for _, tc := range []struct {
		in                 string
		policy, credential string // canonical, "" refused
	}{
		{"*.com", "", ""},
		{"*.COM.", "", ""},
		{"*.co.uk", "", ""},
		{"*.herokuapp.com", "*.herokuapp.com", ""},
		{"*.github.io", "*.github.io", ""},
		{"API.GitHub.com.", "api.github.com", "api.github.com"},
		{"*.GitHub.COM.", "*.github.com", "*.github.com"},
		{"api.github.com..", "", ""},
		{"\u212Aey.example.com", "", ""},
		{"10.0.0.1", "", ""},
	} {
		if got := policyHost(tc.in); got != tc.policy {
			t.Errorf("policy %q: %q, want %q", tc.in, got, tc.policy)
		}
		if got := vaultHost(tc.in); got != tc.credential {
			t.Errorf("vault %q: %q, want %q", tc.in, got, tc.credential)
		}
		if got := credentialHost(tc.in); got != tc.credential {
			t.Errorf("credential %q: %q, want %q", tc.in, got, tc.credential)
		}
	}

	for _, tc := range hostnametest.Patterns {
		p, vh, ch := policyHost(tc.In), vaultHost(tc.In), credentialHost(tc.In)
		if p != tc.Canonical || vh != tc.Canonical || ch != tc.Canonical {
			t.Errorf("%q: policy %q, vault %q, credential %q; want %q", tc.In, p, vh, ch, tc.Canonical)
		}
	}
	for _, tc := range hostnametest.PrivateSuffixWildcards {
		p, vh, ch := policyHost(tc.In), vaultHost(tc.In), credentialHost(tc.In)
		if p != tc.Canonical || vh != "" || ch != "" {
			t.Errorf("%q: policy %q, vault %q, credential %q; want the policy only", tc.In, p, vh, ch)
		}
	}

	pl := New(Config{Exfil: ExfilOff}, nil)
	for _, tc := range hostnametest.Matches {
		pol, err := policy.Compile(&policy.Document{Rules: []policy.Rule{{Name: "r", Host: tc.Pattern, Action: policy.ActionAllow}}})
		if err != nil {
			t.Fatal(err)
		}
		d, err := pol.Decide(ctx, &policy.Request{Host: tc.Host, Port: 443, Method: "GET", Path: "/"})
		if err != nil {
			t.Fatal(err)
		}
		bound, env, undo, err := Bind(ctx, v, tenant, sandboxID, []api.SecretBinding{{Name: "TOKEN", Value: "tok_0123456789abcdef", Hosts: []string{tc.Pattern}}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := Build(v, tenant, bound)
		if err != nil {
			t.Fatal(err)
		}
		pl.Install(b)
		ph := strings.TrimPrefix(env[0], "TOKEN=")
		r := request("GET", "example.test", "/", nil)
		r.Host = tc.Host
		r.Header.Set("Authorization", "Bearer "+ph)
		ref, _ := pl.Request(r)
		swapped := ref == nil && r.Header.Get("Authorization") == "Bearer tok_0123456789abcdef"
		undo()
		sig := &Bindings{SigV4: []*SigV4Binding{{Name: "AWS", Hosts: bound[0].Hosts}}}
		hm := &Bindings{HMAC: []*HMACBinding{{Name: "HOOK", Hosts: bound[0].Hosts}}}
		if d.Allow != tc.Want || swapped != tc.Want || sig.bound(tc.Host) != tc.Want || hm.bound(tc.Host) != tc.Want {
			t.Errorf("%q ~ %q: policy %v, swapped %v (%+v), sigv4 %v, hmac %v; want %v",
				tc.Pattern, tc.Host, d.Allow, swapped, ref, sig.bound(tc.Host), hm.bound(tc.Host), tc.Want)
		}
	}
}
