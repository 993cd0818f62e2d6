package container_test

import (
	"testing"

	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/container"
	"github.com/cagebox/cagebox/isolation/isolationtest"
)

func TestConformance(t *testing.T) {
	stateRoot := t.TempDir()
	rt := container.New(container.Options{StateRoot: stateRoot})
	isolationtest.CheckAvailable(t, rt)
	t.Logf("container runtime: %s", rt.Detail())
	isolationtest.Run(t, rt, isolationtest.Options{
		RootFS:    isolationtest.BusyboxRoot(t),
		AgentPath: isolationtest.BuildAgent(t),
		Restarted: func() isolation.Runtime { return container.New(container.Options{StateRoot: stateRoot}) },
	})
}

// TestConformancePooled: the suite on sandboxes made as a warm pool makes
// them (agent awaiting its claim, no identity) and then claimed.
func TestConformancePooled(t *testing.T) {
	stateRoot := t.TempDir()
	rt := container.New(container.Options{StateRoot: stateRoot})
	isolationtest.CheckAvailable(t, rt)
	isolationtest.Run(t, rt, isolationtest.Options{
		RootFS:    isolationtest.BusyboxRoot(t),
		AgentPath: isolationtest.BuildAgent(t),
		Restarted: func() isolation.Runtime { return container.New(container.Options{StateRoot: stateRoot}) },
		Pooled:    true,
	})
}

// TestMounts: bind mounts, volumes and a read-only root (isolationtest.Mounts).
func TestMounts(t *testing.T) {
	rt := container.New(container.Options{StateRoot: t.TempDir()})
	isolationtest.Mounts(t, rt, isolationtest.Options{
		RootFS:    isolationtest.BusyboxRoot(t),
		AgentPath: isolationtest.BuildAgent(t),
	})
}
