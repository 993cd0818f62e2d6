package daemon

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/kube/fleet"
)

// NodeCapacity is what a node reports to the fleet with each lease
// renewal (`cagebox node`), read from the daemon's own API over its unix
// socket (c) and from /proc/meminfo: the runtimes (usable only when
// available and at or above the floor), what "auto" picks, the host's
// memory, the sandboxes it runs and its warm pools. What cannot be read
// is left out and logged by the caller; a partial report is still a
// heartbeat.
func NodeCapacity(ctx context.Context, c *client.Client) (fleet.Capacity, error) {
	capy := fleet.Capacity{Version: Version, At: time.Now().UTC()}
	var errs []string
	// Health and pools answer at once; the runtimes wait for the start's
	// probes (KVM, runsc's platform), so they come last.
	if h, err := c.Health(ctx); err != nil {
		errs = append(errs, "health: "+err.Error())
	} else {
		capy.Sandboxes = h.Sandboxes
	}
	if p, err := c.Pools(ctx); err != nil {
		errs = append(errs, "pools: "+err.Error())
	} else {
		capy.Pools = p.Pools
	}
	if rts, err := c.Runtimes(ctx); err != nil {
		errs = append(errs, "runtimes: "+err.Error())
	} else {
		for _, r := range rts {
			ri := fleet.RuntimeInfo{Name: r.Name, Class: r.Class, Available: r.Available && r.Reason == "", Reason: clip(r.Reason, maxReason)}
			capy.Runtimes = append(capy.Runtimes, ri)
			if r.Default {
				capy.DefaultRuntime = r.Name
			}
		}
	}
	if total, avail, err := ReadMeminfo("/proc/meminfo"); err != nil {
		errs = append(errs, err.Error())
	} else {
		capy.MemoryTotal, capy.MemoryAvailable = total, avail
	}
	if len(errs) > 0 {
		return capy, fmt.Errorf("node capacity: %s", strings.Join(errs, "; "))
	}
	return capy, nil
}

// ReadMeminfo reads MemTotal and MemAvailable (bytes) from a
// /proc/meminfo file.
func ReadMeminfo(path string) (total, avail int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, fmt.Errorf("meminfo: %w", err)
	}
	defer f.Close()
	found := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "MemTotal" && k != "MemAvailable") {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) != 2 || fs[1] != "kB" {
			return 0, 0, fmt.Errorf("meminfo %s: %s: %q is not a size in kB", path, k, strings.TrimSpace(v))
		}
		n, err := strconv.ParseInt(fs[0], 10, 64)
		if err != nil || n < 0 {
			return 0, 0, fmt.Errorf("meminfo %s: %s: %q is not a size in kB", path, k, fs[0])
		}
		if k == "MemTotal" {
			total = n << 10
		} else {
			avail = n << 10
		}
		found++
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("meminfo %s: %w", path, err)
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("meminfo %s: no MemTotal and MemAvailable", path)
	}
	return total, avail, nil
}

// maxReason bounds a runtime's reason in the lease (rewritten with every
// renewal): the node's `cagebox runtimes` has the whole text.
const maxReason = 160

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
