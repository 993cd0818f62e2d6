package egress

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkProxy compares keep-alive HTTPS requests on loopback sent directly
// to the upstream with the same requests through the intercepting proxy.
// It reports req/s, p50 and p99 latency; compare p50-µs of direct and proxy
// for the latency the proxy adds.
//
//	go test -run '^$' -bench Proxy -benchtime 3s ./internal/egress
func BenchmarkProxy(b *testing.B) {
	for _, h2 := range []bool{false, true} {
		proto := "h1"
		if h2 {
			proto = "h2"
		}
		h := newHarness(b)
		direct := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", h.api.Listener.Addr().String())
			},
			TLSClientConfig:     &tls.Config{RootCAs: h.p.cfg.UpstreamCAs},
			ForceAttemptHTTP2:   h2,
			MaxIdleConnsPerHost: 256,
		}
		if !h2 {
			direct.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		b.Cleanup(direct.CloseIdleConnections)
		proxied := h.client(h2)
		proxied.Transport.(*http.Transport).MaxIdleConnsPerHost = 256
		clients := []struct {
			name string
			c    *http.Client
		}{
			{"direct", &http.Client{Transport: direct}},
			{"proxy", proxied},
		}
		for _, cl := range clients {
			b.Run(proto+"/serial/"+cl.name, func(b *testing.B) {
				benchRequests(b, cl.c, 1)
			})
		}
		for _, cl := range clients {
			b.Run(proto+"/parallel16/"+cl.name, func(b *testing.B) {
				benchRequests(b, cl.c, 16)
			})
		}
	}
}

func benchRequests(b *testing.B, c *http.Client, workers int) {
	do := func() time.Duration {
		t0 := time.Now()
		resp, err := c.Get("https://api.example.test/bench")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatal(resp.Status)
		}
		return time.Since(t0)
	}
	for range 20 { // warm connections and the leaf cache
		do()
	}
	lat := make([][]time.Duration, workers)
	next := make(chan struct{}, b.N)
	for range b.N {
		next <- struct{}{}
	}
	close(next)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				lat[w] = append(lat[w], do())
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
}
