package container_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/container"
	"github.com/cagebox/cagebox/isolation/isolationtest"
	"github.com/cagebox/cagebox/isolation/oci"
)

func TestAudit(t *testing.T) {
	rt := container.New(container.Options{StateRoot: t.TempDir()})
	isolationtest.CheckAvailable(t, rt)
	o := isolationtest.Options{RootFS: isolationtest.BusyboxRoot(t), AgentPath: isolationtest.BuildAgent(t)}
	isolationtest.Audit(t, rt, o)

	// Audit off: the profile notifies nothing and names no listener.
	t.Run("off", func(t *testing.T) {
		g := isolationtest.Start(t, rt, o, isolationBase())
		sb := g.Sandbox.(*container.Sandbox)
		cfg, err := os.ReadFile(filepath.Join(sb.BundlePath(), "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(cfg), "SCMP_ACT_NOTIFY") || strings.Contains(string(cfg), "listenerPath") {
			t.Fatal("a sandbox without audit has a notify rule")
		}
	})

	// The daemon's end gone (a daemon restart): audited syscalls fail at
	// once (ENOSYS), never hang, and never run unrecorded.
	t.Run("listener gone", func(t *testing.T) {
		g, sink := isolationtest.StartAudited(t, rt, o, "exec")
		sb := g.Sandbox.(*container.Sandbox)
		sb.StopAudit()
		if _, err := os.Stat(sb.Path(oci.AuditListener)); err == nil {
			t.Error("listener socket left after StopAudit")
		}
		before := len(sink.Records())
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		start := time.Now()
		_, err := execErr(ctx, g, "/bin/echo", "unrecorded")
		if err == nil {
			t.Fatal("exec ran with the audit listener gone")
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("exec took %v with the listener gone", time.Since(start))
		}
		t.Logf("exec with the listener gone: %v", err)
		if n := len(sink.Records()); n != before {
			t.Fatalf("records arrived after StopAudit: %d -> %d", before, n)
		}
	})
}

func isolationBase() isolation.Resources { return isolation.Resources{} }

// execErr runs argv; an error is a failed start (or a failed request).
func execErr(ctx context.Context, g *isolationtest.Guest, argv ...string) (string, error) {
	var out, errb bytes.Buffer
	res, err := g.Client.Exec(ctx, &agentproto.ExecRequest{Argv: argv}, nil, &out, &errb)
	if err != nil {
		return "", err
	}
	if res.Error != "" || res.ExitCode != 0 {
		return out.String(), fmt.Errorf("exit %d: %s %s", res.ExitCode, res.Error, errb.String())
	}
	return out.String(), nil
}
