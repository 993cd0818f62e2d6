package resign

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"hash"
	"net/http"
	"slices"
	"strings"
)

// HMAC re-signs requests carrying a keyed-hash signature in one header, as
// webhook and many vendor APIs do: signature = Prefix + Encoding(HMAC(key,
// canonical string)), where the canonical string joins the configured parts
// with "\n". It is configured per secret binding and is safe for concurrent
// use.
type HMAC struct {
	Algorithm string // "sha256" | "sha1" | "sha512"
	Header    string // header carrying the signature, e.g. "X-Signature"
	Prefix    string // e.g. "sha256=", prepended to the encoded signature
	Encoding  string // "hex" | "base64" | "base64url"
	// Canonical lists the parts joined by "\n": "method", "path" (as sent,
	// percent-encoded), "query" (raw, as sent), "header:<Name>"
	// (e.g. "header:X-Timestamp"; "header:Host" is the request's host),
	// "body".
	Canonical         []string
	Placeholder, Real []byte
	// MaxBody bounds the body read for a "body" part; 0 means
	// DefaultMaxBody.
	MaxBody int64
	// Report, when set, hears the real signature Resign puts in (prefix
	// and encoding included) with the guest's signature it replaced.
	Report Reporter
}

// Validate checks the configuration (not the keys) and says what to fix.
func (h *HMAC) Validate() error {
	if _, err := h.hashFunc(); err != nil {
		return err
	}
	if _, err := h.decode(""); err != nil {
		return err
	}
	if h.Header == "" || strings.ContainsAny(h.Header, " \t\r\n:") {
		return unsupported("hmac: header %q: name the header that carries the signature, e.g. X-Signature", h.Header)
	}
	if strings.ContainsAny(h.Prefix, "\r\n") {
		return unsupported("hmac: the prefix must be one line")
	}
	if len(h.Canonical) == 0 {
		return unsupported("hmac: no canonical parts configured (e.g. method, path, query, header:X-Timestamp, body)")
	}
	for _, p := range h.Canonical {
		switch {
		case p == "method", p == "path", p == "query", p == "body":
		case strings.HasPrefix(p, "header:") && len(p) > len("header:"):
		default:
			return unsupported("hmac: unknown canonical part %q (want method, path, query, header:NAME or body)", p)
		}
	}
	if h.MaxBody < 0 {
		return unsupported("hmac: negative body limit")
	}
	return nil
}

// Resign verifies r's signature header with Placeholder and replaces it by
// the signature with Real. ErrNotSigned: the header is absent.
// ErrBadSignature: it does not verify. ErrUnsupported: the configuration is
// invalid or the body is over the limit. r is changed only on success
// (except that a body read is put back as a replayable reader).
func (h *HMAC) Resign(r *http.Request) error {
	verifyMsg, err := h.verify(r)
	if err != nil {
		return err
	}
	if len(h.Real) == 0 {
		return unsupported("hmac: no real secret is configured for this binding")
	}
	newHash, _ := h.hashFunc()
	signMsg := verifyMsg
	if fp := forwardPath(r); fp != wirePath(r) && slices.Contains(h.Canonical, "path") {
		if signMsg, err = h.canonical(r, fp); err != nil {
			return err
		}
	}
	m := hmac.New(newHash, h.Real)
	m.Write(signMsg)
	guest := strings.TrimPrefix(strings.TrimSpace(r.Header.Get(h.Header)), h.Prefix)
	sig := h.encode(m.Sum(nil))
	h.Report.report(sig, guest)
	r.Header.Set(h.Header, h.Prefix+sig)
	return nil
}

// Verify reports whether r carries a signature made with Placeholder: nil
// if it does, ErrNotSigned if the header is absent, ErrBadSignature if it
// does not verify. r is not changed (a body read is put back).
func (h *HMAC) Verify(r *http.Request) error {
	_, err := h.verify(r)
	return err
}

// verify checks the signature with Placeholder and returns the canonical
// message it covers.
func (h *HMAC) verify(r *http.Request) ([]byte, error) {
	if err := h.Validate(); err != nil {
		return nil, err
	}
	newHash, _ := h.hashFunc()
	vals := r.Header.Values(h.Header)
	if len(vals) == 0 {
		return nil, ErrNotSigned
	}
	if len(vals) > 1 {
		return nil, bad("hmac: several %s headers", h.Header)
	}
	got, ok := strings.CutPrefix(strings.TrimSpace(vals[0]), h.Prefix)
	if !ok {
		return nil, bad("hmac: %s lacks the configured prefix", h.Header)
	}
	sig, err := h.decode(got)
	if err != nil {
		return nil, bad("hmac: %s is not valid %s", h.Header, h.Encoding)
	}
	msg, err := h.canonical(r, wirePath(r))
	if err != nil {
		return nil, err
	}
	m := hmac.New(newHash, h.Placeholder)
	m.Write(msg)
	if len(h.Placeholder) == 0 || !hmac.Equal(m.Sum(nil), sig) {
		return nil, bad("hmac: the request does not match its signature (changed after signing, or signed with another secret)")
	}
	return msg, nil
}

func (h *HMAC) hashFunc() (func() hash.Hash, error) {
	switch strings.ToLower(h.Algorithm) {
	case "sha256", "":
		return sha256.New, nil
	case "sha1":
		return sha1.New, nil
	case "sha512":
		return sha512.New, nil
	}
	return nil, unsupported("hmac: unknown algorithm %q (want sha256, sha1 or sha512)", h.Algorithm)
}

func (h *HMAC) decode(s string) ([]byte, error) {
	switch h.Encoding {
	case "hex", "":
		return hex.DecodeString(s)
	case "base64":
		return base64.StdEncoding.DecodeString(s)
	case "base64url":
		return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
	}
	return nil, unsupported("hmac: unknown encoding %q (want hex, base64 or base64url)", h.Encoding)
}

func (h *HMAC) encode(b []byte) string {
	switch h.Encoding {
	case "base64":
		return base64.StdEncoding.EncodeToString(b)
	case "base64url":
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return hex.EncodeToString(b)
}

// canonical builds the string to sign with path as the path part.
func (h *HMAC) canonical(r *http.Request, path string) ([]byte, error) {
	if len(h.Canonical) == 0 {
		return nil, unsupported("hmac: no canonical parts configured")
	}
	if _, err := h.decode(""); err != nil {
		return nil, err
	}
	var b []byte
	for i, p := range h.Canonical {
		if i > 0 {
			b = append(b, '\n')
		}
		switch {
		case p == "method":
			b = append(b, r.Method...)
		case p == "path":
			b = append(b, path...)
		case p == "query":
			b = append(b, r.URL.RawQuery...)
		case p == "body":
			max := h.MaxBody
			if max <= 0 {
				max = DefaultMaxBody
			}
			body, err := readBody(r, max)
			if err != nil {
				return nil, err
			}
			b = append(b, body...)
		case strings.HasPrefix(p, "header:") && len(p) > len("header:"):
			name := p[len("header:"):]
			if strings.EqualFold(name, "host") {
				b = append(b, hostOf(r)...)
			} else {
				b = append(b, strings.Join(r.Header.Values(name), ",")...)
			}
		default:
			return nil, unsupported("hmac: unknown canonical part %q", p)
		}
	}
	return b, nil
}
