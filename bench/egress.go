package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cagebox/cagebox/internal/egress"
	"github.com/cagebox/cagebox/internal/testpki"
)

const benchName = "api.example.test"

// egressBench measures keep-alive HTTPS GETs on loopback: (a) direct to the
// upstream, (b) through the cagebox proxy with interception (the client
// connects as a sandbox would, its traffic redirected to the proxy), and
// two intercepting peers as explicit proxies (one CONNECT per connection,
// amortised by keep-alive): (c) squid with ssl_bump (Debian's
// squid-openssl), (d) mitmproxy (Debian's mitmdump). Every proxy mints
// certificates from the client's SNI with its own CA and verifies the
// upstream's certificate against the upstream's CA; every row gets the
// same clients, concurrency and keep-alive.
func egressBench(dur time.Duration, conc int) {
	dir, err := os.MkdirTemp("", "cbx-egress-bench")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	onFail(func() { os.RemoveAll(dir) })

	pki, err := testpki.New(time.Hour, benchName)
	if err != nil {
		fail(err)
	}
	upPool := pki.Pool
	body := []byte("hello from upstream\n")
	// upHits counts the requests the upstream served: every row's requests
	// must reach it (no proxy answers from a cache or with an error page).
	var upHits atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upHits.Add(1)
		_, _ = w.Write(body)
	}))
	up.EnableHTTP2 = true
	up.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	up.StartTLS()
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	caFile := filepath.Join(dir, "up-ca.pem")
	_ = os.WriteFile(caFile, pki.CAPEM, 0o644)

	// (b) the cagebox proxy.
	pl, ca, closeProxy := benchProxy(upAddr, upPool, nil)
	defer closeProxy()
	sbPool := x509.NewCertPool()
	sbPool.AppendCertsFromPEM(ca.CertPEM())

	type client struct {
		name   string
		target string
		h1only bool // the peer speaks HTTP/1.1 to its clients only
		mk     func(h2 bool) *http.Client
	}
	clients := []client{
		{name: "direct to upstream", target: "https://" + benchName + "/", mk: func(h2 bool) *http.Client {
			return &http.Client{Transport: transport(h2, upPool, func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", upAddr.String())
			}, nil)}
		}},
		{name: "cagebox proxy (intercepting)", target: "https://" + benchName + "/", mk: func(h2 bool) *http.Client {
			return &http.Client{Transport: transport(h2, sbPool, func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", pl.String())
			}, nil)}
		}},
	}

	// (c) squid with ssl_bump.
	const squidName = "squid ssl_bump"
	squidLabel := ""
	if sq, err := startSquid(upAddr, pki.CAPEM, numCPU()); err != nil {
		fmt.Printf("  (squid not measured: %v)\n", err)
	} else {
		defer sq.stop()
		squidLabel = fmt.Sprintf("squid %s ssl_bump, %d workers", sq.version, sq.workers)
		sp := x509.NewCertPool()
		sp.AppendCertsFromPEM(sq.caPEM)
		proxyURL, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", sq.port))
		clients = append(clients, client{name: squidName, h1only: true,
			// CONNECT api.example.test:PORT: squid resolves the name from
			// its hosts_file and verifies the upstream's certificate for it.
			target: fmt.Sprintf("https://%s:%d/", benchName, upAddr.Port()),
			mk: func(h2 bool) *http.Client {
				return &http.Client{Transport: transport(h2, sp, nil, http.ProxyURL(proxyURL))}
			}})
	}

	// (d) mitmproxy.
	const mitmName = "mitmproxy 8.1 (intercepting)"
	mitmPort := freeTCPPort()
	mitmConf := filepath.Join(dir, "mitm")
	mitm := exec.Command("mitmdump", "-q", "--listen-host", "127.0.0.1", "--listen-port", fmt.Sprint(mitmPort),
		"--set", "confdir="+mitmConf, "--set", "ssl_verify_upstream_trusted_ca="+caFile, "--set", "connection_strategy=lazy")
	mitmOK := mitm.Start() == nil
	if mitmOK {
		var once sync.Once
		stopMitm := func() { once.Do(func() { _ = mitm.Process.Kill(); _ = mitm.Wait() }) }
		defer stopMitm()
		onFail(stopMitm)
		mitmOK = waitFile(filepath.Join(mitmConf, "mitmproxy-ca-cert.pem"), 20*time.Second) && waitPort(mitmPort, 20*time.Second)
	}
	if mitmOK {
		mitmCA, _ := os.ReadFile(filepath.Join(mitmConf, "mitmproxy-ca-cert.pem"))
		mp := x509.NewCertPool()
		mp.AppendCertsFromPEM(mitmCA)
		proxyURL, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", mitmPort))
		clients = append(clients, client{name: mitmName,
			// CONNECT to the address (mitmproxy cannot resolve the test
			// name); SNI and the certificate check stay api.example.test.
			target: "https://" + upAddr.String() + "/",
			mk: func(h2 bool) *http.Client {
				return &http.Client{Transport: transport(h2, mp, nil, http.ProxyURL(proxyURL))}
			}})
	} else {
		fmt.Println("  (mitmdump not available: scripts/bench.sh installs Debian's mitmproxy)")
	}

	fmt.Printf("egress: keep-alive HTTPS GET of %d bytes on loopback, %d concurrent clients, %s each\n", len(body), conc, dur)
	if squidLabel != "" {
		fmt.Printf("  (%s: %s)\n", squidName, squidLabel)
	}
	type row struct {
		rps      float64
		p50, p99 time.Duration
	}
	for _, h2 := range []bool{false, true} {
		proto := "HTTP/1.1"
		if h2 {
			proto = "HTTP/2"
		}
		results := map[string]row{}
		for _, cl := range clients {
			if h2 && cl.h1only {
				fmt.Printf("  %-8s %-30s %9s          (squid speaks HTTP/1.1 to its clients only)\n", proto, cl.name, "-")
				continue
			}
			hits0 := upHits.Load()
			rps, n1, _, _ := load(cl.mk(h2), cl.target, body, conc, dur)
			_, n2, p50, p99 := load(cl.mk(h2), cl.target, body, 1, dur/2)
			if got := upHits.Load() - hits0; got < int64(n1+n2) {
				fail(fmt.Errorf("%s: the upstream served %d of %d requests", cl.name, got, n1+n2))
			}
			results[cl.name] = row{rps, p50, p99}
			fmt.Printf("  %-8s %-30s %9.0f req/s   serial p50 %8s  p99 %8s\n", proto, cl.name, rps, us(p50), us(p99))
		}
		// Ratios: throughput cagebox/X (above 1: cagebox serves more) and
		// serial p50 latency cagebox/X (below 1: cagebox answers sooner).
		d, c := results[clients[0].name], results[clients[1].name]
		fmt.Printf("  %-8s cagebox added p50 over direct: %s (goal ≤ 0.5 ms)\n", proto, us(c.p50-d.p50))
		for _, peer := range []struct{ name, short, goal string }{{clients[0].name, "direct", ""}, {squidName, "squid", ""}, {mitmName, "mitmproxy", " (goal ≥ 10x)"}} {
			if m, ok := results[peer.name]; ok && m.rps > 0 {
				fmt.Printf("  %-8s cagebox/%-9s throughput %6.2fx%s, serial p50 latency %5.2fx\n", proto, peer.short, c.rps/m.rps, peer.goal, float64(c.p50)/float64(m.p50))
			}
		}
	}
}

