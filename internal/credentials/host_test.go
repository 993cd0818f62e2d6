package credentials

import (
	"crypto/tls"
	"net/http"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/hostname/hostnametest"
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
			Real: func() (resign.AWSCreds, error) {
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
