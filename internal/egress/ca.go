package egress

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/internal/hostname"
)

const (
	// DefaultCAValidity is how long a sandbox CA is valid when NewCA is given zero.
	DefaultCAValidity = 7 * 24 * time.Hour
	// leafValidity bounds every minted leaf certificate.
	leafValidity = 24 * time.Hour
	// leafRenewBefore re-mints a cached leaf this long before it expires.
	leafRenewBefore = time.Hour
	// leafCacheSize bounds the per-CA leaf cache.
	leafCacheSize = 1024
	// clockSkew backdates NotBefore so a guest with a slightly slow clock accepts the certificates.
	clockSkew = 5 * time.Minute
)

// CA is a per-sandbox certificate authority. The guest trusts its certificate
// (CertPEM); the proxy mints short-lived leaf certificates from it on demand,
// one per TLS server name, to terminate the sandbox's TLS connections.
type CA struct {
	sandboxID string
	cert      *x509.Certificate
	certPEM   []byte
	key       *ecdsa.PrivateKey
	// leafKey is shared by all leaves of this CA: generating a key per name
	// buys nothing when the only relying party is this sandbox.
	leafKey *ecdsa.PrivateKey

	// mu guards the leaf cache.
	mu     sync.Mutex
	leaves map[string]*list.Element // name → element of lru holding *leafEntry
	lru    *list.List               // front = most recently used
}

type leafEntry struct {
	name     string
	cert     *tls.Certificate
	notAfter time.Time
}

// NewCA creates the certificate authority of one sandbox: ECDSA P-256, named
// "cagebox sandbox <id> CA", valid for validity (DefaultCAValidity if zero).
func NewCA(sandboxID string, validity time.Duration) (*CA, error) {
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ca key: %w", err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate leaf key: %w", err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	name := caNamePrefix + sandboxID + caNameSuffix
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"cagebox"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create ca certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse ca certificate: %w", err)
	}
	return &CA{
		sandboxID: sandboxID,
		cert:      cert,
		certPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:       key,
		leafKey:   leafKey,
		leaves:    make(map[string]*list.Element),
		lru:       list.New(),
	}, nil
}

// CertPEM returns the CA certificate in PEM form: what the guest trusts.
func (c *CA) CertPEM() []byte { return append([]byte(nil), c.certPEM...) }

// Certificate returns the parsed CA certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// leaf returns a certificate for name, minted on first use and cached.
func (c *CA) leaf(name string) (*tls.Certificate, error) {
	name = hostname.Canonical(name)
	if name == "" {
		return nil, errors.New("leaf certificate: empty name")
	}
	now := time.Now()
	c.mu.Lock()
	if el, ok := c.leaves[name]; ok {
		e := el.Value.(*leafEntry)
		// Fresh enough, or as fresh as this CA can make it.
		fresh := now.Add(leafRenewBefore).Before(e.notAfter) ||
			(now.Before(e.notAfter) && e.notAfter.Equal(c.cert.NotAfter))
		if fresh {
			c.lru.MoveToFront(el)
			c.mu.Unlock()
			return e.cert, nil
		}
	}
	c.mu.Unlock()

	// Mint outside the lock; a concurrent duplicate is harmless.
	e, err := c.mint(name, now)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.leaves[name]; ok {
		el.Value = e
		c.lru.MoveToFront(el)
	} else {
		c.leaves[name] = c.lru.PushFront(e)
		for c.lru.Len() > leafCacheSize {
			old := c.lru.Back()
			c.lru.Remove(old)
			delete(c.leaves, old.Value.(*leafEntry).name)
		}
	}
	return e.cert, nil
}

func (c *CA) mint(name string, now time.Time) (*leafEntry, error) {
	if !now.Before(c.cert.NotAfter) {
		return nil, fmt.Errorf("leaf certificate for %q: sandbox ca expired", name)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	notBefore := now.Add(-clockSkew)
	if notBefore.Before(c.cert.NotBefore) {
		notBefore = c.cert.NotBefore
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("leaf certificate for %q: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("leaf certificate for %q: %w", name, err)
	}
	return &leafEntry{
		name:     name,
		cert:     &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: c.leafKey, Leaf: leaf},
		notAfter: notAfter,
	}, nil
}

func randSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}
	return serial, nil
}

const caNamePrefix, caNameSuffix = "cagebox sandbox ", " CA"

// MarshalPEM returns the CA certificate and its private key in PEM form, for
// the daemon to keep the CA across restarts. The result is a secret: store it
// with 0600 permissions and never log it.
func (c *CA) MarshalPEM() ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(c.key)
	if err != nil {
		return nil, fmt.Errorf("marshal ca key: %w", err)
	}
	out := append([]byte(nil), c.certPEM...)
	return append(out, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})...), nil
}

// LoadCA restores a CA saved with MarshalPEM. The sandbox ID comes from the
// certificate's name; leaf certificates are minted afresh.
func LoadCA(data []byte) (*CA, error) {
	var cert *x509.Certificate
	var key *ecdsa.PrivateKey
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		var err error
		switch block.Type {
		case "CERTIFICATE":
			if cert, err = x509.ParseCertificate(block.Bytes); err != nil {
				return nil, fmt.Errorf("load ca: certificate: %w", err)
			}
		case "EC PRIVATE KEY":
			if key, err = x509.ParseECPrivateKey(block.Bytes); err != nil {
				return nil, fmt.Errorf("load ca: key: %w", err)
			}
		}
	}
	if cert == nil || key == nil {
		return nil, errors.New("load ca: want a certificate and an EC private key")
	}
	if !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("load ca: key does not match the CA certificate")
	}
	cn := cert.Subject.CommonName
	if !strings.HasPrefix(cn, caNamePrefix) || !strings.HasSuffix(cn, caNameSuffix) {
		return nil, fmt.Errorf("load ca: %q is not a cagebox sandbox CA", cn)
	}
	if !time.Now().Before(cert.NotAfter) {
		return nil, fmt.Errorf("load ca: expired at %s", cert.NotAfter.Format(time.RFC3339))
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate leaf key: %w", err)
	}
	return &CA{
		sandboxID: strings.TrimSuffix(strings.TrimPrefix(cn, caNamePrefix), caNameSuffix),
		cert:      cert,
		certPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
		key:       key,
		leafKey:   leafKey,
		leaves:    make(map[string]*list.Element),
		lru:       list.New(),
	}, nil
}

// LogValue keeps the key out of logs.
func (c *CA) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("name", c.cert.Subject.CommonName),
		slog.Time("not_after", c.cert.NotAfter),
		slog.String("key", "REDACTED"),
	)
}
