package selftest

import (
	"bufio"
	"context"
	"encoding/base64"
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

// TestRunFailsOnLeakedValue: whatever a case checks, output that carries a
// secret's real value (as is, base64 or hex) is a FAIL, and a reflection
// case against an upstream that echoes nothing is n/a, not a pass.
func TestRunFailsOnLeakedValue(t *testing.T) {
	var mu sync.Mutex
	var values []string
	f := &fakeDaemon{answer: func(script string) (string, int) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.Contains(script, "command -v $t"):
			return "python3\ncurl\n", 0
		case strings.Contains(script, "leak-raw"):
			return "BLOCKED\nauth=Bearer " + values[0] + "\n", 0
		case strings.Contains(script, "leak-b64"):
			return "BLOCKED " + base64.StdEncoding.EncodeToString([]byte(values[1])) + "\n", 0
		case strings.Contains(script, "unreflected"):
			return "UNREFLECTED 200\n", 0
		}
		return "BLOCKED\n", 0
	}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	// The fake learns the values from the create request, as a guest whose
	// gateway swapped them in would see them.
	orig := f.answer
	f.answer = func(script string) (string, int) {
		f.mu.Lock()
		if len(values) == 0 && len(f.created) > 0 {
			for _, s := range f.created[0].Secrets {
				values = append(values, s.Value)
			}
		}
		f.mu.Unlock()
		return orig(script)
	}
	cases := []Case{
		{Name: "raw", Category: "x", Attack: "a", Script: "leak-raw"},
		{Name: "b64", Category: "x", Attack: "a", Script: "leak-b64"},
		{Name: "refl", Category: "x", Attack: "a", Script: "unreflected", Check: reflectedOrRefused},
		{Name: "clean", Category: "x", Attack: "a", Script: "true"},
	}
	rep, err := Run(context.Background(), client.TCP(srv.URL, ""), cases, Options{Runtimes: []string{"container"}, Upstream: "up.test"})
	if err != nil {
		t.Fatal(err)
	}
	if len(values) != 2 {
		t.Fatalf("secrets bound with an upstream: %d, want the unbound one and the reflected one", len(values))
	}
	v := rep.Results[0].Verdicts
	for name, want := range map[string]Status{"raw": Fail, "b64": Fail, "refl": NA, "clean": Pass} {
		if v[name].Status != want {
			t.Errorf("%s: %+v, want %s", name, v[name], want)
		}
		if strings.Contains(v[name].Reason, values[0]) || strings.Contains(v[name].Reason, values[1]) {
			t.Errorf("%s: the verdict repeats the secret: %s", name, v[name].Reason)
		}
	}
	if s := f.created[0].Secrets; s[1].Name != ReflectVar || s[1].Hosts[0] != "up.test" {
		t.Errorf("reflected secret binding: %+v", s[1])
	}
}
