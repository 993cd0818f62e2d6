package gvisor_test

import (
	"testing"

	"github.com/cagebox/cagebox/isolation/gvisor"
	"github.com/cagebox/cagebox/isolation/isolationtest"
)

func TestAudit(t *testing.T) {
	rt := gvisor.New(gvisor.Options{StateRoot: t.TempDir()})
	isolationtest.CheckAvailable(t, rt)
	o := isolationtest.Options{RootFS: isolationtest.BusyboxRoot(t), AgentPath: isolationtest.BuildAgent(t)}
	isolationtest.Audit(t, rt, o)
}
