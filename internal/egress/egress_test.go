package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

type denialBody struct {
	Error, Rule, Host, Reason string
}

func get(t *testing.T, c *http.Client, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(b)
}

func newReq(t *testing.T, method, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func wantDenied(t *testing.T, resp *http.Response, body, rule string) denialBody {
	t.Helper()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("status %d, want 403; body %q", resp.StatusCode, body)
	}
	if got := resp.Header.Get("X-Cagebox-Denied"); got != rule {
		t.Errorf("X-Cagebox-Denied = %q, want %q", got, rule)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("content type %q", ct)
	}
	var d denialBody
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if d.Error != "denied by cagebox egress policy" || d.Rule != rule {
		t.Errorf("denial %+v, want rule %q", d, rule)
	}
	return d
}

func TestAllowedHTTPS(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			h := newHarness(t)
			c := h.client(h2)
			req := newReq(t, "POST", "https://api.example.test/v1/things?q=1", strings.NewReader("payload"))
			req.Header.Set("X-Forwarded-For", "10.9.9.9") // the sandbox cannot forge this either
			resp, body := get(t, c, req)
			if resp.StatusCode != 200 || body != "hello from upstream: POST /v1/things payload" {
				t.Fatalf("status %d body %q", resp.StatusCode, body)
			}
			wantProto := "HTTP/1.1"
			if h2 {
				wantProto = "HTTP/2.0"
			}
			if resp.Proto != wantProto {
				t.Errorf("sandbox side proto %s, want %s", resp.Proto, wantProto)
			}
			s := h.api.seen()
			if len(s) != 1 {
				t.Fatalf("upstream saw %d requests", len(s))
			}
			if s[0].Host != "api.example.test" || s[0].Path != "/v1/things" {
				t.Errorf("upstream saw %+v", s[0])
			}
			if len(s[0].XFF) != 0 || s[0].Header.Get("Forwarded") != "" || s[0].Header.Get("Via") != "" {
				t.Errorf("upstream saw forwarding headers: %v", s[0].Header)
			}
			if s[0].Proto != "HTTP/2.0" {
				t.Errorf("upstream proto %s, want HTTP/2.0 (offered by upstream)", s[0].Proto)
			}
			ev := h.waitEvents(1)
			if len(ev) != 1 {
				t.Fatalf("events %+v", ev)
			}
			e := ev[0]
			if e.Verdict != "allow" || e.Rule != "allow-api" || e.Status != 200 || e.Host != "api.example.test" ||
				e.Port != 443 || e.Protocol != "https" || e.Method != "POST" || e.Path != "/v1/things" ||
				e.Sandbox != "sb-test" || e.Tenant != "tenant-a" {
				t.Errorf("event %+v", e)
			}
			if e.BytesUp != int64(len("payload")) || e.BytesDown != int64(len(body)) || e.Duration <= 0 {
				t.Errorf("event bytes up %d down %d duration %v", e.BytesUp, e.BytesDown, e.Duration)
			}
		})
	}
}

func TestDenied(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			h := newHarness(t)
			resp, body := get(t, h.client(h2), newReq(t, "GET", "https://api.example.test/admin/users", nil))
			d := wantDenied(t, resp, body, "deny-admin")
			if d.Host != "api.example.test" || d.Reason != "admin API is off limits" {
				t.Errorf("denial %+v", d)
			}
			if n := len(h.api.seen()); n != 0 {
				t.Errorf("upstream saw %d requests", n)
			}
			ev := h.waitEvents(1)
			if len(ev) != 1 || ev[0].Verdict != "deny" || ev[0].Rule != "deny-admin" || ev[0].Status != 403 {
				t.Errorf("events %+v", ev)
			}
		})
	}
}

func TestPolicyErrorRefuses(t *testing.T) {
	h := newHarness(t)
	h.setPolicy(func(_ context.Context, r *Request) (Decision, error) {
		if r.Method == "" {
			return Decision{Allow: true}, nil
		}
		return Decision{Allow: true, Rule: "oops"}, errors.New("engine down")
	})
	resp, body := get(t, h.client(false), newReq(t, "GET", "https://api.example.test/", nil))
	wantDenied(t, resp, body, "oops")
	if ev := h.waitEvents(1); len(ev) != 1 || ev[0].Verdict != "error" {
		t.Errorf("events %+v", ev)
	}
}

