package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/container"
	"github.com/cagebox/cagebox/isolation/gvisor"
)

// baseline is a runtime's bare equivalent of a cold start.
type baseline struct {
	label string
	run   func() time.Duration
	n     int
}

// coldStarts prints, per runtime available here, cold create → first exec
// through cagebox beside the bare runtime's start of the same image,
// interleaved so both sides see the same machine state.
func coldStarts(c *client.Client, home, rootfs, agentPath string, n, vmN int, names string) {
	fmt.Println("cold create → first exec, per runtime (busybox image; goal ≤ 1.15x bare)")
	for _, name := range strings.Split(names, ",") {
		rt, ok := isolation.Lookup(name)
		if !ok {
			fmt.Printf("  %-10s not built in\n", name)
			continue
		}
		if err := rt.Available(); err != nil {
			fmt.Printf("  %-10s unavailable here: %v\n", name, err)
			continue
		}
		b, err := bareFor(rt, home, rootfs, agentPath, n, vmN)
		if err != nil {
			fmt.Printf("  %-10s no baseline: %v\n", name, err)
			continue
		}
		// Warm caches on both sides once (a VM runtime builds its disk).
		coldCagebox(c, name)
		b.run()
		var cb, bare []time.Duration
		for i := 0; i < b.n; i++ {
			cb = append(cb, coldCagebox(c, name))
			bare = append(bare, b.run())
		}
		p50c, p99c := pct(cb, 50), pct(cb, 99)
		p50b, p99b := pct(bare, 50), pct(bare, 99)
		fmt.Printf("  %s (%s, n = %d)\n", name, rt.Class(), b.n)
		fmt.Printf("    %-50s p50 %9s  p99 %9s\n", "cagebox (API create + exec true)", ms(p50c), ms(p99c))
		fmt.Printf("    %-50s p50 %9s  p99 %9s\n", b.label, ms(p50b), ms(p99b))
		fmt.Printf("    %-50s p50 %8.2fx  p99 %8.2fx\n", "ratio cagebox/bare", ratio(p50c, p50b), ratio(p99c, p99b))
	}
	fmt.Println()
}

func bareFor(rt isolation.Runtime, home, rootfs, agentPath string, n, vmN int) (*baseline, error) {
	switch r := rt.(type) {
	case *container.Runtime:
		bin := r.Binary()
		return &baseline{
			label: "bare `" + filepath.Base(bin) + " run` of an equivalent bundle",
			n:     n,
			run:   func() time.Duration { return bareRun(bin, nil, nil, rootfs, agentPath, home) },
		}, nil
	case *gvisor.Runtime:
		flags := []string{"--platform=" + r.Platform(), "--network=none", "--overlay2=none", "--oci-seccomp", "--cpu-num-from-quota"}
		// runsc's own threads count against a pids cgroup limit; cagebox
		// moves the guest's limit to RLIMIT_NPROC, and so does the bare run.
		tweak := func(sp *specs.Spec) {
			if sp.Linux != nil && sp.Linux.Resources != nil && sp.Linux.Resources.Pids != nil && sp.Linux.Resources.Pids.Limit != nil {
				lim := uint64(*sp.Linux.Resources.Pids.Limit)
				sp.Linux.Resources.Pids = nil
				sp.Process.Rlimits = append(sp.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: lim, Soft: lim})
			}
		}
		return &baseline{
			label: "bare `runsc run` (" + r.Platform() + ") of the same bundle",
			n:     min(n, 15),
			run:   func() time.Duration { return bareRun("runsc", flags, tweak, rootfs, agentPath, home) },
		}, nil
	}
	return bareVM(rt, n, vmN)
}
