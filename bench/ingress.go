package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/daemon"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/link"
)

// guestSrc is the server the ingress bench runs in the guest: Go, static,
// so the guest's own cost is small next to what is measured.
const guestSrc = `package main

import (
	"io"
	"net/http"
	"os"
	"strconv"
)

func main() {
	big := make([]byte, 1<<20)
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			w.Write(big)
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("ok"))
	})
	if _, err := os.Stat("/tmp/cert.pem"); err == nil {
		// The HTTPS baseline: the guest terminates TLS itself.
		go http.ListenAndServeTLS(":8443", "/tmp/cert.pem", "/tmp/key.pem", nil)
	}
	http.ListenAndServe(":8080", nil)
}
`

const benchDomain = "bench.test"

// ingressBench measures the ingress listener against dialing the guest's
// address directly from the host: added latency (p50/p99), throughput,
// and a request to an idle-paused sandbox against a running one.
func ingressBench(agentPath string, latN int, dur time.Duration, conc int) {
	home, err := os.MkdirTemp("", "cbx-bench-ing")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(home)
	if _, err := (&image.Cache{Dir: filepath.Join(home, "images")}).BuildBusybox(context.Background(), "default"); err != nil {
		fail(err)
	}
	srvBin := filepath.Join(home, "guestsrv")
	src := filepath.Join(home, "guestsrv.go")
	if err := os.WriteFile(src, []byte(guestSrc), 0o644); err != nil {
		fail(err)
	}
	build := exec.Command("go", "build", "-o", srvBin, src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		fail(fmt.Errorf("build the guest server: %v: %s", err, out))
	}
	ingAddr := freeAddr()
	// The plain-HTTP listener a TLS-terminating proxy on the host would
	// use: the proxy's own cost, without TLS's.
	plainAddr := freeAddr()
	netCfg := daemon.NetworkConfig{TableName: os.Getenv("CAGEBOX_NET_TABLE"), IfPrefix: os.Getenv("CAGEBOX_NET_IFPREFIX")}
	if p := os.Getenv("CAGEBOX_LINK_POOL"); p != "" {
		netCfg.Pool = netip.MustParsePrefix(p)
	}
	defer runBenchDaemon(daemon.Config{
		Home: home, AgentPath: agentPath, DefaultRuntime: "container", Network: netCfg,
		Ingress: daemon.IngressConfig{Addr: ingAddr, Domain: benchDomain, Rate: -1, PlainAddr: plainAddr},
	})()
	c := client.Unix(client.SocketPath(home))

	gc := newGuestCert()
	sb := startGuest(c, srvBin, "", gc)
	tok := sb.Ports[0].Token
	guest := netip.AddrPortFrom(netip.MustParseAddr(sb.Network.Address), 8080).String()
	caPEM, err := os.ReadFile(filepath.Join(home, "ingress", "ca.pem"))
	if err != nil {
		fail(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	ingClient := func(conns int) *http.Client {
		d := &net.Dialer{}
		return &http.Client{Transport: &http.Transport{
			DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "tcp", ingAddr) },
			TLSClientConfig:     &tls.Config{RootCAs: pool},
			MaxIdleConnsPerHost: conns,
			TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1, as direct
		}}
	}
	plainClient := func(conns int) *http.Client {
		d := &net.Dialer{}
		return &http.Client{Transport: &http.Transport{
			DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "tcp", plainAddr) },
			MaxIdleConnsPerHost: conns,
		}}
	}
	plainURL := "http://8080-" + sb.ID + "." + benchDomain + "/"
	// Direct: the host dials the guest with the ingress mark (nothing
	// else may connect into a link).
	directClient := func(conns int) *http.Client {
		return &http.Client{Transport: &http.Transport{DialContext: markDialer().DialContext, MaxIdleConnsPerHost: conns}}
	}
	ingURL := "https://8080-" + sb.ID + "." + benchDomain + "/"
	directURL := "http://" + guest + "/"
	get := func(hc *http.Client, u string) {
		req, _ := http.NewRequest("GET", u, nil)
		req.Header.Set("X-Cagebox-Access", tok)
		resp, err := hc.Do(req)
		if err != nil {
			fail(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			fail(fmt.Errorf("GET %s: %s", u, resp.Status))
		}
	}
	lat := func(hc *http.Client, u string) []time.Duration {
		for i := 0; i < 50; i++ {
			get(hc, u) // warm: connections, TLS session
		}
		out := make([]time.Duration, latN)
		for i := range out {
			t0 := time.Now()
			get(hc, u)
			out[i] = time.Since(t0)
		}
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out
	}
	// The yardstick for the plain path: the least an HTTP reverse proxy
	// in Go does (httputil's, one fixed upstream, no routing, access
	// checks, limits or events), on loopback like the plain listener.
	bareL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	bare := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: guest})
	bare.Transport = &http.Transport{DialContext: markDialer().DialContext, MaxIdleConnsPerHost: conc}
	bareSrv := &http.Server{Handler: bare}
	go func() { _ = bareSrv.Serve(bareL) }()
	defer bareSrv.Close()
	bareURL := "http://" + bareL.Addr().String() + "/"
	dl, il, pll := lat(directClient(1), directURL), lat(ingClient(1), ingURL), lat(plainClient(1), plainURL)
	bl := lat(&http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}, bareURL)
	fmt.Printf("ingress: GET of a 2-byte body, keep-alive, HTTP/1.1, one client (n = %d)\n", latN)
	fmt.Printf("  %-40s p50 %8s  p99 %8s\n", "direct to the guest (host, marked)", ms(pct(dl, 50)), ms(pct(dl, 99)))
	fmt.Printf("  %-40s p50 %8s  p99 %8s\n", "through ingress (HTTPS)", ms(pct(il, 50)), ms(pct(il, 99)))
	fmt.Printf("  %-40s p50 %7.3fms p99 %7.3fms   (goal p50 ≤ 0.3 ms)\n", "added by ingress", float64(pct(il, 50)-pct(dl, 50))/1e6, float64(pct(il, 99)-pct(dl, 99))/1e6)
	fmt.Printf("  %-40s p50 %8s  p99 %8s\n", "through ingress (plain, behind a proxy)", ms(pct(pll, 50)), ms(pct(pll, 99)))
	fmt.Printf("  %-40s p50 %7.3fms p99 %7.3fms\n", "added by ingress (plain)", float64(pct(pll, 50)-pct(dl, 50))/1e6, float64(pct(pll, 99)-pct(dl, 99))/1e6)
	fmt.Printf("  %-40s p50 %7.3fms p99 %7.3fms   (ingress plain adds %.2f× of it)\n", "added by a bare Go reverse proxy", float64(pct(bl, 50)-pct(dl, 50))/1e6, float64(pct(bl, 99)-pct(dl, 99))/1e6,
		float64(pct(pll, 50)-pct(dl, 50))/float64(max(pct(bl, 50)-pct(dl, 50), 1)))

	// Throughput: each kind of client in turn, for several rounds, so a
	// slow spell of this shared host falls on every kind alike; medians.
	tput := func(hc *http.Client, u string, d time.Duration) float64 {
		var bytesN atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		end := start.Add(d)
		for i := 0; i < conc; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					req, _ := http.NewRequest("GET", u+"big", nil)
					req.Header.Set("X-Cagebox-Access", tok)
					resp, err := hc.Do(req)
					if err != nil {
						fail(err)
					}
					n, _ := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || n != 1<<20 {
						fail(fmt.Errorf("GET %sbig: %s, %d bytes", u, resp.Status, n))
					}
					bytesN.Add(n)
				}
			}()
		}
		wg.Wait()
		return float64(bytesN.Load()) / time.Since(start).Seconds() / (1 << 20)
	}
	// Direct HTTPS: the guest terminates TLS itself (the same key type
	// and cipher suite as the ingress listener): what ingress replaces.
	guestTLS := netip.AddrPortFrom(netip.MustParseAddr(sb.Network.Address), 8443).String()
	directTLSClient := func(conns int) *http.Client {
		hc := directClient(conns)
		tr := hc.Transport.(*http.Transport)
		tr.TLSClientConfig = &tls.Config{RootCAs: gc.pool, ServerName: guestTLSName}
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{} // HTTP/1.1, as ingress
		return hc
	}
	kinds := []struct {
		name string
		hc   *http.Client
		url  string
		got  []float64
	}{
		{name: "direct to the guest (plain HTTP)", hc: directClient(conc), url: directURL},
		{name: "direct to the guest (HTTPS, guest's TLS)", hc: directTLSClient(conc), url: "https://" + guestTLS + "/"},
		{name: "through ingress (HTTPS)", hc: ingClient(conc), url: ingURL},
		{name: "through ingress (plain, behind a proxy)", hc: plainClient(conc), url: plainURL},
		{name: "bare Go reverse proxy (plain, yardstick)", hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}, url: bareURL},
	}
	const rounds = 4
	for i := range kinds {
		tput(kinds[i].hc, kinds[i].url, 300*time.Millisecond) // warm: connections, TLS record sizes
	}
	for r := 0; r < rounds; r++ {
		for i := range kinds {
			kinds[i].got = append(kinds[i].got, tput(kinds[i].hc, kinds[i].url, dur/rounds))
		}
	}
	med := func(v []float64) float64 {
		w := append([]float64(nil), v...)
		sort.Float64s(w)
		if len(w)%2 == 0 {
			return (w[len(w)/2-1] + w[len(w)/2]) / 2
		}
		return w[len(w)/2]
	}
	span := func(v []float64) string {
		lo, hi := v[0], v[0]
		for _, x := range v {
			lo, hi = min(lo, x), max(hi, x)
		}
		return fmt.Sprintf("[%.0f–%.0f]", lo, hi)
	}
	plainD, httpsD, ingT, ingP, bareP := med(kinds[0].got), med(kinds[1].got), med(kinds[2].got), med(kinds[3].got), med(kinds[4].got)
	fmt.Printf("ingress: 1 MiB downloads, %d clients, %d rounds of %s per kind, medians (client, ingress and guest share this host's CPUs)\n", conc, rounds, dur/rounds)
	for _, k := range kinds {
		fmt.Printf("  %-42s %6.0f MiB/s %-13s\n", k.name, med(k.got), span(k.got))
	}
	fmt.Printf("  %-42s ratio %.2f (goal ≥ 0.5)\n", "ingress HTTPS vs direct HTTPS", ingT/httpsD)
	fmt.Printf("  %-42s ratio %.2f (goal ≥ 0.5)\n", "ingress plain vs direct plain", ingP/plainD)
	fmt.Printf("  %-42s ratio %.2f\n", "ingress HTTPS vs direct plain", ingT/plainD)
	fmt.Printf("  %-42s ratio %.2f (the yardstick itself: %.2f of direct plain)\n", "ingress plain vs bare Go reverse proxy", ingP/bareP, bareP/plainD)
	// Upload: 50 MiB through ingress.
	body := bytes.Repeat([]byte("x"), 50<<20)
	t0 := time.Now()
	req, _ := http.NewRequest("POST", ingURL+"up", bytes.NewReader(body))
	req.Header.Set("X-Cagebox-Access", tok)
	if resp, err := ingClient(1).Do(req); err != nil || resp.StatusCode != 200 {
		fail(fmt.Errorf("upload: %v", err))
	}
	fmt.Printf("  %-40s %8s (%.0f MiB/s)\n", "50 MiB upload through ingress", ms(time.Since(t0)), 50/time.Since(t0).Seconds())

	// Paused vs running: a sandbox the idle timeout pauses (1s).
	sb2 := startGuest(c, srvBin, "1s", nil)
	tok2 := sb2.Ports[0].Token
	u2 := "https://8080-" + sb2.ID + "." + benchDomain + "/"
	hc := ingClient(1)
	one := func() time.Duration {
		req, _ := http.NewRequest("GET", u2, nil)
		req.Header.Set("X-Cagebox-Access", tok2)
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			fail(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			fail(fmt.Errorf("GET: %s", resp.Status))
		}
		return time.Since(t0)
	}
	const wakes = 8
	var running, paused, resume []time.Duration
	for i := 0; i < wakes; i++ {
		running = append(running, one())
		deadline := time.Now().Add(20 * time.Second)
		for {
			s, err := c.Get(context.Background(), sb2.ID)
			if err == nil && s.Status == "paused" {
				break
			}
			if time.Now().After(deadline) {
				fail(fmt.Errorf("sandbox never idle-paused: %+v %v", s, err))
			}
			time.Sleep(20 * time.Millisecond)
		}
		hc.CloseIdleConnections() // a visitor arriving after a pause opens a new connection
		paused = append(paused, one())
	}
	// Resume time through the API (pause, then resume, timed).
	for i := 0; i < wakes; i++ {
		if _, err := c.Pause(context.Background(), sb.ID); err != nil {
			fail(err)
		}
		t0 := time.Now()
		if _, err := c.Resume(context.Background(), sb.ID); err != nil {
			fail(err)
		}
		resume = append(resume, time.Since(t0))
	}
	for _, d := range [][]time.Duration{running, paused, resume} {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	}
	fmt.Printf("ingress: request to an idle-paused sandbox vs a running one (container, n = %d)\n", wakes)
	fmt.Printf("  %-40s p50 %8s\n", "running (new TLS connection)", ms(pct(running, 50)))
	fmt.Printf("  %-40s p50 %8s\n", "idle-paused: wake + request", ms(pct(paused, 50)))
	fmt.Printf("  %-40s p50 %8s\n", "resume through the API", ms(pct(resume, 50)))
	added := pct(paused, 50) - pct(running, 50)
	fmt.Printf("  %-40s p50 %7.2fms   (goal ≤ resume + 20 ms = %s)\n", "added by the wake", float64(added)/1e6, ms(pct(resume, 50)+20*time.Millisecond))
	for _, id := range []string{sb.ID, sb2.ID} {
		_ = c.Remove(context.Background(), id)
	}
}

