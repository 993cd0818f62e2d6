package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

var sigRE = regexp.MustCompile(`Credential=([^/]+)/[^,]+, ?SignedHeaders=([^,]+), ?Signature=([0-9a-f]+)`)

// validateSigV4 recomputes an S3 request's signature with the REAL key, as
// AWS would, using the aws-sdk-go-v2 signer.
func validateSigV4(realID, realSecret string) func(*http.Request) error {
	return func(r *http.Request) error {
		m := sigRE.FindStringSubmatch(r.Header.Get("Authorization"))
		if m == nil {
			return fmt.Errorf("no sigv4 authorization")
		}
		if m[1] != realID {
			return fmt.Errorf("signed with access key %q, not the real one", m[1])
		}
		u := *r.URL
		u.Scheme, u.Host = "https", r.Host
		req2, err := http.NewRequest(r.Method, u.String(), nil)
		if err != nil {
			return err
		}
		req2.Host = r.Host
		for _, h := range strings.Split(m[2], ";") {
			if h != "host" {
				req2.Header.Set(h, r.Header.Get(h))
			}
		}
		t, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
		if err != nil {
			return err
		}
		hash := r.Header.Get("X-Amz-Content-Sha256")
		if hash == "" {
			sum := sha256.Sum256(nil)
			hash = hex.EncodeToString(sum[:])
		}
		signer := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
		if err := signer.SignHTTP(context.Background(), aws.Credentials{AccessKeyID: realID, SecretAccessKey: realSecret}, req2, hash, "s3", "us-east-1", t); err != nil {
			return err
		}
		want := sigRE.FindStringSubmatch(req2.Header.Get("Authorization"))
		if want == nil || want[3] != m[3] {
			return fmt.Errorf("signature does not verify with the real key")
		}
		return nil
	}
}

// TestSigV4Resign: the guest signs with placeholder AWS keys (curl
// --aws-sigv4); an upstream that validates with the REAL key accepts the
// re-signed request, including an S3 path with a space; a request signed
// with a wrong secret is refused; the placeholder key to another host is
// refused; the real key is never in the guest.
func TestSigV4Resign(t *testing.T) {
	e := newDebianEnv(t)
	const realID, realSecret = "AKIAREALKEY000000001", "realSecretAccessKey/0000000000000000000001"
	up := newUpstream(t, "s3.example.test", "other.example.test")
	up.validate = validateSigV4(realID, realSecret)
	up.reflect = true // the answer echoes the Authorization it got
	e.startDaemon(up.daemonArgs("s3.example.test", "other.example.test")...)
	os.Setenv("CBX_AWS", realID+":"+realSecret)
	defer os.Unsetenv("CBX_AWS")
	if r := e.cli("", "secret", "add", "AWS", "--host", "s3.example.test", "--from-env", "CBX_AWS"); r.code != 0 {
		t.Fatal(r)
	}
	r := e.cli("", "create", "--allow", "s3.example.test", "--allow", "other.example.test", "--secret", "AWS=vault:AWS", "--secret-sigv4", "AWS")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	sh := func(script string) result { t.Helper(); return e.cli("", "exec", id, "--", "sh", "-c", script) }
	r = sh(`printf '%s %s' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY"`)
	if !strings.HasPrefix(r.stdout, "AKIA") || strings.Contains(r.stdout, realID) || strings.Contains(r.stdout, realSecret) {
		t.Fatalf("guest's AWS keys: %q", r.stdout)
	}
	sign := `curl -sS --aws-sigv4 aws:amz:us-east-1:s3 --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" `
	r = sh(sign + `"https://s3.example.test/bucket/my%20file.txt"`)
	if r.code != 0 || !strings.Contains(r.stdout, "hello from upstream") {
		t.Fatalf("re-signed S3 GET (path with a space): %+v", r)
	}
	r = sh(sign + `"https://s3.example.test/bucket?list-type=2&prefix=photos"`)
	if !strings.Contains(r.stdout, "hello from upstream") {
		t.Fatalf("re-signed S3 GET with a query: %+v", r)
	}
	// The upstream echoed the re-signed Authorization: the guest sees its
	// own key id and signature, never the real key id or the real-key
	// signature, in any form.
	guestAuth := regexp.MustCompile(`auth=(.*)`).FindStringSubmatch(r.stdout)
	seen := up.requests()
	realSig := sigRE.FindStringSubmatch(seen[len(seen)-1])
	if guestAuth == nil || realSig == nil {
		t.Fatalf("reflected Authorization %q, upstream saw %q", r.stdout, seen[len(seen)-1])
	}
	if f := realForms(r.stdout, realID); len(f) > 0 || strings.Contains(r.stdout, realSig[3]) || !strings.Contains(guestAuth[1], "Credential=AKIA") {
		t.Errorf("the guest got the real key id (%v) or the real signature: %q", f, r.stdout)
	}
	if ev := e.cli("", "events", "--json", id).stdout; !strings.Contains(ev, `"secret.reflected"`) {
		t.Error("no secret.reflected event for the reflected signature")
	}
	n := len(up.requests())
	r = sh(`curl -sS --aws-sigv4 aws:amz:us-east-1:s3 --user "$AWS_ACCESS_KEY_ID:not-the-placeholder-secret" https://s3.example.test/bucket/x`)
	if !strings.Contains(r.stdout, "denied") || !strings.Contains(r.stdout, "signature") {
		t.Errorf("signed with a wrong secret: %+v", r)
	}
	r = sh(sign + `https://other.example.test/bucket/x`)
	if !strings.Contains(r.stdout, "denied") || !strings.Contains(r.stdout, "secret:AWS") {
		t.Errorf("placeholder key to another host: %+v", r)
	}
	if got := up.requests(); len(got) != n {
		t.Errorf("refused requests reached the upstream: %v", got[n:])
	}
	if strings.Contains(e.logBuf.String(), realSecret) {
		t.Error("real secret in the daemon log")
	}
}
