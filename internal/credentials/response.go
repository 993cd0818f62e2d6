package credentials

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/andybalholm/brotli"
)

// Reflection is a real value found in a response and replaced by its
// placeholder. It never carries the value.
type Reflection struct {
	Name     string // binding name
	Where    string // "status", "header:NAME", "trailer:NAME", "body", "websocket"
	Encoding string // EncRaw, EncPercent, EncJSON, EncHex, EncBase64, EncB64URL (or two joined by "+")
}

// Alert is a guest WebSocket frame carrying one of the sandbox's
// placeholders: the connection is closed.
type Alert struct {
	Name   string
	Reason string
}

// Scrub is the response half of one request: Filter rewrites the response
// before the proxy sends it to the sandbox.
type Scrub struct {
	// Reals are the real values put into the request.
	Reals *Reals
	// Placeholder reports whose placeholder text carries, in any form; it
	// checks guest WebSocket frames. Nil: frames are not checked.
	Placeholder func(text string) (name string, ok bool)
	// PlaceholderWindow is the longest form Placeholder looks for: how far
	// back a placeholder split across frames can begin.
	PlaceholderWindow int
	// OnReflect hears each (name, where, encoding) once per response.
	OnReflect func(Reflection)
	// OnAlert hears a guest frame that carried a placeholder.
	OnAlert func(Alert)
	// MaxFrame bounds a WebSocket frame (and a fragmented message) held
	// for inspection; 0 means DefaultMaxFrame.
	MaxFrame int

	// mu guards seen.
	mu   sync.Mutex
	seen map[Reflection]bool
}

// DefaultMaxFrame is Scrub.MaxFrame's default.
const DefaultMaxFrame = 1 << 20

// DecodableEncodings is what a scrubbed response may be encoded with; the
// request's Accept-Encoding is narrowed to it (see NarrowAcceptEncoding).
var DecodableEncodings = []string{"gzip", "deflate", "br"}

// Error is a response the scrub refuses: the proxy answers 502 with
// Reason. It never carries a value.
type Error struct{ Reason string }

func (e *Error) Error() string { return e.Reason }

// NarrowAcceptEncoding keeps in r's Accept-Encoding only the encodings the
// scrub can decode (identity when none is left).
func NarrowAcceptEncoding(r *http.Request) {
	if vs := r.Header.Values("Accept-Encoding"); len(vs) > 0 {
		var keep []string
		for _, v := range vs {
			for _, part := range strings.Split(v, ",") {
				part = strings.TrimSpace(part)
				coding, _, _ := strings.Cut(part, ";")
				coding = strings.ToLower(strings.TrimSpace(coding))
				if coding == "identity" || coding == "x-gzip" {
					keep = append(keep, part)
					continue
				}
				for _, d := range DecodableEncodings {
					if coding == d {
						keep = append(keep, part)
					}
				}
			}
		}
		if len(keep) == 0 {
			r.Header.Set("Accept-Encoding", "identity")
		} else {
			r.Header.Set("Accept-Encoding", strings.Join(keep, ", "))
		}
	}
}

func (s *Scrub) report(sw *swapInfo, where, enc string) {
	if s.OnReflect == nil {
		return
	}
	ref := Reflection{Name: sw.name, Where: where, Encoding: enc}
	s.mu.Lock()
	if s.seen == nil {
		s.seen = map[Reflection]bool{}
	}
	dup := s.seen[ref]
	s.seen[ref] = true
	s.mu.Unlock()
	if !dup {
		s.OnReflect(ref)
	}
}

func (s *Scrub) hits(m *matcher, where string) func(int, string) {
	return func(sw int, enc string) { s.report(&m.swaps[sw], where, enc) }
}

