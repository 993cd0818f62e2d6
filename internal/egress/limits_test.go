package egress

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// limitBody is the JSON body of a limit refusal.
type limitBody struct {
	Error, Rule, Host, Reason string
}

func wantLimit(t *testing.T, resp *http.Response, body string, status int, rule string) limitBody {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %q", resp.StatusCode, status, body)
	}
	if got := resp.Header.Get("X-Cagebox-Limit"); got != rule {
		t.Errorf("X-Cagebox-Limit = %q, want %q", got, rule)
	}
	var l limitBody
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if l.Error != limitMessage || l.Rule != rule || l.Reason == "" {
		t.Errorf("refusal %+v, want rule %q", l, rule)
	}
	return l
}

// TestInFlightBytesShared: what a sandbox's requests hold in the gateway
// (here a hook buffering whole bodies, as signature verification does) is
// one budget shared by its concurrent requests; over it a request is
// refused with 503 naming the limit, and the budget comes back when
// requests end. Streaming bodies are not held and pass at any size. Before,
// nothing bounded it: each request could buffer up to 64 MiB.
func TestInFlightBytesShared(t *testing.T) {
	holding, release := make(chan struct{}), make(chan struct{})
	h := newHarness(t, func(c *Config) {
		c.MaxInFlightBytesPerSandbox = 1 << 20
		c.Hook = func(sb *Sandbox, r *http.Request) (*Refusal, ResponseFilter) {
			if r.Header.Get("X-Buffer") == "" {
				return nil, nil // stream
			}
			b, err := io.ReadAll(r.Body)
			if err != nil {
				if !errors.Is(err, ErrInFlightLimit) {
					t.Errorf("hook read: %v, want ErrInFlightLimit", err)
				}
				return &Refusal{Rule: "hook", Reason: "could not read the body"}, nil
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			if r.Header.Get("X-Hold") != "" {
				holding <- struct{}{}
				<-release
			}
			return nil, nil
		}
	})
	c := h.client(true)
	post := func(n int, hdr ...string) *http.Request {
		req := newReq(t, "POST", "https://api.example.test/upload", bytes.NewReader(bytes.Repeat([]byte("a"), n)))
		for _, k := range hdr {
			req.Header.Set(k, "1")
		}
		return req
	}
	// A holds 700 KiB; B needs 700 KiB more of the 1 MiB.
	type result struct {
		resp *http.Response
		body string
	}
	aDone := make(chan result, 1)
	go func() {
		resp, err := c.Do(post(700<<10, "X-Buffer", "X-Hold"))
		if err != nil {
			t.Error(err)
			aDone <- result{}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		aDone <- result{resp, string(b)}
	}()
	<-holding
	resp, body := get(t, c, post(700<<10, "X-Buffer"))
	wantLimit(t, resp, body, http.StatusServiceUnavailable, ruleInFlight)
	if resp.Header.Get("Retry-After") == "" {
		t.Error("no Retry-After on a 503")
	}
	close(release)
	if a := <-aDone; a.resp == nil || a.resp.StatusCode != http.StatusOK {
		t.Fatalf("A: %+v", a)
	}
	// The budget is back: the same request now passes.
	if resp, body := get(t, c, post(700<<10, "X-Buffer")); resp.StatusCode != http.StatusOK {
		t.Fatalf("after A ended: %d %q", resp.StatusCode, body)
	}
	// One request over the whole budget is refused on its own.
	resp, body = get(t, c, post(2<<20, "X-Buffer"))
	wantLimit(t, resp, body, http.StatusServiceUnavailable, ruleInFlight)
	// A body that streams through is not held: any size passes.
	if resp, body := get(t, c, post(4<<20)); resp.StatusCode != http.StatusOK || !strings.HasSuffix(body, strings.Repeat("a", 100)) {
		t.Fatalf("streamed 4 MiB: %d", resp.StatusCode)
	}
	// Nothing is left charged once every request has ended.
	h.p.mu.Lock()
	l := h.p.limits["sb-test"]
	h.p.mu.Unlock()
	if l != nil && l.inflight.Load() != 0 {
		t.Errorf("%d bytes still charged", l.inflight.Load())
	}
	var denied int
	for _, ev := range h.takeEvents() {
		if ev.Rule == ruleInFlight {
			denied++
			if ev.Verdict != VerdictDeny {
				t.Errorf("event %+v", ev)
			}
		}
	}
	if denied != 2 {
		t.Errorf("%d in-flight refusals in events, want 2", denied)
	}
}

// TestBodyTimeouts: a sandbox that stops sending a body, or trickles it,
// cannot hold a proxy goroutine (and an upstream request) forever: 408
// naming the limit. Before, the proxy waited for as long as the sandbox
// kept the connection open.
func TestBodyTimeouts(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.BodyIdleTimeout = 300 * time.Millisecond
		c.BodyTimeout = time.Second
	})
	send := func(t *testing.T, trickle bool) (*http.Response, string) {
		c, err := h.tlsDial("api.example.test", "http/1.1")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: 100000\r\n\r\n0123456789")
		stop := make(chan struct{})
		defer close(stop)
		if trickle {
			// Well inside the idle timeout each time, never done.
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
						if _, err := c.Write([]byte("x")); err != nil {
							return
						}
					}
				}
			}()
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	t.Run("stalled", func(t *testing.T) {
		resp, body := send(t, false)
		l := wantLimit(t, resp, body, http.StatusRequestTimeout, ruleBodyTimeout)
		if !strings.Contains(l.Reason, "300ms") {
			t.Errorf("reason %q does not name the limit", l.Reason)
		}
	})
	t.Run("trickled", func(t *testing.T) {
		resp, body := send(t, true)
		l := wantLimit(t, resp, body, http.StatusRequestTimeout, ruleBodyTimeout)
		if !strings.Contains(l.Reason, "1s") {
			t.Errorf("reason %q does not name the limit", l.Reason)
		}
	})
	t.Run("stalled over HTTP/2", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		go pw.Write([]byte("0123456789"))
		req := newReq(t, "POST", "https://api.example.test/upload", pr)
		req.ContentLength = 100000
		resp, body := get(t, h.client(true), req)
		if resp.ProtoMajor != 2 {
			t.Fatalf("proto %s", resp.Proto)
		}
		wantLimit(t, resp, body, http.StatusRequestTimeout, ruleBodyTimeout)
	})
	// A body that arrives in time is not affected, and a long response
	// after it is not cut by a read deadline left behind (the HTTP/1 server
	// reads on in the background once a body has ended). Plain HTTP/1.1 on
	// both sides, so that the body is sent before the response streams.
	h.setDst(dstPlain)
	resp, err := h.client(false).Do(newReq(t, "POST", "http://plain.example.test/sse", strings.NewReader("hello")))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != "data: one\n" {
		t.Fatalf("stream: %q", line)
	}
	time.Sleep(3 * 300 * time.Millisecond) // past the idle timeout, twice over
	close(h.release)
	if rest, err := io.ReadAll(br); err != nil || string(rest) != "\ndata: two\n\n" {
		t.Fatalf("stream cut: %q, %v", rest, err)
	}
}

