package resign

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// Credentials used by the tests. Every secret below is searched for in
// error strings by TestErrorsCarryNoSecrets.
var (
	phCreds   = AWSCreds{AccessKeyID: "AKIAPLACEHOLDER7Q2KX", SecretAccessKey: "phSECRET/placeholder+do-not-leak0000000"}
	realCreds = AWSCreds{AccessKeyID: "AKIAREALKEY77777777X", SecretAccessKey: "realSECRET/real+do-not-leak111111111111"}
	phToken   = "phTOKEN-placeholder-session-token-do-not-leak"
	realToken = "realTOKEN-real-session-token-do-not-leak"
	signTime  = time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)
)

const region = "eu-west-1"

var allSecrets = []string{
	phCreds.SecretAccessKey, realCreds.SecretAccessKey, phToken, realToken, realCreds.AccessKeyID,
	string(hmacPlaceholder), string(hmacReal),
}

func sha256hex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// ---- upstream: a loopback stand-in for AWS that validates with the real key ----

type accepted struct {
	rawPath, rawQuery string
	header            http.Header
	body              []byte
}

type upstream struct {
	*httptest.Server
	creds AWSCreds

	// mu guards got.
	mu  sync.Mutex
	got []accepted
}

func newUpstream(t *testing.T, creds AWSCreds) *upstream {
	u := &upstream{creds: creds}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, err := validateSigV4(r, u.creds)
	if err != nil {
		http.Error(w, "upstream: "+err.Error(), http.StatusForbidden)
		return
	}
	path, _, _ := strings.Cut(r.RequestURI, "?")
	u.mu.Lock()
	u.got = append(u.got, accepted{rawPath: path, rawQuery: r.URL.RawQuery, header: r.Header.Clone(), body: body})
	u.mu.Unlock()
	io.WriteString(w, "ok")
}

func (u *upstream) accepted() []accepted {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]accepted(nil), u.got...)
}

// sdkClone rebuilds, for the SDK signer, the request the signature covers:
// the path as received, the query, and only the signed headers.
func sdkClone(r *http.Request, names []string) *http.Request {
	path, _, _ := strings.Cut(r.RequestURI, "?")
	c, _ := http.NewRequest(r.Method, "http://"+r.Host+"/", nil)
	c.URL.Opaque = "//" + r.Host + path
	c.URL.RawQuery = r.URL.RawQuery
	c.Host = r.Host
	c.Header = http.Header{}
	for _, n := range names {
		switch n {
		case "host":
		case "content-length":
			c.ContentLength = r.ContentLength
		default:
			c.Header[textproto.CanonicalMIMEHeaderKey(n)] = r.Header.Values(n)
		}
	}
	return c
}

func isS3(service string) bool { return service == "s3" }

