package qemu

import (
	"testing"

	"github.com/cagebox/cagebox/isolation/isolationtest"
)

func TestAudit(t *testing.T) {
	rt := testRuntime(t)
	rt = New(Options{Dir: rt.cache.Dir, NoBackgroundTemplates: true})
	isolationtest.Audit(t, rt, isolationtest.Options{
		RootFS:       isolationtest.BusyboxRoot(t),
		AgentPath:    isolationtest.BuildAgent(t),
		StartTimeout: startTimeout,
	})
}
