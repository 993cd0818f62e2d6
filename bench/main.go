// Command bench measures cagebox against the baselines the issues name and
// prints the figures side by side, with ratios, in one run:
//
//   - cold create → first exec (p50/p99): cagebox (API → daemon → runtime →
//     agent → `true`) vs a bare `runc run` (or crun) of an equivalent bundle
//     (same image, same seccomp/namespaces/limits) running /bin/true;
//   - exec round trip of `true` in a running sandbox (p50/p99), through the
//     daemon API and directly over the agent protocol;
//   - with -only audit, the cost of syscall audit (audit.go): an
//     exec-heavy workload with and without --audit, per runtime;
//   - with -only cli, the CLI's own cost (cli.go): `cagebox --version` of
//     the CLI beside the full build, and `cagebox run -- true` from a warm
//     pool beside podman, pair by pair;
//   - with -only e2b, the official E2B SDK on the E2B front beside our
//     TypeScript SDK on the same daemon (e2b.go, test/e2b/bench.mjs);
//   - with -only snapshot, the qemu runtime's VM templates (snapshot.go):
//     restore vs cold boot to first exec, memory of many sandboxes, and
//     the template's build time and size.
//
// Run as root: `make bench` (or `go run ./bench -n 30`).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/cgroups"
	"github.com/cagebox/cagebox/internal/daemon"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/container"
	"github.com/cagebox/cagebox/isolation/oci"
)

func main() {
	n := flag.Int("n", 30, "cold starts per side")
	execN := flag.Int("exec", 300, "exec round trips")
	agent := flag.String("agent", "bin/cagebox-agent", "static cagebox-agent binary")
	only := flag.String("only", "", "run only \"runtime\", \"egress\", \"secrets\", \"policy\", \"pool\", \"cli\", \"e2b\", \"snapshot\", \"ingress\" or \"audit\"")
	sustained := flag.Int("sustained", 200, "pool: `cagebox run -- true` back to back per runtime")
	egressDur := flag.Duration("egress-time", 4*time.Second, "egress: load duration per client kind")
	egressConc := flag.Int("egress-conc", 16, "egress: concurrent clients")
	vmN := flag.Int("vm-n", 5, "cold starts per side for the qemu runtime (TCG boots take seconds)")
	runtimes := flag.String("runtimes", "container,gvisor,qemu", "runtimes to measure cold starts of (those available here)")
	snapN := flag.Int("snap-n", 5, "snapshot: cold boots and restores timed per side")
	snapMemN := flag.Int("snap-mem-n", 20, "snapshot: sandboxes running at once per side for the memory comparison")
	e2bN := flag.Int("e2b-n", 15, "e2b: creates timed per SDK (round trips: 10×, writes: 2×)")
	auditRounds := flag.Int("audit-rounds", 3, "audit: workload runs per side per runtime")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (bench daemon included) to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	if *only == "egress" {
		egressBench(*egressDur, *egressConc)
		return
	}
	if *only == "secrets" {
		secretsBench(*egressDur, *egressConc, 200)
		return
	}
	if *only == "policy" {
		policyBench(*egressDur, *egressConc, 250)
		return
	}
	if os.Geteuid() != 0 {
		fail("bench: run as root")
	}
	agentPath, err := filepath.Abs(*agent)
	if err != nil {
		fail(err)
	}
	if _, err := os.Stat(agentPath); err != nil {
		fail(fmt.Errorf("%v: run `make build` first", err))
	}
	if *only == "pool" {
		poolBench(agentPath, *n, *vmN, *sustained, *runtimes)
		return
	}
	if *only == "e2b" {
		e2bBench(agentPath, *e2bN)
		return
	}
	if *only == "cli" {
		cliBench(agentPath, *n)
		return
	}
	if *only == "snapshot" {
		snapshotBench(agentPath, *snapN, *snapMemN)
		return
	}
	if *only == "ingress" {
		ingressBench(agentPath, *execN*10, *egressDur, *egressConc)
		return
	}
	if *only == "audit" {
		auditBench(agentPath, *auditRounds, *runtimes)
		return
	}
	home, err := os.MkdirTemp("", "cbx-bench")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(home)
	cache := &image.Cache{Dir: filepath.Join(home, "images")}
	benchImages, benchAgent = cache.Dir, agentPath
	// VM runtimes boot the kernel setup fetched into $CAGEBOX_HOME/vm.
	machineHome := os.Getenv("CAGEBOX_HOME")
	if machineHome == "" {
		machineHome = "/var/lib/cagebox"
	}
	if _, err := os.Stat(filepath.Join(machineHome, "vm", "kernel")); err == nil {
		if err := os.Symlink(filepath.Join(machineHome, "vm"), filepath.Join(home, "vm")); err != nil {
			fail(err)
		}
	}
	img, err := cache.BuildBusybox(context.Background(), "default")
	if err != nil {
		fail(err)
	}

	stop := runBenchDaemon(daemon.Config{Home: home, AgentPath: agentPath})
	c := client.Unix(client.SocketPath(home))
	rt := container.New(container.Options{StateRoot: filepath.Join(home, "oci")})

	fmt.Printf("cagebox bench — %d CPUs, image busybox (%d KiB)\n\n", numCPU(), img.SizeBytes>>10)

	coldStarts(c, home, img.Path, agentPath, *n, *vmN, *runtimes)

	sb, err := c.Create(context.Background(), &api.CreateSandboxRequest{Runtime: container.Name})
	if err != nil {
		fail(err)
	}
	var viaAPI []time.Duration
	for i := 0; i < *execN; i++ {
		t0 := time.Now()
		res, err := c.Exec(context.Background(), sb.ID, &api.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard)
		if err != nil || *res.ExitCode != 0 {
			fail(fmt.Errorf("exec: %v", err))
		}
		viaAPI = append(viaAPI, time.Since(t0))
	}
	direct := directExec(rt, img.Path, agentPath, home, *execN)
	floor := hostSpawn(*execN)
	fmt.Println("exec round trip of `true` in a running sandbox (n =", *execN, ")")
	fmt.Printf("  %-44s p50 %8s  p99 %8s   (goal p50 ≤ 2 ms)\n", "CLI path: API → daemon → agent", ms(pct(viaAPI, 50)), ms(pct(viaAPI, 99)))
	fmt.Printf("  %-44s p50 %8s  p99 %8s\n", "agent protocol only (host → agent)", ms(pct(direct, 50)), ms(pct(direct, 99)))
	fmt.Printf("  %-44s p50 %8s  p99 %8s   (floor: process spawn on this host)\n", "bare fork+exec+wait of /bin/true on the host", ms(pct(floor, 50)), ms(pct(floor, 99)))
	fmt.Printf("  cagebox added over the bare spawn            p50 %7.2fms\n", float64(pct(viaAPI, 50)-pct(floor, 50))/1e6)
	_ = c.Remove(context.Background(), sb.ID)
	stop()
	_ = cgroups.Remove("/cagebox-bench")
	if *only == "" {
		fmt.Println()
		egressBench(*egressDur, *egressConc)
		secretsBench(*egressDur, *egressConc, 200)
	}
}

