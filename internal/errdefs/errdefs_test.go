package errdefs_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeaf guards that errdefs stays a leaf every package can import: no
// package of cagebox's and nothing of HTTP (the daemon maps kinds to
// status codes).
func TestLeaf(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, std, _ := strings.Cut(line, " ")
		switch {
		case pkg == "github.com/cagebox/cagebox/internal/errdefs":
		case std != "true":
			t.Errorf("errdefs imports %s: it must import nothing but the standard library", pkg)
		case pkg == "net/http" || strings.HasPrefix(pkg, "net/http/"):
			t.Errorf("errdefs imports %s: status codes belong to the daemon", pkg)
		}
	}
}
