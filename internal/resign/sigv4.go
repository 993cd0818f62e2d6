package resign

import (
	"crypto/hmac"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
)

const (
	sigv4Algorithm           = "AWS4-HMAC-SHA256"
	unsignedPayload          = "UNSIGNED-PAYLOAD"
	streamingSigned          = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
	streamingSignedTrailer   = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
	streamingUnsignedTrailer = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
	amzDateFormat            = "20060102T150405Z"
	securityTokenHeader      = "x-amz-security-token"
)

// AWSCreds is one AWS credential set.
type AWSCreds struct {
	AccessKeyID, SecretAccessKey, SessionToken string
}

// Credentials converts c for the SDK.
func (c AWSCreds) Credentials() aws.Credentials {
	return aws.Credentials{AccessKeyID: c.AccessKeyID, SecretAccessKey: c.SecretAccessKey, SessionToken: c.SessionToken, Source: "cagebox"}
}

// SigV4 re-signs AWS Signature Version 4 requests (Authorization header or
// presigned query) signed with Placeholder so that they carry Real instead.
// It is safe for concurrent use once its fields are set; to rotate Real,
// publish a new *SigV4 (e.g. through an atomic.Pointer) rather than writing
// the fields of one in use. It must not be copied after first use.
type SigV4 struct {
	Placeholder AWSCreds
	Real        AWSCreds
	// MaxBody bounds the body read to check a payload hash; 0 means
	// DefaultMaxBody.
	MaxBody int64
	// Report, when set, hears every real-key output Resign puts into the
	// request (the real key id, session token, request, chunk and trailer
	// signatures), each with what the guest sent in its place, so that the
	// gateway can keep them out of the response. See Reporter.
	Report Reporter

	// mu guards keys, derived signing keys by secret and credential scope
	// (deriving one costs four HMACs; a scope changes once a day).
	mu   sync.Mutex
	keys map[string][]byte
}

const maxCachedKeys = 64

// key returns the signing key of secret for q's scope.
func (s *SigV4) key(secret string, q *sigv4Req) []byte {
	id := secret + "\x00" + q.scope
	s.mu.Lock()
	k, ok := s.keys[id]
	s.mu.Unlock()
	if ok {
		return k
	}
	k = signingKey(secret, q.date, q.region, q.service)
	s.mu.Lock()
	if s.keys == nil || len(s.keys) >= maxCachedKeys {
		s.keys = make(map[string][]byte)
	}
	s.keys[id] = k
	s.mu.Unlock()
	return k
}

// sigv4Req is one request being verified and re-signed.
type sigv4Req struct {
	r         *http.Request
	presigned bool
	s3        bool

	date, region, service string // credential scope
	scope                 string // date/region/service/aws4_request
	amzDate               string // 20060102T150405Z
	names                 []string
	signature             []byte
	payloadHash           string
	// checkHash is the declared payload hash the body must match, checked
	// as the body streams (nil: nothing to check).
	checkHash []byte

	headers map[string][]string // lower-case name → values
	query   []queryPair
}

