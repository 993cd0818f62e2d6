package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// squidCertgen is Debian's squid-openssl certificate helper.
const squidCertgen = "/usr/lib/squid/security_file_certgen"

// squidPeer is a running squid (Debian's squid-openssl) with ssl_bump: an
// explicit proxy that intercepts TLS with its own CA, as the cagebox proxy
// does with a sandbox's.
type squidPeer struct {
	port    int
	caPEM   []byte
	version string
	workers int
	stop    func()
}

// startSquid runs squid from a config written into a directory of its
// own (its port, CA, ssl_db, pid file and cache.log; no disk cache, no
// access log, nothing under /var), forwarding to the loopback upstream as
// benchName with the upstream CA verified (tls_outgoing_options cafile=,
// as the cagebox proxy's UpstreamCAs and mitmproxy's
// ssl_verify_upstream_trusted_ca). It uses as many workers as the machine
// has CPUs, as the Go runtime does for the cagebox proxy.
func startSquid(upAddr netip.AddrPort, upCAPEM []byte, workers int) (*squidPeer, error) {
	squid, err := exec.LookPath("squid")
	if err != nil {
		return nil, fmt.Errorf("squid: %w (scripts/bench.sh installs Debian's squid-openssl)", err)
	}
	if _, err := os.Stat(squidCertgen); err != nil {
		return nil, fmt.Errorf("squid without ssl_bump support: %w (install squid-openssl)", err)
	}
	out, _ := exec.Command(squid, "-v").Output()
	version, _, _ := strings.Cut(string(out), "\n")
	version = strings.TrimPrefix(version, "Squid Cache: Version ")

	dir, err := os.MkdirTemp("", "cbx-squid")
	if err != nil {
		return nil, err
	}
	p := &squidPeer{port: freeTCPPort(), version: version, workers: workers}
	var stop func()
	var cmd *exec.Cmd
	var stopOnce sync.Once
	p.stop = func() { stopOnce.Do(stop) }
	stop = func() {
		if cmd != nil && cmd.Process != nil {
			// SIGTERM is squid's shutdown; shutdown_lifetime bounds it.
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-done
			}
		}
		os.RemoveAll(dir)
	}
	ok := false
	defer func() {
		if !ok {
			p.stop()
		}
	}()

	caPEM, keyPEM, err := benchCA("cagebox bench squid CA")
	if err != nil {
		return nil, err
	}
	p.caPEM = caPEM
	ssldb := filepath.Join(dir, "ssl_db")
	conf := filepath.Join(dir, "squid.conf")
	files := map[string][]byte{
		"ca.pem":    caPEM,
		"ca.key":    keyPEM,
		"up-ca.pem": upCAPEM,
		// squid resolves the upstream's name from here, never from DNS.
		"hosts": []byte(fmt.Sprintf("%s %s\n", upAddr.Addr(), benchName)),
		"squid.conf": []byte(strings.Join([]string{
			"workers " + strconv.Itoa(workers),
			fmt.Sprintf("http_port 127.0.0.1:%d ssl-bump generate-host-certificates=on dynamic_cert_mem_cache_size=16MB tls-cert=%s tls-key=%s",
				p.port, filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca.key")),
			fmt.Sprintf("sslcrtd_program %s -s %s -M 16MB", squidCertgen, ssldb),
			"sslcrtd_children 8 startup=2 idle=1",
			// Bump at step 2, from the client's SNI (as the cagebox proxy
			// mints from the SNI); upstream connections are then ordinary
			// pooled TLS connections.
			"acl step1 at_step SslBump1",
			"ssl_bump peek step1",
			"ssl_bump bump all",
			"tls_outgoing_options cafile=" + filepath.Join(dir, "up-ca.pem"),
			"hosts_file " + filepath.Join(dir, "hosts"),
			"http_access allow localhost",
			"http_access deny all",
			"cache deny all",
			"access_log none",
			"cache_store_log none",
			"cache_log " + filepath.Join(dir, "cache.log"),
			"pid_filename " + filepath.Join(dir, "squid.pid"),
			"coredump_dir " + dir,
			"netdb_filename none",
			"shutdown_lifetime 1 seconds",
			"visible_hostname cagebox-bench",
			"",
		}, "\n")),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return nil, err
		}
	}
	if out, err := exec.Command(squidCertgen, "-c", "-s", ssldb, "-M", "16MB").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("squid: create ssl_db: %v: %s", err, out)
	}
	// Squid started as root runs its workers and helpers as
	// cache_effective_user (Debian: proxy), which must own the directory.
	if os.Geteuid() == 0 {
		if err := chownTree(dir, "proxy"); err != nil {
			return nil, err
		}
	}
	// --foreground: the master stays our child (SMP workers and all) until
	// it is told to stop.
	cmd = exec.Command(squid, "--foreground", "-f", conf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start squid: %w", err)
	}
	if !waitPort(p.port, 20*time.Second) {
		log, _ := os.ReadFile(filepath.Join(dir, "cache.log"))
		return nil, fmt.Errorf("squid did not listen on %d:\n%s", p.port, log)
	}
	ok = true
	onFail(p.stop)
	return p, nil
}

// chownTree gives dir and everything in it to user name.
func chownTree(dir, name string) error {
	u, err := user.Lookup(name)
	if err != nil {
		return fmt.Errorf("squid runs as %s: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// benchCA makes a CA of the kind the cagebox proxy uses per sandbox
// (ECDSA P-256) for a peer proxy, as PEM certificate and PKCS#8 key.
func benchCA(cn string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), nil
}