// benchImages and benchAgent are the bench daemon's image cache and agent.
var benchImages, benchAgent string

// coldCagebox times create → first exec of `true`, removing the sandbox
// (and waiting for it) after.
func coldCagebox(c *client.Client, runtime string) time.Duration {
	return createExec(c, &api.CreateSandboxRequest{Runtime: runtime}, c.Remove)
}

// bareRun times `<bin> run` of a bundle equivalent to a sandbox's (same
// namespaces, seccomp, limits, mounts; the image root read-only, so without
// cagebox's overlay and agent) whose process is /bin/true. flags go before
// "run" (runsc's platform and network); tweak adjusts the spec.
func bareRun(bin string, flags []string, tweak func(*specs.Spec), rootfs, agentPath, home string) time.Duration {
	dir, err := os.MkdirTemp(home, "bare")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	id := "bare-" + randHex()
	spec := &isolation.Spec{ID: id, AgentPath: agentPath, RootFS: rootfs}
	sp := oci.Spec(spec, oci.BundleOptions{RootFS: rootfs, RunDir: dir, CgroupsPath: "/cagebox-bench/" + id, ReadonlyRoot: true})
	sp.Process.Args = []string{"/bin/true"}
	// The bare bundle has no agent: drop the agent mounts.
	var mounts = sp.Mounts[:0]
	for _, m := range sp.Mounts {
		if m.Destination != oci.GuestAgentPath && m.Destination != oci.GuestRunDir {
			mounts = append(mounts, m)
		}
	}
	sp.Mounts = mounts
	if tweak != nil {
		tweak(sp)
	}
	if err := oci.WriteBundle(dir, sp); err != nil {
		fail(err)
	}
	root := filepath.Join(home, "bare-"+filepath.Base(bin))
	args := append([]string{"--root", root}, flags...)
	args = append(args, "run", "--bundle", dir, id)
	t0 := time.Now()
	cmd := exec.Command(bin, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		fail(fmt.Errorf("bare %s run: %v: %s", filepath.Base(bin), err, out))
	}
	d := time.Since(t0)
	_ = exec.Command(bin, "--root", root, "delete", "--force", id).Run()
	return d
}

func directExec(rt *container.Runtime, rootfs, agentPath, home string, n int) []time.Duration {
	ctx := context.Background()
	id := "direct-" + randHex()
	tok := randHex()
	sb, err := rt.Create(ctx, &isolation.Spec{ID: id, StateDir: filepath.Join(home, "direct", id), RootFS: rootfs, AgentPath: agentPath, AgentToken: tok})
	if err != nil {
		fail(err)
	}
	defer sb.Destroy(ctx)
	if err := sb.Start(ctx); err != nil {
		fail(err)
	}
	conn, err := sb.DialAgent(ctx)
	if err != nil {
		fail(err)
	}
	cl, err := agentproto.NewClient(ctx, conn, tok)
	if err != nil {
		fail(err)
	}
	defer cl.Close()
	var out []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := cl.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard); err != nil {
			fail(err)
		}
		out = append(out, time.Since(t0))
	}
	return out
}

// hostSpawn times a plain fork+exec+wait of /bin/true on the host: the
// floor any exec of a new process pays on this machine.
func hostSpawn(n int) []time.Duration {
	var out []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			fail(err)
		}
		out = append(out, time.Since(t0))
	}
	return out
}

func randHex() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/1e6) }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	n := 0
	for i := 0; i+9 < len(b); i++ {
		if string(b[i:i+9]) == "processor" {
			n++
		}
	}
	return n
}

// onFail registers f to run (last registered first) when the bench
// fails: peers it started (squid, mitmproxy) must not outlive it.
func onFail(f func()) { atFail = append(atFail, f) }

var atFail []func()

func fail(v any) {
	fmt.Fprintln(os.Stderr, "bench:", v)
	for i := len(atFail) - 1; i >= 0; i-- {
		atFail[i]()
	}
	os.Exit(1)
}
