package resign

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// reports collects what a re-signer reported.
type reports map[string]string // real → guest

func (r reports) fn() Reporter { return func(real, guest string) { r[real] = guest } }

var hex64 = regexp.MustCompile(`[0-9a-f]{64}`)

// Every real-key output on the wire after Resign (key id, token, request,
// chunk and trailer signatures) was reported, each with the guest's value
// it replaced; and the guest's values are what the guest sent.
func TestSigV4ReportsWhatItPutIn(t *testing.T) {
	check := func(t *testing.T, wire string, got reports, guestWire string) {
		t.Helper()
		for _, want := range []string{realCreds.AccessKeyID} {
			if _, ok := got[want]; !ok || got[want] != phCreds.AccessKeyID {
				t.Errorf("key id not reported with its placeholder")
			}
		}
		for _, sig := range hex64.FindAllString(wire, -1) {
			if strings.Contains(guestWire, sig) {
				continue // the payload hash, the same on both sides
			}
			g, ok := got[sig]
			if !ok {
				t.Errorf("real signature %s… on the wire was not reported", sig[:8])
				continue
			}
			if !strings.Contains(guestWire, g) {
				t.Errorf("reported guest signature %s… is not what the guest sent", g[:8])
			}
		}
	}
	t.Run("header", func(t *testing.T) {
		got := reports{}
		req := guestRequest(t, "GET", "https://s3.example", s3Key, nil, guestOpt{creds: withToken(phCreds, phToken), sendHash: true})
		guestWire := req.Header.Get("Authorization")
		s := &SigV4{Placeholder: withToken(phCreds, phToken), Real: withToken(realCreds, realToken), Report: got.fn()}
		if err := s.Resign(req); err != nil {
			t.Fatal(err)
		}
		check(t, req.Header.Get("Authorization"), got, guestWire)
		if got[realToken] != phToken {
			t.Error("session token not reported with the guest's")
		}
	})
	t.Run("presigned", func(t *testing.T) {
		got := reports{}
		req, _ := http.NewRequest("GET", "https://s3.example"+s3Key+"?X-Amz-Expires=300", nil)
		signed, _, err := v4.NewSigner().PresignHTTP(context.Background(), phCreds.Credentials(), req, unsignedPayload, "s3", region, signTime, func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
		if err != nil {
			t.Fatal(err)
		}
		preq, _ := http.NewRequest("GET", signed, nil)
		s := &SigV4{Placeholder: phCreds, Real: realCreds, Report: got.fn()}
		if err := s.Resign(preq); err != nil {
			t.Fatal(err)
		}
		check(t, preq.URL.RawQuery, got, signed)
	})
	t.Run("chunked", func(t *testing.T) {
		got := reports{}
		req := chunkedUpload(t, "https://s3.example", phCreds, [][]byte{bytes.Repeat([]byte("a"), 100), []byte("tail")}, true)
		guestBody, _ := req.GetBody()
		gb, _ := io.ReadAll(guestBody)
		guestWire := req.Header.Get("Authorization") + string(gb)
		s := &SigV4{Placeholder: phCreds, Real: realCreds, Report: got.fn()}
		if err := s.Resign(req); err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			t.Fatal(err)
		}
		check(t, req.Header.Get("Authorization")+string(body), got, guestWire)
		if len(got) < 5 { // key id, request, 3 chunks, trailer
			t.Errorf("reported %d values", len(got))
		}
	})
}

func TestHMACReportsWhatItPutIn(t *testing.T) {
	for _, enc := range []string{"hex", "base64"} {
		cfg := HMAC{Algorithm: "sha256", Header: "X-Sig", Prefix: "v1=", Encoding: enc, Canonical: []string{"method", "body"}, Placeholder: hmacPlaceholder, Real: hmacReal}
		got := reports{}
		cfg.Report = got.fn()
		req, _ := http.NewRequest("POST", "https://hooks.example/x", strings.NewReader("{}"))
		guest := testHMAC(cfg, hmacPlaceholder, "POST", "/x", "", req.Header, []byte("{}"))
		req.Header.Set("X-Sig", guest)
		if err := cfg.Resign(req); err != nil {
			t.Fatal(err)
		}
		real := strings.TrimPrefix(req.Header.Get("X-Sig"), "v1=")
		if len(got) != 1 || "v1="+got[real] != guest {
			t.Errorf("%s: reported %d values; real signature reported with the guest's: %v", enc, len(got), "v1="+got[real] == guest)
		}
		if _, err := hex.DecodeString(real); enc == "hex" && err != nil {
			t.Error(err)
		}
	}
}
