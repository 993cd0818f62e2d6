package gvisor

import (
	"reflect"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/kvm"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/oci"
)

func TestPlatforms(t *testing.T) {
	for _, tc := range []struct {
		name, flags string
		want        []string
	}{
		{"2022", "  -pcap-log string\n    \tlocation of PCAP log file.\n  -platform string\n    \tspecifies which platform to use: ptrace (default), kvm. (default \"ptrace\")\n  -platform_device_path string\n", []string{"kvm", "ptrace"}},
		{"systrap", "  -platform string\n    \tspecifies which platform to use: systrap (default), kvm, ptrace. (default \"systrap\")\n", []string{"kvm", "systrap", "ptrace"}},
		{"unparsable", "nothing here", []string{"ptrace"}},
	} {
		if got := sortedKeys(platforms(tc.flags)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: platforms %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestChoosePlatform(t *testing.T) {
	all := map[string]bool{"kvm": true, "systrap": true, "ptrace": true}
	old := map[string]bool{"kvm": true, "ptrace": true}
	for _, tc := range []struct {
		known map[string]bool
		kvm   bool
		want  string
	}{
		{all, true, "kvm"},
		{all, false, "systrap"},
		{old, true, "kvm"},
		{old, false, "ptrace"},
		{map[string]bool{"ptrace": true}, true, "ptrace"},
	} {
		v := kvm.Verdict{Usable: tc.kvm, Reason: "probe said so", Evidence: "cannot read client sync file"}
		got, why := choosePlatform(tc.known, v)
		if got != tc.want || why == "" {
			t.Errorf("choosePlatform(%v, kvm=%v) = %q (%q), want %q", tc.known, tc.kvm, got, why, tc.want)
		}
		if tc.known["kvm"] && !tc.kvm && !strings.Contains(why, "cannot read client sync file") {
			t.Errorf("a fallback from kvm does not quote the probe: %q", why)
		}
	}
}

func TestParseVersion(t *testing.T) {
	if v := parseVersion("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n"); v != "0.0~20221219.0" {
		t.Errorf("version %q", v)
	}
}

func TestAdjustSpecMovesGuestPIDsLimitIntoTheSentry(t *testing.T) {
	sp := oci.Spec(&isolation.Spec{ID: "x", AgentPath: "/agent", Resources: isolation.Resources{PIDs: 64}},
		oci.BundleOptions{RootFS: "/r", RunDir: "/run", CgroupsPath: "/cagebox/x", AgentListen: "unix:/.cagebox/run/agent.sock"})
	adjustSpec(sp)
	if got := *sp.Linux.Resources.Pids.Limit; got != hostPIDs(64) || got <= 64 {
		t.Errorf("host pids limit %d, want %d", got, hostPIDs(64))
	}
	var nproc uint64
	for _, r := range sp.Process.Rlimits {
		if r.Type == "RLIMIT_NPROC" && r.Hard == r.Soft {
			nproc = r.Hard
		}
	}
	if nproc != 64 {
		t.Errorf("RLIMIT_NPROC %d, want the guest's 64", nproc)
	}
	if sp.Process.Args[2] != "unix:/.cagebox/run/agent.sock" {
		t.Errorf("agent listens on %q", sp.Process.Args[2])
	}
}
