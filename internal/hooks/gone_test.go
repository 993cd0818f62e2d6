package hooks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
)

func (h *harness) setGone(sandboxID, status string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone == nil {
		h.gone = map[string]string{}
	}
	h.gone[sandboxID] = status
}

// TestStoppedSandboxAnswersGone: a verified delivery for a stopped or
// failed sandbox is refused with 410 and what to do (webhook.rejected),
// and nothing is queued; an unverified sender still learns nothing (401,
// and 404 for an unknown token); no webhook is added to such a sandbox.
func TestStoppedSandboxAnswersGone(t *testing.T) {
	for _, status := range []string{"stopped", "failed"} {
		t.Run(status, func(t *testing.T) {
			h := newHarness(t, nil)
			_, url := h.add("gh")
			h.setGone("sb-1", status)
			body := `{"n":1}`
			code, resp := h.post(url, body, "X-Hub-Signature-256", ghSign(body), "X-GitHub-Delivery", "d-1")
			if code != http.StatusGone || !strings.Contains(resp, status+" and takes no more deliveries") || !strings.Contains(resp, "remove the webhook") {
				t.Fatalf("a signed delivery for a %s sandbox: %d %q, want 410 saying it is %s and what to do", status, code, resp, status)
			}
			for name, c := range map[string]struct {
				url  string
				hdr  []string
				want int
			}{
				"unsigned":      {url, nil, http.StatusUnauthorized},
				"forged":        {url, []string{"X-Hub-Signature-256", "sha256=" + strings.Repeat("00", 32)}, http.StatusUnauthorized},
				"unknown token": {h.edge.URL + "/w/cbw_nope", []string{"X-Hub-Signature-256", ghSign(body)}, http.StatusNotFound},
			} {
				if code, resp := h.post(c.url, body, c.hdr...); code != c.want || strings.Contains(resp, status) {
					t.Errorf("%s: %d %q, want %d and no word of the sandbox", name, code, resp, c.want)
				}
			}
			l, err := h.svc.List(context.Background(), "t1", "sb-1")
			if err != nil || len(l) != 1 || l[0].Pending != 0 {
				t.Errorf("list: %+v %v, want nothing pending", l, err)
			}
			h.mu.Lock()
			var gone []api.WebhookRejected
			for _, e := range h.events {
				switch e := e.(type) {
				case api.WebhookRejected:
					if e.Status == http.StatusGone {
						gone = append(gone, e)
					}
				case api.WebhookReceived:
					t.Errorf("webhook.received for a %s sandbox: %+v", status, e)
				}
			}
			h.mu.Unlock()
			if len(gone) != 1 || gone[0].Webhook != "gh" || !strings.Contains(gone[0].Reason, status+" and takes no more deliveries") {
				t.Errorf("webhook.rejected with 410: %+v, want one naming the reason", gone)
			}
			_, err = h.svc.Add(context.Background(), "t1", "sb-1", &api.WebhookRequest{Name: "gh2", Port: 8080, Verify: "github", Secret: "GH_HOOK"})
			if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), status) {
				t.Errorf("webhook add to a %s sandbox: %v, want a conflict saying so", status, err)
			}
		})
	}
}

// TestStoppedSandboxQueueGivesUp: deliveries queued for a sandbox that
// then stops — one of them being retried — are finished as failed at
// once (webhook.failed, gave_up, naming the reason), not retried for
// hours; the guest gets no further attempt.
func TestStoppedSandboxQueueGivesUp(t *testing.T) {
	h := newHarness(t, nil)
	const failing = 1000
	h.mu.Lock()
	h.failNext = failing
	h.mu.Unlock()
	_, url := h.add("gh")
	for i := 1; i <= 3; i++ {
		b := fmt.Sprintf(`{"n":%d}`, i)
		if code, resp := h.post(url, b, "X-Hub-Signature-256", ghSign(b), "X-GitHub-Delivery", fmt.Sprint("d-", i)); code != http.StatusAccepted {
			t.Fatalf("delivery %d: %d %s", i, code, resp)
		}
	}
	failed := func() (retried, gaveUp []api.WebhookFailed) {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, e := range h.events {
			if f, ok := e.(api.WebhookFailed); ok {
				if f.GaveUp {
					gaveUp = append(gaveUp, f)
				} else {
					retried = append(retried, f)
				}
			}
		}
		return retried, gaveUp
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r, _ := failed(); len(r) >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first attempt never failed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The first delivery waits for its second attempt; the sandbox stops.
	h.setGone("sb-1", "stopped")
	h.mu.Lock()
	attemptsBefore := failing - h.failNext
	h.mu.Unlock()
	stopped := time.Now()
	deadline = stopped.Add(5 * time.Second)
	for {
		if _, g := failed(); len(g) == 3 {
			break
		}
		if time.Now().After(deadline) {
			r, g := failed()
			t.Fatalf("%d deliveries gave up within 5 s of the stop (%d attempts retried), want all 3", len(g), len(r))
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(stopped)
	retried, gaveUp := failed()
	seen := map[int64]bool{}
	for _, f := range gaveUp {
		if f.Webhook != "gh" || !strings.Contains(f.Error, "the sandbox is stopped") || seen[f.Delivery] {
			t.Errorf("webhook.failed: %+v, want gave_up once per delivery, naming the stop", f)
		}
		seen[f.Delivery] = true
	}
	// Only the attempt under way at the stop may have reached the guest
	// after it; the second and third deliveries were never tried.
	time.Sleep(300 * time.Millisecond)
	h.mu.Lock()
	attempts := failing - h.failNext
	h.mu.Unlock()
	if attempts > attemptsBefore+1 || len(retried) > 2 {
		t.Errorf("%d attempts before the stop, %d in all (%d retried): the stopped sandbox's deliveries were tried again", attemptsBefore, attempts, len(retried))
	}
	l, err := h.svc.List(context.Background(), "t1", "sb-1")
	if err != nil || len(l) != 1 || l[0].Pending != 0 {
		t.Errorf("list: %+v %v, want nothing pending", l, err)
	}
	t.Logf("the stopped sandbox's 3 deliveries gave up %v after the stop", took.Round(time.Millisecond))
}
