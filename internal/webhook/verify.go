// Package webhook verifies webhook deliveries at the edge, with the
// sender's shared secret held by the host: GitHub (X-Hub-Signature-256),
// Stripe (Stripe-Signature with its timestamp tolerance), Slack
// (X-Slack-Signature over v0:timestamp:body) and a generic HMAC scheme
// described by a spec. A verified delivery gets a replay key: the scheme
// and the MAC bytes the verifier computed — the same for every re-sending
// of one delivery, however the sender re-cases, re-encodes or re-labels
// it, and never text an attacker could vary. The caller refuses a key it
// has seen (package hooks keeps them in the store); a forgery or a stale
// timestamp is refused here, and the guest that consumes the webhook never
// needs the secret.
//
// The package is a leaf: it knows nothing of sandboxes, the store or the
// ingress listener. It is hand-written on crypto/hmac because each
// sender's scheme is a few lines over the standard library and the
// senders' own SDKs are not Go libraries of the field (stripe-go's
// webhook.ConstructEvent would pull the whole Stripe client in for one
// HMAC); every comparison is constant-time.
package webhook

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrForged: the signature is missing, malformed or wrong.
var ErrForged = errors.New("webhook signature rejected")

// ErrStale: the signed timestamp is outside the tolerance (a replay of an
// old delivery, or a clock far off).
var ErrStale = errors.New("webhook timestamp outside the tolerance")

// ErrSpec: a verification scheme that cannot be used.
var ErrSpec = errors.New("invalid webhook verification scheme")

// DefaultTolerance is how far a signed timestamp may be from now (Stripe's
// and Slack's documented default: five minutes).
const DefaultTolerance = 5 * time.Minute

// Verifier checks one delivery. It returns the delivery's replay key:
// the scheme's kind and the hex of the MAC it computed over what the
// sender signed ("github:…", "stripe:…", "slack:…", "hmac:…"). A delivery
// id the sender sends beside the signature (GitHub's X-GitHub-Delivery, an
// hmac id-header) is not in it: nothing signs it, so a replay could carry
// a fresh one. What the MAC covers bounds the key: Stripe, Slack and hmac
// with timestamp-header sign a timestamp, so a replay of a key is also
// refused as stale once the tolerance has passed; GitHub signs the body
// only, so two deliveries of the very same body are one delivery.
type Verifier interface {
	Verify(h http.Header, body []byte, now time.Time) (key string, err error)
	// Scheme is the name the verifier was made from ("github", "hmac:…").
	Scheme() string
}

// New makes the verifier of a scheme: "github", "stripe", "slack", or
// "hmac:KEY=VALUE,…" (see HMAC). secret is the shared secret; it is kept
// by the verifier and never appears in an error.
func New(scheme string, secret []byte) (Verifier, error) {
	if len(secret) == 0 {
		return nil, fmt.Errorf("%w: the shared secret is empty", ErrSpec)
	}
	key := append([]byte(nil), secret...)
	switch {
	case scheme == "github":
		return &github{key: key}, nil
	case scheme == "stripe":
		return &stripe{key: key, tolerance: DefaultTolerance}, nil
	case scheme == "slack":
		return &slack{key: key, tolerance: DefaultTolerance}, nil
	case strings.HasPrefix(scheme, "hmac:"):
		return parseHMAC(scheme, key)
	}
	return nil, fmt.Errorf("%w: %q (use github, stripe, slack or hmac:header=NAME[,alg=sha256][,encoding=hex|base64][,prefix=P][,timestamp-header=NAME][,tolerance=5m])", ErrSpec, scheme)
}

// replayKey is the key of a verified delivery: kind and the MAC computed.
func replayKey(kind string, mac []byte) string { return kind + ":" + hex.EncodeToString(mac) }

