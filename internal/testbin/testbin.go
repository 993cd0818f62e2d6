// Package testbin builds the binaries the end-to-end suites run through
// (test/e2e, test/kube): bin/cagebox and bin/cagebox-agent, static and
// trimmed as `make build` makes them, into a directory of their own.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Commands are the binaries Build makes, by name under cmd/.
var Commands = []string{"cagebox", "cagebox-agent"}

// Build builds Commands into a new temporary directory and returns it
// (the caller removes it).
func Build() (dir string, err error) {
	dir, err = os.MkdirTemp("", "cbx-test-bin")
	if err != nil {
		return "", fmt.Errorf("testbin: %w", err)
	}
	for _, p := range Commands {
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, p), "github.com/cagebox/cagebox/cmd/"+p)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("testbin: build %s: %v\n%s", p, err, out)
		}
	}
	return dir, nil
}
