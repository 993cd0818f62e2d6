package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cagebox/cagebox/internal/egress"
	"github.com/cagebox/cagebox/internal/substitute"
	"github.com/cagebox/cagebox/internal/testpki"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/internal/vault/sqlitebackend"
)

// secretsBench measures (a) proxy throughput with and without placeholder
// substitution (one binding, its real value fetched from the SQLite vault
// on every request, as in the daemon), and (b) revoke → enforced: from the
// start of a revoke to the moment the next request is refused.
func secretsBench(dur time.Duration, conc, revokes int) {
	dir, err := os.MkdirTemp("", "cbx-secrets-bench")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	pki, err := testpki.New(time.Hour, benchName)
	if err != nil {
		fail(err)
	}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") }))
	up.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	up.StartTLS()
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())

	key, err := vault.GenerateKey()
	if err != nil {
		fail(err)
	}
	be, err := sqlitebackend.Open(filepath.Join(dir, "vault.db"))
	if err != nil {
		fail(err)
	}
	defer be.Close()
	v := vault.New(be, key)
	ctx := context.Background()
	const real = "ghp_BenchRealValue000000000000000000000001"
	if _, err := v.Put(ctx, "bench", "GITHUB_TOKEN", []byte(real), []string{benchName}, ""); err != nil {
		fail(err)
	}
	ph, err := substitute.NewPlaceholder([]byte(real))
	if err != nil {
		fail(err)
	}
	set, err := substitute.NewSet(&substitute.Binding{Name: "GITHUB_TOKEN", Placeholder: ph, Hosts: []string{benchName},
		Real: func(string) ([]byte, error) {
			s, _, err := v.Value(ctx, "bench", "GITHUB_TOKEN")
			if err != nil {
				return nil, err
			}
			return s.Bytes(), nil
		}})
	if err != nil {
		fail(err)
	}
	hook := func(_ *egress.Sandbox, r *http.Request) (*egress.Refusal, egress.ResponseFilter) {
		res, err := set.Apply(r, benchName, r.TLS != nil)
		if err != nil {
			return &egress.Refusal{Rule: "secret", Reason: err.Error()}, nil
		}
		if res.Refusal != nil {
			return &egress.Refusal{Rule: res.Refusal.Rule, Reason: res.Refusal.Reason}, nil
		}
		return nil, nil
	}
	mk := func(h egress.RequestHook) (*http.Client, func()) {
		addr, ca, closeProxy := benchProxy(upAddr, pki.Pool, h)
		pool := pki.Pool.Clone()
		pool.AppendCertsFromPEM(ca.CertPEM())
		c := &http.Client{Transport: transport(true, pool, func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr.String())
		}, nil)}
		return c, closeProxy
	}
	plain, closePlain := mk(nil)
	defer closePlain()
	subst, closeSubst := mk(hook)
	defer closeSubst()

	withAuth := func(c *http.Client) *http.Client {
		return &http.Client{Transport: authTransport{c.Transport, "Bearer " + ph}}
	}
	fmt.Printf("\nsecrets: HTTP/2 keep-alive GETs with 'Authorization: Bearer <placeholder>', %d clients, %s each\n", conc, dur)
	rpsPlain, _, p50Plain, _ := load(withAuth(plain), "https://"+benchName+"/", []byte("ok\n"), conc, dur)
	rpsSub, _, p50Sub, _ := load(withAuth(subst), "https://"+benchName+"/", []byte("ok\n"), conc, dur)
	fmt.Printf("  proxy without substitution   %9.0f req/s  p50 %s\n", rpsPlain, us(p50Plain))
	fmt.Printf("  proxy with substitution      %9.0f req/s  p50 %s   (real value from the vault per request)\n", rpsSub, us(p50Sub))
	fmt.Printf("  with/without                 %.2fx\n", rpsSub/rpsPlain)

	// Revoke → enforced.
	c := withAuth(subst)
	var lat []time.Duration
	for i := 0; i < revokes; i++ {
		if _, err := v.Put(ctx, "bench", "GITHUB_TOKEN", []byte(real), []string{benchName}, ""); err != nil {
			fail(err)
		}
		if code := get(c); code != 200 {
			fail(fmt.Errorf("before revoke: HTTP %d", code))
		}
		t0 := time.Now()
		if err := v.Revoke(ctx, "bench", "GITHUB_TOKEN"); err != nil {
			fail(err)
		}
		if code := get(c); code != 403 {
			fail(fmt.Errorf("after revoke: HTTP %d, want 403", code))
		}
		lat = append(lat, time.Since(t0))
	}
	fmt.Printf("  revoke → next request refused (n = %d): p50 %s  p99 %s   (goal p99 ≤ 5 ms; includes the vault's fsync'd write)\n",
		revokes, ms(pct(lat, 50)), ms(pct(lat, 99)))
}

type authTransport struct {
	rt   http.RoundTripper
	auth string
}

func (a authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", a.auth)
	return a.rt.RoundTrip(r)
}

func get(c *http.Client) int {
	resp, err := c.Get("https://" + benchName + "/")
	if err != nil {
		fail(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
