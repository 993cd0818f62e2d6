package gvisor

import (
	"fmt"
	"os"
	"testing"
)

// TestMain keeps the tests' probe verdicts (of stand-in runsc binaries)
// and probe records out of the host's kvm.DefaultStateDir.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cbx-kvm-state-")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	kvmProbes.Dir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
