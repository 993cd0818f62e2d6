package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestCA(t *testing.T) {
	ca, err := NewCA("sb-1", 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(ca.CertPEM())
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatal("CertPEM is not a PEM certificate")
	}
	root, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if root.Subject.CommonName != "cagebox sandbox sb-1 CA" || !root.IsCA || !root.MaxPathLenZero {
		t.Errorf("root %+v", root.Subject)
	}
	if pk, ok := root.PublicKey.(*ecdsa.PublicKey); !ok || pk.Curve != elliptic.P256() {
		t.Errorf("root key %T", root.PublicKey)
	}
	if d := time.Until(root.NotAfter); d > 48*time.Hour || d < 47*time.Hour {
		t.Errorf("root valid for %v", d)
	}
	pool := x509.NewCertPool()
	pool.AddCert(root)

	leaf, err := ca.leaf("API.Example.test.")
	if err != nil {
		t.Fatal(err)
	}
	l := leaf.Leaf
	if _, err := l.Verify(x509.VerifyOptions{Roots: pool, DNSName: "api.example.test"}); err != nil {
		t.Errorf("leaf does not verify: %v", err)
	}
	if len(l.DNSNames) != 1 || l.DNSNames[0] != "api.example.test" {
		t.Errorf("SAN %v", l.DNSNames)
	}
	if d := l.NotAfter.Sub(time.Now()); d > 24*time.Hour {
		t.Errorf("leaf valid for %v (> 24h)", d)
	}
	again, _ := ca.leaf("api.example.test")
	if again != leaf {
		t.Error("leaf not cached")
	}
	// Another sandbox's CA does not vouch for this one's leaves.
	other, _ := NewCA("sb-2", time.Hour)
	op := x509.NewCertPool()
	op.AddCert(other.Certificate())
	if _, err := l.Verify(x509.VerifyOptions{Roots: op, DNSName: "api.example.test"}); err == nil {
		t.Error("leaf verifies under another sandbox's CA")
	}
	// A short-lived CA bounds its leaves.
	short, _ := NewCA("sb-3", time.Hour)
	sl, _ := short.leaf("x.test")
	if sl.Leaf.NotAfter.After(short.Certificate().NotAfter) {
		t.Error("leaf outlives its CA")
	}
	if _, err := ca.leaf(""); err == nil {
		t.Error("empty name minted")
	}
}

func TestCALeafCacheBounded(t *testing.T) {
	ca, err := NewCA("sb-lru", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for i := range leafCacheSize + 10 {
		if _, err := ca.leaf(fmt.Sprintf("h%d.test", i)); err != nil {
			t.Fatal(err)
		}
	}
	ca.mu.Lock()
	n, m := ca.lru.Len(), len(ca.leaves)
	_, oldest := ca.leaves["h0.test"]
	ca.mu.Unlock()
	if n != leafCacheSize || m != leafCacheSize || oldest {
		t.Errorf("cache holds %d/%d entries (oldest present: %v), want %d", n, m, oldest, leafCacheSize)
	}
}

func TestCAMarshalLoad(t *testing.T) {
	ca, err := NewCA("sb-persist", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	data, err := ca.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	back, err := LoadCA(data)
	if err != nil {
		t.Fatal(err)
	}
	if back.sandboxID != "sb-persist" || string(back.CertPEM()) != string(ca.CertPEM()) {
		t.Errorf("loaded CA %q differs", back.sandboxID)
	}
	// Leaves minted by the loaded CA verify under the original certificate.
	leaf, err := back.leaf("api.example.test")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "api.example.test"}); err != nil {
		t.Errorf("leaf from loaded CA: %v", err)
	}
	// A key that does not match is refused.
	other, _ := NewCA("sb-other", time.Hour)
	otherPEM, _ := other.MarshalPEM()
	mixed := append(ca.CertPEM(), otherPEM[len(other.CertPEM()):]...)
	if _, err := LoadCA(mixed); err == nil {
		t.Error("mismatched key loaded")
	}
	if _, err := LoadCA(ca.CertPEM()); err == nil {
		t.Error("certificate without key loaded")
	}
	if s := fmt.Sprint(slogValue(ca)); strings.Contains(s, "PRIVATE") {
		t.Errorf("log value leaks the key: %s", s)
	}
}

func slogValue(ca *CA) string { return ca.LogValue().String() }
