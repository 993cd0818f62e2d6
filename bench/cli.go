package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/isolation"
)

// cliBench measures what a user's shell pays for the CLI itself (issue 26):
//
//   - `cagebox --version`, pair by pair: bin/cagebox (the CLI, built with
//     -tags lite) against bin/cagebox-server (the full build of the same
//     command tree — what bin/cagebox was before the split: the daemon,
//     the runtimes and the Kubernetes code linked and initialised);
//   - `cagebox run --runtime container -- true` with a warm pool against
//     `podman run --rm --network none` of the same rootfs, pair by pair.
func cliBench(agentPath string, n int) {
	binDir := filepath.Dir(agentPath)
	cli, server := filepath.Join(binDir, "cagebox"), filepath.Join(binDir, "cagebox-server")
	for _, b := range []string{cli, server} {
		if _, err := os.Stat(b); err != nil {
			fail(fmt.Errorf("%v: run `make build` first", err))
		}
	}
	start := func(bin string) time.Duration { return timed(bin, "--version") }
	start(cli) // page both binaries in once
	start(server)
	truePath, err := exec.LookPath("true")
	if err != nil {
		fail(err)
	}
	k := max(n, 50)
	var lite, full, floor []time.Duration
	for i := 0; i < k; i++ {
		lite = append(lite, start(cli))
		full = append(full, start(server))
		floor = append(floor, start(truePath))
	}
	fmt.Printf("cagebox CLI — %d CPUs\n\n", numCPU())
	fmt.Printf("`--version`, pair by pair (n = %d): goal ≤ 5 ms\n", k)
	fmt.Printf("  %-60s p50 %9s  p99 %9s\n", "bin/cagebox (the CLI: -tags lite)", ms(pct(lite, 50)), ms(pct(lite, 99)))
	fmt.Printf("  %-60s p50 %9s  p99 %9s\n", "bin/cagebox-server (the full build, the CLI before)", ms(pct(full, 50)), ms(pct(full, 99)))
	fmt.Printf("  %-60s p50 %9s  p99 %9s\n", "floor: "+truePath+" started the same way", ms(pct(floor, 50)), ms(pct(floor, 99)))
	fmt.Printf("  %-60s p50 %8.2fx  p99 %8.2fx\n\n", "ratio CLI/full", ratio(pct(lite, 50), pct(full, 50)), ratio(pct(lite, 99), pct(full, 99)))

	home, err := os.MkdirTemp("", "cbx-cli-bench")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(home)
	cache := &image.Cache{Dir: filepath.Join(home, "images")}
	img, err := cache.BuildBusybox(context.Background(), "default")
	if err != nil {
		fail(err)
	}
	class := pool.ClassOf("container", "default", isolation.Resources{})
	stop := startBenchDaemon(home, agentPath, []pool.Target{{Class: class, Size: 4}})
	defer stop()
	c := client.Unix(client.SocketPath(home))
	run := cliRun(cli, home)
	waitReady(c, class.String(), 4)
	run("--runtime", "container", "--", "true")
	cliVsPodman(c, run, img.Path, n, 0.10)
}
