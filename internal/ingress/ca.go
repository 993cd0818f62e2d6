package ingress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// CA file names under the directory given to LoadOrCreateCA.
const (
	caCertFile = "ca.pem"
	caKeyFile  = "ca.key"
)

// CAPath is the certificate clients trust (curl --cacert) when the daemon
// makes its own ingress certificate.
func CAPath(dir string) string { return filepath.Join(dir, caCertFile) }

// SelfSigned loads (or makes, at first start) the daemon's ingress CA
// under dir and returns a TLS config serving a fresh certificate for
// DOMAIN and *.DOMAIN signed by it. For tests and single-host setups;
// production passes --ingress-cert/--ingress-key.
func SelfSigned(dir, domain string) (*tls.Config, error) {
	ca, key, err := loadOrCreateCA(dir)
	if err != nil {
		return nil, fmt.Errorf("ingress ca: %w", err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ingress certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("ingress certificate: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: domain, Organization: []string{"cagebox ingress"}},
		DNSNames:  []string{domain, "*." + domain},
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(90 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &leafKey.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("ingress certificate: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der, ca.Raw}, PrivateKey: leafKey}},
	}, nil
}

// FromFiles is the TLS config of --ingress-cert/--ingress-key.
func FromFiles(certFile, keyFile string) (*tls.Config, error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--ingress-cert/--ingress-key: %w", err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{c}}, nil
}

func loadOrCreateCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, cerr := os.ReadFile(filepath.Join(dir, caCertFile))
	kb, kerr := os.ReadFile(filepath.Join(dir, caKeyFile))
	if cerr == nil && kerr == nil {
		cp, _ := pem.Decode(cb)
		kp, _ := pem.Decode(kb)
		if cp == nil || kp == nil {
			return nil, nil, fmt.Errorf("%s: not PEM: remove %s and %s to make a new CA", dir, caCertFile, caKeyFile)
		}
		cert, err := x509.ParseCertificate(cp.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("parse %s: %w", caCertFile, err)
		}
		key, err := x509.ParseECPrivateKey(kp.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("parse %s: %w", caKeyFile, err)
		}
		return cert, key, nil
	}
	if !errors.Is(cerr, os.ErrNotExist) && cerr != nil {
		return nil, nil, cerr
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "cagebox ingress CA", Organization: []string{"cagebox"}},
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
		MaxPathLen: 0, MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, caKeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, caCertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// LoadOrCreateKey returns the signing key for signed URLs, made (32 random
// bytes, 0600) at first start.
func LoadOrCreateKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil && len(b) == 32 {
		return b, nil
	}
	if err == nil {
		return nil, fmt.Errorf("%s: want 32 bytes, found %d: remove it to make a new key (every signed URL is revoked)", path, len(b))
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	b = make([]byte, 32)
	_, _ = rand.Read(b)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, err
	}
	return b, nil
}
