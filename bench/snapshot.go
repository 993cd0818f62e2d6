package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/vmproc"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/qemu"
)

// snapshotBench measures the qemu runtime's VM templates (issue 11):
//
//   - create → first exec: a restore from a template (create, start,
//     claim, connect with the sandbox's token, exec `true`) against a
//     cold boot of the same sandbox, p50 over n runs each, interleaved,
//     under the accelerator this host has (TCG here; KVM is probed and
//     said when it cannot be used);
//   - host memory of memN sandboxes running at once, restored against
//     cold-booted: the sum of the PSS of their QEMU processes
//     (/proc/PID/smaps_rollup), the template's shared RAM counted once
//     beside it;
//   - the template's build time and size on disk.
//
// It runs at the runtime level (no daemon): what the daemon adds is the
// same on both sides.
func snapshotBench(agentPath string, n, memN int) {
	if os.Geteuid() != 0 {
		fail("bench: run as root")
	}
	home, err := os.MkdirTemp("", "cbx-snapbench")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(home)
	onFail(func() { os.RemoveAll(home) })
	img, err := (&image.Cache{Dir: filepath.Join(home, "images")}).BuildBusybox(context.Background(), "busybox")
	if err != nil {
		fail(err)
	}
	vmDir := filepath.Join(os.Getenv("CAGEBOX_HOME"), "vm")
	if os.Getenv("CAGEBOX_HOME") == "" {
		vmDir = "/var/lib/cagebox/vm"
	}
	// Templates of this run only, so that the build is measured.
	tplDir := filepath.Join(home, "templates")
	cold := qemu.New(qemu.Options{Dir: vmDir, DisableTemplates: true})
	warm := qemu.New(qemu.Options{Dir: vmDir, TemplateDir: tplDir, NoBackgroundTemplates: true})
	if err := cold.Available(); err != nil {
		fmt.Printf("qemu snapshots: qemu unavailable here: %v\n", err)
		return
	}
	kvm := cold.KVM()
	accel := "tcg"
	if kvm.Usable {
		accel = "kvm"
	}
	const mem = 256 << 20
	spec := func() *isolation.Spec {
		id := "snap" + randHex()
		return &isolation.Spec{
			ID: id, StateDir: filepath.Join(home, "s", id), RootFS: img.Path, AgentPath: agentPath,
			AgentToken: randHex() + randHex(), Hostname: id, Resources: isolation.Resources{MemoryBytes: mem},
		}
	}
	ctx := context.Background()
	fmt.Printf("qemu VM templates — busybox image, %d MiB guests, %s\n", mem>>20, accel)

	tp, err := warm.BuildTemplate(ctx, spec())
	if err != nil {
		fail(fmt.Errorf("build template: %w", err))
	}
	fmt.Printf("  %-46s %9s   disk %s\n", "template build (cold boot → agent waits → saved)", tp.BuildTime.Round(time.Millisecond), mib(tp.SizeBytes))

	// Warm both paths once (page cache, the template's memfd).
	runOnce(cold, spec())
	runOnce(warm, spec())
	var cs, rs, rds []time.Duration
	for i := 0; i < n; i++ {
		cs = append(cs, runOnce(cold, spec()))
		rs = append(rs, runOnce(warm, spec()))
		redial = true
		rds = append(rds, runOnce(warm, spec()))
		redial = false
	}
	fmt.Printf("  create → first exec (n = %d)\n", n)
	fmt.Printf("    %-44s p50 %9s  p99 %9s\n", "cold boot", ms(pct(cs, 50)), ms(pct(cs, 99)))
	fmt.Printf("    %-44s p50 %9s  p99 %9s\n", "restore from the template + claim", ms(pct(rs, 50)), ms(pct(rs, 99)))
	fmt.Printf("    %-44s p50 %9s  p99 %9s\n", "  the same, redialling after the claim", ms(pct(rds, 50)), ms(pct(rds, 99)))
	fmt.Printf("    %-44s p50 %8.1fx             (goal ≥ 8x under TCG)\n", "speed-up cold/restore", ratio(pct(cs, 50), pct(rs, 50)))
	if kvm.Usable {
		fmt.Printf("    (measured under KVM)\n")
	} else {
		fmt.Printf("    kvm: not measured: %s\n", kvm)
	}

	fmt.Printf("  host memory of %d sandboxes running at once (sum of PSS of their QEMU processes)\n", memN)
	rPSS := fleetPSS(warm, spec, memN)
	cPSS := fleetPSS(cold, spec, memN)
	fmt.Printf("    %-44s %10s\n", "cold-booted", mib(cPSS))
	// The daemon holds the template's RAM once, every page allocated
	// (qemu's loadSealed); the pages sandboxes map count in their PSS.
	fmt.Printf("    %-44s %10s   + the template's RAM, held once by the daemon: %s\n", "restored from one template", mib(rPSS), mib(tp.MemoryBytes))
	fmt.Printf("    %-44s %9.2fx   (%.2fx counting the template's RAM in full; goal ≤ 0.5x)\n", "ratio restored/cold", float64(rPSS)/float64(cPSS), float64(rPSS+tp.MemoryBytes)/float64(cPSS))
	fmt.Println()
}

