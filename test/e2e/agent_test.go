package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSandboxProcessesHoldNoCapabilities: every process in a sandbox, as
// root or not, holds no capability in any set and has no_new_privs set.
func TestSandboxProcessesHoldNoCapabilities(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	r := e.cli("", "create")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	zero := "0000000000000000"
	for _, user := range []string{"", "0", "65534", "65534:65534"} {
		args := []string{"exec", id}
		if user != "" {
			args = append(args, "--user", user)
		}
		// The process's child too: nothing comes back at a second exec.
		args = append(args, "--", "sh", "-c", "grep -E '^(Cap|NoNewPrivs)' /proc/self/status; sh -c 'grep -E \"^(Cap|NoNewPrivs)\" /proc/self/status'")
		r := e.cli("", args...)
		if r.code != 0 {
			t.Fatalf("user %q: %+v", user, r)
		}
		// gVisor's status shows no NoNewPrivs (nor CapAmb on some
		// versions); the sets it shows must be empty.
		seen := map[string]int{}
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			k, v, _ := strings.Cut(l, ":")
			v = strings.TrimSpace(v)
			seen[k]++
			if (k == "NoNewPrivs" && v != "1") || (k != "NoNewPrivs" && v != zero) {
				t.Errorf("user %q: %s = %s", user, k, v)
			}
		}
		for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd"} {
			if seen[k] != 2 {
				t.Errorf("user %q: %s shown %d times, want 2:\n%s", user, k, seen[k], r.stdout)
			}
		}
	}
}

// buildAgentVariant builds cagebox-agent into its own directory with extra
// go build arguments and environment.
func buildAgentVariant(t *testing.T, env string, args ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cagebox-agent")
	cmd := exec.Command("go", append(append([]string{"build", "-trimpath", "-o", bin}, args...), "github.com/cagebox/cagebox/cmd/cagebox-agent")...)
	cmd.Env = append(os.Environ(), env)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s go build %v: %v\n%s", env, args, err, out)
	}
	return bin
}

// TestAgentRefusalFailsCreate: an agent whose processes would keep
// capabilities (a test build that skips the drop; the container gives the
// agent CAP_SETUID, CAP_SETGID and CAP_SETPCAP) runs nothing, and the
// daemon fails the create with the agent's words, leaving nothing behind.
func TestAgentRefusalFailsCreate(t *testing.T) {
	bin := buildAgentVariant(t, "CGO_ENABLED=0", "-tags", "cagebox_fault_keepcaps")
	e := newEnv(t)
	e.startDaemon("--agent", bin)
	r := e.cli("", "run", "--", "touch", "/tmp/ran")
	if r.code == 0 {
		t.Fatalf("run with an agent whose processes keep capabilities: %+v", r)
	}
	for _, want := range []string{"refusing to run processes", "CapPrm=CapEff=CapBnd=00000000000001c0 (CAP_SETGID, CAP_SETUID, CAP_SETPCAP)"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("create error %q lacks %q", r.stderr, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := e.client().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range l {
		if s.Status != "failed" || !strings.Contains(s.Error, "refusing to run processes") {
			t.Errorf("refused create left %+v", s)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(e.home, "sandboxes")); len(ents) > 0 {
		t.Errorf("refused create left state dirs: %v", ents)
	}
	if n := countLinks(t); n != 0 {
		t.Errorf("refused create left %d links", n)
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, en := range ents {
		if strings.HasPrefix(en.Name(), os.Getenv("CAGEBOX_NET_IFPREFIX")+"-") {
			t.Errorf("refused create left netns %s", en.Name())
		}
	}
}

// TestDaemonRefusesDynamicAgent: the daemon does not start with an agent
// built with cgo (dynamically linked), and says how to build it.
func TestDaemonRefusesDynamicAgent(t *testing.T) {
	cc, err := exec.Command("go", "env", "CC").Output()
	if err != nil {
		t.Skipf("go env CC: %v", err)
	}
	if _, err := exec.LookPath(strings.TrimSpace(string(cc))); err != nil {
		t.Skipf("no C compiler, so no dynamically linked agent: %v", err)
	}
	bin := buildAgentVariant(t, "CGO_ENABLED=1")
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "cagebox"), "--home", home, "daemon", "--agent", bin).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "dynamically linked") || !strings.Contains(string(out), "CGO_ENABLED=0 go build") {
		t.Fatalf("daemon with a cgo agent: %v\n%s", err, out)
	}
}