func TestConnectionLevelDenial(t *testing.T) {
	h := newHarness(t)
	h.setDst(dstOther)
	h.setPolicy(func(_ context.Context, r *Request) (Decision, error) {
		if r.Method != "" {
			t.Errorf("per-request policy consulted after a connection-level denial: %+v", r)
		}
		return Decision{Rule: "block-other", Reason: "not today"}, nil
	})
	resp, body := get(t, h.client(true), newReq(t, "GET", "https://other.example.test/x", nil))
	d := wantDenied(t, resp, body, "block-other")
	if d.Host != "other.example.test" {
		t.Errorf("denial %+v", d)
	}
}

func TestDomainFronting(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			h := newHarness(t)
			for _, host := range []string{"other.example.test", "api.example.test:8443", "evil.test"} {
				req := newReq(t, "GET", "https://api.example.test/", nil)
				req.Host = host
				resp, body := get(t, h.client(h2), req)
				wantDenied(t, resp, body, "builtin:domain-fronting")
			}
			if n := len(h.api.seen()); n != 0 {
				t.Errorf("upstream saw %d requests", n)
			}
		})
	}
}

func TestSNIChecks(t *testing.T) {
	h := newHarness(t)
	// SNI names another host than the synthetic address the guest dialled.
	if _, err := h.client(false).Get("https://other.example.test/"); err == nil {
		t.Error("SNI != NameOf(dst): request succeeded")
	}
	// No SNI at all.
	if c, err := h.tlsDial(""); err == nil {
		c.Close()
		t.Error("no SNI: handshake succeeded")
	}
	// A literal IP destination has no name: refused whatever the SNI says.
	h.setDst(dstIP)
	if _, err := h.client(false).Get("https://api.example.test/"); err == nil {
		t.Error("literal IP destination: request succeeded")
	}
	ev := h.waitEvents(3)
	rules := map[string]bool{}
	for _, e := range ev {
		if e.Verdict != "deny" {
			t.Errorf("event %+v", e)
		}
		rules[e.Rule] = true
	}
	for _, r := range []string{"builtin:sni-mismatch", "builtin:no-sni", "builtin:literal-ip"} {
		if !rules[r] {
			t.Errorf("no event with rule %s in %+v", r, ev)
		}
	}
}

