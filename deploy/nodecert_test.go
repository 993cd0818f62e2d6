package deploy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
)

// TestNodeCertScript runs the DaemonSet's init container script (with
// its two directories moved to a temp dir) and checks what the controller
// relies on: a certificate for the node's address that verifies against
// the node CA, with its key, private to its owner.
func TestNodeCertScript(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl here (the node image has it)")
	}
	var script string
	for _, obj := range manifests(t) {
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			for _, c := range ds.Spec.Template.Spec.InitContainers {
				if c.Name == "node-cert" {
					script = c.Args[0]
				}
			}
		}
	}
	if script == "" {
		t.Fatal("no node-cert init container")
	}
	dir := t.TempDir()
	tlsDir, caDir := filepath.Join(dir, "tls"), filepath.Join(dir, "ca")
	for _, d := range []string{tlsDir, caDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// The node CA, as the guide's openssl command makes it.
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cagebox-node-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(caKey)
	_ = os.WriteFile(filepath.Join(caDir, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o444)
	_ = os.WriteFile(filepath.Join(caDir, "ca.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o400)

	script = strings.ReplaceAll(script, "/run/cagebox/tls", tlsDir)
	script = strings.ReplaceAll(script, "/etc/cagebox/node-ca", caDir)
	cmd := exec.Command("/bin/sh", "-ec", script)
	cmd.Env = append(os.Environ(), "NODE_NAME=worker-7", "HOST_IP=10.1.2.3")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("script: %v\n%s", err, out)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(tlsDir, "tls.crt"), filepath.Join(tlsDir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("node certificate does not verify against the node CA: %v", err)
	}
	if err := leaf.VerifyHostname("10.1.2.3"); err != nil {
		t.Errorf("not for the node's address: %v", err)
	}
	if err := leaf.VerifyHostname("10.1.2.4"); err == nil {
		t.Error("valid for another address")
	}
	if len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.ParseIP("10.1.2.3")) || leaf.NotAfter.Before(time.Now().Add(300*24*time.Hour)) {
		t.Errorf("IPs %v, not after %v", leaf.IPAddresses, leaf.NotAfter)
	}
	fi, err := os.Stat(filepath.Join(tlsDir, "tls.key"))
	if err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("tls.key mode %v, %v: want private to its owner", fi.Mode(), err)
	}
	left, _ := filepath.Glob(filepath.Join(tlsDir, "*"))
	if len(left) != 2 {
		t.Errorf("left behind: %v", left)
	}
}
