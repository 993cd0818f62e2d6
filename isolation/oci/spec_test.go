package oci

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cagebox/cagebox/isolation"
)

func TestSpecDefaults(t *testing.T) {
	sp := Spec(&isolation.Spec{ID: "x", AgentPath: "/agent", Resources: isolation.Resources{MemoryBytes: 64 << 20, PIDs: 10, CPUs: 0.5}},
		BundleOptions{RootFS: "/r", RunDir: "/run", CgroupsPath: "/cagebox/x"})
	ns := map[specs.LinuxNamespaceType]bool{}
	for _, n := range sp.Linux.Namespaces {
		ns[n.Type] = true
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.MountNamespace, specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace} {
		if !ns[want] {
			t.Errorf("namespace %s missing", want)
		}
	}
	if !sp.Process.NoNewPrivileges {
		t.Error("no_new_privs off")
	}
	for _, set := range [][]string{sp.Process.Capabilities.Bounding, sp.Process.Capabilities.Effective, sp.Process.Capabilities.Permitted} {
		for _, c := range set {
			if c != "CAP_SETUID" && c != "CAP_SETGID" && c != "CAP_SETPCAP" {
				t.Errorf("agent gets capability %s", c)
			}
		}
	}
	if len(sp.Process.Capabilities.Inheritable) > 0 || len(sp.Process.Capabilities.Ambient) > 0 {
		t.Error("inheritable or ambient capabilities set")
	}
	r := sp.Linux.Resources
	if *r.Memory.Limit != 64<<20 || *r.Memory.Swap != 64<<20 || *r.Pids.Limit != 10 || *r.CPU.Quota != 50000 {
		t.Errorf("limits: mem %d swap %d pids %d quota %d", *r.Memory.Limit, *r.Memory.Swap, *r.Pids.Limit, *r.CPU.Quota)
	}
	if sp.Linux.CgroupsPath != "/cagebox/x" {
		t.Error("cgroups path")
	}
}

func TestSeccompCoversEveryABI(t *testing.T) {
	sc := Seccomp()
	arch := map[specs.Arch]bool{}
	for _, a := range sc.Architectures {
		arch[a] = true
	}
	for _, a := range []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32} {
		if !arch[a] {
			t.Errorf("seccomp misses ABI %s: its syscalls would get the default action", a)
		}
	}
	denied := map[string]bool{}
	for _, r := range sc.Syscalls {
		if r.Action == specs.ActErrno && len(r.Args) == 0 {
			for _, n := range r.Names {
				denied[n] = true
			}
		}
	}
	for _, n := range []string{"mount", "ptrace", "bpf", "kexec_load", "keyctl", "init_module", "finit_module", "unshare", "setns", "userfaultfd", "open_by_handle_at", "clone3"} {
		if !denied[n] {
			t.Errorf("%s is not denied", n)
		}
	}
}