func TestConnectRefused(t *testing.T) {
	h := newHarness(t)
	check := func(c net.Conn) {
		t.Helper()
		defer c.Close()
		fmt.Fprintf(c, "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		wantDenied(t, resp, string(b), "builtin:connect")
	}
	tc, err := h.tlsDial("api.example.test", "http/1.1")
	if err != nil {
		t.Fatal(err)
	}
	check(tc)
	h.setDst(dstPlain)
	pc, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	check(pc)
}

func TestPlainHTTP(t *testing.T) {
	h := newHarness(t)
	h.setDst(dstPlain)
	c := h.client(false)
	resp, body := get(t, c, newReq(t, "GET", "http://plain.example.test/hi", nil))
	if resp.StatusCode != 200 || body != "hello from upstream: GET /hi " {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if s := h.plain.seen(); len(s) != 1 || s[0].Host != "plain.example.test" || len(s[0].XFF) != 0 {
		t.Errorf("upstream saw %+v", s)
	}
	// Host header for another name.
	req := newReq(t, "GET", "http://plain.example.test/hi", nil)
	req.Host = "api.example.test"
	resp, body = get(t, c, req)
	wantDenied(t, resp, body, "builtin:domain-fronting")

	// Absolute-form request URI for another host.
	raw, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	fmt.Fprintf(raw, "GET http://evil.test/ HTTP/1.1\r\nHost: plain.example.test\r\n\r\n")
	resp, err = http.ReadResponse(bufio.NewReader(raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	wantDenied(t, resp, string(b), "builtin:domain-fronting")

	// Policy denial.
	resp, body = get(t, c, newReq(t, "GET", "http://plain.example.test/admin", nil))
	wantDenied(t, resp, body, "deny-admin")

	// A literal IP destination.
	h.setDst(netip.MustParseAddrPort("169.254.169.254:80"))
	resp, body = get(t, h.client(false), newReq(t, "GET", "http://169.254.169.254/latest/meta-data/", nil))
	wantDenied(t, resp, body, "builtin:literal-ip")
	if n := len(h.plain.seen()); n != 1 {
		t.Errorf("upstream saw %d requests, want 1", n)
	}
}

func TestSSEStreamsUnbuffered(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			h := newHarness(t)
			resp, err := h.client(h2).Get("https://api.example.test/sse")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			first := make(chan string, 1)
			go func() {
				line, _ := br.ReadString('\n')
				first <- line
			}()
			select {
			case line := <-first:
				if line != "data: one\n" {
					t.Fatalf("first line %q", line)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("first event not delivered before the upstream finished: buffered")
			}
			close(h.release)
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "\ndata: two\n\n" {
				t.Fatalf("rest %q, %v", rest, err)
			}
		})
	}
}

func TestRedirectPassedThrough(t *testing.T) {
	h := newHarness(t)
	resp, _ := get(t, h.client(true), newReq(t, "GET", "https://api.example.test/redirect", nil))
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/target" {
		t.Fatalf("status %d location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, s := range h.api.seen() {
		if s.Path == "/target" {
			t.Error("proxy followed the redirect")
		}
	}
}

func TestDoHRefused(t *testing.T) {
	h := newHarness(t)
	for _, h2 := range []bool{false, true} {
		req := newReq(t, "POST", "https://api.example.test/dns-query", strings.NewReader("\x00\x00"))
		req.Header.Set("Content-Type", "application/dns-message")
		resp, body := get(t, h.client(h2), req)
		wantDenied(t, resp, body, "deny-doh")
		req = newReq(t, "GET", "https://api.example.test/dns-query?dns=AAAB", nil)
		req.Header.Set("Accept", "application/dns-message")
		resp, body = get(t, h.client(h2), req)
		wantDenied(t, resp, body, "deny-doh")
	}
	if n := len(h.api.seen()); n != 0 {
		t.Errorf("upstream saw %d requests", n)
	}
}

func TestUpstreamBadCertificate(t *testing.T) {
	h := newHarness(t)
	h.setDst(dstBad)
	resp, body := get(t, h.client(false), newReq(t, "GET", "https://bad.example.test/", nil))
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	var d map[string]string
	json.Unmarshal([]byte(body), &d)
	if d["error"] != "upstream refused: certificate verification failed" {
		t.Errorf("body %q", body)
	}
	ev := h.waitEvents(1)
	if len(ev) != 1 || ev[0].Verdict != "error" || ev[0].Status != 502 {
		t.Errorf("events %+v", ev)
	}
}

func TestUpstreamRefusedByGuard(t *testing.T) {
	// No override for plain.example.test:80 here and the name resolves to
	// loopback: the guard refuses.
	h := newHarness(t, func(c *Config) { delete(c.Resolve, "plain.example.test:80") })
	h.p.guard.Lookup = func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	h.setDst(dstPlain)
	resp, body := get(t, h.client(false), newReq(t, "GET", "http://plain.example.test/", nil))
	if resp.StatusCode != 502 || !strings.Contains(body, `"upstream refused: resolves to a loopback address"`) {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if strings.Contains(body, "127.0.0.1") {
		t.Errorf("body leaks the address: %q", body)
	}
}

func TestRawTCP(t *testing.T) {
	h := newHarness(t)
	h.setDst(dstTCP)
	exchange := func() (string, error) {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		msg := "\x00\x00\x00\x08\x04\xd2\x16\x2fhello"
		if _, err := io.WriteString(c, msg); err != nil {
			return "", err
		}
		c.(*net.TCPConn).CloseWrite()
		b, err := io.ReadAll(c)
		return string(b), err
	}
	// Denied by default: closed without a byte.
	if got, _ := exchange(); got != "" {
		t.Fatalf("denied flow echoed %q", got)
	}
	h.setPolicy(func(_ context.Context, r *Request) (Decision, error) {
		if r.Protocol == "tcp" && r.Host == "tcp.example.test" && r.Port == 5432 {
			return Decision{Allow: true, Rule: "allow-pg"}, nil
		}
		return Decision{Rule: "default-deny"}, nil
	})
	got, err := exchange()
	if err != nil || got != "\x00\x00\x00\x08\x04\xd2\x16\x2fhello" {
		t.Fatalf("allowed flow: %q, %v", got, err)
	}
	// Allowed name, other port.
	h.setDst(netip.AddrPortFrom(dstTCP.Addr(), 6000))
	if got, _ := exchange(); got != "" {
		t.Fatalf("other port echoed %q", got)
	}
	// Literal IP.
	h.setDst(netip.MustParseAddrPort("127.0.0.1:5432"))
	if got, _ := exchange(); got != "" {
		t.Fatalf("literal IP echoed %q", got)
	}
	// Events are emitted when each flow ends, so their order may vary.
	ev := h.waitEvents(4)
	if len(ev) != 4 {
		t.Fatalf("events %+v", ev)
	}
	var lines []string
	for _, e := range ev {
		if e.Protocol != "tcp" {
			t.Errorf("event %+v", e)
		}
		lines = append(lines, fmt.Sprintf("%s %s %s:%d up=%d down=%d", e.Verdict, e.Rule, e.Host, e.Port, e.BytesUp, e.BytesDown))
	}
	sort.Strings(lines)
	want := []string{
		"allow allow-pg tcp.example.test:5432 up=13 down=13",
		"deny builtin:literal-ip :5432 up=0 down=0",
		"deny default-deny tcp.example.test:5432 up=0 down=0",
		"deny default-deny tcp.example.test:6000 up=0 down=0",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

func TestRawTCPServerSpeaksFirst(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.PeekTimeout = 200 * time.Millisecond })
	h.setDst(dstSpeak)
	h.setPolicy(func(_ context.Context, r *Request) (Decision, error) {
		return Decision{Allow: r.Protocol == "tcp" && r.Host == "smtp.example.test", Rule: "allow-smtp"}, nil
	})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "220 smtp.example.test ready\r\n" {
		t.Fatalf("banner %q, %v", line, err)
	}
}

func TestWebSocket(t *testing.T) {
	h := newHarness(t)
	upgrade := func() (*http.Response, net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := h.tlsDial("api.example.test", "http/1.1")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: api.example.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp, c, br
	}
	resp, c, _ := upgrade()
	b, _ := io.ReadAll(resp.Body)
	wantDenied(t, resp, string(b), "default-deny")
	c.Close()

	h.setPolicy(func(ctx context.Context, r *Request) (Decision, error) {
		if r.WebSocket {
			return Decision{Allow: true, Rule: "allow-ws"}, nil
		}
		return defaultTestPolicy(ctx, r)
	})
	resp, c, br := upgrade()
	defer c.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", resp.StatusCode)
	}
	io.WriteString(c, "ping-frame")
	got := make([]byte, len("ping-frame"))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "ping-frame" {
		t.Fatalf("echo %q, %v", got, err)
	}
	c.Close()
	ev := h.waitEvents(2)
	if len(ev) != 2 || ev[1].Verdict != "allow" || ev[1].Rule != "allow-ws" || ev[1].Status != 101 ||
		ev[1].BytesUp != 10 || ev[1].BytesDown != 10 {
		t.Errorf("events %+v", ev)
	}
}

func TestHookRewritesAndRefuses(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Hook = func(sb *Sandbox, r *http.Request) (*Refusal, ResponseFilter) {
			if r.URL.Path == "/forbidden-by-hook" {
				return &Refusal{Rule: "vault", Reason: "credential revoked"}, nil
			}
			if r.Header.Get("Authorization") == "Bearer cbx_placeholder" {
				r.Header.Set("Authorization", "Bearer real-secret")
			}
			return nil, nil
		}
	})
	req := newReq(t, "GET", "https://api.example.test/x", nil)
	req.Header.Set("Authorization", "Bearer cbx_placeholder")
	resp, _ := get(t, h.client(true), req)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if s := h.api.seen(); len(s) != 1 || s[0].Header.Get("Authorization") != "Bearer real-secret" {
		t.Errorf("upstream saw %+v", s)
	}
	resp, body := get(t, h.client(true), newReq(t, "GET", "https://api.example.test/forbidden-by-hook", nil))
	wantDenied(t, resp, body, "vault")
}

