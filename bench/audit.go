package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/daemon"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/isolation"
)

// auditWorkload is exec-heavy: 2000 execs of /bin/true, one after another.
const auditWorkload = `i=0; while [ $i -lt 2000 ]; do /bin/true; i=$((i+1)); done`

// auditBench measures what syscall audit costs (-only audit): the
// exec-heavy workload in a sandbox without audit and in one with
// `--audit exec,net,file,priv`, per runtime, rounds times each
// (alternating), printing the median seconds and their ratio, and the
// audited sandbox's recorded/dropped counters.
func auditBench(agentPath string, rounds int, names string) {
	home, err := os.MkdirTemp("", "cbx-audit-bench")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(home)
	cache := &image.Cache{Dir: filepath.Join(home, "images")}
	if vm := machineVMDir(); vm != "" {
		if err := os.Symlink(vm, filepath.Join(home, "vm")); err != nil {
			fail(err)
		}
	}
	if _, err := cache.BuildBusybox(context.Background(), "default"); err != nil {
		fail(err)
	}
	daemon.RegisterRuntimes(home)
	stop := startBenchDaemon(home, agentPath, nil)
	defer stop()
	c := client.Unix(client.SocketPath(home))
	fmt.Printf("cagebox syscall audit — %d CPUs, image busybox, workload: sh -c '%s', median of %d\n\n", numCPU(), auditWorkload, rounds)
	fmt.Printf("  %-10s %-20s %9s %10s %7s  %s\n", "runtime", "--audit", "off (s)", "audit (s)", "ratio", "audited sandbox")
	for _, name := range strings.Split(names, ",") {
		rt, ok := isolation.Lookup(name)
		if !ok {
			continue
		}
		if err := rt.Available(); err != nil {
			fmt.Printf("  %-10s unavailable here: %v\n", name, err)
			continue
		}
		auditRuntime(c, name, rounds, []string{"exec", "net", "file", "priv"})
		auditRuntime(c, name, rounds, []string{"exec"})
	}
}

func auditRuntime(c *client.Client, rt string, rounds int, classes []string) {
	ctx := context.Background()
	off, err := c.Create(ctx, &api.CreateSandboxRequest{Runtime: rt})
	if err != nil {
		fail(err)
	}
	defer c.Remove(ctx, off.ID)
	on, err := c.Create(ctx, &api.CreateSandboxRequest{Runtime: rt, Audit: classes})
	if err != nil {
		fmt.Printf("  %-10s audit refused: %v\n", rt, err)
		return
	}
	defer c.Remove(ctx, on.ID)
	var tOff, tOn []time.Duration
	for i := 0; i < rounds; i++ {
		tOff = append(tOff, timeWorkload(c, off.ID))
		tOn = append(tOn, timeWorkload(c, on.ID))
	}
	mOff, mOn := median(tOff), median(tOn)
	sb, err := c.Get(ctx, on.ID)
	if err != nil {
		fail(err)
	}
	note := ""
	if sb.Audit != nil {
		note = fmt.Sprintf("%d recorded, %d dropped", sb.Audit.Recorded, sb.Audit.Dropped)
		if len(sb.Audit.Unrecorded) > 0 {
			note += fmt.Sprintf(" (%s not recorded)", strings.Join(sb.Audit.Unrecorded, ","))
		}
	}
	fmt.Printf("  %-10s %-20s %9.3f %10.3f %6.2fx  %s\n", rt, strings.Join(classes, ","), mOff.Seconds(), mOn.Seconds(), mOn.Seconds()/mOff.Seconds(), note)
}

func timeWorkload(c *client.Client, id string) time.Duration {
	var errb bytes.Buffer
	t0 := time.Now()
	res, err := c.Exec(context.Background(), id, &api.ExecRequest{Argv: []string{"sh", "-c", auditWorkload}, Timeout: "10m"}, nil, io.Discard, &errb)
	d := time.Since(t0)
	if err != nil || res.ExitCode == nil || *res.ExitCode != 0 {
		fail(fmt.Errorf("audit workload in %s: %v: %s", id, err, errb.String()))
	}
	return d
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
