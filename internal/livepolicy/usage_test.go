package livepolicy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/cagebox/cagebox/internal/policy"
)

// ParseUsage reads the usage of a whole JSON body or SSE stream with the
// meter MeterResponse streams a response through.
func ParseUsage(contentType string, body []byte) (Usage, bool) {
	var (
		u     Usage
		found bool
	)
	m := &meter{sse: strings.HasPrefix(contentType, "text/event-stream"), eof: true,
		done: func(mu Usage, ok bool) { u, found = mu, ok }}
	m.feed(body)
	m.finish()
	return u, found
}

func TestParseUsage(t *testing.T) {
	for name, tc := range map[string]struct {
		ct, body string
		want     Usage
	}{
		"openai json": {"application/json", `{"id":"x","model":"gpt-4o-2024-08-06","usage":{"prompt_tokens":1000,"completion_tokens":500,"total_tokens":1500}}`,
			Usage{"gpt-4o-2024-08-06", 1000, 500}},
		"anthropic json": {"application/json", `{"type":"message","model":"claude-sonnet-4","usage":{"input_tokens":200,"output_tokens":30,"cache_read_input_tokens":5}}`,
			Usage{"claude-sonnet-4", 200, 30}},
		"openai sse": {"text/event-stream", "data: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n" +
			"data: {\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n",
			Usage{"gpt-4o", 7, 3}},
		"anthropic sse": {"text/event-stream; charset=utf-8", "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-4\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"x\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
			Usage{"claude-sonnet-4", 25, 15}},
	} {
		t.Run(name, func(t *testing.T) {
			u, ok := ParseUsage(tc.ct, []byte(tc.body))
			if !ok || u != tc.want {
				t.Fatalf("ParseUsage: %+v %v, want %+v", u, ok, tc.want)
			}
			// The streaming meter reads the same, one byte at a time.
			_, s, _, _ := newSandbox(t, "version: 2\nprices: {gpt-4o: {input: 1, output: 1}}\nrules: [{name: r, host: llm.example.com, action: allow}]\nbudgets: [{name: b, spend: 100}]")
			res := &http.Response{Header: http.Header{"Content-Type": {tc.ct}}, Body: io.NopCloser(iotest.OneByteReader(strings.NewReader(tc.body)))}
			s.MeterResponse(context.Background(), res, "llm.example.com", "r")
			if _, err := io.ReadAll(res.Body); err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			want := Price(map[string]policy.Price{"gpt-4o": {Input: 1, Output: 1}}, tc.want)
			if got := s.Usage()[0].Used.SpendMicros; got != want {
				t.Fatalf("metered %d micro-USD, want %d", got, want)
			}
		})
	}
}

func TestPrice(t *testing.T) {
	prices := map[string]policy.Price{"gpt-4o": {Input: 2.5, Output: 10}, "gpt-4o-mini": {Input: 0.15, Output: 0.6}, "claude": {Input: 3, Output: 15}}
	for _, tc := range []struct {
		u    Usage
		want int64
	}{
		{Usage{"gpt-4o", 1000, 1000}, 12500},
		{Usage{"gpt-4o-mini-2024-07-18", 1000000, 0}, 150000}, // the longest prefix wins
		{Usage{"unknown-model", 1000, 1000}, 18000},           // the highest prices
	} {
		if got := Price(prices, tc.u); got != tc.want {
			t.Errorf("%+v: %d, want %d", tc.u, got, tc.want)
		}
	}
}

func TestUnreadableResponseExhaustsSpend(t *testing.T) {
	for name, res := range map[string]*http.Response{
		"compressed":       {Header: http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip"}}, Body: io.NopCloser(strings.NewReader("\x1f\x8b..."))},
		"abandoned stream": {Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(strings.NewReader("data: {\"model\":\"gpt-4o\",\"usage\":null}\n\n" + strings.Repeat("data: {}\n\n", 100)))},
	} {
		t.Run(name, func(t *testing.T) {
			_, s, _, _ := newSandbox(t, "version: 2\nprices: {gpt-4o: {input: 1, output: 1}}\nrules: [{name: r, host: llm.example.com, action: allow}]\nbudgets: [{name: b, spend: 5}]")
			s.MeterResponse(context.Background(), res, "llm.example.com", "r")
			_, _ = res.Body.Read(make([]byte, 10)) // the guest reads a little and gives up
			res.Body.Close()
			if d := decide(t, s, get("llm.example.com", "POST", "/v1/chat")); d.Allow || d.Rule != "budget:b" {
				t.Fatalf("after an unreadable response: %+v", d)
			}
		})
	}
}
