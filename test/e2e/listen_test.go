package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// writeServerCert makes a CA and a server certificate it issues for
// 127.0.0.1 and localhost, and writes the CA certificate, the server
// certificate and its key as PEM files.
func writeServerCert(t *testing.T) (caFile, certFile, keyFile string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, key := newKey(), newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cagebox e2e test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "cagebox daemon"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", kder)
}

// TestTenantKeyOverHTTPS: a daemon given a certificate serves its TCP API
// over HTTPS; a tenant's key works there — Go client and CLI, with the
// test's CA given as a file or in CAGEBOX_CA_CERT — and every client that
// does not trust that CA, or speaks plain HTTP, gets nothing.
func TestTenantKeyOverHTTPS(t *testing.T) {
	ca, cert, key := writeServerCert(t)
	e := newEnv(t)
	addr := freePort(t)
	e.startDaemon("--listen", addr, "--tls-cert", cert, "--tls-key", key)
	ctx := context.Background()
	admin := e.client()
	if _, err := admin.CreateTenant(ctx, &api.CreateTenantRequest{Name: "secure"}); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateKey(ctx, "secure")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + addr

	c, err := client.NewTCP(url, k.Key, client.Options{CACertFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, &api.CreateSandboxRequest{})
	if err != nil {
		t.Fatalf("create over HTTPS: %v", err)
	}
	var out strings.Builder
	res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Argv: []string{"echo", "over tls"}}, nil, &out, &out)
	if err != nil || *res.ExitCode != 0 || out.String() != "over tls\n" {
		t.Fatalf("exec over HTTPS: %q %+v %v", out.String(), res, err)
	}
	if sb.Tenant != "secure" {
		t.Errorf("sandbox tenant %q", sb.Tenant)
	}

	// Without the CA: the system roots do not know it.
	untrusting, err := client.NewTCP(url, k.Key, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := untrusting.List(ctx); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("without the CA: %v, want a certificate error", err)
	}
	// Plain HTTP to the HTTPS port.
	if _, err := client.TCP("http://"+addr, k.Key).List(ctx); err == nil {
		t.Error("plain HTTP to the HTTPS listener worked")
	}

	// The CLI: --ca-cert, then CAGEBOX_CA_CERT, then neither.
	t.Setenv("CAGEBOX_API_KEY", k.Key)
	if r := e.cli("", "--host", url, "--ca-cert", ca, "ls"); r.code != 0 || !strings.Contains(r.stdout, sb.ID) {
		t.Errorf("cli --ca-cert: %+v", r)
	}
	t.Setenv("CAGEBOX_CA_CERT", ca)
	if r := e.cli("", "--host", url, "ls"); r.code != 0 || !strings.Contains(r.stdout, sb.ID) {
		t.Errorf("cli CAGEBOX_CA_CERT: %+v", r)
	}
	os.Unsetenv("CAGEBOX_CA_CERT")
	if r := e.cli("", "--host", url, "ls"); r.code == 0 || !strings.Contains(r.stderr, "certificate") {
		t.Errorf("cli without the CA: %+v", r)
	}
	if err := c.Remove(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// TestListenRefusesPlainHTTP: `cagebox daemon --listen` on a non-loopback
// address without a certificate exits at once, saying what to do, and
// leaves no home behind.
func TestListenRefusesPlainHTTP(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", "192.0.2.10:7070"} {
		home := filepath.Join(t.TempDir(), "home")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "cagebox"), "--home", home, "daemon",
			"--agent", filepath.Join(binDir, "cagebox-agent"), "--listen", addr)
		out, err := cmd.CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil || timedOut {
			t.Fatalf("--listen %s: %v (%s)", addr, err, out)
		}
		for _, want := range []string{"refusing to serve the API in plain HTTP", "--tls-cert FILE --tls-key FILE", "--insecure-listen"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("--listen %s: output %q does not say %q", addr, out, want)
			}
		}
		if _, err := os.Stat(home); !os.IsNotExist(err) {
			t.Errorf("--listen %s: home made: %v", addr, err)
		}
	}
}
