package selftest

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestCasesAreWellFormed(t *testing.T) {
	cs := Cases()
	if len(cs) < 25 {
		t.Fatalf("%d cases, want at least 25", len(cs))
	}
	seen := map[string]bool{}
	for _, c := range cs {
		if c.Name == "" || c.Category == "" || c.Attack == "" || c.Script == "" {
			t.Errorf("incomplete case %+v", c)
		}
		if seen[c.Name] {
			t.Errorf("duplicate case %s", c.Name)
		}
		seen[c.Name] = true
		for _, n := range c.Needs {
			if n != "python3" && n != "curl" && n != "upstream" {
				t.Errorf("%s needs unknown %q", c.Name, n)
			}
		}
		if strings.Contains(c.Script, "{{UPSTREAM}}") != contains(c.Needs, "upstream") {
			t.Errorf("%s: uses {{UPSTREAM}} iff it needs upstream", c.Name)
		}
		if strings.Contains(Expand(c.Script, Env{Upstream: "u.test", Gateway: "10.0.0.1"}), "{{") {
			t.Errorf("%s: placeholder left after Expand", c.Name)
		}
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// Checks can fail: each verdict function flags an output where the attack
// worked, and an output that proves nothing.
func TestChecksCanFail(t *testing.T) {
	for _, tc := range []struct {
		name  string
		check func(Output) error
		out   Output
		pass  bool
	}{
		{"marker blocked", Marker, Output{Stdout: "BLOCKED x\nBLOCKED y\n"}, true},
		{"marker escaped", Marker, Output{Stdout: "BLOCKED x\nESCAPED wrote /proc/sys/kernel/panic\n"}, false},
		{"marker silent", Marker, Output{Stderr: "python3: not found", Exit: 127}, false},
		{"caps zero", zeroCaps, Output{Stdout: "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n"}, true},
		{"caps full", zeroCaps, Output{Stdout: "CapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\n"}, false},
		{"caps missing", zeroCaps, Output{Stdout: ""}, false},
		{"gateway 403", gatewayRefusal("builtin:literal-ip"), Output{Stdout: `{"error":"denied by cagebox egress policy","rule":"builtin:literal-ip"}` + "\n403\n"}, true},
		{"gateway other rule", gatewayRefusal("builtin:literal-ip"), Output{Stdout: `{"error":"denied by cagebox egress policy","rule":"x"}` + "\n403\n"}, false},
		{"upstream 200", gatewayRefusal(""), Output{Stdout: "hello\n200\n"}, false},
		{"foreign 403", gatewayRefusal(""), Output{Stdout: "forbidden\n403\n"}, false},
		{"no connection", gatewayRefusal(""), Output{Stdout: "\n000\n", Exit: 7}, false},
	} {
		err := tc.check(tc.out)
		if (err == nil) != tc.pass {
			t.Errorf("%s: err %v, want pass=%v", tc.name, err, tc.pass)
		}
	}
}

func TestScoreAndTable(t *testing.T) {
	cases := []Case{{Name: "a", Category: "x"}, {Name: "b", Category: "x"}, {Name: "c", Category: "y"}}
	ok := Result{Runtime: "container", Verdicts: map[string]Verdict{
		"a": {Status: Pass}, "b": {Status: Pass}, "c": {Status: NA, Reason: "image default has no curl"}}}
	bad := Result{Runtime: "gvisor", Verdicts: map[string]Verdict{
		"a": {Status: Pass}, "b": {Status: Fail, Reason: "ESCAPED wrote it"}, "c": {Status: Pass}}}
	off := Result{Runtime: "qemu", Skipped: "unavailable: no qemu", Verdicts: map[string]Verdict{
		"a": {Status: NA, Reason: "unavailable: no qemu"}}}
	for _, r := range []*Result{&ok, &bad, &off} {
		r.Score()
	}
	if ok.Passed != 2 || ok.Applicable != 2 || bad.Passed != 2 || bad.Failed != 1 || bad.Applicable != 3 || off.Applicable != 0 {
		t.Fatalf("scores: %+v %+v %+v", ok, bad, off)
	}
	rep := &Report{Cases: cases, Results: []Result{ok, bad, off}}
	if rep.OK() {
		t.Fatal("a report with a FAIL is OK")
	}
	var b bytes.Buffer
	rep.Table(&b)
	out := b.String()
	for _, want := range []string{"CASE", "container", "gvisor", "qemu", "SCORE", "2/2", "2/3", "FAIL b on gvisor: ESCAPED wrote it", "n/a c on container: image default has no curl", "qemu: not run: unavailable: no qemu"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[2], "b ") || !strings.Contains(lines[2], "FAIL") {
		t.Errorf("row b: %q", lines[2])
	}
	b.Reset()
	if err := rep.JSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Results[1].Verdicts["b"].Status != Fail || back.Cases[0].Name != "a" {
		t.Fatalf("json round trip: %+v", back)
	}
	rep.Results = rep.Results[:1]
	if !rep.OK() {
		t.Fatal("a report without FAIL is not OK")
	}
}

func TestOwnKernel(t *testing.T) {
	c := Case{Name: "io-uring", OwnKernel: true}
	worked := Output{Stdout: "ESCAPED io_uring_setup: returned 3 errno 0\n"}
	if v := Judge(c, "namespaces", worked); v.Status != Fail {
		t.Fatalf("shared kernel: %+v", v)
	}
	for _, class := range []string{"app-kernel", "hypervisor"} {
		if v := Judge(c, class, worked); v.Status != NA || !strings.Contains(v.Reason, "returned 3") {
			t.Fatalf("%s: %+v", class, v)
		}
	}
	c.OwnKernel = false
	if v := Judge(c, "hypervisor", worked); v.Status != Fail {
		t.Fatalf("not OwnKernel on hypervisor: %+v", v)
	}
}
