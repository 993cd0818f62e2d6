// Package testbin builds the binaries the end-to-end suites run through
// (test/e2e, test/kube): bin/cagebox (the CLI), bin/cagebox-server (the
// full build it execs for the daemon and other host-side commands) and
// bin/cagebox-agent, static and trimmed as `make build` makes them, into a
// directory of their own.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Binary is one executable Build makes.
type Binary struct {
	Name string // file name in the directory
	Pkg  string // package under cmd/
	Tags string // build tags, "" for none
}

// Binaries are what Build makes, as the Makefile's build target does.
var Binaries = []Binary{
	{Name: "cagebox", Pkg: "cagebox", Tags: "lite"},
	{Name: "cagebox-server", Pkg: "cagebox"},
	{Name: "cagebox-agent", Pkg: "cagebox-agent"},
}

// Build builds Binaries into a new temporary directory and returns it
// (the caller removes it).
func Build() (dir string, err error) {
	dir, err = os.MkdirTemp("", "cbx-test-bin")
	if err != nil {
		return "", fmt.Errorf("testbin: %w", err)
	}
	for _, b := range Binaries {
		args := []string{"build", "-trimpath", "-o", filepath.Join(dir, b.Name)}
		if b.Tags != "" {
			args = append(args, "-tags", b.Tags)
		}
		cmd := exec.Command("go", append(args, "github.com/cagebox/cagebox/cmd/"+b.Pkg)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("testbin: build %s: %v\n%s", b.Name, err, out)
		}
	}
	return dir, nil
}
