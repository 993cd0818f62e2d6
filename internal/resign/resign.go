// Package resign verifies requests that a sandbox signed with placeholder
// credentials and signs them again with the real ones, so that a signing
// credential (AWS SigV4, a webhook-style HMAC) never has to enter the guest.
//
// The guest holds a placeholder key and signs normally. On the host the
// credential pipeline (package credentials) calls Resign: the request's
// signature is recomputed with the placeholder secret (a request altered
// after signing is refused with ErrBadSignature), then the request is
// signed with the real secret keeping everything else the guest signed
// (date, region, service, signed headers).
//
// Because the guest knows the placeholder secret it can sign anything it
// likes: verification proves the request is intact, not that it is allowed.
// Which hosts, services and regions may see the real key is for policy to
// decide before Resign is called.
package resign

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
)

// Kinds of error returned by Resign. Error strings never contain a secret,
// a signature or a key id.
var (
	// ErrNotSigned: the request carries no signature of the kind the
	// re-signer handles; the caller decides whether to forward it as is.
	ErrNotSigned = errors.New("request is not signed")
	// ErrBadSignature: the signature does not verify with the placeholder
	// credentials (the request was altered after signing, or was signed with
	// another key). The request must be refused.
	ErrBadSignature = errors.New("signature does not verify")
	// ErrUnsupported: the request uses a signing variant the re-signer cannot
	// handle; the message says what to change.
	ErrUnsupported = errors.New("unsupported signing variant")
	// ErrBodyTooLarge (with ErrUnsupported): verifying the signature needs
	// the whole body in memory and the body is over the limit.
	ErrBodyTooLarge = errors.New("body too large to verify")
)

// Reporter hears a real-key output a re-signer put into a request and
// what the guest had sent in its place (its own signature, its key id; ""
// when the guest sent nothing there). It must keep the value in memory for
// the request only and never log it.
type Reporter func(real, guest string)

func (r Reporter) report(real, guest string) {
	if r != nil && real != "" {
		r(real, guest)
	}
}

// DefaultMaxBody bounds how much of a body is read into memory when
// verifying a signature needs the whole body first: an HMAC over the body,
// or a SigV4 request whose payload hash is not declared in
// X-Amz-Content-Sha256 (non-S3 services). A declared payload hash is
// checked as the body streams, with no such bound.
const DefaultMaxBody = 16 << 20

const redacted = "REDACTED"

// readBody reads r's body up to max bytes and puts a replayable copy back on
// r (Body and GetBody). A body larger than max is left readable in full and
// reported as ErrUnsupported.
func readBody(r *http.Request, max int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > max {
		return nil, fmt.Errorf("%w: %w: the signature covers a %d-byte body, over the %d-byte limit for verification; use UNSIGNED-PAYLOAD, send X-Amz-Content-Sha256, or a smaller request", ErrUnsupported, ErrBodyTooLarge, r.ContentLength, max)
	}
	orig := r.Body
	buf, err := io.ReadAll(io.LimitReader(orig, max+1))
	if int64(len(buf)) > max {
		r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), orig), orig}
		return nil, fmt.Errorf("%w: %w: the signature covers a body over the %d-byte limit for verification; use UNSIGNED-PAYLOAD, send X-Amz-Content-Sha256, or a smaller request", ErrUnsupported, ErrBodyTooLarge, max)
	}
	if err != nil {
		r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), orig), orig}
		return nil, fmt.Errorf("read request body: %w", err)
	}
	r.Body = readCloser{bytes.NewReader(buf), orig}
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	return buf, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// wirePath is the request path exactly as the guest sent it: the path part of
// RequestURI for a request read by a server, else what an http.Transport
// would send for r.URL. This is what the guest signed.
func wirePath(r *http.Request) string {
	if uri := r.RequestURI; uri != "" && uri != "*" {
		if i := strings.IndexByte(uri, '?'); i >= 0 {
			uri = uri[:i]
		}
		if !strings.HasPrefix(uri, "/") { // absolute-form: scheme://authority/path
			if i := strings.Index(uri, "://"); i >= 0 {
				uri = uri[i+3:]
				if j := strings.IndexByte(uri, '/'); j >= 0 {
					uri = uri[j:]
				} else {
					uri = ""
				}
			}
		}
		if uri == "" {
			uri = "/"
		}
		return uri
	}
	return forwardPath(r)
}

// forwardPath is the path an http.Transport sends for r.URL (Opaque when set,
// else EscapedPath), i.e. what the upstream will see when the gateway forwards
// r.URL unchanged. The new signature covers this path.
func forwardPath(r *http.Request) string {
	u := r.URL
	p := ""
	if u.Opaque != "" {
		// Same rule as the SDK signer and net/http: "//host/path" or "/path".
		o := u.Opaque
		if i := strings.IndexByte(o, '?'); i >= 0 {
			o = o[:i]
		}
		o = strings.TrimPrefix(o, "//")
		if strings.HasPrefix(u.Opaque, "//") {
			if i := strings.IndexByte(o, '/'); i >= 0 {
				p = o[i:]
			}
		} else {
			p = o
		}
	} else {
		p = u.EscapedPath()
	}
	if p == "" {
		p = "/"
	}
	return p
}

// hostOf is the Host the request carries (the signed "host" header).
func hostOf(r *http.Request) string {
	if r.Host != "" {
		return r.Host
	}
	return r.URL.Host
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

// String, GoString and LogValue keep secrets out of logs and %v.
func (c AWSCreds) String() string   { return "AWSCreds{" + redacted + "}" }
func (c AWSCreds) GoString() string { return c.String() }

// LogValue implements slog.LogValuer.
func (c AWSCreds) LogValue() slog.Value { return slog.StringValue(redacted) }

// String keeps secrets out of %v.
func (s *SigV4) String() string { return "resign.SigV4{" + redacted + "}" }

// LogValue implements slog.LogValuer.
func (s *SigV4) LogValue() slog.Value { return slog.StringValue(redacted) }

// String keeps secrets out of %v.
func (h *HMAC) String() string {
	return fmt.Sprintf("resign.HMAC{%s %s %s}", h.Algorithm, h.Header, redacted)
}

// LogValue implements slog.LogValuer.
func (h *HMAC) LogValue() slog.Value { return slog.StringValue(h.String()) }
