package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/selftest"
)

// knownFindings are FAILs the battery reports today that need a change
// outside the selftest (issue 14's report); the test logs them, and fails
// once one passes so the entry is removed.
var knownFindings = map[string]string{
	"agent-memory/gvisor": "runsc 20221219 does not apply the agent's non-dumpable ptrace check to /proc/1/fd: a guest process resolves the agent's fd links and opens its stdio and pipes (its sockets, the host channel, stay unopenable)",
}

// TestSelftest runs `cagebox selftest` through the real CLI on every
// available runtime, one sandbox each (the Debian image: python3, curl),
// with a loopback HTTPS upstream allowed so the fronting, placeholder and
// non-HTTP cases apply, and asserts every applicable case passes.
func TestSelftest(t *testing.T) {
	e := newDebianEnv(t)
	const name = "selftest.example.test"
	up := newUpstream(t, name)
	// It echoes the credentials it receives: the encoded-placeholder and
	// reflected-secret cases look for a real value in what comes back.
	up.reflect = true
	e.startDaemon(up.daemonArgs(name)...)

	r := e.cli("", "runtimes", "--json")
	var rts []api.Runtime
	if err := json.Unmarshal([]byte(r.stdout), &rts); err != nil {
		t.Fatalf("runtimes --json: %v %+v", err, r)
	}
	args := []string{"selftest", "--json", "--upstream", name}
	var tested []string
	for _, want := range []string{"container", "gvisor", "qemu"} {
		for _, rt := range rts {
			if rt.Name != want {
				continue
			}
			if !rt.Available {
				t.Logf("%s: skipped, unavailable: %s", rt.Name, rt.Reason)
				continue
			}
			args = append(args, "--runtime", rt.Name)
			tested = append(tested, rt.Name)
		}
	}
	if len(tested) == 0 {
		t.Skip("no runtime available")
	}
	start := time.Now()
	r = e.cli("", args...)
	t.Logf("selftest on %v: %s", tested, time.Since(start).Round(time.Second))
	var rep selftest.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("selftest --json: %v\n%+v", err, r)
	}
	var table bytes.Buffer
	rep.Table(&table)
	t.Logf("selftest table:\n%s", table.String())
	if len(rep.Cases) < 25 || len(rep.Results) != len(tested) {
		t.Fatalf("report: %d cases, %d results for %v", len(rep.Cases), len(rep.Results), tested)
	}
	anyFail := false
	for _, res := range rep.Results {
		if res.Skipped != "" {
			t.Errorf("%s: skipped: %s", res.Runtime, res.Skipped)
			continue
		}
		t.Logf("%s: %d/%d (%.0f s)", res.Runtime, res.Passed, res.Applicable, res.Seconds)
		for _, c := range rep.Cases {
			v := res.Verdicts[c.Name]
			key := c.Name + "/" + res.Runtime
			switch {
			case v.Status == selftest.Fail && knownFindings[key] != "":
				anyFail = true
				t.Logf("known finding %s: %s (%s)", key, v.Reason, knownFindings[key])
			case v.Status == selftest.Fail:
				anyFail = true
				t.Errorf("%s: the attack succeeded: %s", key, v.Reason)
			case knownFindings[key] != "":
				t.Errorf("%s is listed as a known finding but is %s now: remove it from knownFindings", key, v.Status)
			case v.Status == selftest.NA && c.Needs != nil && !c.OwnKernel:
				// With the Debian image and an upstream, every case
				// needing a tool or the upstream applies.
				t.Errorf("%s: n/a: %s", key, v.Reason)
			}
		}
	}
	if anyFail != (r.code == 1) {
		t.Errorf("exit code %d with FAILs=%v: %s", r.code, anyFail, r.stderr)
	}
	// Only the encoded-placeholder and reflected-secret cases may reach
	// the upstream (to the allowed name, by the front door); none of what
	// reached it may carry the real value of the credential bound
	// elsewhere (its values start "cbxst"), in any common encoding.
	for _, got := range up.requests() {
		if !strings.Contains(got, " "+name+" /selftest ") {
			t.Errorf("the upstream saw a request no case should have got through: %s", got)
		}
		for _, form := range []string{"cbxst", base64.StdEncoding.EncodeToString([]byte("cbxst"))[:6], hex.EncodeToString([]byte("cbxst"))} {
			if strings.Contains(got, form) {
				t.Errorf("the upstream received the real value of a credential bound to another host (%q): %s", form, got)
			}
		}
	}
	// The table form has a row per case and a score per runtime.
	if r := e.cli("", "selftest", "--runtime", "container", "--image", "busybox"); !strings.Contains(r.stdout, "SCORE") || !strings.Contains(r.stdout, "n/a") || !strings.Contains(r.stdout, "capabilities") {
		t.Errorf("selftest table: %+v", r)
	}
}