// Resign verifies r, as received from the guest, with the placeholder
// credentials and rewrites it for the real ones: the Authorization header (or
// the X-Amz-Credential and X-Amz-Signature of a presigned URL) and
// X-Amz-Security-Token; X-Amz-Date, the region, the service and the signed
// header list stay as the guest signed them (plus x-amz-security-token when
// Real has a session token). r is changed only when Resign returns nil,
// except that a body read to check its hash is put back as a replayable
// reader.
//
// The path is verified as the guest sent it (RequestURI) and signed as the
// gateway will forward it (r.URL: Opaque, else EscapedPath), so the gateway
// must forward r.URL's path and RawQuery unchanged.
//
// For aws-chunked uploads r.Body is replaced by a reader that verifies each
// chunk signature against the placeholder chain and rewrites it for the real
// chain as the body streams; a bad chunk makes that reader fail (wrapping
// ErrBadSignature) before any of the chunk is passed on. A body with a
// declared payload hash (X-Amz-Content-Sha256) is not read here either: r.Body
// is replaced by a reader that hashes it as it streams and fails (wrapping
// ErrBadSignature) instead of passing on its last bytes if it does not match,
// so an upstream never receives a complete body that differs from what was
// signed. Only a payload hash that is signed but not declared (non-S3
// services) needs the body in memory first, up to MaxBody.
func (s *SigV4) Resign(r *http.Request) error {
	q, err := s.parse(r)
	if err != nil {
		return err
	}
	if s.Real.AccessKeyID == "" || s.Real.SecretAccessKey == "" {
		return unsupported("no real AWS credentials are configured for this binding")
	}
	pk := s.key(s.Placeholder.SecretAccessKey, q)
	uri, qmode, ok := q.verify(pk)
	if !ok {
		return fmt.Errorf("%w: the request does not match its signature (changed after signing, or signed with another secret)", ErrBadSignature)
	}
	rk := s.key(s.Real.SecretAccessKey, q)
	guestToken := ""
	if v := q.headers[securityTokenHeader]; len(v) > 0 {
		guestToken = v[0]
	}
	for _, p := range q.query {
		if p.ok && p.key == "X-Amz-Security-Token" {
			guestToken = p.val
		}
	}
	s.Report.report(s.Real.AccessKeyID, s.Placeholder.AccessKeyID)
	s.Report.report(s.Real.SessionToken, guestToken)
	if q.presigned {
		sig := q.resignQuery(s.Real, rk, uri, qmode)
		s.Report.report(sig, hex.EncodeToString(q.signature))
		if q.checkHash != nil {
			checkBody(r, q.checkHash)
		}
		return nil
	}
	sig := q.resignHeader(s.Real, rk, uri, qmode)
	s.Report.report(hex.EncodeToString(sig), hex.EncodeToString(q.signature))
	if q.payloadHash == streamingSigned || q.payloadHash == streamingSignedTrailer {
		q.streamBody(s, pk, rk, sig)
	}
	if q.checkHash != nil {
		checkBody(r, q.checkHash)
	}
	return nil
}

func (s *SigV4) maxBody() int64 {
	if s.MaxBody > 0 {
		return s.MaxBody
	}
	return DefaultMaxBody
}

func bad(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadSignature}, a...)...)
}

func unsupported(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnsupported}, a...)...)
}

