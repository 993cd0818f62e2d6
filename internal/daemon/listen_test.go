package daemon

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeTestCert writes a self-signed certificate for 127.0.0.1 and
// localhost, valid until notAfter, and its key; it returns their paths.
func writeTestCert(t *testing.T, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cagebox test"},
		NotBefore: notAfter.Add(-48 * time.Hour), NotAfter: notAfter,
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestDaemonListenRefusals starts the daemon (Run) with each --listen
// (and --e2b-listen, which follows the same rules) setting. Plain HTTP on anything but loopback is refused before anything
// is made (not even the home directory), with a message saying what to do;
// loopback, HTTPS and --insecure-listen get past the listener (to the
// missing agent binary, which stops these daemons).
func TestDaemonListenRefusals(t *testing.T) {
	cert, key := writeTestCert(t, time.Now().Add(24*time.Hour))
	oldCert, oldKey := writeTestCert(t, time.Now().Add(-24*time.Hour))
	const passed = "cagebox-agent binary" // the first check after the listener
	for _, tc := range []struct {
		name      string
		cfg       Config
		want      []string // in the error
		plain     bool     // errors.Is ErrPlainListen
		warn      bool     // a loud warning is logged
		needsIPv6 bool
	}{
		{name: "all IPv4 addresses", cfg: Config{Listen: "0.0.0.0:0"}, plain: true,
			want: []string{"0.0.0.0:0", "every address of the host", "plain HTTP", "--tls-cert FILE --tls-key FILE", "127.0.0.1", "--insecure-listen"}},
		{name: "all addresses", cfg: Config{Listen: "[::]:0"}, plain: true, want: []string{"[::]:0", "every address of the host"}},
		{name: "empty host", cfg: Config{Listen: ":7070"}, plain: true, want: []string{"every address of the host"}},
		{name: "non-loopback address", cfg: Config{Listen: "192.0.2.10:7070"}, plain: true, want: []string{"192.0.2.10:7070", "a non-loopback address"}},
		{name: "non-loopback IPv6", cfg: Config{Listen: "[2001:db8::1]:7070"}, plain: true, want: []string{"a non-loopback address"}},
		{name: "loopback", cfg: Config{Listen: "127.0.0.1:0"}, want: []string{passed}},
		{name: "other loopback", cfg: Config{Listen: "127.0.0.2:0"}, want: []string{passed}},
		{name: "IPv6 loopback", cfg: Config{Listen: "[::1]:0"}, want: []string{passed}, needsIPv6: true},
		{name: "localhost", cfg: Config{Listen: "localhost:0"}, want: []string{passed}},
		{name: "insecure", cfg: Config{Listen: "0.0.0.0:0", InsecureListen: true}, want: []string{passed}, warn: true},
		{name: "https everywhere", cfg: Config{Listen: "0.0.0.0:0", TLSCert: cert, TLSKey: key}, want: []string{passed}},
		{name: "https loopback", cfg: Config{Listen: "127.0.0.1:0", TLSCert: cert, TLSKey: key}, want: []string{passed}},
		{name: "cert without key", cfg: Config{Listen: "0.0.0.0:0", TLSCert: cert}, want: []string{"--tls-cert and --tls-key go together"}},
		{name: "https and insecure", cfg: Config{Listen: "0.0.0.0:0", TLSCert: cert, TLSKey: key, InsecureListen: true}, want: []string{"drop one"}},
		{name: "tls without listen", cfg: Config{TLSCert: cert, TLSKey: key}, want: []string{"give --listen"}},
		{name: "cert and key swapped", cfg: Config{Listen: "0.0.0.0:0", TLSCert: key, TLSKey: cert}, want: []string{"--tls-cert " + key}},
		{name: "missing cert", cfg: Config{Listen: "0.0.0.0:0", TLSCert: "/nonexistent.pem", TLSKey: key}, want: []string{"/nonexistent.pem"}},
		{name: "expired cert", cfg: Config{Listen: "0.0.0.0:0", TLSCert: oldCert, TLSKey: oldKey}, want: []string{"expired"}},
		{name: "bad address", cfg: Config{Listen: "7070"}, want: []string{"HOST:PORT"}},
		{name: "e2b front off loopback", cfg: Config{E2B: E2BConfig{Listen: "0.0.0.0:0"}}, plain: true, want: []string{"--e2b-listen 0.0.0.0:0", "every address of the host"}},
		{name: "e2b front on loopback", cfg: Config{E2B: E2BConfig{Listen: "127.0.0.1:0"}}, want: []string{passed}},
		{name: "e2b front over https", cfg: Config{E2B: E2BConfig{Listen: "0.0.0.0:0"}, TLSCert: cert, TLSKey: key}, want: []string{passed}},
		{name: "e2b front, bad address", cfg: Config{E2B: E2BConfig{Listen: "3000"}}, want: []string{"--e2b-listen", "HOST:PORT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needsIPv6 {
				if l, err := net.Listen("tcp", "[::1]:0"); err != nil {
					t.Skip("no IPv6 loopback here")
				} else {
					l.Close()
				}
			}
			var logBuf bytes.Buffer
			cfg := tc.cfg
			cfg.Home = filepath.Join(t.TempDir(), "home")
			cfg.AgentPath = filepath.Join(t.TempDir(), "no-agent")
			cfg.Logger = slog.New(slog.NewTextHandler(&logBuf, nil))
			err := Run(context.Background(), cfg)
			if err == nil {
				t.Fatal("Run returned nil")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if errors.Is(err, ErrPlainListen) != tc.plain {
				t.Errorf("errors.Is(%v, ErrPlainListen) = %v", err, !tc.plain)
			}
			if !strings.Contains(err.Error(), passed) {
				if _, serr := os.Stat(cfg.Home); !errors.Is(serr, os.ErrNotExist) {
					t.Errorf("refused start made its home: %v", serr)
				}
			}
			if got := strings.Contains(logBuf.String(), "level=WARN msg=\"INSECURE: the API is served in plain HTTP"); got != tc.warn {
				t.Errorf("warning logged = %v, want %v; log:\n%s", got, tc.warn, logBuf.String())
			}
		})
	}
}

func TestParseHostAddr(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.7":        "203.0.113.7/32",
		"203.0.113.9/28":     "203.0.113.0/28",
		"2001:db8::7":        "2001:db8::7/128",
		"2001:db8::7/64":     "2001:db8::/64",
		"::ffff:1.2.3.4":     "1.2.3.4/32",
		"":                   "",
		"example.com":        "",
		"fe80::1%eth0":       "",
		"::ffff:1.2.3.4/120": "",
	} {
		p, err := ParseHostAddr(in)
		switch {
		case want == "" && err == nil:
			t.Errorf("ParseHostAddr(%q) = %v, want an error", in, p)
		case want != "" && (err != nil || p != netip.MustParsePrefix(want)):
			t.Errorf("ParseHostAddr(%q) = %v, %v; want %s", in, p, err, want)
		}
	}
}

func TestParseResolve(t *testing.T) {
	k, ap, err := ParseResolve("API.Example.Test.:443=127.0.0.1:8443")
	if err != nil || k != "api.example.test:443" || ap != netip.MustParseAddrPort("127.0.0.1:8443") {
		t.Errorf("got %q %v %v", k, ap, err)
	}
	for _, s := range []string{"api.example.test=127.0.0.1:1", "10.0.0.1:443=127.0.0.1:1", "*.example.test:443=127.0.0.1:1", "\u212Aey.test:443=127.0.0.1:1", "a.test:443=nowhere"} {
		if _, _, err := ParseResolve(s); err == nil {
			t.Errorf("ParseResolve(%q) accepted", s)
		}
	}
}