// Filter rewrites res: status, headers, trailers and body, or for a
// WebSocket upgrade the frames both ways. Its error refuses the response
// (see Error).
func (s *Scrub) Filter(res *http.Response) error {
	swaps, gen, pending := s.Reals.snapshot()
	ws := res.StatusCode == http.StatusSwitchingProtocols
	if len(swaps) == 0 && !pending && !(ws && s.Placeholder != nil) {
		return nil
	}
	m := newMatcher(swaps)
	if !m.empty() {
		res.Status = scrubString(m, res.Status, s.hits(m, "status"))
		s.scrubHeader(m, res.Header, "header:")
	}
	if ws {
		rwc, ok := res.Body.(io.ReadWriteCloser)
		if !ok {
			return &Error{Reason: "WebSocket upgrade without a connection to inspect"}
		}
		res.Body = s.newWSConn(rwc, m)
		return nil
	}
	if !hasBody(res) {
		return nil
	}
	coding, err := contentCoding(res.Header)
	if err != nil {
		return err
	}
	body := res.Body
	sr := &scrubReader{s: s, reals: s.Reals, gen: gen, e: &engine{m: m}}
	sr.e.onHit = s.hits(m, "body")
	var out io.Reader = sr
	switch coding {
	case "":
		sr.src = body
	case "gzip", "x-gzip":
		sr.src = &lazyReader{mk: func() (io.Reader, error) { return gzip.NewReader(body) }}
		out = &encodeReader{src: sr, mk: func(w io.Writer) flushWriter {
			z, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
			return z
		}}
	case "deflate":
		// HTTP's deflate is zlib-wrapped (RFC 9110); some servers send raw
		// DEFLATE. Answer in the form that came.
		var wrapped bool
		sr.src = &lazyReader{mk: func() (io.Reader, error) {
			br := bufio.NewReader(body)
			h, err := br.Peek(2)
			if err != nil && len(h) < 2 {
				return nil, fmt.Errorf("deflate response: %w", err)
			}
			if h[0]&0x0f == 8 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
				wrapped = true
				return zlib.NewReader(br)
			}
			return flate.NewReader(br), nil
		}}
		out = &encodeReader{src: sr, mk: func(w io.Writer) flushWriter {
			if wrapped {
				z, _ := zlib.NewWriterLevel(w, zlib.BestSpeed)
				return z
			}
			z, _ := flate.NewWriter(w, flate.BestSpeed)
			return z
		}}
	case "br":
		sr.src = brotli.NewReader(body)
		out = &encodeReader{src: sr, mk: func(w io.Writer) flushWriter { return brotli.NewWriterLevel(w, 1) }}
	}
	res.Body = &bodyReader{r: out, c: body, eof: func() { s.scrubHeader(sr.e.m, res.Trailer, "trailer:") }}
	res.ContentLength = -1
	res.Header.Del("Content-Length")
	return nil
}

// hasBody reports whether res may carry a body.
func hasBody(res *http.Response) bool {
	if res.Body == nil || res.Body == http.NoBody {
		return false
	}
	if res.Request != nil && res.Request.Method == http.MethodHead {
		return false
	}
	c := res.StatusCode
	return c >= 200 && c != http.StatusNoContent && c != http.StatusNotModified
}