// markDialer dials with the ingress mark: nothing else may connect into
// a link.
func markDialer() *net.Dialer {
	return &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		_ = rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(link.DefaultIngressMark))
		})
		return serr
	}}
}

// startGuest creates a sandbox publishing 8080 (idle-pausing after idle,
// when set) and starts the guest server in it; with guestTLS, also 8443,
// where the guest serves HTTPS itself with that certificate.
func startGuest(c *client.Client, srvBin, idle string, guestTLS *guestCert) *api.Sandbox {
	req := &api.CreateSandboxRequest{Runtime: "container", Publish: []api.PortSpec{{Port: 8080}}}
	if guestTLS != nil {
		req.Publish = append(req.Publish, api.PortSpec{Port: 8443})
	}
	if idle != "" {
		req.IdleTimeout, req.IdleAction = idle, "pause"
	}
	sb, err := c.Create(context.Background(), req)
	if err != nil {
		fail(err)
	}
	// A bench that fails leaves no sandbox running (the daemon stops
	// after this, sandboxes would outlive it).
	onFail(func() { _ = c.Remove(context.Background(), sb.ID) })
	bin, err := os.ReadFile(srvBin)
	if err != nil {
		fail(err)
	}
	write := func(path string, mode uint32, data []byte) {
		if err := c.WriteFile(context.Background(), sb.ID, path, mode, bytes.NewReader(data)); err != nil {
			fail(err)
		}
	}
	if guestTLS != nil {
		write("/tmp/cert.pem", 0o644, guestTLS.certPEM)
		write("/tmp/key.pem", 0o600, guestTLS.keyPEM)
	}
	write("/tmp/srv", 0o755, bin)
	if _, err := c.Exec(context.Background(), sb.ID, &api.ExecRequest{Argv: []string{"sh", "-c", "setsid /tmp/srv >/dev/null 2>&1 </dev/null &"}}, nil, io.Discard, io.Discard); err != nil {
		fail(err)
	}
	time.Sleep(300 * time.Millisecond)
	if strings.TrimSpace(sb.Ports[0].Token) == "" {
		fail("no token")
	}
	return sb
}

// guestCert is the certificate the guest serves its HTTPS baseline with:
// self-signed, ECDSA P-256 like the ingress listener's, so both sides do
// the same TLS work.
type guestCert struct {
	certPEM, keyPEM []byte
	pool            *x509.CertPool
}

const guestTLSName = "guest." + benchDomain

func newGuestCert() *guestCert {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		fail(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: guestTLSName},
		DNSNames: []string{guestTLSName}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		fail(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		fail(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		fail(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &guestCert{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		pool:    pool,
	}
}