// parse classifies r and reads everything the signature covers.
func (s *SigV4) parse(r *http.Request) (*sigv4Req, error) {
	auths := r.Header.Values("Authorization")
	q := &sigv4Req{r: r, query: parseQuery(r.URL.RawQuery)}
	var presign map[string][]string // X-Amz-* query parameters
	for _, p := range q.query {
		if p.ok && strings.HasPrefix(p.key, "X-Amz-") {
			if presign == nil {
				presign = map[string][]string{}
			}
			presign[p.key] = append(presign[p.key], p.val)
		}
	}
	_, hasQuerySig := presign["X-Amz-Signature"]
	_, hasQueryAlg := presign["X-Amz-Algorithm"]

	var cred, signed, sig string
	switch {
	case len(auths) > 1:
		return nil, bad("several Authorization headers")
	case len(auths) == 1 && strings.HasPrefix(auths[0], sigv4Algorithm+" "):
		if hasQuerySig || hasQueryAlg {
			return nil, bad("signed both in the Authorization header and in the query")
		}
		var err error
		if cred, signed, sig, err = parseAuthorization(auths[0]); err != nil {
			return nil, err
		}
	case len(auths) == 1 && strings.HasPrefix(auths[0], "AWS4-ECDSA-P256-SHA256"):
		return nil, unsupported("SigV4a (AWS4-ECDSA-P256-SHA256) requests cannot be re-signed; configure the SDK for regional SigV4 endpoints")
	case len(auths) == 1 && strings.HasPrefix(auths[0], "AWS4-"):
		return nil, bad("malformed or unknown AWS4 Authorization header")
	case len(auths) == 1 && strings.HasPrefix(auths[0], "AWS "):
		return nil, unsupported("signature version 2 cannot be re-signed; configure the client for SigV4")
	case hasQuerySig || hasQueryAlg:
		if len(auths) == 1 && strings.HasPrefix(auths[0], "AWS4-") {
			return nil, bad("signed both in the Authorization header and in the query")
		}
		for _, k := range []string{"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-SignedHeaders", "X-Amz-Signature"} {
			if len(presign[k]) != 1 {
				return nil, bad("presigned URL needs exactly one %s", k)
			}
		}
		if a := presign["X-Amz-Algorithm"][0]; a != sigv4Algorithm {
			if strings.HasPrefix(a, "AWS4-ECDSA") {
				return nil, unsupported("SigV4a presigned URLs cannot be re-signed")
			}
			return nil, bad("unknown presigned URL algorithm")
		}
		q.presigned = true
		cred, signed, sig = presign["X-Amz-Credential"][0], presign["X-Amz-SignedHeaders"][0], presign["X-Amz-Signature"][0]
		q.amzDate = presign["X-Amz-Date"][0]
	default:
		if _, ok := presign["X-Amz-Credential"]; ok {
			return nil, bad("presigned URL without X-Amz-Algorithm")
		}
		return nil, ErrNotSigned
	}

	// Credential=AKID/DATE/REGION/SERVICE/aws4_request
	parts := strings.Split(cred, "/")
	if len(parts) != 5 || parts[4] != "aws4_request" || len(parts[1]) != 8 || parts[2] == "" || parts[3] == "" {
		return nil, bad("malformed credential scope")
	}
	if subtle.ConstantTimeCompare([]byte(parts[0]), []byte(s.Placeholder.AccessKeyID)) != 1 || s.Placeholder.AccessKeyID == "" {
		return nil, bad("signed with an access key id other than this sandbox's placeholder")
	}
	q.date, q.region, q.service = parts[1], parts[2], parts[3]
	q.scope = q.date + "/" + q.region + "/" + q.service + "/aws4_request"
	q.s3 = q.service == "s3" || q.service == "s3express" || strings.HasPrefix(q.service, "s3-")

	var err error
	if q.signature, err = hex.DecodeString(sig); err != nil || len(q.signature) != 32 {
		return nil, bad("malformed signature")
	}
	if q.names, err = parseSignedHeaders(signed); err != nil {
		return nil, err
	}

	q.headers = lowerHeaders(r)
	if !q.presigned {
		switch d := q.headers["x-amz-date"]; {
		case len(d) == 1:
			q.amzDate = d[0]
		case len(d) > 1:
			return nil, bad("several X-Amz-Date headers")
		default:
			// SigV4 allows the Date header in its place.
			t, err := http.ParseTime(r.Header.Get("Date"))
			if err != nil {
				return nil, bad("no X-Amz-Date or Date header")
			}
			q.amzDate = t.UTC().Format(amzDateFormat)
		}
	}
	if _, err := time.Parse(amzDateFormat, q.amzDate); err != nil {
		return nil, bad("malformed X-Amz-Date")
	}
	if q.amzDate[:8] != q.date {
		return nil, bad("X-Amz-Date and credential scope disagree on the date")
	}

	// A session token, if sent, must be the placeholder's.
	tok := q.headers[securityTokenHeader]
	if q.presigned {
		tok = presign["X-Amz-Security-Token"]
	}
	if len(tok) > 1 || (len(tok) == 1 && (s.Placeholder.SessionToken == "" ||
		subtle.ConstantTimeCompare([]byte(tok[0]), []byte(s.Placeholder.SessionToken)) != 1)) {
		return nil, bad("carries a session token other than this sandbox's placeholder")
	}

	if err := s.payload(q); err != nil {
		return nil, err
	}
	return q, nil
}

