package e2e

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
)

// TestTools: a registered tool runs per execute in a fresh sandbox (from
// the warm pool when one holds its class), with the input on stdin or in
// a file, the credential swapped at the gateway, its egress decisions and
// bounded output in the result, and the sandbox gone afterwards; bad
// tools and inputs get clear errors.
func TestTools(t *testing.T) {
	e := newDebianEnv(t)
	up := newUpstream(t, "api.example.test")
	rt := e2eRuntime()
	e.startDaemon(append(up.daemonArgs("api.example.test"), "--pool", rt+":default=1")...)
	const real = "ghp_R3alT0kenThatMustNeverEnterTheGuest01"
	os.Setenv("CBX_TOOL_TOKEN", real)
	defer os.Unsetenv("CBX_TOOL_TOKEN")
	if r := e.cli("", "secret", "add", "GITHUB_TOKEN", "--host", "api.example.test", "--from-env", "CBX_TOOL_TOKEN"); r.code != 0 {
		t.Fatalf("secret add: %+v", r)
	}
	if r := e.cli("", "tool", "add", "fetch", "--runtime", rt, "--allow", "api.example.test", "--secret", "GITHUB_TOKEN=vault:GITHUB_TOKEN",
		"--timeout", "60s", "--description", "fetches", "--",
		"sh", "-c", `read x; echo "in=$x"; printf %s "$GITHUB_TOKEN" >&2; curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://api.example.test/tool; curl -sS http://203.0.113.7/x >/dev/null 2>&1; exit 3`); r.code != 0 {
		t.Fatalf("tool add: %+v", r)
	}
	e.waitPoolReady(rt+":default", 1)
	n0 := len(up.requests())
	r := e.cli("hello\n", "execute", "fetch", "--json")
	if r.code != 3 {
		t.Fatalf("execute: %+v, want exit 3", r)
	}
	var res api.ExecuteResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("result: %v: %s", err, r.stdout)
	}
	if !strings.HasPrefix(res.Stdout, "in=hello\n") || res.ExitCode != 3 || res.Tool != "fetch" || res.Runtime != rt || !res.Pooled {
		t.Errorf("result %+v", res)
	}
	if res.Stderr == real || !strings.HasPrefix(res.Stderr, "ghp_") {
		t.Errorf("the guest's GITHUB_TOKEN is %q: want a placeholder", res.Stderr)
	}
	if got := up.requests(); len(got) != n0+1 || !strings.Contains(got[len(got)-1], "auth=Bearer "+real) {
		t.Errorf("upstream saw %q: want the real token swapped in", got[n0:])
	}
	var allowed, denied bool
	for _, d := range res.Egress {
		if d.Host == "api.example.test" && d.Allowed && d.Path == "/tool" {
			allowed = true
		}
		if !d.Allowed && d.Rule == "builtin:literal-ip" {
			denied = true
		}
	}
	if !allowed || !denied {
		t.Errorf("egress decisions %+v: want the allowed request and the refused literal IP", res.Egress)
	}
	// The daemon's metrics counted it (Prometheus text over the API).
	met, err := e.client().Metrics(context.Background())
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	for _, want := range []string{
		`cagebox_egress_requests_total{verdict="allow"} `, `cagebox_egress_requests_total{verdict="deny"} `,
		`cagebox_secret_swaps_total 1`, `cagebox_pool_events_total{class="` + rt + `:default",result="hit"} 1`,
		`cagebox_sandbox_create_seconds_count{path="pool",runtime="` + rt + `"} 1`, `cagebox_pool_ready{class="` + rt + `:default"} `,
	} {
		if !strings.Contains(met, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(met, real) || strings.Contains(met, "api.example.test") {
		t.Error("metrics carry a secret or a host name")
	}
	// The sandbox is gone after the execute.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := e.client().Get(context.Background(), res.Sandbox); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s of the execute is still there", res.Sandbox)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Input as a file; output cut at the limit; a time limit.
	for _, add := range [][]string{
		{"wc", "--runtime", rt, "--input-file", "/tmp/in.txt", "--", "wc", "-c", "/tmp/in.txt"},
		{"big", "--runtime", rt, "--", "sh", "-c", "head -c 2000000 /dev/zero | tr '\\0' x"},
		{"slow", "--runtime", rt, "--timeout", "1s", "--", "sleep", "30"},
	} {
		if r := e.cli("", append([]string{"tool", "add"}, add...)...); r.code != 0 {
			t.Fatalf("tool add %s: %+v", add[0], r)
		}
	}
	if r := e.cli("", "execute", "wc", "--input", "12345"); r.code != 0 || !strings.HasPrefix(r.stdout, "5 ") {
		t.Errorf("input file: %+v", r)
	}
	r = e.cli("", "execute", "big", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || !res.StdoutTruncated || len(res.Stdout) != 1<<20 {
		t.Errorf("big output: truncated %v, %d bytes (%v)", res.StdoutTruncated, len(res.Stdout), err)
	}
	r = e.cli("", "execute", "slow", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || !res.TimedOut {
		t.Errorf("slow: %+v %v", res, err)
	}

	if r := e.cli("", "tool", "ls"); !strings.Contains(r.stdout, "fetch") || !strings.Contains(r.stdout, "wc") {
		t.Errorf("tool ls: %+v", r)
	}
	// Errors: unknown tool, an inline secret, a bad name, a duplicate.
	os.Setenv("INLINE", "x-inline-value-1234")
	defer os.Unsetenv("INLINE")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"execute", "nosuch"}, "no tool"},
		{[]string{"tool", "add", "inl", "--secret", "INLINE@api.example.test", "--", "true"}, "stored secrets only"},
		{[]string{"tool", "add", "Bad Name", "--", "true"}, "lowercase"},
		{[]string{"tool", "add", "wc", "--", "true"}, "exists"},
		{[]string{"tool", "add", "nofloor", "--runtime", "container", "--runtime-floor", "hypervisor", "--", "true"}, "runtime"},
	} {
		if r := e.cli("", c.args...); r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: %+v, want an error mentioning %q", c.args, r, c.want)
		}
	}
	if r := e.cli("", "tool", "rm", "wc"); r.code != 0 {
		t.Fatal(r)
	}
	if r := e.cli("", "execute", "wc"); r.code != 125 || !strings.Contains(r.stderr, "no tool") {
		t.Errorf("execute after rm: %+v", r)
	}
}
