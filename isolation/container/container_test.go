package container_test

import (
	"os"
	"testing"

	"github.com/cagebox/cagebox/isolation/container"
	"github.com/cagebox/cagebox/isolation/isolationtest"
)

func TestConformance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the container runtime needs root")
	}
	rt := container.New(container.Options{StateRoot: t.TempDir()})
	t.Logf("container runtime: %s", rt.Detail())
	isolationtest.Run(t, rt, isolationtest.Options{
		RootFS:    isolationtest.BusyboxRoot(t),
		AgentPath: isolationtest.BuildAgent(t),
	})
}
