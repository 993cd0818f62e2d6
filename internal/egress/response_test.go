package egress

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/andybalholm/brotli"
	"golang.org/x/net/websocket"

	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/substitute"
)

// Reflecting upstreams: one speaking HTTP/1.1 only (raw status lines,
// WebSocket), one offering HTTP/2.
var (
	dstReflect1 = netip.MustParseAddrPort("198.18.0.21:443")
	dstReflect2 = netip.MustParseAddrPort("198.18.0.22:443")
)

func init() {
	names[dstReflect1.Addr()] = "reflect1.example.test"
	names[dstReflect2.Addr()] = "reflect2.example.test"
}

const reflectReal = "sk_live_R3alV4lueTh4tMustN3verC0meB4ck01"

// reflectHandler hands back what it received in every way an upstream
// might: echo bodies (plain, chunked, gzip, deflate, br), a redirect
// keeping the query, a cookie, a status reason, JSONP, SSE, trailers.
func reflectHandler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	auth := r.Header.Get("Authorization")
	key := r.URL.Query().Get("key")
	var js strings.Builder
	for _, c := range key {
		fmt.Fprintf(&js, `\u%04x`, c)
	}
	echo := fmt.Sprintf("auth=%s\nkey=%s\nquery=%s\nbody=%s\nb64=%s\nbasic=%s\nhex=%s\npct=%s\njson={\"k\":\"%s\"}\n",
		auth, key, r.URL.RawQuery, body, base64.StdEncoding.EncodeToString([]byte(auth)),
		base64.StdEncoding.EncodeToString([]byte("user:"+key)), hex.EncodeToString([]byte(key)),
		strings.ReplaceAll(url.QueryEscape(key), "_", "%5F"), js.String())
	half := len(echo) / 2
	if i := strings.Index(echo, key); i > 0 {
		half = i + 5 // cut inside the value
	}
	flush := func() { http.NewResponseController(w).Flush() }
	switch strings.TrimPrefix(r.URL.Path, "/") {
	case "echo":
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", fmt.Sprint(len(echo)))
		io.WriteString(w, echo)
	case "chunked":
		io.WriteString(w, echo[:half])
		flush()
		io.WriteString(w, echo[half:])
	case "redirect":
		w.Header().Set("Location", "https://"+r.Host+"/next?"+r.URL.RawQuery)
		w.WriteHeader(http.StatusFound)
	case "cookie":
		http.SetCookie(w, &http.Cookie{Name: "sid", Value: base64.RawURLEncoding.EncodeToString([]byte("u:" + key)), Path: "/"})
		w.Header().Set("X-Debug-Auth", auth)
		io.WriteString(w, "ok\n")
	case "jsonp":
		w.Header().Set("Content-Type", "application/javascript")
		fmt.Fprintf(w, "%s({\"key\":\"%s\",\"echo\":%q});", r.URL.Query().Get("callback"), js.String(), auth)
	case "sse":
		w.Header().Set("Content-Type", "text/event-stream")
		for range 3 {
			fmt.Fprintf(w, "data: {\"key\":\"%s\"}\n\n", key)
			flush()
		}
	case "trailer":
		w.Header().Set("Trailer", "X-Echo")
		io.WriteString(w, "see trailer\n")
		w.Header().Set("X-Echo", auth)
	case "gzip", "deflate", "br":
		enc := strings.TrimPrefix(r.URL.Path, "/")
		w.Header().Set("Content-Encoding", enc)
		var zw interface {
			io.WriteCloser
			Flush() error
		}
		switch enc {
		case "gzip":
			zw = gzip.NewWriter(w)
		case "deflate":
			zw, _ = flate.NewWriter(w, 5)
		default:
			zw = brotli.NewWriter(w)
		}
		io.WriteString(zw, echo[:half])
		zw.Flush()
		flush()
		io.WriteString(zw, echo[half:])
		zw.Close()
	case "big":
		w.Write(bigBody)
	case "biggz":
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(bigGzip)
	case "bigsse":
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range bigEvents {
			w.Write(ev)
			flush()
		}
	case "zstd":
		w.Header().Set("Content-Encoding", "zstd")
		io.WriteString(w, "(\xb5/\xfd"+key)
	case "status":
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, "status needs HTTP/1.1", 500)
			return
		}
		defer c.Close()
		fmt.Fprintf(brw, "HTTP/1.1 401 Bad key %s\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno", key)
		brw.Flush()
	default:
		http.NotFound(w, r)
	}
}

