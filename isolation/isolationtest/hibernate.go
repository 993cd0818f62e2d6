package isolationtest

import (
	"context"
	"testing"
	"time"

	"github.com/cagebox/cagebox/isolation"
)

// hibernate runs for runtimes whose sandboxes are isolation.Hibernators:
// a sandbox is hibernated, recovered by a restarted runtime (o.Restarted),
// resumed, and keeps its files and agent token; Destroy of it leaves
// nothing.
func hibernate(t *testing.T, rt isolation.Runtime, o Options) {
	g := Start(t, rt, o, isolation.Resources{})
	h, ok := g.Sandbox.(isolation.Hibernator)
	if !ok {
		t.Skipf("%s sandboxes do not hibernate", rt.Name())
	}
	g.Exec(t, "sh", "-c", "echo kept > /tmp/mark")
	g.Client.Close()
	g.Client = nil
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := h.Hibernate(ctx); err != nil {
		t.Fatalf("hibernate: %v", err)
	}
	if agentAnswers(g) {
		t.Fatal("a hibernated sandbox's agent answers")
	}
	rt2 := rt
	if o.Restarted != nil {
		rt2 = o.Restarted()
	}
	sb, err := rt2.Recover(ctx, g.Sandbox.State())
	if err != nil {
		t.Fatalf("recover a hibernated sandbox: %v", err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatalf("resume a hibernated sandbox: %v", err)
	}
	c := Connect(t, ctx, sb, g.Token)
	defer c.Close()
	g2 := &Guest{Sandbox: sb, Client: c, Token: g.Token}
	if out, _, _ := g2.Exec(t, "cat", "/tmp/mark"); out != "kept\n" {
		t.Fatalf("after hibernation /tmp/mark = %q", out)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if lc, ok := sb.(isolation.LeakChecker); ok {
		if left := lc.Leftovers(ctx); len(left) > 0 {
			t.Fatalf("left behind: %q", left)
		}
	}
}