func mac(newHash func() hash.Hash, key []byte, parts ...[]byte) []byte {
	m := hmac.New(newHash, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// equalHex compares a hex signature from the sender with want in constant
// time (a malformed one is simply unequal).
func equalHex(got string, want []byte) bool {
	b, err := hex.DecodeString(got)
	return err == nil && hmac.Equal(b, want)
}

// github: X-Hub-Signature-256: sha256=HEX(HMAC-SHA256(secret, body)).
// GitHub signs no timestamp, nor X-GitHub-Delivery: the body's MAC names
// the delivery.
type github struct{ key []byte }

func (g *github) Scheme() string { return "github" }

func (g *github) Verify(h http.Header, body []byte, _ time.Time) (string, error) {
	sig := h.Get("X-Hub-Signature-256")
	hexSig, ok := strings.CutPrefix(sig, "sha256=")
	if !ok {
		return "", fmt.Errorf("%w: no X-Hub-Signature-256: sha256=… header", ErrForged)
	}
	want := mac(sha256.New, g.key, body)
	if !equalHex(hexSig, want) {
		return "", fmt.Errorf("%w: X-Hub-Signature-256 does not match the body", ErrForged)
	}
	return replayKey("github", want), nil
}

// stripe: Stripe-Signature: t=UNIX,v1=HEX[,v1=HEX…] over "t.body"; any v1
// may match (Stripe sends two while a secret rolls); t within tolerance.
type stripe struct {
	key       []byte
	tolerance time.Duration
}

func (s *stripe) Scheme() string { return "stripe" }

func (s *stripe) Verify(h http.Header, body []byte, now time.Time) (string, error) {
	hdr := h.Get("Stripe-Signature")
	if hdr == "" {
		return "", fmt.Errorf("%w: no Stripe-Signature header", ErrForged)
	}
	var ts string
	var sigs []string
	for _, kv := range strings.Split(hdr, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	t, err := parseUnix(ts)
	if err != nil || len(sigs) == 0 {
		return "", fmt.Errorf("%w: Stripe-Signature needs t=TIMESTAMP and v1=SIGNATURE", ErrForged)
	}
	want := mac(sha256.New, s.key, []byte(ts), []byte("."), body)
	ok := false
	for _, sig := range sigs {
		if equalHex(sig, want) {
			ok = true
		}
	}
	if !ok {
		return "", fmt.Errorf("%w: no v1 signature in Stripe-Signature matches", ErrForged)
	}
	if err := within(t, now, s.tolerance); err != nil {
		return "", err
	}
	return replayKey("stripe", want), nil
}

// slack: X-Slack-Signature: v0=HEX(HMAC-SHA256(secret, "v0:TS:body")) with
// X-Slack-Request-Timestamp: TS within tolerance.
type slack struct {
	key       []byte
	tolerance time.Duration
}

func (s *slack) Scheme() string { return "slack" }

func (s *slack) Verify(h http.Header, body []byte, now time.Time) (string, error) {
	ts := h.Get("X-Slack-Request-Timestamp")
	t, err := parseUnix(ts)
	if err != nil {
		return "", fmt.Errorf("%w: no valid X-Slack-Request-Timestamp", ErrForged)
	}
	hexSig, ok := strings.CutPrefix(h.Get("X-Slack-Signature"), "v0=")
	if !ok {
		return "", fmt.Errorf("%w: no X-Slack-Signature: v0=… header", ErrForged)
	}
	want := mac(sha256.New, s.key, []byte("v0:"+ts+":"), body)
	if !equalHex(hexSig, want) {
		return "", fmt.Errorf("%w: X-Slack-Signature does not match", ErrForged)
	}
	if err := within(t, now, s.tolerance); err != nil {
		return "", err
	}
	return replayKey("slack", want), nil
}

// HMAC is the generic scheme, from a spec "hmac:KEY=VALUE,…":
//
//	header=NAME            the header carrying the signature (required)
//	alg=sha256             sha1, sha256 (default) or sha512
//	encoding=hex           hex (default) or base64
//	prefix=P               text before the signature in the header (e.g. sha256=)
//	timestamp-header=NAME  a header with a Unix timestamp; then the MAC is over
//	                       "TIMESTAMP.body" and the timestamp must be within tolerance
//	tolerance=5m           how far that timestamp may be from now
//	id-header=NAME         accepted for old specs and ignored: the header is not
//	                       signed, so the MAC names the delivery
type HMAC struct {
	spec      string
	key       []byte
	header    string
	newHash   func() hash.Hash
	base64    bool
	prefix    string
	tsHeader  string
	tolerance time.Duration
	idHeader  string
}

func parseHMAC(spec string, key []byte) (*HMAC, error) {
	v := &HMAC{spec: spec, key: key, newHash: sha256.New, tolerance: DefaultTolerance}
	for _, kv := range strings.Split(strings.TrimPrefix(spec, "hmac:"), ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return nil, fmt.Errorf("%w: %q: want KEY=VALUE, got %q", ErrSpec, spec, kv)
		}
		switch k {
		case "header":
			v.header = val
		case "alg":
			switch val {
			case "sha1":
				v.newHash = sha1.New
			case "sha256":
				v.newHash = sha256.New
			case "sha512":
				v.newHash = sha512.New
			default:
				return nil, fmt.Errorf("%w: %q: alg is sha1, sha256 or sha512", ErrSpec, spec)
			}
		case "encoding":
			switch val {
			case "hex":
			case "base64":
				v.base64 = true
			default:
				return nil, fmt.Errorf("%w: %q: encoding is hex or base64", ErrSpec, spec)
			}
		case "prefix":
			// "prefix=sha256=": everything after the first '='.
			v.prefix = val
		case "timestamp-header":
			v.tsHeader = val
		case "tolerance":
			d, err := time.ParseDuration(val)
			if err != nil || d <= 0 || d > 24*time.Hour {
				return nil, fmt.Errorf("%w: %q: tolerance is a duration up to 24h", ErrSpec, spec)
			}
			v.tolerance = d
		case "id-header":
			v.idHeader = val
		default:
			return nil, fmt.Errorf("%w: %q: unknown key %q", ErrSpec, spec, k)
		}
	}
	for _, h := range []string{v.header, v.tsHeader, v.idHeader} {
		if h != "" && !validHeaderName(h) {
			return nil, fmt.Errorf("%w: %q: %q is not a header name", ErrSpec, spec, h)
		}
	}
	if v.header == "" {
		return nil, fmt.Errorf("%w: %q: header=NAME is required", ErrSpec, spec)
	}
	return v, nil
}

func validHeaderName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !(c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// Scheme implements Verifier.
func (v *HMAC) Scheme() string { return v.spec }

// Verify implements Verifier.
func (v *HMAC) Verify(h http.Header, body []byte, now time.Time) (string, error) {
	sig, ok := strings.CutPrefix(h.Get(v.header), v.prefix)
	if !ok || sig == "" {
		return "", fmt.Errorf("%w: no %s header (with prefix %q)", ErrForged, v.header, v.prefix)
	}
	parts := [][]byte{body}
	var t time.Time
	if v.tsHeader != "" {
		ts := h.Get(v.tsHeader)
		var err error
		if t, err = parseUnix(ts); err != nil {
			return "", fmt.Errorf("%w: no valid %s timestamp", ErrForged, v.tsHeader)
		}
		parts = [][]byte{[]byte(ts + "."), body}
	}
	want := mac(v.newHash, v.key, parts...)
	var good bool
	if v.base64 {
		b, err := base64.StdEncoding.DecodeString(sig)
		good = err == nil && hmac.Equal(b, want)
	} else {
		good = equalHex(sig, want)
	}
	if !good {
		return "", fmt.Errorf("%w: %s does not match", ErrForged, v.header)
	}
	if v.tsHeader != "" {
		if err := within(t, now, v.tolerance); err != nil {
			return "", err
		}
	}
	return replayKey("hmac", want), nil
}

func parseUnix(s string) (time.Time, error) {
	if s == "" || len(s) > 12 {
		return time.Time{}, errors.New("no timestamp")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}, errors.New("bad timestamp")
	}
	return time.Unix(n, 0), nil
}

func within(t, now time.Time, tol time.Duration) error {
	d := now.Sub(t)
	if d < 0 {
		d = -d
	}
	if d > tol {
		return fmt.Errorf("%w: signed %s ago, the tolerance is %s", ErrStale, now.Sub(t).Round(time.Second), tol)
	}
	return nil
}
