package daemon

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildGo builds a one-file Go program with CGO_ENABLED set as given.
func buildGo(t *testing.T, src string, cgo string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module tiny\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "tiny")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo, "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=%s go build: %v\n%s", cgo, err, out)
	}
	return bin
}

func haveCC(t *testing.T) bool {
	out, err := exec.Command("go", "env", "CC").Output()
	if err != nil {
		return false
	}
	_, err = exec.LookPath(strings.TrimSpace(string(out)))
	return err == nil
}

func TestCheckAgentBinary(t *testing.T) {
	static := buildGo(t, "package main\n\nfunc main() {}\n", "0")
	if err := checkAgentBinary(static); err != nil {
		t.Errorf("static Go binary refused: %v", err)
	}
	dynamic := map[string]string{}
	if _, err := os.Stat("/bin/true"); err == nil {
		dynamic["/bin/true"] = "/bin/true"
	}
	if haveCC(t) {
		dynamic["cgo program"] = buildGo(t, "package main\n\n// int one(void) { return 1; }\nimport \"C\"\n\nfunc main() { _ = C.one() }\n", "1")
	}
	if len(dynamic) == 0 {
		t.Skip("no dynamically linked binary to try: no /bin/true and no C compiler")
	}
	for name, bin := range dynamic {
		err := checkAgentBinary(bin)
		if err == nil {
			t.Errorf("%s: a dynamically linked agent passed", name)
			continue
		}
		for _, want := range []string{"dynamically linked", "ld-linux", "libc.so", "CGO_ENABLED=0 go build", "make build"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q lacks %q", name, err, want)
			}
		}
	}
	text := filepath.Join(t.TempDir(), "agent.sh")
	if err := os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkAgentBinary(text); err == nil || !strings.Contains(err.Error(), "make build") {
		t.Errorf("a shell script as the agent: %v", err)
	}
}

// TestRunRefusesDynamicAgent: the daemon does not start with a dynamically
// linked agent, and says how to build a static one.
func TestRunRefusesDynamicAgent(t *testing.T) {
	if _, err := os.Stat("/bin/true"); err != nil {
		t.Skip("no /bin/true")
	}
	home := t.TempDir()
	err := Run(context.Background(), Config{Home: home, AgentPath: "/bin/true"})
	if err == nil || !strings.Contains(err.Error(), "dynamically linked") || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Fatalf("Run with /bin/true as the agent: %v", err)
	}
	if _, err := os.Stat(filepath.Join(home, "cagebox.db")); !os.IsNotExist(err) {
		t.Errorf("refused start opened the store: %v", err)
	}
}