// redial makes startSandbox close the claim's connection and dial again.
var redial bool

// runOnce creates, starts, claims (if restored) and connects to a sandbox
// of rt, runs `true`, destroys it, and returns the time to the exec's end.
func runOnce(rt *qemu.Runtime, spec *isolation.Spec) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	sb, c := startSandbox(ctx, rt, spec)
	if _, err := c.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard); err != nil {
		fail(fmt.Errorf("exec: %w", err))
	}
	d := time.Since(t0)
	c.Close()
	if err := sb.Destroy(ctx); err != nil {
		fail(err)
	}
	return d
}

// startSandbox creates and starts a sandbox, claims it if it was restored
// (as the daemon's manager does), and returns a client on the sandbox's
// own token.
func startSandbox(ctx context.Context, rt *qemu.Runtime, spec *isolation.Spec) (isolation.Sandbox, *agentproto.Client) {
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		fail(fmt.Errorf("create: %w", err))
	}
	onFail(func() { _ = sb.Destroy(context.Background()) })
	if err := sb.Start(ctx); err != nil {
		fail(fmt.Errorf("start: %w", err))
	}
	if ci := sb.(isolation.Claimable).ClaimInfo(); ci.Token != "" {
		c := dialAgent(ctx, sb, ci.Token)
		cl := &agentproto.Claim{Token: spec.AgentToken, Hostname: spec.Hostname, Entropy: make([]byte, 64), Time: time.Now()}
		_, _ = rand.Read(cl.Entropy)
		if err := c.Claim(ctx, cl); err != nil {
			fail(fmt.Errorf("claim: %w", err))
		}
		// The claimed connection stays the sandbox's (agentproto.Claim):
		// a new one waits out the virtio-serial reconnect gap (redial
		// measures that).
		if !redial {
			return sb, c
		}
		c.Close()
	}
	return sb, dialAgent(ctx, sb, spec.AgentToken)
}

// dialAgent connects to the agent with token, retrying while it boots.
func dialAgent(ctx context.Context, sb isolation.Sandbox, token string) *agentproto.Client {
	var last error
	for ctx.Err() == nil {
		conn, err := sb.DialAgent(ctx)
		if err == nil {
			var c *agentproto.Client
			if c, err = agentproto.NewClient(ctx, conn, token); err == nil {
				return c
			}
			conn.Close()
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	fail(fmt.Errorf("the agent never answered: %v", last))
	return nil
}

// fleetPSS starts n sandboxes of rt at once (at most 4 booting at a time),
// runs `true` in each, sums the PSS of their QEMU processes, and destroys
// them.
func fleetPSS(rt *qemu.Runtime, spec func() *isolation.Spec, n int) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	type vm struct {
		sb   isolation.Sandbox
		c    *agentproto.Client
		spec *isolation.Spec
	}
	vms := make([]vm, n)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i := range vms {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			s := spec()
			sb, c := startSandbox(ctx, rt, s)
			if _, err := c.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard); err != nil {
				fail(fmt.Errorf("exec: %w", err))
			}
			vms[i] = vm{sb, c, s}
		}(i)
	}
	wg.Wait()
	// Let the guests settle (a cold guest's boot-time work ends).
	time.Sleep(2 * time.Second)
	var sum int64
	for _, v := range vms {
		p, err := vmproc.ReadFile(filepath.Join(v.spec.StateDir, "vmm.pid"))
		if err != nil {
			fail(err)
		}
		pss, err := pssOf(p.PID)
		if err != nil {
			fail(err)
		}
		sum += pss
	}
	for _, v := range vms {
		v.c.Close()
		if err := v.sb.Destroy(ctx); err != nil {
			fail(err)
		}
	}
	return sum
}

// pssOf is the proportional set size of pid (bytes).
func pssOf(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no Pss in /proc/%d/smaps_rollup", pid)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
