package oci

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

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

func TestAgentListen(t *testing.T) {
	s := &isolation.Spec{ID: "x", AgentPath: "/agent"}
	if got := Spec(s, BundleOptions{}).Process.Args[2]; got != "fd:3" {
		t.Errorf("default listen %q, want fd:3", got)
	}
	if got := Spec(s, BundleOptions{AgentListen: "unix:/.cagebox/run/agent.sock"}).Process.Args[2]; got != "unix:/.cagebox/run/agent.sock" {
		t.Errorf("listen %q", got)
	}
}

func TestSeccompRefusesDeviceNodes(t *testing.T) {
	found := map[string]map[uint64]bool{}
	for _, r := range Seccomp().Syscalls {
		if r.Action != specs.ActErrno || len(r.Args) != 1 || r.Args[0].Op != specs.OpMaskedEqual || r.Args[0].Value != unix.S_IFMT {
			continue
		}
		for _, n := range r.Names {
			want := map[string]uint{"mknod": 1, "mknodat": 2}
			if idx, ok := want[n]; ok && r.Args[0].Index == idx {
				if found[n] == nil {
					found[n] = map[uint64]bool{}
				}
				found[n][r.Args[0].ValueTwo] = true
			}
		}
	}
	for _, n := range []string{"mknod", "mknodat"} {
		if !found[n][unix.S_IFCHR] || !found[n][unix.S_IFBLK] {
			t.Errorf("%s of character and block devices is not refused: %v", n, found[n])
		}
	}
}