// validateSigV4 checks r the way AWS would, recomputing the signature with
// the SDK signer and creds. It returns the (decoded) body.
func validateSigV4(r *http.Request, creds AWSCreds) ([]byte, error) {
	ctx := context.Background()
	if r.URL.Query().Get("X-Amz-Signature") != "" {
		return validatePresigned(r, creds)
	}
	auth := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 ")
	if !ok {
		return nil, errors.New("no sigv4 authorization")
	}
	f := map[string]string{}
	for _, p := range strings.Split(rest, ", ") {
		k, v, _ := strings.Cut(p, "=")
		f[k] = v
	}
	scope := strings.Split(f["Credential"], "/")
	if len(scope) != 5 || scope[0] != creds.AccessKeyID {
		return nil, errors.New("unknown access key id")
	}
	service := scope[3]
	if creds.SessionToken != "" && r.Header.Get("X-Amz-Security-Token") != creds.SessionToken {
		return nil, errors.New("bad session token")
	}
	if creds.SessionToken == "" && r.Header.Get("X-Amz-Security-Token") != "" {
		return nil, errors.New("unexpected session token")
	}
	tm, err := time.Parse(amzDateFormat, r.Header.Get("X-Amz-Date"))
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	ph := r.Header.Get("X-Amz-Content-Sha256")
	switch {
	case ph == "":
		ph = sha256hex(body)
	case ph == unsignedPayload:
	case ph == streamingSigned || ph == streamingSignedTrailer:
		seed, _ := hex.DecodeString(f["Signature"])
		body, err = dechunk(body, seed, creds, service, tm, ph == streamingSignedTrailer)
		if err != nil {
			return nil, err
		}
		if n, _ := strconv.Atoi(r.Header.Get("X-Amz-Decoded-Content-Length")); n != len(body) {
			return nil, errors.New("decoded length mismatch")
		}
	default:
		if ph != sha256hex(body) {
			return nil, errors.New("payload hash mismatch")
		}
	}
	c := sdkClone(r, strings.Split(f["SignedHeaders"], ";"))
	err = v4.NewSigner().SignHTTP(ctx, creds.Credentials(), c, ph, service, region, tm, func(o *v4.SignerOptions) {
		o.DisableURIPathEscaping = isS3(service)
	})
	if err != nil {
		return nil, err
	}
	if got := c.Header.Get("Authorization"); got != auth {
		return nil, fmt.Errorf("signature mismatch")
	}
	return body, nil
}

func validatePresigned(r *http.Request, creds AWSCreds) ([]byte, error) {
	q := r.URL.Query()
	scope := strings.Split(q.Get("X-Amz-Credential"), "/")
	if len(scope) != 5 || scope[0] != creds.AccessKeyID {
		return nil, errors.New("unknown access key id")
	}
	if q.Get("X-Amz-Security-Token") != creds.SessionToken {
		return nil, errors.New("bad session token")
	}
	tm, err := time.Parse(amzDateFormat, q.Get("X-Amz-Date"))
	if err != nil {
		return nil, err
	}
	sig := q.Get("X-Amz-Signature")
	names := strings.Split(q.Get("X-Amz-SignedHeaders"), ";")
	for _, k := range []string{"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token"} {
		q.Del(k)
	}
	c := sdkClone(r, names)
	c.URL.RawQuery = q.Encode()
	signed, _, err := v4.NewSigner().PresignHTTP(context.Background(), creds.Credentials(), c, unsignedPayload, scope[3], region, tm, func(o *v4.SignerOptions) {
		o.DisableURIPathEscaping = isS3(scope[3])
	})
	if err != nil {
		return nil, err
	}
	su, _ := url.Parse(signed)
	if su.Query().Get("X-Amz-Signature") != sig {
		return nil, errors.New("presigned signature mismatch")
	}
	return io.ReadAll(r.Body)
}

// testSigningKey derives the SigV4 key independently of the package.
func testSigningKey(secret string, tm time.Time, service string) []byte {
	mac := func(k []byte, s string) []byte { m := hmac.New(sha256.New, k); m.Write([]byte(s)); return m.Sum(nil) }
	k := mac([]byte("AWS4"+secret), tm.Format("20060102"))
	return mac(mac(mac(k, region), service), "aws4_request")
}

func trailerSignature(creds AWSCreds, service string, tm time.Time, prev []byte, canonical string) string {
	sts := "AWS4-HMAC-SHA256-TRAILER\n" + tm.Format(amzDateFormat) + "\n" +
		tm.Format("20060102") + "/" + region + "/" + service + "/aws4_request\n" +
		hex.EncodeToString(prev) + "\n" + sha256hex([]byte(canonical))
	m := hmac.New(sha256.New, testSigningKey(creds.SecretAccessKey, tm, service))
	m.Write([]byte(sts))
	return hex.EncodeToString(m.Sum(nil))
}

