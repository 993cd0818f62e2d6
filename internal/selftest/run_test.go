package selftest

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// fakeDaemon answers the API calls Run makes; exec answers by the script.
type fakeDaemon struct {
	mu      sync.Mutex
	created []api.CreateSandboxRequest
	removed []string
	answer  func(script string) (stdout string, code int)
}

func (f *fakeDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == "GET" && r.URL.Path == "/v1/runtimes":
		_ = json.NewEncoder(w).Encode([]api.Runtime{
			{Name: "container", Class: "namespaces", Available: true},
			{Name: "qemu", Class: "hypervisor", Available: true},
			{Name: "firecracker", Class: "hypervisor", Reason: "no /dev/kvm"},
		})
	case r.Method == "POST" && r.URL.Path == "/v1/sandboxes":
		var req api.CreateSandboxRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.created = append(f.created, req)
		f.mu.Unlock()
		_ = json.NewEncoder(w).Encode(api.Sandbox{ID: "sb-" + req.Runtime})
	case r.Method == "DELETE":
		f.mu.Lock()
		f.removed = append(f.removed, strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"))
		f.mu.Unlock()
	case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/exec"):
		line, _ := bufio.NewReader(r.Body).ReadBytes('\n')
		var req api.ExecRequest
		_ = json.Unmarshal(line, &req)
		out, code := f.answer(req.Argv[len(req.Argv)-1])
		enc := json.NewEncoder(w)
		_ = enc.Encode(api.ExecFrame{Stream: "stdout", Data: []byte(out)})
		_ = enc.Encode(api.ExecFrame{Stream: "exit", ExitCode: &code})
	default:
		http.NotFound(w, r)
	}
}

func TestRunOverTheAPI(t *testing.T) {
	f := &fakeDaemon{answer: func(script string) (string, int) {
		switch {
		case strings.Contains(script, "command -v $t"):
			return "python3\n", 0 // no curl
		case strings.Contains(script, "io_uring_setup"):
			return "ESCAPED io_uring_setup: returned 3 errno 0\n", 0
		case strings.Contains(script, "/proc/sys/kernel/panic"):
			return "ESCAPED wrote /proc/sys/kernel/panic\n", 0
		}
		return "BLOCKED\n", 0
	}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	cases := []Case{
		{Name: "sysctl", Category: "privileged", Attack: "a", Script: "echo > /proc/sys/kernel/panic"},
		{Name: "uring", Category: "kernel", Attack: "a", Script: "io_uring_setup", Needs: []string{"python3"}, OwnKernel: true},
		{Name: "curl", Category: "exfiltration", Attack: "a", Script: "curl", Needs: []string{"curl"}},
		{Name: "front", Category: "exfiltration", Attack: "a", Script: "curl {{UPSTREAM}}", Needs: []string{"python3", "upstream"}},
		{Name: "quiet", Category: "x", Attack: "a", Script: "true"},
	}
	rep, err := Run(context.Background(), client.TCP(srv.URL, ""), cases, Options{Runtimes: []string{"container", "qemu", "firecracker", "nope"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 4 || rep.OK() {
		t.Fatalf("report: %+v", rep)
	}
	byRT := map[string]Result{}
	for _, r := range rep.Results {
		byRT[r.Runtime] = r
	}
	want := map[string]map[string]Status{
		"container": {"sysctl": Fail, "uring": Fail, "curl": NA, "front": NA, "quiet": Pass},
		"qemu":      {"sysctl": Fail, "uring": NA, "curl": NA, "front": NA, "quiet": Pass},
	}
	for rt, m := range want {
		for cs, st := range m {
			if got := byRT[rt].Verdicts[cs]; got.Status != st {
				t.Errorf("%s/%s: %+v, want %s", rt, cs, got, st)
			}
		}
	}
	if r := byRT["container"]; r.Passed != 1 || r.Failed != 2 || r.Applicable != 3 {
		t.Errorf("container score: %+v", r)
	}
	if r := byRT["qemu"]; r.Passed != 1 || r.Failed != 1 || r.Applicable != 2 {
		t.Errorf("qemu score: %+v", r)
	}
	if !strings.Contains(byRT["firecracker"].Skipped, "no /dev/kvm") || byRT["firecracker"].Verdicts["quiet"].Status != NA {
		t.Errorf("firecracker: %+v", byRT["firecracker"])
	}
	if !strings.Contains(byRT["nope"].Skipped, "no such runtime") {
		t.Errorf("unknown runtime: %+v", byRT["nope"])
	}
	if v := byRT["container"].Verdicts["front"]; !strings.Contains(v.Reason, "--upstream") {
		t.Errorf("front n/a reason: %+v", v)
	}
	// One sandbox per available runtime, each removed; the placeholder is
	// bound to the unreachable host only.
	if len(f.created) != 2 || len(f.removed) != 2 || f.created[0].Image != "default" || len(f.created[0].Allow) != 0 {
		t.Fatalf("created %+v removed %v", f.created, f.removed)
	}
	if s := f.created[0].Secrets; len(s) != 1 || s[0].Name != SecretVar || s[0].Hosts[0] != BoundHost {
		t.Fatalf("secret binding: %+v", s)
	}
}
