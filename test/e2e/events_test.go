package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
)

// eventsOf returns a sandbox's events through the real CLI.
func (e *env) eventsOf(id string) []api.Event {
	e.t.Helper()
	r := e.cli("", "events", "--json", id)
	if r.code != 0 {
		e.t.Fatalf("events %s: %+v", id, r)
	}
	var out []api.Event
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if line == "" {
			continue
		}
		var ev api.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			e.t.Fatalf("events %s: %q: %v", id, line, err)
		}
		out = append(out, ev)
	}
	return out
}

// dataOf is an event's data as JSON.
func dataOf(ev api.Event) []byte {
	b, _ := json.Marshal(ev.Data)
	return b
}

// waitEvent polls a sandbox's events until ok accepts one (the event path
// is asynchronous); it fails after a minute.
func (e *env) waitEvent(id, what string, ok func(api.Event) bool) api.Event {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		for _, ev := range e.eventsOf(id) {
			if ok(ev) {
				return ev
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no %s among the events of %s", what, id)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestEventFlood: a sandbox flooding the resolver with queries goes over
// its event rate. The daemon keeps answering (exec, DNS) for another
// sandbox, whose events still arrive, and `cagebox events` shows the
// flooder's events.dropped with a count of what was dropped.
func TestEventFlood(t *testing.T) {
	e := newEnv(t)
	e.startDaemon("--event-rate", "20", "--event-burst", "100")
	ctx := context.Background()
	flood, err := e.client().Create(ctx, &api.CreateSandboxRequest{Allow: []string{"api.example.test"}})
	if err != nil {
		t.Fatal(err)
	}
	calm, err := e.client().Create(ctx, &api.CreateSandboxRequest{Allow: []string{"calm.example.test"}})
	if err != nil {
		t.Fatal(err)
	}
	if flood.Network == nil || calm.Network == nil {
		t.Fatalf("sandboxes without network: %+v %+v", flood, calm)
	}

	// The flood: thousands of queries, one nslookup after another (each
	// is an A and an AAAA query, each query an event), from inside.
	const script = `i=0; while [ $i -lt 1500 ]; do nslookup q$i.example.test >/dev/null 2>&1; i=$((i+1)); done; echo flooded`
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	finished := make(chan struct{}) // the flood's exec has returned
	go func() {
		defer close(finished)
		cmd := exec.Command(filepath.Join(binDir, "cagebox"), "--home", e.home, "exec", flood.ID, "--", "sh", "-c", script)
		cmd.Env = append(os.Environ(), "CAGEBOX_AGENT="+filepath.Join(binDir, "cagebox-agent"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		done <- result{out.Bytes(), err}
	}()
	t.Cleanup(func() { <-finished }) // before the daemon stops
	e.waitEvent(flood.ID, "dns.query of the flood", func(ev api.Event) bool { return ev.Kind == "dns.query" })

	// Meanwhile the other sandbox is served, and its events arrive.
	r := e.cli("", "exec", calm.ID, "--", "nslookup", "calm.example.test")
	if r.code != 0 || !strings.Contains(r.stdout, "198.18.") {
		t.Fatalf("nslookup in the calm sandbox during the flood: %+v", r)
	}
	e.waitEvent(calm.ID, "dns.query of calm.example.test", func(ev api.Event) bool {
		return ev.Kind == "dns.query" && strings.Contains(string(dataOf(ev)), `"name":"calm.example.test"`)
	})

	res := <-done
	if res.err != nil || !strings.Contains(string(res.out), "flooded") {
		t.Fatalf("flood: %v: %s", res.err, res.out)
	}
	ev := e.waitEvent(flood.ID, "events.dropped", func(ev api.Event) bool { return ev.Kind == "events.dropped" })
	var d struct {
		Count       int64            `json:"count"`
		Kinds       map[string]int64 `json:"kinds"`
		RateLimited int64            `json:"rate_limited"`
		Window      struct{ From, To time.Time }
	}
	if err := json.Unmarshal(dataOf(ev), &d); err != nil {
		t.Fatal(err)
	}
	if d.Count <= 0 || d.Kinds["dns.query"] <= 0 || d.RateLimited <= 0 || d.Window.From.IsZero() || d.Window.To.Before(d.Window.From) {
		t.Errorf("events.dropped %s: want a count of dropped dns.query over the rate and its window", dataOf(ev))
	}
	for _, ev := range e.eventsOf(calm.ID) {
		if ev.Kind == "events.dropped" {
			t.Errorf("the calm sandbox lost events to the flood: %s", dataOf(ev))
		}
	}
	// The flooder's own lifecycle events have a budget of their own.
	if r := e.cli("", "exec", flood.ID, "--", "true"); r.code != 0 {
		t.Fatalf("exec after the flood: %+v", r)
	}
	e.waitEvent(flood.ID, "sandbox.exec after the flood", func(ev api.Event) bool {
		return ev.Kind == "sandbox.exec" && strings.Contains(string(dataOf(ev)), `"command":"true"`)
	})
}