// dechunk decodes an aws-chunked body, checking every chunk signature (and
// the trailer signature) against creds' chain.
func dechunk(body, seed []byte, creds AWSCreds, service string, tm time.Time, trailer bool) ([]byte, error) {
	ss := v4.NewStreamSigner(creds.Credentials(), service, region, seed)
	br := bufio.NewReader(bytes.NewReader(body))
	var out []byte
	prev := seed
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, err
		}
		sizeHex, sig, _ := strings.Cut(strings.TrimSuffix(line, "\r\n"), ";chunk-signature=")
		size, err := strconv.ParseInt(sizeHex, 16, 64)
		if err != nil {
			return nil, err
		}
		data := make([]byte, size)
		if _, err := io.ReadFull(br, data); err != nil {
			return nil, err
		}
		want, _ := ss.GetSignature(context.Background(), nil, data, tm)
		if hex.EncodeToString(want) != sig {
			return nil, errors.New("chunk signature mismatch")
		}
		prev = want
		if size == 0 {
			break
		}
		out = append(out, data...)
		if crlf, _ := br.ReadString('\n'); crlf != "\r\n" {
			return nil, errors.New("bad chunk terminator")
		}
	}
	var canon, tsig string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, err
		}
		if line == "\r\n" {
			break
		}
		k, v, _ := strings.Cut(strings.TrimSuffix(line, "\r\n"), ":")
		if k == "x-amz-trailer-signature" {
			tsig = v
		} else {
			canon += k + ":" + v + "\n"
		}
	}
	if trailer && tsig != trailerSignature(creds, service, tm, prev, canon) {
		return nil, errors.New("trailer signature mismatch")
	}
	if !trailer && (canon != "" || tsig != "") {
		return nil, errors.New("unexpected trailer")
	}
	if br.Buffered() != 0 {
		return nil, errors.New("data after the final chunk")
	}
	return out, nil
}

// ---- proxy: the gateway's use of a re-signer, on loopback ----

type resigner interface{ Resign(*http.Request) error }

type proxy struct {
	*httptest.Server
	rs     resigner
	target string

	// mu guards errs.
	mu   sync.Mutex
	errs []error
}

func newProxy(t *testing.T, rs resigner, target string) *proxy {
	p := &proxy{rs: rs, target: target}
	p.Server = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.Close)
	return p
}

func (p *proxy) record(err error) {
	p.mu.Lock()
	p.errs = append(p.errs, err)
	p.mu.Unlock()
}

// lastErr returns the last error the proxy met (Resign or a body read).
func (p *proxy) lastErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.errs) == 0 {
		return nil
	}
	return p.errs[len(p.errs)-1]
}

type errRecorder struct {
	io.ReadCloser
	p *proxy
}

func (e errRecorder) Read(b []byte) (int, error) {
	n, err := e.ReadCloser.Read(b)
	if err != nil && err != io.EOF {
		e.p.record(err)
	}
	return n, err
}

