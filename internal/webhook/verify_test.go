package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func sign(key, msg string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

// The examples GitHub and Slack publish in their documentation.
func TestPublishedVectors(t *testing.T) {
	gh, _ := New("github", []byte("It's a Secret to Everybody"))
	id, err := gh.Verify(hdr("X-Hub-Signature-256", "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17", "X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"), []byte("Hello, World!"), time.Now())
	if err != nil || id != "github:757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17" {
		t.Fatalf("GitHub's example: %q %v", id, err)
	}
	body := "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
	sl, _ := New("slack", []byte("8f742231b10e8888abcd99yyyzzz85a5"))
	h := hdr("X-Slack-Request-Timestamp", "1531420618", "X-Slack-Signature", "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503")
	if _, err := sl.Verify(h, []byte(body), time.Unix(1531420618+60, 0)); err != nil {
		t.Fatalf("Slack's example: %v", err)
	}
	if _, err := sl.Verify(h, []byte(body), time.Unix(1531420618+301, 0)); !errors.Is(err, ErrStale) {
		t.Fatalf("Slack's example six minutes later: %v, want ErrStale", err)
	}
}

func TestForgeries(t *testing.T) {
	const key = "whsec_test"
	now := time.Unix(1_700_000_000, 0)
	ts := fmt.Sprint(now.Unix())
	body := []byte(`{"id":"evt_1","type":"payment_intent.succeeded"}`)
	good := sign(key, ts+"."+string(body))
	st, _ := New("stripe", []byte(key))
	if _, err := st.Verify(hdr("Stripe-Signature", "t="+ts+",v1="+good), body, now); err != nil {
		t.Fatalf("valid Stripe delivery: %v", err)
	}
	// A rolling secret: two v1 values, one matches.
	if _, err := st.Verify(hdr("Stripe-Signature", "t="+ts+",v1="+strings.Repeat("0", 64)+",v1="+good), body, now); err != nil {
		t.Fatalf("Stripe with two v1 signatures: %v", err)
	}
	bad := map[string]http.Header{
		"no header":         hdr(),
		"no timestamp":      hdr("Stripe-Signature", "v1="+good),
		"no v1":             hdr("Stripe-Signature", "t="+ts+",v0="+good),
		"wrong signature":   hdr("Stripe-Signature", "t="+ts+",v1="+sign("other", ts+"."+string(body))),
		"timestamp swapped": hdr("Stripe-Signature", "t="+fmt.Sprint(now.Unix()+1)+",v1="+good),
		"not hex":           hdr("Stripe-Signature", "t="+ts+",v1=zz"+good[2:]),
		"truncated":         hdr("Stripe-Signature", "t="+ts+",v1="+good[:32]),
	}
	for name, h := range bad {
		if _, err := st.Verify(h, body, now); !errors.Is(err, ErrForged) {
			t.Errorf("Stripe %s: %v, want ErrForged", name, err)
		}
	}
	if _, err := st.Verify(hdr("Stripe-Signature", "t="+ts+",v1="+good), append(body, ' '), now); !errors.Is(err, ErrForged) {
		t.Errorf("Stripe with a changed body: %v", err)
	}
	if _, err := st.Verify(hdr("Stripe-Signature", "t="+ts+",v1="+good), body, now.Add(6*time.Minute)); !errors.Is(err, ErrStale) {
		t.Errorf("Stripe delivery replayed six minutes later: %v, want ErrStale", err)
	}
	gh, _ := New("github", []byte(key))
	for name, h := range map[string]http.Header{
		"sha1 only":   hdr("X-Hub-Signature", "sha1="+strings.Repeat("a", 40)),
		"no prefix":   hdr("X-Hub-Signature-256", sign(key, string(body))),
		"other key":   hdr("X-Hub-Signature-256", "sha256="+sign("nope", string(body))),
		"empty value": hdr("X-Hub-Signature-256", "sha256="),
	} {
		if _, err := gh.Verify(h, body, now); !errors.Is(err, ErrForged) {
			t.Errorf("GitHub %s: %v, want ErrForged", name, err)
		}
	}
	// Errors never carry the secret.
	_, err := gh.Verify(hdr("X-Hub-Signature-256", "sha256=00"), body, now)
	if err == nil || strings.Contains(err.Error(), key) {
		t.Errorf("error %v", err)
	}
}

func TestGenericHMAC(t *testing.T) {
	const key = "s3cret"
	now := time.Unix(1_700_000_000, 0)
	body := []byte("payload")
	v, err := New("hmac:header=X-Signature,prefix=sha256=", []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(hdr("X-Signature", "sha256="+sign(key, "payload")), body, now); err != nil {
		t.Fatalf("hex with prefix: %v", err)
	}
	if _, err := v.Verify(hdr("X-Signature", sign(key, "payload")), body, now); !errors.Is(err, ErrForged) {
		t.Errorf("missing prefix: %v", err)
	}
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte("1700000000.payload"))
	b64 := base64.StdEncoding.EncodeToString(m.Sum(nil))
	v, err = New("hmac:header=X-Sig,encoding=base64,timestamp-header=X-Ts,tolerance=1m,id-header=X-Id", []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	id, err := v.Verify(hdr("X-Sig", b64, "X-Ts", "1700000000", "X-Id", "d-1"), body, now.Add(30*time.Second))
	if err != nil || id != "hmac:"+hex.EncodeToString(m.Sum(nil)) {
		t.Fatalf("base64 with timestamp: %q %v", id, err)
	}
	if _, err := v.Verify(hdr("X-Sig", b64, "X-Ts", "1700000000"), body, now.Add(2*time.Minute)); !errors.Is(err, ErrStale) {
		t.Errorf("stale: %v", err)
	}
	if _, err := v.Verify(hdr("X-Sig", b64, "X-Ts", "1700000001"), body, now); !errors.Is(err, ErrForged) {
		t.Errorf("timestamp not the signed one: %v", err)
	}
	for _, spec := range []string{"hmac:", "hmac:alg=md5,header=X", "hmac:header=X,encoding=rot13", "hmac:header=X Y", "hmac:header=X,tolerance=forever", "hmac:header", "hmac:header=X,colour=red", "gitlab", ""} {
		if _, err := New(spec, []byte(key)); !errors.Is(err, ErrSpec) {
			t.Errorf("New(%q) = %v, want ErrSpec", spec, err)
		}
	}
	if _, err := New("github", nil); !errors.Is(err, ErrSpec) {
		t.Errorf("empty secret: %v", err)
	}
}

// TestReplayKey: every re-sending of one delivery that verifies has the
// same key — with a fresh unsigned delivery id, the hex re-cased, other
// whitespace, extra signatures beside the good one — and a new delivery
// (another body, another signed timestamp) has another.
func TestReplayKey(t *testing.T) {
	const key = "whsec_replay"
	now := time.Unix(1_700_000_000, 0)
	ts := fmt.Sprint(now.Unix())
	body := []byte(`{"id":"evt_1"}`)
	other := []byte(`{"id":"evt_2"}`)
	tsSig := func(ts string, b []byte) string { return sign(key, ts+"."+string(b)) }
	slackSig := func(ts string, b []byte) string { return sign(key, "v0:"+ts+":"+string(b)) }
	b64 := func(msg string) string {
		m := hmac.New(sha256.New, []byte(key))
		m.Write([]byte(msg))
		return base64.StdEncoding.EncodeToString(m.Sum(nil))
	}
	ts2 := fmt.Sprint(now.Unix() + 1)
	for _, tc := range []struct {
		scheme string
		body   []byte
		same   []http.Header // the first delivery, then re-sendings of it
		fresh  []http.Header // genuinely new deliveries (over fresh)
		freshB []byte
	}{
		{"github", body, []http.Header{
			hdr("X-Hub-Signature-256", "sha256="+sign(key, string(body)), "X-GitHub-Delivery", "d-1"),
			hdr("X-Hub-Signature-256", "sha256="+sign(key, string(body)), "X-GitHub-Delivery", "d-2"),
			hdr("X-Hub-Signature-256", "sha256="+strings.ToUpper(sign(key, string(body)))),
			hdr("X-Hub-Signature-256", " sha256="+sign(key, string(body))+" ", "X-GitHub-Delivery", "d-3"),
		}, []http.Header{hdr("X-Hub-Signature-256", "sha256="+sign(key, string(other)), "X-GitHub-Delivery", "d-1")}, other},
		{"stripe", body, []http.Header{
			hdr("Stripe-Signature", "t="+ts+",v1="+tsSig(ts, body)),
			hdr("Stripe-Signature", "t="+ts+",v1="+strings.ToUpper(tsSig(ts, body))),
			hdr("Stripe-Signature", " t="+ts+" , v1="+tsSig(ts, body)+" ,v0=00"),
			hdr("Stripe-Signature", "t="+ts+",v1="+strings.Repeat("0", 64)+",v1="+tsSig(ts, body)),
		}, []http.Header{hdr("Stripe-Signature", "t="+ts2+",v1="+tsSig(ts2, body))}, body},
		{"slack", body, []http.Header{
			hdr("X-Slack-Request-Timestamp", ts, "X-Slack-Signature", "v0="+slackSig(ts, body)),
			hdr("X-Slack-Request-Timestamp", ts, "X-Slack-Signature", "v0="+strings.ToUpper(slackSig(ts, body))),
			hdr("X-Slack-Request-Timestamp", " "+ts, "X-Slack-Signature", "v0="+slackSig(ts, body)+"\t"),
		}, []http.Header{hdr("X-Slack-Request-Timestamp", ts2, "X-Slack-Signature", "v0="+slackSig(ts2, body))}, body},
		{"hmac:header=X-Sig,prefix=sha256=,id-header=X-Id", body, []http.Header{
			hdr("X-Sig", "sha256="+sign(key, string(body)), "X-Id", "a"),
			hdr("X-Sig", "sha256="+strings.ToUpper(sign(key, string(body))), "X-Id", "b"),
		}, []http.Header{hdr("X-Sig", "sha256="+sign(key, string(other)), "X-Id", "a")}, other},
		{"hmac:header=X-Sig,encoding=base64,timestamp-header=X-Ts", body, []http.Header{
			hdr("X-Sig", b64(ts+"."+string(body)), "X-Ts", ts),
			hdr("X-Sig", " "+b64(ts+"."+string(body)), "X-Ts", ts),
		}, []http.Header{hdr("X-Sig", b64(ts2+"."+string(body)), "X-Ts", ts2)}, body},
	} {
		v, err := New(tc.scheme, []byte(key))
		if err != nil {
			t.Fatal(err)
		}
		var first string
		for i, h := range tc.same {
			// Header values as a server reads them: surrounding blanks trimmed.
			for k, vs := range h {
				for j := range vs {
					vs[j] = strings.Trim(vs[j], " \t")
				}
				h[k] = vs
			}
			k, err := v.Verify(h, tc.body, now)
			if err != nil {
				t.Errorf("%s: re-sending %d does not verify: %v", tc.scheme, i, err)
				continue
			}
			if i == 0 {
				first = k
			} else if k != first {
				t.Errorf("%s: re-sending %d has key %q, the delivery %q: a replay would pass", tc.scheme, i, k, first)
			}
		}
		kind, _, _ := strings.Cut(tc.scheme, ":")
		if !strings.HasPrefix(first, kind+":") {
			t.Errorf("%s: key %q does not name the scheme", tc.scheme, first)
		}
		for _, h := range tc.fresh {
			if k, err := v.Verify(h, tc.freshB, now); err != nil || k == first {
				t.Errorf("%s: a new delivery: %q %v (the first: %q)", tc.scheme, k, err, first)
			}
		}
	}
}
