package credentials

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/resign"
	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/internal/vault/sqlitebackend"
)

// The filter's own cost on a 1 MiB body (identity and gzip: decode, scrub,
// encode) and on an SSE stream, in MB/s of the decoded body. The cost
// beside the same path without scrubbing, through the proxy, is
// BenchmarkResponseScrub in internal/egress.
//
//	go test -run '^$' -bench Scrub -benchtime 2s ./internal/credentials
func BenchmarkScrub(b *testing.B) {
	sw := Swap{Name: "TOKEN", Real: "ghp_R3alT0kenThatMustNeverEnterTheGuest01", Placeholder: "ghp_Pl4ceh0lderThatTheGuestHoldsInstead02"}
	// Text with JSON-ish lines; the real value reflected every 64 KiB.
	var body bytes.Buffer
	for body.Len() < 1<<20 {
		if body.Len()%(64<<10) < 100 {
			fmt.Fprintf(&body, `{"echo":"Bearer %s"}`+"\n", sw.Real)
		}
		fmt.Fprintf(&body, `{"id":%d,"name":"item-%d","tags":["alpha","beta"],"url":"https:\/\/example.test\/items\/%d?x=1%%20y"}`+"\n", body.Len(), body.Len(), body.Len())
	}
	raw := body.Bytes()
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(raw)
	zw.Close()
	gz := zb.Bytes()
	// SSE: 1 KiB events, each read as it comes.
	var events [][]byte
	for i := 0; i < 1024; i++ {
		ev := fmt.Sprintf("data: {\"n\":%d,\"text\":\"%s\"}\n\n", i, strings.Repeat("token ", 160))
		if i%64 == 0 {
			ev = fmt.Sprintf("data: {\"n\":%d,\"auth\":\"%s\"}\n\n", i, sw.Real)
		}
		events = append(events, []byte(ev))
	}
	sseSize := int64(0)
	for _, e := range events {
		sseSize += int64(len(e))
	}

	read := func(filter bool, h http.Header, body io.Reader) {
		res := &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(body), Request: &http.Request{Method: "GET"}, Trailer: http.Header{}}
		if filter {
			s := &Scrub{Reals: &Reals{}, OnReflect: func(Reflection) {}}
			s.Reals.Add(sw)
			if err := s.Filter(res); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := io.Copy(io.Discard, res.Body); err != nil {
			b.Fatal(err)
		}
	}
	cases := []struct {
		name string
		size int64
		run  func(filter bool)
	}{
		{"identity-1MiB", int64(len(raw)), func(f bool) { read(f, http.Header{}, bytes.NewReader(raw)) }},
		{"gzip-1MiB", int64(len(raw)), func(f bool) {
			read(f, http.Header{"Content-Encoding": {"gzip"}}, bytes.NewReader(gz))
		}},
		{"sse-1024-events", sseSize, func(f bool) {
			read(f, http.Header{"Content-Type": {"text/event-stream"}}, &eventReader{events: events})
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(c.size)
			for range b.N {
				c.run(true)
			}
		})
	}
}

// eventReader returns one event per Read, as a streaming upstream does.
type eventReader struct {
	events [][]byte
	i      int
}

func (e *eventReader) Read(p []byte) (int, error) {
	if e.i == len(e.events) {
		return 0, io.EOF
	}
	n := copy(p, e.events[e.i])
	e.i++
	return n, nil
}

// The request half's cost per request with the daemon's vault (SQLite):
// each swap and re-sign opens its value, and the secret's current record
// with it (revocation, hosts), from vault.db.
//
//	go test -run '^$' -bench PipelineRequest -benchtime 2s ./internal/credentials
func BenchmarkPipelineRequest(b *testing.B) {
	be, err := sqlitebackend.Open(filepath.Join(b.TempDir(), "vault.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	key, err := vault.GenerateKey()
	if err != nil {
		b.Fatal(err)
	}
	v := vault.New(be, key)
	ctx := context.Background()
	for name, val := range map[string]string{"GH": ghReal, "AWS": awsRealKey, "HOOK": hmacReal} {
		if _, err := v.Put(ctx, tenant, name, []byte(val), []string{ghHost, otherHost}, ""); err != nil {
			b.Fatal(err)
		}
	}
	bound, env, undo, err := Bind(ctx, v, tenant, sandboxID, []api.SecretBinding{
		{Name: "GH"},
		{Name: "AWS", Mode: ModeSigV4},
		{Name: "HOOK", Mode: ModeHMAC, HMAC: &api.HMACSigning{Algorithm: "sha256", Header: "X-Signature", Prefix: "sha256=", Encoding: "hex", Sign: []string{"method", "path", "body"}}},
	})
	if err != nil {
		undo()
		b.Fatal(err)
	}
	ph := map[string]string{}
	for _, kv := range env {
		k, val, _ := strings.Cut(kv, "=")
		ph[k] = val
	}
	bs, err := Build(v, tenant, bound)
	if err != nil {
		b.Fatal(err)
	}
	p := New(Config{Exfil: ExfilOff}, nil)
	p.Install(bs)
	body := []byte(`{"event":"push"}`)
	at := time.Now().UTC()
	awsPH := resign.AWSCreds{AccessKeyID: ph["AWS_ACCESS_KEY_ID"], SecretAccessKey: ph["AWS_SECRET_ACCESS_KEY"]}
	cases := []struct {
		name string
		req  func() *http.Request
	}{
		{"swap", func() *http.Request {
			r := request("GET", ghHost, "/user", nil)
			r.Header.Set("Authorization", "Bearer "+ph["GH"])
			return r
		}},
		{"sigv4", func() *http.Request {
			r := request("GET", ghHost, "/bucket/key", nil)
			signAWSAt(b, r, awsPH, at)
			return r
		}},
		{"hmac", func() *http.Request {
			r := request("POST", ghHost, "/hook", body)
			r.Header.Set("X-Signature", hmacSign([]byte(ph["HOOK"]), "POST", "/hook", body))
			return r
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				r := c.req()
				b.StartTimer()
				if ref, _ := p.Request(r); ref != nil {
					b.Fatal(ref.Reason)
				}
			}
		})
	}
}