// TestUpstreamConnCap: a sandbox's open upstream connections are capped; a
// request needing one more waits briefly, then gets a 503 naming the
// limit. Idle connections make room. Before, a sandbox could open as many
// upstream connections as it had requests in flight.
func TestUpstreamConnCap(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.MaxUpstreamConnsPerSandbox = 2
		c.UpstreamConnWait = 300 * time.Millisecond
	})
	h.setDst(dstPlain) // HTTP/1.1 upstream: one connection per request in flight
	c := h.client(false)
	var open []*http.Response
	for range 2 {
		resp, err := c.Get("http://plain.example.test/sse")
		if err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		if line != "data: one\n" {
			t.Fatalf("stream: %q", line)
		}
		open = append(open, resp)
	}
	resp, body := get(t, c, newReq(t, "GET", "http://plain.example.test/x", nil))
	l := wantLimit(t, resp, body, http.StatusServiceUnavailable, ruleUpstreamConns)
	if !strings.Contains(l.Reason, "limit 2") {
		t.Errorf("reason %q does not name the limit", l.Reason)
	}
	close(h.release)
	for _, r := range open {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	// Both connections are idle now, in the pool; another host needs a
	// new one, and gets it.
	h.setDst(dstAPI)
	if resp, body := get(t, h.client(true), newReq(t, "GET", "https://api.example.test/after", nil)); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the streams ended: %d %q", resp.StatusCode, body)
	}
}
