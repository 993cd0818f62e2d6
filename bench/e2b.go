package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/daemon"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/isolation"
)

// e2bBench times the official E2B SDK (npm e2b, test/e2b) against the
// daemon's E2B front beside cagebox's own TypeScript SDK on the same
// daemon, tenant and warm pool (issue 24's figures): create → first run
// with a pool hit, a command's round trip, and a 1 MiB file write. Both
// SDKs talk to the daemon over loopback TCP with the tenant's key. It needs
// node, the Debian image (scripts/setup.sh) and the SDKs' npm installs,
// which it makes when missing (npm ci in test/e2b and sdk/typescript).
func e2bBench(agentPath string, n int) {
	if _, err := exec.LookPath("node"); err != nil {
		fail("e2b: node is not installed (scripts/setup.sh installs it)")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		fail(err)
	}
	e2bDir, tsDir := filepath.Join(root, "test", "e2b"), filepath.Join(root, "sdk", "typescript")
	for _, step := range []struct {
		dir, done string
		args      [][]string
	}{
		{e2bDir, "node_modules/e2b", [][]string{{"npm", "ci", "--no-audit", "--no-fund"}}},
		{tsDir, "dist/index.js", [][]string{{"npm", "ci", "--no-audit", "--no-fund"}, {"npm", "run", "build"}}},
	} {
		if _, err := os.Stat(filepath.Join(step.dir, step.done)); err == nil {
			continue
		}
		for _, a := range step.args {
			cmd := exec.Command(a[0], a[1:]...)
			cmd.Dir = step.dir
			if out, err := cmd.CombinedOutput(); err != nil {
				fail(fmt.Errorf("%s in %s: %v\n%s", strings.Join(a, " "), step.dir, err, out))
			}
		}
	}
	shared := os.Getenv("CAGEBOX_HOME")
	if shared == "" {
		shared = "/var/lib/cagebox"
	}
	shared = filepath.Join(shared, "images")
	if _, err := (&image.Cache{Dir: shared}).Get("default"); err != nil {
		fail(fmt.Errorf("e2b: the Debian image is needed (the SDK runs commands with bash): %v (scripts/setup.sh builds it)", err))
	}
	home, err := os.MkdirTemp("", "cbx-e2b-bench")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(home)
	if err := os.MkdirAll(filepath.Join(home, "images"), 0o700); err != nil {
		fail(err)
	}
	if err := os.Symlink(filepath.Join(shared, "default"), filepath.Join(home, "images", "default")); err != nil {
		fail(err)
	}
	apiAddr, e2bAddr := freeAddr(), freeAddr()
	class := pool.ClassOf("container", "default", isolation.Resources{})
	defer runBenchDaemon(daemon.Config{
		Home: home, AgentPath: agentPath, DefaultRuntime: "container",
		Pools: []pool.Target{{Class: class, Size: 2}}, PoolMemory: 8 << 30,
		Listen: apiAddr, E2B: daemon.E2BConfig{Listen: e2bAddr},
	})()
	c := client.Unix(client.SocketPath(home))
	bg := context.Background()
	if _, err := c.CreateTenant(bg, &api.CreateTenantRequest{Name: "bench"}); err != nil {
		fail(err)
	}
	k, err := c.CreateKey(bg, "bench")
	if err != nil {
		fail(err)
	}
	waitReady(c, class.String(), 2)
	before := poolOf(c, class.String())
	cmd := exec.Command("node", "bench.mjs")
	cmd.Dir = e2bDir
	cmd.Env = append(os.Environ(),
		"E2B_API_URL=http://"+e2bAddr, "E2B_SANDBOX_URL=http://"+e2bAddr,
		"E2B_API_KEY="+daemon.E2BKeyPrefix+strings.TrimPrefix(k.Key, "cbk_"),
		"CAGEBOX_HOST=http://"+apiAddr, "CAGEBOX_API_KEY="+k.Key, "CAGEBOX_HOME="+home,
		"POOL_CLASS="+class.String(), fmt.Sprintf("N=%d", n))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		fail(fmt.Errorf("node bench.mjs: %v\n%s", err, stderr.String()))
	}
	var r struct {
		Create, Run, Write struct{ E2B, Cagebox, CageboxBash []float64 }
		Fatal              string
	}
	if err := json.Unmarshal(out, &r); err != nil {
		fail(fmt.Errorf("bench.mjs: %v: %s", err, out))
	}
	if r.Fatal != "" {
		fail("bench.mjs: " + r.Fatal)
	}
	after := poolOf(c, class.String())
	msd := func(v []float64) []time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x * 1e6)
		}
		return d
	}
	fmt.Printf("E2B SDK (npm e2b 2.51.0) on the E2B front beside cagebox's TypeScript SDK — %d CPUs, container runtime, Debian image, warm pool of 2, loopback TCP\n", numCPU())
	// A miss is a cold create (seconds): it shows as the p99 of a side.
	fmt.Printf("pool: %d hits, %d misses over both SDKs' creates\n\n", after.Claims-before.Claims, after.Misses-before.Misses)
	row := func(title, goal string, e, cg []float64) {
		ed, cd := msd(e), msd(cg)
		fmt.Printf("%s (n = %d each): goal %s\n", title, len(ed), goal)
		fmt.Printf("  %-52s p50 %9s  p99 %9s\n", "E2B SDK", ms(pct(ed, 50)), ms(pct(ed, 99)))
		fmt.Printf("  %-52s p50 %9s  p99 %9s\n", "cagebox TypeScript SDK", ms(pct(cd, 50)), ms(pct(cd, 99)))
		fmt.Printf("  %-52s p50 %8.2fx  p99 %8.2fx\n", "ratio E2B/cagebox", ratio(pct(ed, 50), pct(cd, 50)), ratio(pct(ed, 99), pct(cd, 99)))
	}
	// No start-up figure published by E2B is reachable from here (their
	// SDK repository states none), so none is printed beside ours.
	row("Sandbox.create() → first commands.run('true') done, pool hit", "≤ 1.2×", r.Create.E2B, r.Create.Cagebox)
	cb := msd(r.Create.CageboxBash)
	fmt.Printf("  %-52s p50 %9s  p99 %9s\n", "cagebox SDK, the SDK's command (bash -l -c true)", ms(pct(cb, 50)), ms(pct(cb, 99)))
	fmt.Printf("  %-52s p50 %8.2fx  p99 %8.2fx\n\n", "ratio E2B/cagebox, same command", ratio(pct(msd(r.Create.E2B), 50), pct(cb, 50)), ratio(pct(msd(r.Create.E2B), 99), pct(cb, 99)))
	row("commands.run('true') round trip in a running sandbox", "≤ 1.2×", r.Run.E2B, r.Run.Cagebox)
	bd := msd(r.Run.CageboxBash)
	fmt.Printf("  %-52s p50 %9s  p99 %9s\n", "cagebox SDK, the SDK's command (bash -l -c true)", ms(pct(bd, 50)), ms(pct(bd, 99)))
	fmt.Printf("  %-52s p50 %8.2fx  p99 %8.2fx\n\n", "ratio E2B/cagebox, same command", ratio(pct(msd(r.Run.E2B), 50), pct(bd, 50)), ratio(pct(msd(r.Run.E2B), 99), pct(bd, 99)))
	row("files.write of 1 MiB", "≤ 1.2×", r.Write.E2B, r.Write.Cagebox)
	fmt.Println()
}

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	defer l.Close()
	return l.Addr().String()
}
