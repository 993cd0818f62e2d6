package ingress

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Header and parameter names of the access check.
const (
	// AccessHeader carries a port's access token.
	AccessHeader = "X-Cagebox-Access"
	// SigParam is the query parameter of a signed URL; it is removed
	// before the request reaches the guest.
	SigParam = "cbx_sig"
	// CookieName holds a signature after a signed URL was visited (so the
	// page's own links and assets work); removed before the guest.
	CookieName = "cbx_access"
	// tokenPrefix marks cagebox port tokens (for secret scanners).
	tokenPrefix = "cbp_"
)

// Errors of the access check.
var (
	// ErrNoAccess: no token or signature, or a wrong one (401).
	ErrNoAccess = errors.New("access token or signed URL required")
	// ErrExpired: a valid signature past its expiry (403).
	ErrExpired = errors.New("signed URL expired")
)

// NewToken makes a port access token: "cbp_" and 32 random bytes.
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// HashToken is how a token is stored. Tokens are 32 random bytes, so a
// fast hash is enough (no dictionary to guess from).
func HashToken(tok string) []byte {
	h := sha256.Sum256([]byte(tok))
	return h[:]
}

// CheckToken compares a presented token with the stored hash in constant
// time.
func CheckToken(presented string, hash []byte) bool {
	if presented == "" || len(hash) != sha256.Size {
		return false
	}
	return subtle.ConstantTimeCompare(HashToken(presented), hash) == 1
}

// Signer makes and checks signed URLs under the daemon's key.
type Signer struct {
	Key []byte
	Now func() time.Time
}

func (s *Signer) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// mac binds a signature to the sandbox, the port, the expiry and the
// port's token hash: a new token (rotation) invalidates every signature
// made before it.
func (s *Signer) mac(id string, port uint16, exp int64, tokenHash []byte) []byte {
	h := hmac.New(sha256.New, s.Key)
	var b [10]byte
	binary.BigEndian.PutUint16(b[:2], port)
	binary.BigEndian.PutUint64(b[2:], uint64(exp))
	h.Write([]byte("cagebox-ingress-v1\x00" + id + "\x00"))
	h.Write(b[:])
	h.Write(tokenHash)
	return h.Sum(nil)
}

// Sign returns the value of SigParam for a URL valid until exp.
func (s *Signer) Sign(id string, port uint16, exp time.Time, tokenHash []byte) string {
	e := exp.Unix()
	return strconv.FormatInt(e, 10) + "." + base64.RawURLEncoding.EncodeToString(s.mac(id, port, e, tokenHash))
}

// Verify checks a signature: ErrNoAccess if it is malformed or forged,
// ErrExpired if it is genuine but past its expiry. The expiry is checked
// after the MAC, so a forged signature never learns whether its time was
// right.
func (s *Signer) Verify(sig, id string, port uint16, tokenHash []byte) (time.Time, error) {
	es, ms, ok := strings.Cut(sig, ".")
	if !ok {
		return time.Time{}, ErrNoAccess
	}
	e, err := strconv.ParseInt(es, 10, 64)
	if err != nil || e <= 0 {
		return time.Time{}, ErrNoAccess
	}
	got, err := base64.RawURLEncoding.DecodeString(ms)
	if err != nil || !hmac.Equal(got, s.mac(id, port, e, tokenHash)) {
		return time.Time{}, ErrNoAccess
	}
	exp := time.Unix(e, 0)
	if !s.now().Before(exp) {
		return exp, ErrExpired
	}
	return exp, nil
}