// contentCoding is the one coding the body is in ("" for identity), or an
// Error when the scrub cannot decode it.
func contentCoding(h http.Header) (string, error) {
	var codings []string
	for _, v := range h.Values("Content-Encoding") {
		for _, c := range strings.Split(v, ",") {
			c = strings.ToLower(strings.TrimSpace(c))
			if c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	switch {
	case len(codings) == 0:
		return "", nil
	case len(codings) > 1:
		return "", &Error{Reason: fmt.Sprintf("response to a request that carried a credential is encoded %q; the gateway must scrub it and decodes only one of gzip, deflate or br", strings.Join(codings, ", "))}
	}
	switch c := codings[0]; c {
	case "gzip", "x-gzip", "deflate", "br":
		return c, nil
	default:
		return "", &Error{Reason: fmt.Sprintf("response to a request that carried a credential is encoded %q, which the gateway cannot decode to scrub it (it decodes gzip, deflate and br)", c)}
	}
}

func (s *Scrub) scrubHeader(m *matcher, h http.Header, prefix string) {
	if m.empty() {
		return
	}
	var renamed map[string]string
	for k, vs := range h {
		where := prefix + k
		for i, v := range vs {
			vs[i] = scrubString(m, v, s.hits(m, where))
		}
		if nk := scrubString(m, k, s.hits(m, prefix+"name")); nk != k {
			if renamed == nil {
				renamed = map[string]string{}
			}
			renamed[k] = nk
		}
	}
	for k, nk := range renamed {
		h[nk] = append(h[nk], h[k]...)
		delete(h, k)
	}
}

// scrubReader scrubs a stream as it is read; it holds back no more than
// the longest form of a real value.
type scrubReader struct {
	s     *Scrub
	src   io.Reader
	reals *Reals
	gen   uint64
	e     *engine
	buf   []byte
	err   error
}

func (r *scrubReader) Read(p []byte) (int, error) {
	for {
		if out := r.e.take(r.err != nil); len(out) > 0 {
			n := copy(p, out)
			r.e.consume(n)
			return n, nil
		}
		if r.err != nil {
			return 0, r.err
		}
		if r.buf == nil {
			r.buf = make([]byte, 32<<10)
		}
		n, err := r.src.Read(r.buf)
		if g := r.reals.generation(); g != r.gen {
			// A streamed request body swapped in more values.
			swaps, gen, _ := r.reals.snapshot()
			r.gen = gen
			r.e.m = newMatcher(swaps)
			r.e.onHit = r.s.hits(r.e.m, "body")
		}
		if n > 0 {
			r.e.feed(r.buf[:n], false)
		}
		switch {
		case err == io.EOF:
			r.e.feed(nil, true)
			r.err = io.EOF
		case err != nil:
			// Drop what was held back: it may begin a real value.
			r.e.carry, r.e.out = nil, nil
			r.err = err
		}
	}
}

// lazyReader makes its reader on the first Read, so that a decoder waiting
// for its header never blocks the response headers.
type lazyReader struct {
	mk  func() (io.Reader, error)
	r   io.Reader
	err error
}

func (l *lazyReader) Read(p []byte) (int, error) {
	if l.r == nil && l.err == nil {
		l.r, l.err = l.mk()
		if l.err != nil {
			l.err = fmt.Errorf("decode response to scrub it: %w", l.err)
		}
	}
	if l.err != nil {
		return 0, l.err
	}
	return l.r.Read(p)
}

type flushWriter interface {
	io.WriteCloser
	Flush() error
}

// encodeReader encodes what it reads from src, flushing the encoder after
// every read so that a stream (SSE) is passed on as it comes.
type encodeReader struct {
	src   io.Reader
	mk    func(io.Writer) flushWriter
	w     flushWriter
	buf   bytes.Buffer
	chunk []byte
	err   error
}

func (e *encodeReader) Read(p []byte) (int, error) {
	for e.buf.Len() == 0 {
		if e.err != nil {
			return 0, e.err
		}
		if e.chunk == nil {
			e.chunk = make([]byte, 32<<10)
		}
		n, err := e.src.Read(e.chunk)
		if e.w == nil && (n > 0 || err == io.EOF) {
			e.w = e.mk(&e.buf)
		}
		if n > 0 {
			if _, werr := e.w.Write(e.chunk[:n]); werr != nil {
				return 0, werr
			}
			if ferr := e.w.Flush(); ferr != nil {
				return 0, ferr
			}
		}
		if err == io.EOF {
			if cerr := e.w.Close(); cerr != nil {
				return 0, cerr
			}
			e.err = io.EOF
		} else if err != nil {
			e.err = err
			e.buf.Reset()
		}
	}
	return e.buf.Read(p)
}

// bodyReader is a scrubbed body: it reads r, closes c, and calls eof once
// at the end (trailers are known then).
type bodyReader struct {
	r    io.Reader
	c    io.Closer
	eof  func()
	once sync.Once
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		b.once.Do(b.eof)
	}
	return n, err
}

func (b *bodyReader) Close() error { return b.c.Close() }
