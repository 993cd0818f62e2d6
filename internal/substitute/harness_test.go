package substitute

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// seen is a request as the upstream received it.
type seen struct {
	Header   http.Header
	RawQuery string
	Query    url.Values
	Body     []byte
	CL       int64
	TE       []string
	Trailer  http.Header
}

// upstream is a loopback HTTP server recording what reaches it.
type upstream struct {
	*httptest.Server
	mu  sync.Mutex
	got []seen
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.ContentLength >= 0 && int64(len(body)) != r.ContentLength {
			http.Error(w, "content-length mismatch", http.StatusBadRequest)
			return
		}
		u.mu.Lock()
		u.got = append(u.got, seen{Header: r.Header.Clone(), RawQuery: r.URL.RawQuery, Query: r.URL.Query(), Body: body, CL: r.ContentLength, TE: r.TransferEncoding, Trailer: r.Trailer.Clone()})
		u.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) last(t *testing.T) seen {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.got) == 0 {
		t.Fatal("upstream saw no request")
	}
	return u.got[len(u.got)-1]
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.got)
}

// proxy stands in for the egress gateway: it takes the guest's request,
// runs Apply as if it arrived for sni over (intercepted) TLS, and forwards
// it to the upstream with a real http.Transport. A refusal is a 403 whose
// JSON body carries the Refusal.
type proxy struct {
	*httptest.Server
	set       *Set
	sni       string
	tls       bool
	det       *Detector
	mu        sync.Mutex
	results   []*Result
	streamErr []*RefusalError
	findings  [][]Finding
}

func newProxy(t *testing.T, set *Set, up *upstream, sni string, tls bool) *proxy {
	p := &proxy{set: set, sni: sni, tls: tls}
	target, _ := url.Parse(up.URL)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.det != nil {
			f, err := p.det.Scan(r, 1<<20, set)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			p.mu.Lock()
			p.findings = append(p.findings, f)
			p.mu.Unlock()
		}
		res, err := set.Apply(r, p.sni, p.tls)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		p.mu.Lock()
		p.results = append(p.results, res)
		p.mu.Unlock()
		if res.Refusal != nil {
			refuse(w, res.Refusal)
			return
		}
		out := r.Clone(r.Context())
		out.RequestURI = ""
		out.Trailer = r.Trailer // filled (and substituted) as the body ends
		out.URL.Scheme, out.URL.Host = target.Scheme, target.Host
		resp, err := tr.RoundTrip(out)
		if err != nil {
			var re *RefusalError
			if errors.As(err, &re) {
				p.mu.Lock()
				p.streamErr = append(p.streamErr, re)
				p.mu.Unlock()
				refuse(w, &re.Refusal)
				return
			}
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(p.Close)
	return p
}

func refuse(w http.ResponseWriter, rf *Refusal) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	json.NewEncoder(w).Encode(rf)
}

func (p *proxy) lastResult(t *testing.T) *Result {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.results) == 0 {
		t.Fatal("no Apply result")
	}
	return p.results[len(p.results)-1]
}

// do sends r through the proxy and returns the status and body.
func do(t *testing.T, r *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// rawChunked sends a chunked POST whose body arrives in the given pieces,
// each flushed on its own after a pause, so the server reads them
// separately, then the trailers.
func rawChunked(t *testing.T, addr, path string, header http.Header, pieces []string, trailer http.Header) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var h bytes.Buffer
	h.WriteString("POST " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n")
	header.Write(&h)
	if len(trailer) > 0 {
		var names []string
		for k := range trailer {
			names = append(names, k)
		}
		h.WriteString("Trailer: " + strings.Join(names, ", ") + "\r\n")
	}
	h.WriteString("\r\n")
	if _, err := c.Write(h.Bytes()); err != nil {
		t.Fatal(err)
	}
	for _, p := range pieces {
		if _, err := c.Write([]byte(strconv.FormatInt(int64(len(p)), 16) + "\r\n" + p + "\r\n")); err != nil {
			break // the proxy may have refused and closed already
		}
		time.Sleep(5 * time.Millisecond)
	}
	var tb bytes.Buffer
	tb.WriteString("0\r\n")
	trailer.Write(&tb)
	tb.WriteString("\r\n")
	c.Write(tb.Bytes())
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
