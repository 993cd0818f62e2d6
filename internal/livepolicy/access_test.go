package livepolicy

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

// waitAccessPending returns the id of the sandbox's pending access approval.
func waitAccessPending(t *testing.T, st store.Store) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		as, _ := st.ListApprovals(context.Background(), "t1", "", store.ApprovalPending, 100)
		for _, a := range as {
			if a.Rule == AccessRule {
				return a.ID
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("no pending access request")
	return ""
}

func TestRequestAccess(t *testing.T) {
	g, s, rec, st := newSandbox(t, "version: 2\ndefault: deny\n")
	if s.AllowsName("api.example.com") {
		t.Fatal("allowed before the request")
	}
	type out struct {
		r   *AccessResult
		err error
	}
	ask := func(host string, wait time.Duration) chan out {
		ch := make(chan out, 1)
		go func() {
			r, err := s.RequestAccess(context.Background(), host, "I need the docs", wait)
			ch <- out{r, err}
		}()
		return ch
	}
	// Approved: the host is allowed from then on.
	ch := ask("api.example.com", time.Minute)
	id := waitAccessPending(t, st)
	if !rec.has(api.EventApprovalPending) {
		t.Error("no approval.pending event")
	}
	if _, err := g.Decide(context.Background(), "t1", id, true, false, "api:t1", "ok"); err != nil {
		t.Fatal(err)
	}
	o := <-ch
	if o.err != nil || !o.r.Allowed || o.r.Approval != id {
		t.Fatalf("approved request: %+v %v", o.r, o.err)
	}
	if !s.AllowsName("api.example.com") {
		t.Fatal("the approved host is not allowed")
	}
	// Denied: nothing changes.
	ch = ask("evil.example.com", time.Minute)
	id = waitAccessPending(t, st)
	if _, err := g.Decide(context.Background(), "t1", id, false, false, "api:t1", "no"); err != nil {
		t.Fatal(err)
	}
	if o := <-ch; o.err != nil || o.r.Allowed || o.r.Reason != "no" {
		t.Fatalf("denied request: %+v %v", o.r, o.err)
	}
	if s.AllowsName("evil.example.com") {
		t.Fatal("a denied host is allowed")
	}
	// Unanswered: expires.
	if o := <-ask("slow.example.com", 30*time.Millisecond); o.err != nil || o.r.Allowed || o.r.By != "timeout" {
		t.Fatalf("unanswered request: %+v %v", o.r, o.err)
	}
	// A bad host is refused before anything is recorded.
	if _, err := s.RequestAccess(context.Background(), "*.com", "", time.Second); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad host: %v", err)
	}
}