func TestConcurrent(t *testing.T) {
	h := newHarness(t)
	for _, h2 := range []bool{false, true} {
		c := h.client(h2)
		var wg sync.WaitGroup
		errs := make(chan error, 50)
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				path := fmt.Sprintf("/item/%d", i)
				if i%5 == 0 {
					path = "/admin/" + path
				}
				resp, err := c.Get("https://api.example.test" + path)
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				want := 200
				if i%5 == 0 {
					want = 403
				}
				if resp.StatusCode != want {
					errs <- fmt.Errorf("%s: status %d body %q", path, resp.StatusCode, b)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	ev := h.waitEvents(100)
	if len(ev) != 100 {
		t.Errorf("%d events, want 100", len(ev))
	}
}

func TestCloseStopsServe(t *testing.T) {
	h := newHarness(t)
	// Leave an idle keep-alive connection open; Close must still return.
	if resp, _ := get(t, h.client(false), newReq(t, "GET", "https://api.example.test/", nil)); resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	done := make(chan struct{})
	go func() {
		h.p.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung")
	}
}

func TestDotSegmentsRefused(t *testing.T) {
	h := newHarness(t)
	for _, path := range []string{"/public/../admin", "/public/%2e%2e/admin", "/a/./b", "/x/..", `/public\..\admin`} {
		c, err := h.tlsDial("api.example.test", "http/1.1")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n", path)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		wantDenied(t, resp, string(b), "builtin:path")
	}
	if n := len(h.api.seen()); n != 0 {
		t.Errorf("upstream saw %d requests", n)
	}
}

// TestConnAccountingReleased checks that every kind of flow gives its
// per-sandbox connection slot back when it ends.
func TestConnAccountingReleased(t *testing.T) {
	h := newHarness(t)
	h.setPolicy(func(ctx context.Context, r *Request) (Decision, error) {
		if r.WebSocket || r.Protocol == "tcp" {
			return Decision{Allow: true, Rule: "allow-all"}, nil
		}
		return defaultTestPolicy(ctx, r)
	})
	for _, h2 := range []bool{false, true} {
		c := h.client(h2)
		get(t, c, newReq(t, "GET", "https://api.example.test/", nil))
		c.Transport.(*http.Transport).CloseIdleConnections()
	}
	// WebSocket (hijacked connection).
	c, err := h.tlsDial("api.example.test", "http/1.1")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: api.example.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	c.Close()
	// A refused handshake and a raw flow.
	h.tlsDial("")
	h.setDst(dstTCP)
	if rc, err := net.Dial("tcp", h.addr); err == nil {
		io.WriteString(rc, "\x00raw")
		rc.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.p.mu.Lock()
		n, open, served := h.p.perSandbox["sb-test"], len(h.p.open), len(h.p.served)
		h.p.mu.Unlock()
		if n == 0 && open == 0 && served == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after all clients closed: %d counted, %d open, %d served", n, open, served)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConnLimit(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConnsPerSandbox = 2 })
	var conns []*tls.Conn
	for range 2 {
		c, err := h.tlsDial("api.example.test", "http/1.1")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	if c, err := h.tlsDial("api.example.test", "http/1.1"); err == nil {
		c.Close()
		t.Fatal("third connection accepted over a limit of 2")
	}
	conns[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := h.tlsDial("api.example.test", "http/1.1")
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("slot not released after a connection closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSlowClientNotMisclassified: a ClientHello that arrives after the peek
// timeout is still TLS when raw TCP is not allowed.
func TestSlowClientNotMisclassified(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.PeekTimeout = 50 * time.Millisecond })
	raw, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	time.Sleep(200 * time.Millisecond)
	tc := tls.Client(raw, &tls.Config{ServerName: "api.example.test", RootCAs: h.caPool, NextProtos: []string{"http/1.1"}})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(tc, "GET /slow HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestPolicyPanicRefuses(t *testing.T) {
	h := newHarness(t)
	h.setPolicy(func(_ context.Context, r *Request) (Decision, error) { panic("bug in policy") })
	resp, body := get(t, h.client(false), newReq(t, "GET", "https://api.example.test/", nil))
	wantDenied(t, resp, body, "default")
	if n := len(h.api.seen()); n != 0 {
		t.Errorf("upstream saw %d requests", n)
	}
}

func TestUntrustingSandboxEvent(t *testing.T) {
	h := newHarness(t)
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := tls.Client(c, &tls.Config{ServerName: "api.example.test"}) // system roots only
	if err := tc.Handshake(); err == nil {
		t.Fatal("handshake succeeded without trusting the sandbox CA")
	}
	ev := h.waitEvents(1)
	if len(ev) != 1 || ev[0].Verdict != "error" || ev[0].Host != "api.example.test" {
		t.Errorf("events %+v", ev)
	}
}