// Bench payloads: 1 MiB of JSON lines reflecting the real value every
// 64 KiB (also gzip'd), and 1024 SSE events of 1 KiB.
var bigBody, bigGzip, bigEvents = func() ([]byte, []byte, [][]byte) {
	var b bytes.Buffer
	for b.Len() < 1<<20 {
		if b.Len()%(64<<10) < 100 {
			fmt.Fprintf(&b, `{"echo":"Bearer %s"}`+"\n", reflectReal)
		}
		fmt.Fprintf(&b, `{"id":%d,"name":"item-%d","tags":["alpha","beta"],"url":"https:\/\/example.test\/items\/%d?x=1%%20y"}`+"\n", b.Len(), b.Len(), b.Len())
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(b.Bytes())
	zw.Close()
	var evs [][]byte
	for i := range 1024 {
		ev := fmt.Sprintf("data: {\"n\":%d,\"text\":\"%s\"}\n\n", i, strings.Repeat("token ", 160))
		if i%64 == 0 {
			ev = fmt.Sprintf("data: {\"n\":%d,\"auth\":\"%s\"}\n\n", i, reflectReal)
		}
		evs = append(evs, []byte(ev))
	}
	return b.Bytes(), z.Bytes(), evs
}()

// wsReflect says what the upgrade request carried, then echoes.
var wsReflect = websocket.Server{Handler: func(ws *websocket.Conn) {
	websocket.Message.Send(ws, "auth="+ws.Request().Header.Get("Authorization")+" ext="+ws.Request().Header.Get("Sec-WebSocket-Extensions"))
	websocket.Message.Send(ws, []byte("bin:"+base64.StdEncoding.EncodeToString([]byte(ws.Request().Header.Get("Authorization")))))
	for {
		var m string
		if err := websocket.Message.Receive(ws, &m); err != nil {
			return
		}
		websocket.Message.Send(ws, "echo:"+m)
	}
}}

// reflectLeaks lists the forms of real in text: raw, percent-, JSON- or
// hex-encoded, base64 at any alignment.
func reflectLeaks(text, real string) []string {
	var out []string
	dec := text
	for range 2 {
		if d, err := url.PathUnescape(strings.ReplaceAll(dec, "+", "%2B")); err == nil {
			dec = d
		}
	}
	var js strings.Builder
	for _, c := range real {
		fmt.Fprintf(&js, `\u%04x`, c)
	}
	hx := hex.EncodeToString([]byte(real))
	for name, found := range map[string]bool{
		"raw":     strings.Contains(text, real),
		"percent": strings.Contains(dec, real),
		"json":    strings.Contains(strings.ToLower(text), js.String()),
		"hex":     strings.Contains(strings.ToLower(text), hx),
	} {
		if found {
			out = append(out, name)
		}
	}
	for k := range 3 {
		buf := append(bytes.Repeat([]byte{0}, k), real...)
		for _, e := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			s := e.EncodeToString(buf)
			core := s[(8*k+5)/6 : 8*(k+len(real))/6]
			if strings.Contains(text, core) {
				out = append(out, fmt.Sprintf("base64@%d", k))
			}
		}
	}
	return out
}

type scrubHarness struct {
	*harness
	ph string
	// off: the hook swaps but returns no response filter (the path
	// without scrubbing, for benchmarks).
	off atomic.Bool
	mu  sync.Mutex
	// events are the secret.reflected / secret.alert the hook's filter
	// raised, as "kind where encoding".
	events []string
	seenUp []http.Header
}

