package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/daemon"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/isolation"
)

// poolBench measures what warm pools buy, in one run:
//
//   - warm create → first exec per runtime (a pool hit: the pool is
//     refilled between samples) beside the same runtime's cold create and
//     the bare runtime's start of the same bundle;
//   - sustained creates: `cagebox run -- true` back to back through the
//     CLI at pool size 4, with the misses counted;
//   - the whole CLI as a user times it, pair by pair: `cagebox run
//     --runtime container -- true` (pooled) against `podman run --rm
//     --network none` (runc) of the same rootfs imported.
func poolBench(agentPath string, n, vmN, sustained int, names string) {
	home, err := os.MkdirTemp("", "cbx-pool-bench")
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
	img, err := cache.BuildBusybox(context.Background(), "default")
	if err != nil {
		fail(err)
	}
	// The bare VM baseline boots the same image from this cache.
	benchImages, benchAgent = cache.Dir, agentPath
	daemon.RegisterRuntimes(home)
	var rts []string
	for _, name := range strings.Split(names, ",") {
		rt, ok := isolation.Lookup(name)
		if !ok {
			continue
		}
		if err := rt.Available(); err != nil {
			fmt.Printf("  %-10s unavailable here: %v\n", name, err)
			continue
		}
		rts = append(rts, name)
	}
	var targets []pool.Target
	for _, name := range rts {
		targets = append(targets, pool.Target{Class: pool.ClassOf(name, "default", isolation.Resources{}), Size: 4})
	}
	// Cold creates use another size, which no pool holds.
	coldReq := func(rt string) *api.CreateSandboxRequest {
		return &api.CreateSandboxRequest{Runtime: rt, MemoryBytes: 384 << 20}
	}
	stop := startBenchDaemon(home, agentPath, targets)
	defer stop()
	c := client.Unix(client.SocketPath(home))
	fmt.Printf("cagebox warm pools — %d CPUs, image busybox, pool size 4 per runtime\n\n", numCPU())

	fmt.Println("create → first exec of `true` (API; removal off the path), per runtime")
	fmt.Println("  goal: warm p50 ≤ 15 ms, p99 ≤ 40 ms on every runtime")
	for _, name := range rts {
		rt, _ := isolation.Lookup(name)
		k := n
		if rt.Class() == isolation.Hypervisor {
			k = vmN
		}
		class := pool.ClassOf(name, "default", isolation.Resources{}).String()
		var warm, cold []time.Duration
		waitReady(c, class, 4)
		before := poolOf(c, class)
		for i := 0; i < k; i++ {
			waitReady(c, class, 1)
			warm = append(warm, createExec(c, &api.CreateSandboxRequest{Runtime: name}, c.RemoveAsync))
			cold = append(cold, createExec(c, coldReq(name), c.RemoveAsync))
		}
		after := poolOf(c, class)
		b, err := bareFor(rt, home, img.Path, agentPath, k, vmN)
		var bare []time.Duration
		if err == nil {
			b.run()
			for i := 0; i < b.n; i++ {
				bare = append(bare, b.run())
			}
		}
		fmt.Printf("  %s (%s, n = %d; %d hits, %d misses)\n", name, rt.Class(), k, after.Claims-before.Claims, after.Misses-before.Misses)
		fmt.Printf("    %-46s p50 %9s  p99 %9s\n", "warm (pool hit)", ms(pct(warm, 50)), ms(pct(warm, 99)))
		fmt.Printf("    %-46s p50 %9s  p99 %9s\n", "cold (no pool for the size)", ms(pct(cold, 50)), ms(pct(cold, 99)))
		if err == nil {
			fmt.Printf("    %-46s p50 %9s  p99 %9s\n", b.label, ms(pct(bare, 50)), ms(pct(bare, 99)))
		} else {
			fmt.Printf("    %-46s %v\n", "bare", err)
		}
		fmt.Printf("    %-46s p50 %8.2fx  p99 %8.2fx\n", "ratio warm/cold", ratio(pct(warm, 50), pct(cold, 50)), ratio(pct(warm, 99), pct(cold, 99)))
		if err == nil {
			fmt.Printf("    %-46s p50 %8.2fx  p99 %8.2fx\n", "ratio warm/bare", ratio(pct(warm, 50), pct(bare, 50)), ratio(pct(warm, 99), pct(bare, 99)))
		}
	}
	fmt.Println()

	cli := filepath.Join(filepath.Dir(agentPath), "cagebox")
	if _, err := os.Stat(cli); err != nil {
		fmt.Printf("CLI benchmarks skipped: %v (run `make build`)\n", err)
		return
	}
	run := cliRun(cli, home)
	for _, name := range rts {
		rt, _ := isolation.Lookup(name)
		k := sustained
		if rt.Class() == isolation.Hypervisor {
			k = min(sustained, 4*vmN)
		}
		class := pool.ClassOf(name, "default", isolation.Resources{}).String()
		waitReady(c, class, 4)
		before := poolOf(c, class)
		var d []time.Duration
		t0 := time.Now()
		for i := 0; i < k; i++ {
			d = append(d, run("--runtime", name, "--", "true"))
		}
		wall := time.Since(t0)
		after := poolOf(c, class)
		fmt.Printf("sustained: %d × `cagebox run --runtime %s -- true` back to back, pool size 4\n", k, name)
		fmt.Printf("  p50 %s  p99 %s  (%.1f runs/s; %d hits, %d misses)\n", ms(pct(d, 50)), ms(pct(d, 99)),
			float64(k)/wall.Seconds(), after.Claims-before.Claims, after.Misses-before.Misses)
	}
	fmt.Println()

	if !slices.Contains(rts, "container") {
		fmt.Println("the CLI comparison with podman needs the container runtime (-runtimes container,…)")
		return
	}
	cliVsPodman(c, run, img.Path, n, 0.25)
}

