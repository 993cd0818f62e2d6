package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cagebox/cagebox/internal/egress"
	"github.com/cagebox/cagebox/internal/livepolicy"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/store/sqlite"
	"github.com/cagebox/cagebox/internal/testpki"
)

// livePolicy adapts a live policy to the proxy as the gateway does.
type livePolicy struct{ s *livepolicy.Sandbox }

func (l livePolicy) Decide(ctx context.Context, r *egress.Request) (egress.Decision, error) {
	if r.Protocol == "http" && r.Method == "" && r.Path == "" {
		return egress.Decision{Allow: l.s.AllowsName(r.Host), Rule: "connection"}, nil
	}
	d, err := l.s.Decide(ctx, &policy.Request{Host: r.Host, Port: r.Port, Protocol: r.Protocol, Method: r.Method, Path: r.Path,
		WebSocket: r.WebSocket, ContentType: r.ContentType, Accept: r.Accept, RawQuery: r.RawQuery, Header: r.Header, BodySize: r.BodySize})
	return egress.Decision{Allow: d.Allow, Rule: d.Rule, Reason: d.Reason}, err
}

// policyBench measures the live policy through the real proxy: throughput
// with a one-rule policy vs a 50-rule policy with CEL conditions; change
// → enforced (a rule added, the next request on the same HTTP/2
// connection allowed) over n changes; a hold's added latency when a
// webhook on loopback approves it; freeze → every one of 100 sandboxes
// refused.
func policyBench(dur time.Duration, conc, n int) {
	dir, err := os.MkdirTemp("", "cbx-policy-bench")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(filepath.Join(dir, "cagebox.db"))
	if err != nil {
		fail(err)
	}
	defer st.Close()
	pki, err := testpki.New(time.Hour, benchName)
	if err != nil {
		fail(err)
	}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") }))
	up.EnableHTTP2 = true
	up.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	up.StartTLS()
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = json.NewEncoder(w).Encode(livepolicy.WebhookAnswer{Decision: "allow"})
	}))
	defer hook.Close()
	reg := livepolicy.New(livepolicy.Config{Store: st, WebhookKey: []byte("bench")})
	ctx := context.Background()
	attach := func(id, src string) *livepolicy.Sandbox {
		d, err := policy.Parse([]byte(src))
		if err != nil {
			fail(err)
		}
		s, err := reg.Attach(ctx, id, "bench", d, "", false)
		if err != nil {
			fail(err)
		}
		return s
	}
	client := func(s *livepolicy.Sandbox) (*http.Client, func()) {
		addr, ca, closeProxy := benchProxyWith(upAddr, pki.Pool, nil, livePolicy{s})
		pool := pki.Pool.Clone()
		pool.AppendCertsFromPEM(ca.CertPEM())
		return &http.Client{Transport: transport(true, pool, func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr.String())
		}, nil)}, closeProxy
	}

	one := attach("one", "version: 1\nrules: [{name: api, host: "+benchName+", action: allow}]")
	var b strings.Builder
	b.WriteString("version: 2\nrules:\n")
	for i := 0; i < 25; i++ {
		fmt.Fprintf(&b, "  - {name: other-%d, host: h%d.example.org, action: allow, when: 'request.method == \"GET\"'}\n", i, i)
	}
	for i := 0; i < 24; i++ {
		fmt.Fprintf(&b, "  - {name: team-%d, host: %s, action: deny, when: '\"x-team\" in request.headers && request.headers[\"x-team\"] == \"team-%d\"'}\n", i, benchName, i)
	}
	fmt.Fprintf(&b, "  - {name: api, host: %s, methods: [GET], paths: [\"/**\"], action: allow, when: 'request.size <= 1048576 && session.fired[\"team-0\"] == 0'}\n", benchName)
	fifty := attach("fifty", b.String())
	// The same 50 rules without their conditions (the deny rules narrowed
	// by a path instead): the baseline the CEL figure is compared with.
	var plainSrc strings.Builder
	for n, line := range strings.Split(b.String(), "\n") {
		if i := strings.Index(line, ", when: "); i >= 0 {
			extra := ""
			if strings.Contains(line, "action: deny") {
				extra = fmt.Sprintf(", paths: [/team-%d/**]", n)
			}
			line = line[:i] + extra + "}"
		}
		plainSrc.WriteString(line + "\n")
	}
	plain := attach("plain", plainSrc.String())
	c1, close1 := client(one)
	defer close1()
	c50, close50 := client(fifty)
	defer close50()
	cp, closeP := client(plain)
	defer closeP()
	fmt.Printf("\nlive policy: HTTP/2 keep-alive GETs through the proxy, %d clients, %s each\n", conc, dur)
	rps1, _, p501, _ := load(c1, "https://"+benchName+"/", []byte("ok\n"), conc, dur)
	rpsP, _, p50P, _ := load(cp, "https://"+benchName+"/", []byte("ok\n"), conc, dur)
	rps50, _, p5050, _ := load(c50, "https://"+benchName+"/", []byte("ok\n"), conc, dur)
	fmt.Printf("  1 rule, no conditions            %9.0f req/s  p50 %s\n", rps1, us(p501))
	fmt.Printf("  50 rules, no conditions          %9.0f req/s  p50 %s\n", rpsP, us(p50P))
	fmt.Printf("  50 rules, 25 CEL conditions run  %9.0f req/s  p50 %s\n", rps50, us(p5050))
	fmt.Printf("  50 rules with CEL / without      %.2fx   (goal ≥ 0.9x); / 1 rule %.2fx\n", rps50/rpsP, rps50/rps1)

	// Change → enforced, on one open HTTP/2 connection.
	live := attach("live", "version: 1\nrules: [{name: base, host: "+benchName+", paths: [/base], action: allow}]")
	cl, closeL := client(live)
	defer closeL()
	if code := getPath(cl, "/base"); code != 200 {
		fail(fmt.Errorf("base: %d", code))
	}
	var lat, upd []time.Duration
	for i := 0; i < n; i++ {
		path := fmt.Sprintf("/p%d", i)
		if code := getPath(cl, path); code != 403 {
			fail(fmt.Errorf("%s before the change: %d", path, code))
		}
		t0 := time.Now()
		_, err := live.Update(ctx, 0, "bench", "", func(d *policy.Document) (*policy.Document, error) {
			d.Rules = append([]policy.Rule{{Name: "r" + path, Host: benchName, Paths: []string{path}, Action: policy.ActionAllow}}, d.Rules...)
			return d, nil
		})
		if err != nil {
			fail(err)
		}
		upd = append(upd, time.Since(t0))
		if code := getPath(cl, path); code != 200 {
			fail(fmt.Errorf("%s after the change: %d", path, code))
		}
		lat = append(lat, time.Since(t0))
	}
	fmt.Printf("  change → enforced (n = %d, rule added, next request on the open connection allowed): p50 %s  p99 %s   (goal p99 ≤ 5 ms)\n",
		n, ms(pct(lat, 50)), ms(pct(lat, 99)))
	fmt.Printf("    of which the change itself (validate, compile, store the generation with fsync, swap): p50 %s  p99 %s\n", ms(pct(upd, 50)), ms(pct(upd, 99)))

	// Hold approved by a webhook on loopback vs the same request unheld.
	held := attach("held", "version: 2\napproval: {webhook: '"+hook.URL+"/hook', timeout: 5s}\nrules:\n  - {name: hold, host: "+benchName+", paths: [/held], action: hold}\n  - {name: free, host: "+benchName+", action: allow}\n")
	ch, closeH := client(held)
	defer closeH()
	var free, hld []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if code := getPath(ch, "/free"); code != 200 {
			fail(fmt.Errorf("free: %d", code))
		}
		free = append(free, time.Since(t0))
		t0 = time.Now()
		if code := getPath(ch, "/held"); code != 200 {
			fail(fmt.Errorf("held: %d", code))
		}
		hld = append(hld, time.Since(t0))
	}
	fmt.Printf("  hold approved by a webhook on loopback (n = %d): p50 %s  p99 %s; unheld p50 %s  p99 %s; added p50 %s\n",
		n, ms(pct(hld, 50)), ms(pct(hld, 99)), ms(pct(free, 50)), ms(pct(free, 99)), ms(pct(hld, 50)-pct(free, 50)))

	// Freeze → every one of 100 sandboxes refused.
	var sbs []*livepolicy.Sandbox
	for i := 0; i < 100; i++ {
		sbs = append(sbs, attach(fmt.Sprintf("fz-%d", i), "version: 1\nrules: [{name: api, host: "+benchName+", action: allow}]"))
	}
	var fz []time.Duration
	for round := 0; round < 20; round++ {
		t0 := time.Now()
		_, _ = reg.Freeze(context.Background(), livepolicy.Scope{All: true}, livepolicy.Actor{Principal: livepolicy.Admin, By: "bench"})
		for _, s := range sbs {
			d, _ := s.Decide(ctx, &policy.Request{Host: benchName, Port: 443, Method: "GET", Path: "/"})
			if d.Allow {
				fail(fmt.Errorf("%s allowed while frozen", s.ID))
			}
		}
		fz = append(fz, time.Since(t0))
		_, _, _ = reg.Thaw(context.Background(), livepolicy.Scope{All: true}, livepolicy.Actor{Principal: livepolicy.Admin, By: "bench"})
	}
	fmt.Printf("  freeze --all → each of 100 sandboxes' next request refused (20 rounds): p50 %s  max %s   (goal ≤ 50 ms)\n", ms(pct(fz, 50)), ms(pct(fz, 100)))
}

func getPath(c *http.Client, path string) int {
	resp, err := c.Get("https://" + benchName + path)
	if err != nil {
		fail(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
