package livepolicy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"

	"github.com/cagebox/cagebox/internal/policy"
)

// Usage is what an LLM API response says it used.
type Usage struct {
	Model         string
	Input, Output int64
}

// maxMeteredJSON bounds how much of a JSON response is kept to read its
// usage; maxSSELine bounds one SSE line. Past them the usage is not read
// (and the response is priced as unreadable: see price).
const (
	maxMeteredJSON = 8 << 20
	maxSSELine     = 1 << 20
)

// usageDoc is the part of an OpenAI or Anthropic response (or streamed
// event) that carries usage: OpenAI's usage.prompt_tokens and
// completion_tokens, Anthropic's (and OpenAI Responses') input_tokens and
// output_tokens; Anthropic's message_start nests them under message.
type usageDoc struct {
	Model string     `json:"model"`
	Usage *usageJSON `json:"usage"`
	// Message is Anthropic's message_start event.
	Message *struct {
		Model string     `json:"model"`
		Usage *usageJSON `json:"usage"`
	} `json:"message"`
	// Response is OpenAI Responses' response.completed event.
	Response *struct {
		Model string     `json:"model"`
		Usage *usageJSON `json:"usage"`
	} `json:"response"`
}

type usageJSON struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
}

// add folds one document into u. Streams report cumulative counts, so
// the larger value wins.
func (u *Usage) add(b []byte) bool {
	var d usageDoc
	if json.Unmarshal(b, &d) != nil {
		return false
	}
	found := false
	take := func(model string, j *usageJSON) {
		if model != "" {
			u.Model = model
		}
		if j == nil {
			return
		}
		found = true
		u.Input = max(u.Input, j.PromptTokens, j.InputTokens)
		u.Output = max(u.Output, j.CompletionTokens, j.OutputTokens)
	}
	take(d.Model, d.Usage)
	if d.Message != nil {
		take(d.Message.Model, d.Message.Usage)
	}
	if d.Response != nil {
		take(d.Response.Model, d.Response.Usage)
	}
	return found
}

func sseData(line []byte) ([]byte, bool) {
	line = bytes.TrimRight(line, "\r")
	d, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return nil, false
	}
	d = bytes.TrimSpace(d)
	if len(d) == 0 || d[0] != '{' {
		return nil, false // "[DONE]" and the like
	}
	return d, true
}

// Price returns the micro-USD u costs under prices: the model's price, or
// the longest model name that prefixes it ("gpt-4o" prices
// "gpt-4o-2024-08-06"). An unknown model is priced at the table's
// highest prices, so a model missing from the table cannot spend for
// free.
func Price(prices map[string]policy.Price, u Usage) int64 {
	p, ok := prices[u.Model]
	if !ok {
		best := ""
		for m, mp := range prices {
			if strings.HasPrefix(u.Model, m) && len(m) > len(best) {
				best, p, ok = m, mp, true
			}
		}
	}
	if !ok {
		for _, mp := range prices {
			p.Input, p.Output = math.Max(p.Input, mp.Input), math.Max(p.Output, mp.Output)
		}
	}
	return int64(math.Ceil(float64(u.Input)*p.Input + float64(u.Output)*p.Output))
}

// Meter reports whether responses to host (decided by rule) count toward
// a spend budget: then the gateway meters them (MeterResponse).
func (s *Sandbox) Meter(host, rule string) bool {
	p := s.live.Current()
	for _, b := range p.Budgets() {
		if b.Spend > 0 && b.Covers(host, rule) {
			return true
		}
	}
	return false
}

// MeterResponse wraps res.Body so that, when the guest has read it (or
// closes it), the usage the response reported is priced and added to the
// spend budgets covering host and rule. It reads the body as it streams
// (SSE is not buffered). A response whose usage cannot be read — a
// compressed or oversized body, or a stream the guest abandoned before the
// usage arrived — exhausts the spend budgets in scope rather than spend
// unmetered.
func (s *Sandbox) MeterResponse(ctx context.Context, res *http.Response, host, rule string) {
	if res.Body == nil || res.Body == http.NoBody {
		return
	}
	enc := res.Header.Get("Content-Encoding")
	m := &meter{rc: res.Body, sse: strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream"),
		unreadable: enc != "" && enc != "identity"}
	m.done = func(u Usage, ok bool) {
		p := s.live.Current()
		var micros int64
		switch {
		case ok:
			micros = Price(p.Prices(), u)
		case m.unreadable || m.over || !m.eof:
			// Unmetered spend is not allowed to pass silently: charge
			// what is left of every spend budget in scope.
			micros = math.MaxInt32
			s.g.log.Warn("LLM response usage could not be read; its spend budget is charged in full", "sandbox", s.ID, "host", host, "encoding", enc)
		default:
			return // no usage in it (an error answer, a models list)
		}
		s.Account(context.WithoutCancel(ctx), host, rule, 0, 0, micros)
	}
	res.Body = m
}

type meter struct {
	rc         io.ReadCloser
	sse        bool
	unreadable bool
	over       bool
	buf        []byte
	usage      Usage
	found      bool
	eof        bool
	done       func(Usage, bool)
	once       sync.Once
}

func (m *meter) Read(p []byte) (int, error) {
	n, err := m.rc.Read(p)
	if n > 0 && !m.unreadable {
		m.feed(p[:n])
	}
	if err == io.EOF {
		m.eof = true
		m.finish()
	}
	return n, err
}

func (m *meter) Close() error {
	m.finish()
	return m.rc.Close()
}

func (m *meter) feed(b []byte) {
	if !m.sse {
		if len(m.buf)+len(b) > maxMeteredJSON {
			m.over, m.buf = true, nil
			return
		}
		if !m.over {
			m.buf = append(m.buf, b...)
		}
		return
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if len(m.buf)+len(b) <= maxSSELine {
				m.buf = append(m.buf, b...)
			} else {
				m.buf = m.buf[:0] // an over-long line is skipped
			}
			return
		}
		line := b[:i]
		if len(m.buf) > 0 {
			line = append(m.buf, line...)
		}
		if d, ok := sseData(line); ok && m.usage.add(d) {
			m.found = true
		}
		m.buf = m.buf[:0]
		b = b[i+1:]
	}
}

func (m *meter) finish() {
	m.once.Do(func() {
		if !m.sse && !m.over && !m.unreadable {
			m.found = m.usage.add(m.buf)
		}
		m.buf = nil
		m.done(m.usage, m.found)
	})
}

// MetersAnyRule reports whether a spend budget is scoped by rule names
// (then which rule decides a request must be known to meter it).
func (s *Sandbox) MetersAnyRule() bool {
	for _, b := range s.live.Current().Budgets() {
		if b.Spend > 0 && len(b.Rules) > 0 {
			return true
		}
	}
	return false
}
