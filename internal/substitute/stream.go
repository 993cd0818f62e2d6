package substitute

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// stream is a request body checked — and, for bindings that opted in,
// substituted — as it is forwarded. It reads no further ahead than its
// reader asks, and holds back only the bytes that could begin a placeholder
// it replaces, so interactive streams keep flowing.
type stream struct {
	src   io.ReadCloser
	out   []byte // processed, not yet returned
	carry []byte // raw bytes held back: they may begin a placeholder to replace
	look  []byte // the last raw bytes already checked, to catch forms split across reads
	off   int64  // raw body bytes consumed, read-ahead included

	host   string
	tls    bool
	enc    func(string) string
	req    *http.Request
	list   []*entry
	allow  []bool
	unb    []string // why a binding its secret no longer lets go to host is not (see Binding.Real)
	onlyCk bool     // a known-length body: check only, never substitute
	report Report

	reals     map[*entry]string
	usedLimit int64 // smallest BodyLimit of a binding substituted so far; 0 for none
	buf       []byte
	err       error
}

func (s *stream) windowSize() int {
	w := 0
	for _, e := range s.list {
		w = max(w, e.pat.window)
	}
	return w
}

func (s *stream) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		if s.buf == nil {
			s.buf = make([]byte, 32<<10)
		}
		n, err := s.src.Read(s.buf)
		if n > 0 {
			s.process(s.buf[:n], false)
		}
		if err != nil && s.err == nil {
			if err == io.EOF {
				s.process(nil, true)
				if s.err == nil {
					s.err = io.EOF
				}
			} else {
				s.err = err
			}
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *stream) Close() error { return s.src.Close() }

func (s *stream) fail(e *entry, reason string, alert bool) {
	s.out, s.carry = nil, nil
	s.err = &RefusalError{Refusal: Refusal{Rule: "secret:" + e.name, Reason: reason}, Alert: alert}
}

func (s *stream) refuseFound(i int, h hit, where string) {
	e := s.list[i]
	if s.unb[i] != "" {
		s.fail(e, fmt.Sprintf("placeholder for %s sent to %s (%s; found %s in %s)", e.name, s.host, s.unb[i], h, where), true)
		return
	}
	if !e.bound(s.host) {
		s.fail(e, fmt.Sprintf("placeholder for %s sent to %s (bound to %s; found %s in %s)", e.name, s.host, e.hostList(), h, where), true)
		return
	}
	s.fail(e, fmt.Sprintf("placeholder for %s sent to %s over plain HTTP (substitution needs intercepted TLS; found %s in %s)", e.name, s.host, h, where), true)
}

func (s *stream) overLimit(e *entry) {
	s.fail(e, fmt.Sprintf("placeholder for %s in a streamed body past its %d-byte substitution limit", e.name, e.bodyLimit), false)
}

func (s *stream) real(e *entry, where string) (string, bool) {
	if v, ok := s.reals[e]; ok {
		return v, true
	}
	real, err := e.b.Real(s.host)
	if errors.Is(err, ErrNotBound) {
		s.fail(e, fmt.Sprintf("placeholder for %s sent to %s (%v; found in %s)", e.name, s.host, err, where), true)
		return "", false
	}
	if err != nil || len(real) == 0 {
		s.fail(e, fmt.Sprintf("secret %s is unavailable (revoked, removed or unreadable); the request was aborted", e.name), false)
		return "", false
	}
	if s.reals == nil {
		s.reals = map[*entry]string{}
	}
	s.reals[e] = string(real)
	if s.report != nil {
		s.report(e.name, string(real), e.ph)
	}
	return string(real), true
}

func (s *stream) process(chunk []byte, eof bool) {
	var repl []*entry
	if len(chunk) > 0 {
		win := append(s.look, chunk...)
		v := newViews(string(win))
		for i, e := range s.list {
			h := e.pat.match(&v)
			switch {
			case h == 0:
			case !s.allow[i]:
				s.refuseFound(i, h, "body")
				return
			case !e.body:
				s.fail(e, bodyPlace(e).reason(e), false)
				return
			case e.body && h&hitLiteral != 0 && s.onlyCk:
				s.overLimit(e)
				return
			}
		}
		s.look = tail(win, s.windowSize())
	}
	if !s.onlyCk {
		for i, e := range s.list {
			if s.allow[i] && e.body {
				repl = append(repl, e)
			}
		}
	}
	if len(repl) == 0 {
		s.out = append(s.out, chunk...)
		s.off += int64(len(chunk))
	} else {
		data := append(s.carry, chunk...)
		start := s.off - int64(len(s.carry)) // body offset of data[0]
		var out []byte
		for {
			idx, e := -1, (*entry)(nil)
			for _, r := range repl {
				if j := bytes.Index(data, []byte(r.ph)); j >= 0 && (idx < 0 || j < idx) {
					idx, e = j, r
				}
			}
			if idx < 0 {
				break
			}
			at := start + int64(idx)
			if at+int64(len(e.ph)) > e.bodyLimit {
				s.overLimit(e)
				return
			}
			real, ok := s.real(e, "body")
			if !ok {
				return
			}
			out = append(out, data[:idx]...)
			out = append(out, s.enc(real)...)
			data = data[idx+len(e.ph):]
			start = at + int64(len(e.ph))
			if s.usedLimit == 0 || e.bodyLimit < s.usedLimit {
				s.usedLimit = e.bodyLimit
			}
		}
		keep := 0
		if !eof {
			keep = partialSuffix(data, repl)
		}
		out = append(out, data[:len(data)-keep]...)
		s.carry = bytes.Clone(data[len(data)-keep:])
		s.out = append(s.out, out...)
		s.off += int64(len(chunk))
		if s.usedLimit > 0 && s.off > s.usedLimit {
			for _, e := range repl {
				if e.bodyLimit == s.usedLimit {
					s.overLimit(e)
					return
				}
			}
		}
	}
	if eof {
		s.trailers()
	}
}

// partialSuffix is the length of the longest end of data that begins one of
// the placeholders.
func partialSuffix(data []byte, repl []*entry) int {
	keep := 0
	for _, e := range repl {
		for k := min(len(e.ph)-1, len(data)); k > keep; k-- {
			if bytes.HasSuffix(data, []byte(e.ph[:k])) {
				keep = k
				break
			}
		}
	}
	return keep
}

// trailers checks, and substitutes in, the trailer values that arrived with
// the end of the body.
func (s *stream) trailers() {
	for k, vs := range s.req.Trailer {
		for j, val := range vs {
			v := newViews(val)
			for i, e := range s.list {
				h := e.pat.match(&v)
				if h == 0 {
					continue
				}
				if !s.allow[i] {
					s.refuseFound(i, h, "a trailer")
					return
				}
				if !e.allowsHeader(k) {
					m := headerPlace(e, k)
					if safeName(k) == "" {
						m = misplaced{where: "a trailer", flag: fmt.Sprintf("add the place with --secret-header %s:NAME", e.name)}
					}
					s.fail(e, m.reason(e), false)
					return
				}
				if h&hitLiteral == 0 {
					continue
				}
				real, ok := s.real(e, "a trailer")
				if !ok {
					return
				}
				if strings.ContainsAny(real, "\r\n\x00") {
					s.fail(e, fmt.Sprintf("secret %s holds characters a header cannot carry (CR, LF or NUL)", e.name), false)
					return
				}
				vs[j] = strings.ReplaceAll(vs[j], e.ph, real)
			}
		}
	}
}