func (s *scrubHarness) add(e string) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

func (s *scrubHarness) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.events
	s.events = nil
	return e
}

// newScrubHarness runs the proxy with the gateway's credential hook: the
// request is substituted by substitute.Set and the response filtered by
// credentials.Scrub, as internal/gateway wires them.
func newScrubHarness(t testing.TB) *scrubHarness {
	t.Helper()
	ph, err := substitute.NewPlaceholder([]byte(reflectReal))
	if err != nil {
		t.Fatal(err)
	}
	set, err := substitute.NewSet(&substitute.Binding{
		Name: "API_KEY", Placeholder: ph, Hosts: []string{"reflect1.example.test", "reflect2.example.test"},
		Query: []string{"key"}, Body: true,
		Real: func(string) ([]byte, error) { return []byte(reflectReal), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &scrubHarness{ph: ph}
	ca := newTestCA(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/", reflectHandler)
	mux.Handle("/ws", wsReflect)
	h1 := httptest.NewUnstartedServer(mux)
	h1.TLS = &tls.Config{Certificates: []tls.Certificate{ca.issue(t, "reflect1.example.test")}, NextProtos: []string{"http/1.1"}}
	h1.StartTLS()
	t.Cleanup(h1.Close)
	h2 := newUpstream(t, ca.issue(t, "reflect2.example.test"), mux)
	hook := func(sb *Sandbox, r *http.Request) (*Refusal, ResponseFilter) {
		s.mu.Lock()
		s.seenUp = append(s.seenUp, r.Header)
		s.mu.Unlock()
		reals := &credentials.Reals{}
		res, err := set.ApplyReport(r, r.Host, r.TLS != nil, func(name, real, ph string) {
			reals.Add(credentials.Swap{Name: name, Real: real, Placeholder: ph})
		})
		if err != nil {
			return &Refusal{Rule: "secret", Reason: err.Error()}, nil
		}
		if res.Refusal != nil {
			return &Refusal{Rule: res.Refusal.Rule, Reason: res.Refusal.Reason}, nil
		}
		if res.Streaming {
			reals.SetPending()
		}
		if s.off.Load() {
			return nil, nil
		}
		// What credentials.Pipeline does to a request to a bound host.
		r.Header.Del("Sec-WebSocket-Extensions")
		credentials.NarrowAcceptEncoding(r)
		sc := &credentials.Scrub{
			Reals: reals, Placeholder: set.Contains, PlaceholderWindow: set.Window(),
			OnReflect: func(ref credentials.Reflection) { s.add("secret.reflected " + ref.Where + " " + ref.Encoding) },
			OnAlert:   func(a credentials.Alert) { s.add("secret.alert " + a.Name) },
		}
		return nil, sc.Filter
	}
	s.harness = newHarness(t, func(c *Config) {
		c.Hook = hook
		c.Resolve["reflect1.example.test:443"] = addrPort(t, h1.Listener.Addr())
		c.Resolve["reflect2.example.test:443"] = addrPort(t, h2.Listener.Addr())
		c.UpstreamCAs.AddCert(ca.cert)
	})
	s.setPolicy(func(ctx context.Context, r *Request) (Decision, error) {
		return Decision{Allow: true, Rule: "allow-all"}, nil
	})
	return s
}

// TestResponseScrub: an upstream that reflects the request in every way
// hands the guest its placeholder, never the real value, over HTTP/1.1 and
// HTTP/2 on both sides, and each reflection raises secret.reflected.
func TestResponseScrub(t *testing.T) {
	s := newScrubHarness(t)
	for _, up := range []struct {
		name string
		dst  netip.AddrPort
	}{{"reflect1.example.test", dstReflect1}, {"reflect2.example.test", dstReflect2}} {
		for _, h2 := range []bool{false, true} {
			c := s.client(h2)
			for _, path := range []string{"echo", "chunked", "redirect", "cookie", "jsonp", "sse", "trailer", "gzip", "deflate", "br", "status"} {
				if path == "status" && up.name != "reflect1.example.test" {
					continue
				}
				t.Run(fmt.Sprintf("%s/h2=%v/%s", up.name, h2, path), func(t *testing.T) {
					s.setDst(up.dst)
					req := newReq(t, "POST", "https://"+up.name+"/"+path+"?callback=cb&key="+s.ph, strings.NewReader(`{"body":"`+s.ph+`"}`))
					req.Header.Set("Authorization", "Bearer "+s.ph)
					req.Header.Set("Accept-Encoding", "gzip, deflate, br, zstd")
					resp, err := c.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					raw, err := io.ReadAll(resp.Body)
					if err != nil {
						t.Fatal(err)
					}
					body := string(raw)
					switch resp.Header.Get("Content-Encoding") {
					case "gzip":
						zr, err := gzip.NewReader(bytes.NewReader(raw))
						if err != nil {
							t.Fatal(err)
						}
						b, err := io.ReadAll(zr)
						if err != nil {
							t.Fatal(err)
						}
						body = string(b)
					case "deflate":
						b, err := io.ReadAll(flate.NewReader(bytes.NewReader(raw)))
						if err != nil {
							t.Fatal(err)
						}
						body = string(b)
					case "br":
						b, err := io.ReadAll(brotli.NewReader(bytes.NewReader(raw)))
						if err != nil {
							t.Fatal(err)
						}
						body = string(b)
					}
					var all strings.Builder
					fmt.Fprintf(&all, "%s\n", resp.Status)
					resp.Header.Write(&all)
					resp.Trailer.Write(&all)
					all.WriteString(body)
					if l := reflectLeaks(all.String(), reflectReal); len(l) > 0 {
						t.Fatalf("the guest got the real value (%v):\n%s", l, all.String())
					}
					// The guest sees its placeholder where the value was
					// reflected (a status reason is never relayed: the
					// proxy writes its own).
					if path != "status" && !strings.Contains(all.String(), s.ph) {
						t.Fatalf("placeholder not in the response:\n%s", all.String())
					}
					ev := s.take()
					if len(ev) == 0 && path != "status" {
						t.Fatalf("no secret.reflected event; response:\n%s", all.String())
					}
					for _, e := range ev {
						if strings.Contains(e, reflectReal) {
							t.Fatal("an event carries the real value")
						}
					}
				})
			}
		}
	}
	// A response encoded in a way the gateway cannot decode is refused.
	s.setDst(dstReflect2)
	req := newReq(t, "GET", "https://reflect2.example.test/zstd?key="+s.ph, nil)
	req.Header.Set("Accept-Encoding", "zstd")
	resp, body := get(t, s.client(true), req)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "zstd") || strings.Contains(body, reflectReal) {
		t.Fatalf("zstd: %d %s", resp.StatusCode, body)
	}
	// The upstream was offered only encodings the gateway decodes.
	s.mu.Lock()
	last := s.seenUp[len(s.seenUp)-1]
	s.mu.Unlock()
	if ae := last.Get("Accept-Encoding"); ae != "identity" {
		t.Errorf("Accept-Encoding upstream %q", ae)
	}
}

// TestWebSocketScrub: after an upgrade on a bound host, the upstream's
// frames carrying the real value reach the guest with the placeholder
// (text and binary, base64 too), permessage-deflate is not offered, and a
// guest frame carrying the placeholder closes the connection with an
// alert.
func TestWebSocketScrub(t *testing.T) {
	s := newScrubHarness(t)
	s.setDst(dstReflect1)
	dial := func() *websocket.Conn {
		t.Helper()
		tc, err := s.tlsDial("reflect1.example.test", "http/1.1")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := websocket.NewConfig("wss://reflect1.example.test/ws", "https://reflect1.example.test/")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Header = http.Header{"Authorization": {"Bearer " + s.ph}, "Sec-Websocket-Extensions": {"permessage-deflate; client_max_window_bits"}}
		tc.SetDeadline(tc.ConnectionState().PeerCertificates[0].NotAfter)
		ws, err := websocket.NewClient(cfg, tc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ws.Close() })
		return ws
	}
	ws := dial()
	var first string
	var second []byte
	if err := websocket.Message.Receive(ws, &first); err != nil {
		t.Fatal(err)
	}
	if err := websocket.Message.Receive(ws, &second); err != nil {
		t.Fatal(err)
	}
	if first != "auth=Bearer "+s.ph+" ext=" {
		t.Fatalf("first frame %q", first)
	}
	if l := reflectLeaks(first+string(second), reflectReal); len(l) > 0 {
		t.Fatalf("frames leak %v: %q %q", l, first, second)
	}
	if string(second) != "bin:"+base64.StdEncoding.EncodeToString([]byte("Bearer "+s.ph)) {
		t.Fatalf("binary frame %q", second)
	}
	// A long message in several frames, echoed.
	long := strings.Repeat("x", 70000)
	if err := websocket.Message.Send(ws, long); err != nil {
		t.Fatal(err)
	}
	var echo string
	if err := websocket.Message.Receive(ws, &echo); err != nil || echo != "echo:"+long {
		t.Fatalf("echo of a 70000-byte message: %d bytes, %v", len(echo), err)
	}
	ev := s.take()
	if len(ev) < 2 || !strings.Contains(strings.Join(ev, ","), "secret.reflected websocket") {
		t.Fatalf("events %v", ev)
	}
	// The guest sends the placeholder (base64) in a frame: closed, alert.
	websocket.Message.Send(ws, "leak "+base64.StdEncoding.EncodeToString([]byte(s.ph)))
	var m string
	if err := websocket.Message.Receive(ws, &m); err == nil {
		t.Fatalf("connection still open; got %q", m)
	}
	if ev := s.take(); len(ev) != 1 || ev[0] != "secret.alert API_KEY" {
		t.Fatalf("events %v", ev)
	}
}

// BenchmarkResponseScrub: a 1 MiB response (identity and gzip) and an SSE
// stream of 1024 events, fetched over HTTP/2 through the proxy by a guest
// whose request carried a credential, with the response scrubbed, beside
// the same requests with the hook swapping but not scrubbing. It reports
// MB/s of the decoded body for both and the ratio.
//
//	go test -run '^$' -bench ResponseScrub -benchtime 2s ./internal/egress
func BenchmarkResponseScrub(b *testing.B) {
	s := newScrubHarness(b)
	s.setDst(dstReflect2)
	c := s.client(true)
	fetch := func(path string) int64 {
		req, _ := http.NewRequest("GET", "https://reflect2.example.test/"+path, nil)
		req.Header.Set("Authorization", "Bearer "+s.ph)
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := c.Transport.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		var body io.Reader = resp.Body
		if resp.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(resp.Body)
			if err != nil {
				b.Fatal(err)
			}
			body = zr
		}
		n, err := io.Copy(io.Discard, body)
		if err != nil || resp.StatusCode != 200 {
			b.Fatal(resp.Status, err)
		}
		return n
	}
	for _, path := range []string{"big", "biggz", "bigsse"} {
		b.Run(path, func(b *testing.B) {
			size := int64(0)
			for _, off := range []bool{true, false} { // warm both paths
				s.off.Store(off)
				size = fetch(path)
			}
			s.take()
			b.SetBytes(size)
			b.ResetTimer()
			for range b.N {
				fetch(path)
			}
			b.StopTimer()
			scrubNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			s.off.Store(true)
			t0 := time.Now()
			for range b.N {
				fetch(path)
			}
			plainNs := float64(time.Since(t0).Nanoseconds()) / float64(b.N)
			s.off.Store(false)
			s.take()
			b.ReportMetric(float64(size)/plainNs*1e3, "plain-MB/s")
			b.ReportMetric(scrubNs/plainNs, "scrub/plain")
		})
	}
}