// machineVMDir is the machine's VM cache (kernel, initramfs) if setup
// fetched one.
func machineVMDir() string {
	h := os.Getenv("CAGEBOX_HOME")
	if h == "" {
		h = "/var/lib/cagebox"
	}
	if _, err := os.Stat(filepath.Join(h, "vm", "kernel")); err != nil {
		return ""
	}
	return filepath.Join(h, "vm")
}

// startBenchDaemon runs a daemon in this process with pools; stop stops it.
func startBenchDaemon(home, agentPath string, targets []pool.Target) (stop func()) {
	return runBenchDaemon(daemon.Config{Home: home, AgentPath: agentPath, Pools: targets, PoolMemory: 16 << 30})
}

// runBenchDaemon runs a daemon of cfg in this process (its log discarded)
// until stop (once; a failure of the bench calls it too); it returns once
// the daemon serves.
func runBenchDaemon(cfg daemon.Config) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Ready = func() { close(ready) }
	go func() { done <- daemon.Run(ctx, cfg) }()
	select {
	case <-ready:
	case err := <-done:
		fail(err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	onFail(stop)
	return stop
}

// timed runs argv to its end and returns how long it took; a failure
// fails the bench with its output.
func timed(argv ...string) time.Duration {
	cmd := exec.Command(argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		fail(fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, out.String()))
	}
	return time.Since(t0)
}

// cliRun is `cli --home home run ARGS…`, timed.
func cliRun(cli, home string) func(args ...string) time.Duration {
	return func(args ...string) time.Duration {
		return timed(append([]string{cli, "--home", home, "run"}, args...)...)
	}
}

func poolOf(c *client.Client, class string) api.PoolStatus {
	p, err := c.Pools(context.Background())
	if err != nil {
		fail(err)
	}
	for _, s := range p.Pools {
		if s.Class == class {
			return s
		}
	}
	fail(fmt.Errorf("no pool %s", class))
	return api.PoolStatus{}
}

func waitReady(c *client.Client, class string, k int) {
	deadline := time.Now().Add(5 * time.Minute)
	for poolOf(c, class).Ready < k {
		if time.Now().After(deadline) {
			fail(fmt.Errorf("pool %s never had %d ready: %+v", class, k, poolOf(c, class)))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// createExec times create → first exec of `true`; remove then removes
// the sandbox, off the timed path.
func createExec(c *client.Client, req *api.CreateSandboxRequest, remove func(context.Context, string) error) time.Duration {
	ctx := context.Background()
	t0 := time.Now()
	sb, err := c.Create(ctx, req)
	if err != nil {
		fail(err)
	}
	res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard)
	d := time.Since(t0)
	if err != nil || *res.ExitCode != 0 {
		fail(fmt.Errorf("exec: %v", err))
	}
	if err := remove(ctx, sb.ID); err != nil {
		fail(err)
	}
	return d
}

// cliVsPodman times `cagebox run --runtime container -- true` (run, a pool
// hit: the container pool of c is refilled between pairs) against `podman
// run --rm --network none` (runc) of the same rootfs, pair by pair, and
// prints both and their ratio beside goal.
func cliVsPodman(c *client.Client, run func(args ...string) time.Duration, rootfs string, n int, goal float64) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		fmt.Println("podman is not installed (scripts/bench.sh installs it): the CLI comparison is skipped")
		return
	}
	const tag = "localhost/cagebox-bench-busybox:latest"
	imp := exec.Command("sh", "-c", "tar -C "+rootfs+" -c . | "+podman+" import - "+tag)
	if out, err := imp.CombinedOutput(); err != nil {
		fmt.Printf("podman import failed: %v: %s\n", err, out)
		return
	}
	defer exec.Command(podman, "rmi", "-f", tag).Run()
	podmanRun := func() time.Duration {
		return timed(podman, "run", "--rm", "--network", "none", "--runtime", "runc",
			// podman's default rlimits exceed what some hosts allow a
			// container (a low hard limit fails runc's setrlimit).
			"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", tag, "true")
	}
	podmanRun() // warm podman's storage once
	waitReady(c, pool.ClassOf("container", "default", isolation.Resources{}).String(), 4)
	var cb, pm []time.Duration
	for i := 0; i < n; i++ {
		// The pool refills between pairs, as it would between a user's
		// commands.
		waitReady(c, pool.ClassOf("container", "default", isolation.Resources{}).String(), 4)
		cb = append(cb, run("--runtime", "container", "--", "true"))
		pm = append(pm, podmanRun())
	}
	fmt.Printf("the whole CLI, pair by pair (n = %d): goal ≤ %.2f× podman\n", n, goal)
	fmt.Printf("  %-60s p50 %9s  p99 %9s\n", "cagebox run --runtime container -- true (pool hit, full gateway)", ms(pct(cb, 50)), ms(pct(cb, 99)))
	fmt.Printf("  %-60s p50 %9s  p99 %9s\n", "podman run --rm --network none --runtime runc (same rootfs)", ms(pct(pm, 50)), ms(pct(pm, 99)))
	fmt.Printf("  %-60s p50 %8.2fx  p99 %8.2fx\n", "ratio cagebox/podman", ratio(pct(cb, 50), pct(pm, 50)), ratio(pct(cb, 99), pct(pm, 99)))
}