func parseAuthorization(v string) (cred, signed, sig string, err error) {
	rest := strings.TrimSpace(strings.TrimPrefix(v, sigv4Algorithm))
	var seen int
	for _, part := range strings.Split(rest, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return "", "", "", bad("malformed Authorization header")
		}
		switch k {
		case "Credential":
			cred, seen = val, seen|1
		case "SignedHeaders":
			signed, seen = val, seen|2
		case "Signature":
			sig, seen = val, seen|4
		default:
			return "", "", "", bad("malformed Authorization header")
		}
	}
	if seen != 7 {
		return "", "", "", bad("Authorization header lacks Credential, SignedHeaders or Signature")
	}
	return cred, signed, sig, nil
}

func parseSignedHeaders(s string) ([]string, error) {
	names := strings.Split(s, ";")
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if n == "" || n != strings.ToLower(n) || seen[n] {
			return nil, bad("malformed SignedHeaders")
		}
		seen[n] = true
	}
	if !seen["host"] {
		return nil, bad("host is not among the signed headers")
	}
	return names, nil
}

// payload decides the hashed payload of the canonical request, checking the
// body against a declared hash.
func (s *SigV4) payload(q *sigv4Req) error {
	decl := q.headers["x-amz-content-sha256"]
	if len(decl) > 1 {
		return bad("several X-Amz-Content-Sha256 headers")
	}
	var d string
	if len(decl) == 1 {
		d = decl[0]
	}
	switch {
	case d == unsignedPayload, d == streamingUnsignedTrailer:
		q.payloadHash = d
		return nil
	case d == streamingSigned, d == streamingSignedTrailer:
		if q.presigned {
			return unsupported("aws-chunked bodies with a presigned URL")
		}
		if q.r.Body == nil || q.r.Body == http.NoBody {
			return bad("aws-chunked upload without a body")
		}
		q.payloadHash = d
		return nil
	case strings.HasPrefix(d, "STREAMING-"):
		return unsupported("payload mode %q cannot be re-signed; use UNSIGNED-PAYLOAD or STREAMING-AWS4-HMAC-SHA256-PAYLOAD", d)
	case d == "" && q.presigned && q.s3:
		q.payloadHash = unsignedPayload
		return nil
	case isHex64(d):
		// The signature covers the declared hash, not the body: verify
		// it now, and the body against it as it streams (hashReader), so
		// nothing is buffered.
		q.payloadHash = d
		want, _ := hex.DecodeString(d)
		if q.r.Body == nil || q.r.Body == http.NoBody {
			if sha256Hex(nil) != strings.ToLower(d) {
				return bad("the body does not match X-Amz-Content-Sha256")
			}
			return nil
		}
		q.checkHash = want
		return nil
	case d == "":
		// The payload hash is in the signature but not in a header: the
		// whole body is needed before anything can be verified.
		body, err := readBody(q.r, s.maxBody())
		if err != nil {
			return err
		}
		q.payloadHash = sha256Hex(body)
		return nil
	}
	return bad("X-Amz-Content-Sha256 is neither a SHA-256 hash nor a known payload mode")
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i] | 0x20
		if !('0' <= s[i] && s[i] <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func signingKey(secret, date, region, service string) []byte {
	k := hmacSHA256([]byte("AWS4"+secret), date)
	k = hmacSHA256(k, region)
	k = hmacSHA256(k, service)
	return hmacSHA256(k, "aws4_request")
}

func (q *sigv4Req) sign(key []byte, canonical string) []byte {
	sts := sigv4Algorithm + "\n" + q.amzDate + "\n" + q.scope + "\n" + sha256Hex([]byte(canonical))
	return hmacSHA256(key, sts)
}

func (q *sigv4Req) skip() string {
	if q.presigned {
		return "X-Amz-Signature"
	}
	return ""
}

// verify recomputes the guest's signature with the placeholder key. Signers
// disagree on a few canonicalisation details (see canonicalURIs and the query
// modes); every form tried is a function of the request as received, so
// accepting any of them never lets a changed request through. It returns the
// path form index and query mode that matched, to sign the same way again.
func (q *sigv4Req) verify(key []byte) (uriForm, qmode int, ok bool) {
	uris := canonicalURIs(wirePath(q.r), q.s3)
	qs := []string{canonicalQuery(q.query, queryDecoded, q.skip())}
	if raw := canonicalQuery(q.query, queryRaw, q.skip()); raw != qs[0] {
		qs = append(qs, raw)
	}
	for ui, u := range uris {
		for qi, qq := range qs {
			c := canonicalRequest(q.r.Method, u, qq, q.names, q.headers, q.payloadHash)
			if hmac.Equal(q.sign(key, c), q.signature) {
				return ui, qi, true
			}
		}
	}
	return 0, 0, false
}

func (q *sigv4Req) resignURI(form int) string {
	uris := canonicalURIs(forwardPath(q.r), q.s3)
	if form < len(uris) {
		return uris[form]
	}
	return uris[len(uris)-1]
}

// resignHeader signs again for real in the Authorization header and returns
// the new signature.
func (q *sigv4Req) resignHeader(real AWSCreds, key []byte, uriForm, qmode int) []byte {
	r := q.r
	names := slices.DeleteFunc(slices.Clone(q.names), func(n string) bool { return n == securityTokenHeader })
	deleteHeader(r.Header, "X-Amz-Security-Token")
	delete(q.headers, securityTokenHeader)
	if real.SessionToken != "" {
		r.Header.Set("X-Amz-Security-Token", real.SessionToken)
		q.headers[securityTokenHeader] = []string{real.SessionToken}
		i := 0
		for i < len(names) && names[i] < securityTokenHeader {
			i++
		}
		names = slices.Insert(names, i, securityTokenHeader)
	}
	c := canonicalRequest(r.Method, q.resignURI(uriForm), canonicalQuery(q.query, qmode, ""), names, q.headers, q.payloadHash)
	sig := q.sign(key, c)
	deleteHeader(r.Header, "Authorization")
	r.Header.Set("Authorization", sigv4Algorithm+" Credential="+real.AccessKeyID+"/"+q.scope+
		", SignedHeaders="+strings.Join(names, ";")+", Signature="+hex.EncodeToString(sig))
	return sig
}

// resignQuery signs a presigned URL again for real and returns the new
// signature (hex).
func (q *sigv4Req) resignQuery(real AWSCreds, key []byte, uriForm, qmode int) string {
	pairs := make([]queryPair, 0, len(q.query)+1)
	set := func(k, v string) queryPair {
		return queryPair{raw: uriEncode(k, false) + "=" + uriEncode(v, false), key: k, val: v, ok: true}
	}
	for _, p := range q.query {
		switch {
		case p.ok && p.key == "X-Amz-Credential":
			pairs = append(pairs, set(p.key, real.AccessKeyID+"/"+q.scope))
		case p.ok && p.key == "X-Amz-Security-Token":
			// dropped here, added below when Real has one
		case p.ok && p.key == "X-Amz-Signature":
			if real.SessionToken != "" {
				pairs = append(pairs, set("X-Amz-Security-Token", real.SessionToken))
			}
			pairs = append(pairs, p) // placeholder until signed
		default:
			pairs = append(pairs, p)
		}
	}
	c := canonicalRequest(q.r.Method, q.resignURI(uriForm), canonicalQuery(pairs, qmode, "X-Amz-Signature"), q.names, q.headers, q.payloadHash)
	sig := hex.EncodeToString(q.sign(key, c))
	for i, p := range pairs {
		if p.ok && p.key == "X-Amz-Signature" {
			pairs[i] = set(p.key, sig)
		}
	}
	q.r.URL.RawQuery = joinQuery(pairs)
	q.r.URL.ForceQuery = false
	return sig
}

// deleteHeader removes every spelling of name (a request built by hand may
// hold non-canonical keys).
func deleteHeader(h http.Header, name string) {
	for k := range h {
		if strings.EqualFold(k, name) {
			delete(h, k)
		}
	}
}
