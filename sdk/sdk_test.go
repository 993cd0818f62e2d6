// Package sdk holds the tests that keep the Python and TypeScript SDKs
// (sdk/python, sdk/typescript) in step with the daemon's routes, and runs
// their own suites, which drive a real daemon with real sandboxes.
package sdk

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/daemon"
)

// sdks are the SDKs' names (as ABSENT.md spells them) and their sources.
var sdks = []struct{ name, dir, ext string }{
	{"python", "python/cagebox", ".py"},
	{"typescript", "typescript/src", ".ts"},
}

// routeLit matches a route as the SDKs name it: "METHOD /path".
var routeLit = regexp.MustCompile(`"(GET|POST|PUT|PATCH|DELETE) (/[^"\s]*)"`)

// absentRow matches a row of ABSENT.md: | `METHOD /path` | sdk, sdk | why |
var absentRow = regexp.MustCompile("(?m)^\\| `([A-Z]+ /[^`]*)` \\| ([^|]+) \\| *([^|]*[^| ]) *\\|")

func sdkRoutes(t *testing.T, dir, ext string) map[string]bool {
	t.Helper()
	found := map[string]bool{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ext) {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range routeLit.FindAllStringSubmatch(string(b), -1) {
			found[m[1]+" "+m[2]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestRoutesCovered fails when a route of the daemon is neither called by
// an SDK nor listed in ABSENT.md for it, when an SDK calls a route the
// daemon does not have, or when ABSENT.md lists a route that is gone or that
// the SDK calls after all.
func TestRoutesCovered(t *testing.T) {
	routes := map[string]bool{}
	for _, r := range daemon.Routes() {
		routes[r.Method+" "+r.Path] = true
	}
	md, err := os.ReadFile("ABSENT.md")
	if err != nil {
		t.Fatal(err)
	}
	absent := map[string]map[string]bool{} // sdk → route
	for _, m := range absentRow.FindAllStringSubmatch(string(md), -1) {
		if !routes[m[1]] {
			t.Errorf("ABSENT.md lists %s, which is not a route of the daemon: remove the row", m[1])
		}
		for _, s := range strings.Split(m[2], ",") {
			s = strings.TrimSpace(s)
			if absent[s] == nil {
				absent[s] = map[string]bool{}
			}
			absent[s][m[1]] = true
		}
	}
	for _, s := range sdks {
		used := sdkRoutes(t, s.dir, s.ext)
		if len(used) == 0 {
			t.Fatalf("%s: no route literals found in %s", s.name, s.dir)
		}
		var missing, unknown, stale []string
		for r := range routes {
			if !used[r] && !absent[s.name][r] {
				missing = append(missing, r)
			}
			if used[r] && absent[s.name][r] {
				stale = append(stale, r)
			}
		}
		for r := range used {
			if !routes[r] {
				unknown = append(unknown, r)
			}
		}
		sort.Strings(missing)
		sort.Strings(unknown)
		sort.Strings(stale)
		for _, r := range missing {
			t.Errorf("%s SDK (%s) does not call %s: add a method for it, or a row to sdk/ABSENT.md saying why not", s.name, s.dir, r)
		}
		for _, r := range unknown {
			t.Errorf("%s SDK (%s) calls %s, which is not in internal/daemon Routes()", s.name, s.dir, r)
		}
		for _, r := range stale {
			t.Errorf("%s SDK (%s) calls %s, which sdk/ABSENT.md lists as absent: remove the row", s.name, s.dir, r)
		}
	}
	for s := range absent {
		known := false
		for _, k := range sdks {
			known = known || k.name == s
		}
		if !known {
			t.Errorf("ABSENT.md names an SDK %q; the SDKs are python and typescript", s)
		}
	}
}

// readInputs reads every file of an SDK (but dependencies and build
// output) so that go test's cache knows them: a change to a test script,
// which only a child process reads, then runs the suite again.
func readInputs(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", "dist", "__pycache__", "build":
				return filepath.SkipDir
			}
			return nil
		}
		_, err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// daemonSkip says why the SDK suites cannot start a daemon here ("" when
// they can): the daemon needs root, and the binaries of `make build`.
func daemonSkip(t *testing.T) (binDir, reason string) {
	bin, err := filepath.Abs(filepath.Join("..", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		return bin, "needs root (the daemon makes namespaces, mounts, cgroups and nftables rules)"
	}
	for _, b := range []string{"cagebox", "cagebox-agent"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return bin, filepath.Join(bin, b) + " is missing: run `make build` first (make test does)"
		}
	}
	return bin, ""
}

// run runs a command in dir, logging its output, and fails the test if it
// fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	if err != nil {
		t.Fatalf("%s %s (in %s): %v after %s\n%s", name, strings.Join(args, " "), dir, err, time.Since(start).Round(time.Millisecond), out.String())
	}
	t.Logf("%s %s: ok in %s\n%s", name, strings.Join(args, " "), time.Since(start).Round(time.Millisecond), tail(out.String(), 40))
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func tail(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestPython runs the Python SDK's unittest suites: the unit tests always,
// the daemon tests (a real daemon, real sandboxes) as root after `make
// build`.
func TestPython(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	readInputs(t, "python")
	bin, reason := daemonSkip(t)
	env := []string{"CAGEBOX_BIN_DIR=" + bin, "PYTHONDONTWRITEBYTECODE=1"}
	t.Run("unit", func(t *testing.T) {
		run(t, "python", env, "python3", "-m", "unittest", "discover", "-s", "tests", "-p", "test_unit.py", "-v")
	})
	t.Run("daemon", func(t *testing.T) {
		if reason != "" {
			t.Skip(reason)
		}
		// Required: the suite fails instead of skipping if it cannot start.
		run(t, "python", append(env, "CAGEBOX_SDK_REQUIRE_DAEMON=1"), "python3", "-m", "unittest", "discover", "-s", "tests", "-p", "test_daemon.py", "-v")
	})
}

// TestTypeScript builds the TypeScript SDK (npm ci when node_modules does
// not match package-lock.json, then tsc into dist/) and runs its node
// --test suites: the unit tests always, the daemon tests as root after
// `make build`.
func TestTypeScript(t *testing.T) {
	for _, b := range []string{"node", "npm"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s is not installed (scripts/setup.sh installs nodejs and npm)", b)
		}
	}
	v, err := exec.Command("node", "-p", "process.versions.node").Output()
	if err != nil {
		t.Fatalf("node -p process.versions.node: %v", err)
	}
	if major, _, _ := strings.Cut(strings.TrimSpace(string(v)), "."); atoi(major) < 20 {
		t.Skipf("node %s is installed; the TypeScript SDK needs Node 20 or later", strings.TrimSpace(string(v)))
	}
	dir := "typescript"
	readInputs(t, dir)
	npmCI(t, dir)
	run(t, dir, nil, "node", filepath.Join("node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json")
	bin, reason := daemonSkip(t)
	env := []string{"CAGEBOX_BIN_DIR=" + bin}
	t.Run("unit", func(t *testing.T) {
		run(t, dir, env, "node", "--test", "test/unit.test.mjs")
	})
	t.Run("daemon", func(t *testing.T) {
		if reason != "" {
			t.Skip(reason)
		}
		run(t, dir, append(env, "CAGEBOX_SDK_REQUIRE_DAEMON=1"), "node", "--test", "test/daemon.test.mjs")
	})
}

// npmCI installs the dev dependencies (typescript, @types/node) when
// node_modules was not installed from this package-lock.json: a stamp
// holds the lock's sha256.
func npmCI(t *testing.T, dir string) {
	t.Helper()
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	want := hex.EncodeToString(sum[:])
	stamp := filepath.Join(dir, "node_modules", ".cagebox-lock-sha256")
	if got, err := os.ReadFile(stamp); err == nil && strings.TrimSpace(string(got)) == want {
		return
	}
	// --ignore-scripts: the build is the next step, with the test's output.
	run(t, dir, nil, "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	if err := os.WriteFile(stamp, []byte(want+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}