// mitmproxy gets CONNECT host:port; the name must resolve, so the bench
// dials it through a map instead of DNS.
func transport(h2 bool, roots *x509.CertPool, dial func(context.Context, string, string) (net.Conn, error), proxy func(*http.Request) (*url.URL, error)) *http.Transport {
	t := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: roots, ServerName: benchName},
		ForceAttemptHTTP2:   h2,
		MaxIdleConnsPerHost: 1024,
		DialContext:         dial,
		Proxy:               proxy,
	}
	if !h2 {
		t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return t
}

// load runs conc clients that GET target for dur, each response checked
// to be a 200 with body want; it returns the throughput, the number of
// requests (warm-up included) and the latency percentiles.
func load(c *http.Client, target string, want []byte, conc int, dur time.Duration) (float64, int, time.Duration, time.Duration) {
	get := func() error {
		resp, err := c.Get(target)
		if err != nil {
			return err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || !bytes.Equal(b, want) {
			return fmt.Errorf("%s: %s %q, want 200 %q", target, resp.Status, b, want)
		}
		return nil
	}
	// Warm the connections.
	for i := 0; i < conc; i++ {
		if err := get(); err != nil {
			fail(fmt.Errorf("%s: %v", target, err))
		}
	}
	var mu sync.Mutex
	var lat []time.Duration
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < conc; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(deadline) && len(mine) < 200000 {
				t0 := time.Now()
				if err := get(); err != nil {
					fail(err)
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	el := time.Since(start)
	c.CloseIdleConnections()
	return float64(len(lat)) / el.Seconds(), len(lat) + conc, pct(lat, 50), pct(lat, 99)
}

func us(d time.Duration) string { return fmt.Sprintf("%.0fµs", float64(d)/1e3) }

func freeTCPPort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitFile(p string, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

func waitPort(port int, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// benchProxy runs the cagebox proxy on loopback as one sandbox's gateway:
// every connection is that sandbox's, to api.example.test (a synthetic
// address), allowed by policy, upstream at upAddr; hook may be nil.
func benchProxy(upAddr netip.AddrPort, upPool *x509.CertPool, hook egress.RequestHook) (net.Addr, *egress.CA, func()) {
	return benchProxyWith(upAddr, upPool, hook, egress.PolicyFunc(func(context.Context, *egress.Request) (egress.Decision, error) {
		return egress.Decision{Allow: true, Rule: "bench"}, nil
	}))
}

// benchProxyWith is benchProxy deciding with pol.
func benchProxyWith(upAddr netip.AddrPort, upPool *x509.CertPool, hook egress.RequestHook, pol egress.Policy) (net.Addr, *egress.CA, func()) {
	ca, err := egress.NewCA("bench", time.Hour)
	if err != nil {
		fail(err)
	}
	synthetic := netip.MustParseAddrPort("198.18.0.2:443")
	sb := &egress.Sandbox{ID: "bench", Tenant: "bench", CA: ca, Policy: pol,
		NameOf: func(a netip.Addr) (string, bool) { return benchName, a == synthetic.Addr() },
	}
	px, err := egress.New(egress.Config{
		Lookup:      func(net.Conn) (*egress.Sandbox, netip.AddrPort, bool) { return sb, synthetic, true },
		Resolve:     map[string]netip.AddrPort{benchName + ":443": upAddr},
		UpstreamCAs: upPool,
		Hook:        hook,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		fail(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	go func() { _ = px.Serve(l) }()
	return l.Addr(), ca, func() { px.Close() }
}
