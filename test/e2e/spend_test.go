package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/testpki"
)

// newLLM starts a stand-in LLM API on loopback (HTTPS, a test CA): POST
// /v1/chat/completions answers OpenAI-style usage (1000 prompt + 1000
// completion tokens of gpt-4o), as JSON or, with "stream":true, as SSE with
// the usage in the last chunk; /v1/messages answers Anthropic-style SSE.
func newLLM(t *testing.T, name string) (args []string) {
	t.Helper()
	pki, err := testpki.New(time.Hour, name)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		stream := strings.Contains(string(body), `"stream":true`)
		switch {
		case r.URL.Path == "/v1/messages":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-4\",\"usage\":{\"input_tokens\":1000,\"output_tokens\":1}}}\n\n")
			w.(http.Flusher).Flush()
			fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":1000}}\n\n")
		case stream:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n")
			w.(http.Flusher).Flush()
			fmt.Fprint(w, "data: {\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":1000}}\n\ndata: [DONE]\n\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"model":"gpt-4o-2024-08-06","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1000,"completion_tokens":1000}}`)
		}
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "llm-ca.pem")
	if err := os.WriteFile(ca, pki.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"--upstream-ca", ca, "--resolve", fmt.Sprintf("%s:443=127.0.0.1:%d", name, srv.Listener.Addr().(*net.TCPAddr).Port)}
}

// TestSpendBudget: a spend budget over a stand-in LLM API is charged from
// the usage its JSON and SSE answers report, priced by the policy's table;
// once spent, the next request gets a 403 naming the budget, and the spend
// survives a daemon restart.
func TestSpendBudget(t *testing.T) {
	e := newDebianEnv(t)
	args := newLLM(t, "llm.example.test")
	e.startDaemon(args...)
	pol := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(pol, []byte(`
version: 2
prices:
  gpt-4o: {input: 2.5, output: 10}
  claude-sonnet-4: {input: 3, output: 15}
rules: [{name: llm, host: llm.example.test, action: allow}]
budgets: [{name: llm-spend, hosts: [llm.example.test], spend: 0.04}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.cli("", "create", "--policy", pol)
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	call := func(path, body string) string {
		t.Helper()
		r := e.cli("", "exec", id, "--", "curl", "-sS", "--compressed", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Content-Type: application/json", "-d", body, "https://llm.example.test"+path)
		return r.stdout
	}
	// $0.0125 (JSON), $0.0125 (OpenAI SSE), $0.018 (Anthropic SSE): $0.043 ≥ $0.04.
	for i, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"gpt-4o"}`},
		{"/v1/chat/completions", `{"model":"gpt-4o","stream":true}`},
		{"/v1/messages", `{"model":"claude-sonnet-4","stream":true}`},
	} {
		if code := call(c.path, c.body); code != "200" {
			t.Fatalf("call %d: %s", i, code)
		}
	}
	if r := e.cli("", "exec", id, "--", "curl", "-sS", "-d", "{}", "https://llm.example.test/v1/chat/completions"); !strings.Contains(r.stdout, "budget:llm-spend") {
		t.Fatalf("after the budget is spent: %+v", r)
	}
	us, err := e.client().PolicyUsage(context.Background(), id)
	if err != nil || len(us) != 1 || fmt.Sprintf("%.4f", us[0].Spend) != "0.0430" || !us[0].Exhausted {
		t.Fatalf("usage: %v %+v", err, us)
	}
	e.stopDaemon(9)
	e.startDaemon(args...)
	if code := call("/v1/chat/completions", `{}`); code != "403" {
		t.Fatalf("after a restart: %s", code)
	}
	r = e.cli("", "policy", "usage", id)
	if !strings.Contains(r.stdout, "$0.0430/$0.04") || !strings.Contains(r.stdout, "spent") {
		t.Fatalf("policy usage: %+v", r)
	}
}