func (p *proxy) serve(w http.ResponseWriter, r *http.Request) {
	if err := p.rs.Resign(r); err != nil {
		p.record(err)
		http.Error(w, "refused: "+err.Error(), http.StatusForbidden)
		return
	}
	tu, _ := url.Parse(p.target)
	out := &http.Request{
		Method:        r.Method,
		URL:           &url.URL{Scheme: tu.Scheme, Host: tu.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery},
		Header:        r.Header.Clone(),
		Host:          r.Host,
		ContentLength: r.ContentLength,
		Body:          errRecorder{r.Body, p},
	}
	if r.ContentLength == 0 {
		out.Body = http.NoBody
	}
	resp, err := http.DefaultTransport.RoundTrip(out.WithContext(r.Context()))
	if err != nil {
		if errors.Is(p.lastErr(), ErrBadSignature) {
			// The body failed its check as it streamed (the gateway
			// answers such a body with a 403 too).
			http.Error(w, "refused: "+p.lastErr().Error(), http.StatusForbidden)
			return
		}
		http.Error(w, "proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

// ---- guest: an AWS SDK inside the sandbox, holding placeholders ----

type guestOpt struct {
	creds       AWSCreds
	service     string
	payloadHash string // "" → SHA-256 of the body, X-Amz-Content-Sha256 not sent
	sendHash    bool   // send X-Amz-Content-Sha256
	header      map[string]string
}

// guestRequest builds a request to base+pathQuery (already escaped as an
// SDK would) and signs it with the SDK signer.
func guestRequest(t testing.TB, method, base, pathQuery string, body []byte, o guestOpt) *http.Request {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, base+pathQuery, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range o.header {
		req.Header.Set(k, v)
	}
	ph := o.payloadHash
	if ph == "" {
		ph = sha256hex(body)
	}
	if o.sendHash {
		req.Header.Set("X-Amz-Content-Sha256", ph)
	}
	if o.service == "" {
		o.service = "s3"
	}
	// The Go SDK signer rewrites RawQuery into canonical form; other SDKs
	// send the query as they built it. Send it as built, which covers both.
	rawQuery := req.URL.RawQuery
	defer func() { req.URL.RawQuery = rawQuery }()
	err = v4.NewSigner().SignHTTP(context.Background(), o.creds.Credentials(), req, ph, o.service, region, signTime, func(so *v4.SignerOptions) {
		so.DisableURIPathEscaping = isS3(o.service)
	})
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func do(t testing.TB, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// chunkedUpload builds an aws-chunked PUT signed by creds' chain.
func chunkedUpload(t testing.TB, base string, creds AWSCreds, chunks [][]byte, trailer bool) *http.Request {
	t.Helper()
	var decoded int
	for _, c := range chunks {
		decoded += len(c)
	}
	mode := streamingSigned
	if trailer {
		mode = streamingSignedTrailer
	}
	trailerLine := "x-amz-checksum-crc32:AAAAAA=="
	build := func(seed []byte) []byte {
		var b bytes.Buffer
		ss := v4.NewStreamSigner(creds.Credentials(), "s3", region, seed)
		prev := seed
		for _, c := range slices.Concat(chunks, [][]byte{nil}) {
			sig := make([]byte, 32)
			if seed != nil {
				sig, _ = ss.GetSignature(context.Background(), nil, c, signTime)
			}
			prev = sig
			fmt.Fprintf(&b, "%x;chunk-signature=%x\r\n", len(c), sig)
			b.Write(c)
			if len(c) > 0 {
				b.WriteString("\r\n")
			}
		}
		if trailer {
			b.WriteString(trailerLine + "\r\n")
			ts := strings.Repeat("0", 64)
			if seed != nil {
				ts = trailerSignature(creds, "s3", signTime, prev, trailerLine+"\n")
			}
			b.WriteString("x-amz-trailer-signature:" + ts + "\r\n")
		}
		b.WriteString("\r\n")
		return b.Bytes()
	}
	req, err := http.NewRequest("PUT", base+"/bucket/chunked%20upload.bin", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(build(nil)))
	req.Header.Set("Content-Encoding", "aws-chunked")
	req.Header.Set("X-Amz-Decoded-Content-Length", strconv.Itoa(decoded))
	req.Header.Set("X-Amz-Content-Sha256", mode)
	if trailer {
		req.Header.Set("X-Amz-Trailer", "x-amz-checksum-crc32")
	}
	err = v4.NewSigner().SignHTTP(context.Background(), creds.Credentials(), req, mode, "s3", region, signTime, func(o *v4.SignerOptions) {
		o.DisableURIPathEscaping = true
	})
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndex(req.Header.Get("Authorization"), "Signature=")
	seed, _ := hex.DecodeString(req.Header.Get("Authorization")[i+len("Signature="):])
	body := build(seed)
	if int64(len(body)) != req.ContentLength {
		t.Fatalf("chunked body length %d, want %d", len(body), req.ContentLength)
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return req
}
