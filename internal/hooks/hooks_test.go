package hooks

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

const hookSecret = "gh-webhook-secret-value"

type harness struct {
	t     *testing.T
	st    store.Store
	svc   *Service
	edge  *httptest.Server // the hooks origin
	guest *httptest.Server // stands in for the guest's endpoint

	mu       sync.Mutex
	events   []api.EventPayload
	got      []*http.Request
	bodies   []string
	failNext int               // the guest answers 500 this many times
	gone     map[string]string // sandbox → status, for Config.Gone
}

func newHarness(t *testing.T, st store.Store) *harness {
	t.Helper()
	if st == nil {
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "store.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if err := db.CreateTenant(context.Background(), &store.Tenant{ID: "t1", Name: "t1"}); err != nil {
			t.Fatal(err)
		}
		st = db
	}
	h := &harness{t: t, st: st}
	h.guest = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.failNext > 0 {
			h.failNext--
			http.Error(w, "not yet", 500)
			return
		}
		h.got = append(h.got, r)
		h.bodies = append(h.bodies, string(b))
	}))
	t.Cleanup(h.guest.Close)
	h.svc = New(Config{
		Store:   st,
		BaseURL: "https://hooks.example.test",
		Secret: func(_ context.Context, tenant, name string) ([]byte, func(), error) {
			if tenant != "t1" || name != "GH_HOOK" {
				return nil, nil, errors.New("no such secret")
			}
			return []byte(hookSecret), func() {}, nil
		},
		// Deliver over real HTTP to the stand-in guest.
		Deliver: func(ctx context.Context, sandboxID string, port int, req *http.Request) (int, error) {
			req.URL.Scheme, req.URL.Host = "http", strings.TrimPrefix(h.guest.URL, "http://")
			req.RequestURI = ""
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, err
			}
			resp.Body.Close()
			return resp.StatusCode, nil
		},
		Emit: func(_, _ string, ev api.EventPayload) {
			h.mu.Lock()
			h.events = append(h.events, ev)
			h.mu.Unlock()
		},
		Gone: func(_ context.Context, sandboxID string) (string, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.gone[sandboxID], nil
		},
		MaxBody:    1 << 10,
		MaxPending: 3,
	})
	h.edge = httptest.NewServer(h.svc)
	t.Cleanup(h.edge.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.svc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

func ghSign(body string) string {
	m := hmac.New(sha256.New, []byte(hookSecret))
	m.Write([]byte(body))
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

func (h *harness) post(url, body string, hdr ...string) (int, string) {
	h.t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (h *harness) waitDelivered(n int) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		got := len(h.got)
		h.mu.Unlock()
		if got >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.t.Fatalf("%d deliveries reached the guest, want %d", len(h.got), n)
}

func (h *harness) add(name string) (*api.Webhook, string) {
	h.t.Helper()
	w, err := h.svc.Add(context.Background(), "t1", "sb-1", &api.WebhookRequest{Name: name, Port: 8080, Path: "/hook", Verify: "github", Secret: "GH_HOOK"})
	if err != nil {
		h.t.Fatal(err)
	}
	// The URL's path on the test origin.
	return w, h.edge.URL + "/w/" + w.Token
}

func TestVerifiedDeliveryReachesGuest(t *testing.T) {
	h := newHarness(t, nil)
	w, url := h.add("gh")
	if !strings.HasPrefix(w.URL, "https://hooks.example.test/w/cbw_") || w.Token == "" {
		t.Fatalf("webhook: %+v", w)
	}
	body := `{"action":"opened"}`
	code, resp := h.post(url, body, "X-Hub-Signature-256", ghSign(body), "X-GitHub-Delivery", "d-1", "X-GitHub-Event", "pull_request",
		"Authorization", "Bearer should-not-pass", "X-Cagebox-Access", "forged")
	if code != http.StatusAccepted || !strings.Contains(resp, `"accepted":true`) {
		t.Fatalf("valid delivery: %d %s", code, resp)
	}
	h.waitDelivered(1)
	h.mu.Lock()
	r, b := h.got[0], h.bodies[0]
	h.mu.Unlock()
	if b != body || r.URL.Path != "/hook" || r.Method != "POST" {
		t.Errorf("the guest got %s %s %q", r.Method, r.URL.Path, b)
	}
	if r.Header.Get("X-Github-Event") != "pull_request" || r.Header.Get("X-Cagebox-Webhook-Verified") != "github" {
		t.Errorf("headers: %v", r.Header)
	}
	if r.Header.Get("Authorization") != "" || r.Header.Get("X-Cagebox-Access") != "" {
		t.Errorf("sender's credentials or cagebox headers reached the guest: %v", r.Header)
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			if strings.Contains(v, hookSecret) {
				t.Errorf("the secret reached the guest in %s", k)
			}
		}
	}
	// The same delivery again: a replay.
	if code, _ := h.post(url, body, "X-Hub-Signature-256", ghSign(body), "X-GitHub-Delivery", "d-1"); code != http.StatusUnauthorized {
		t.Errorf("replay: %d, want 401", code)
	}
	l, err := h.svc.List(context.Background(), "t1", "sb-1")
	if err != nil || len(l) != 1 || l[0].Token != "" || l[0].URL != "" || l[0].Pending != 0 {
		t.Errorf("list: %+v %v", l, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var kinds []string
	for _, e := range h.events {
		kinds = append(kinds, string(e.EventKind()))
		if s := fmt.Sprintf("%+v", e); strings.Contains(s, hookSecret) {
			t.Errorf("event carries the secret: %s", s)
		}
	}
	if strings.Join(kinds, ",") != "webhook.received,webhook.delivered,webhook.rejected" {
		t.Errorf("events: %v", kinds)
	}
}

func TestRefusals(t *testing.T) {
	h := newHarness(t, nil)
	_, url := h.add("gh")
	body := `{"x":1}`
	for name, c := range map[string]struct {
		url  string
		body string
		hdr  []string
		want int
	}{
		"unsigned":       {url, body, nil, 401},
		"wrong key":      {url, body, []string{"X-Hub-Signature-256", "sha256=" + strings.Repeat("00", 32)}, 401},
		"body changed":   {url, body + " ", []string{"X-Hub-Signature-256", ghSign(body)}, 401},
		"unknown token":  {h.edge.URL + "/w/cbw_nope", body, []string{"X-Hub-Signature-256", ghSign(body)}, 404},
		"no token":       {h.edge.URL + "/w/", body, nil, 404},
		"too large":      {url, strings.Repeat("a", 2000), []string{"X-Hub-Signature-256", ghSign(strings.Repeat("a", 2000))}, 413},
		"token and path": {url + "/x", body, []string{"X-Hub-Signature-256", ghSign(body)}, 404},
	} {
		if code, resp := h.post(c.url, c.body, c.hdr...); code != c.want {
			t.Errorf("%s: %d %s, want %d", name, code, resp, c.want)
		}
	}
	req, _ := http.NewRequest("GET", url, nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 405 {
		t.Errorf("GET: %v %v", resp, err)
	}
	time.Sleep(100 * time.Millisecond)
	h.mu.Lock()
	if len(h.got) != 0 {
		t.Errorf("a refused request reached the guest: %d", len(h.got))
	}
	h.mu.Unlock()
	// Add refuses what cannot work, with what to do.
	for name, req := range map[string]*api.WebhookRequest{
		"no verify":  {Name: "a", Port: 80, Secret: "GH_HOOK"},
		"bad scheme": {Name: "a", Port: 80, Verify: "gitlab", Secret: "GH_HOOK"},
		"no secret":  {Name: "a", Port: 80, Verify: "github"},
		"unknown":    {Name: "a", Port: 80, Verify: "github", Secret: "NOPE"},
		"bad port":   {Name: "a", Port: 0, Verify: "github", Secret: "GH_HOOK"},
		"bad name":   {Name: "A B", Port: 80, Verify: "github", Secret: "GH_HOOK"},
		"bad path":   {Name: "a", Port: 80, Path: "hook", Verify: "github", Secret: "GH_HOOK"},
	} {
		if _, err := h.svc.Add(context.Background(), "t1", "sb-1", req); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Add %s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := h.svc.Add(context.Background(), "t1", "sb-1", &api.WebhookRequest{Name: "gh", Port: 80, Verify: "github", Secret: "GH_HOOK"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Add twice: %v", err)
	}
	if err := h.svc.Remove(context.Background(), "t1", "sb-1", "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Remove unknown: %v", err)
	}
}

// TestRetriesAndQueueBound: a guest that fails gets the delivery again
// (with backoff), in order; the queue refuses past its bound with 503.
func TestRetriesAndQueueBound(t *testing.T) {
	h := newHarness(t, nil)
	h.mu.Lock()
	h.failNext = 1
	h.mu.Unlock()
	_, url := h.add("gh")
	for i := 1; i <= 2; i++ {
		b := fmt.Sprintf(`{"n":%d}`, i)
		if code, _ := h.post(url, b, "X-Hub-Signature-256", ghSign(b), "X-GitHub-Delivery", fmt.Sprint("d-", i)); code != 202 {
			t.Fatalf("delivery %d: %d", i, code)
		}
	}
	h.waitDelivered(2)
	h.mu.Lock()
	if h.bodies[0] != `{"n":1}` || h.bodies[1] != `{"n":2}` || h.got[0].Header.Get("X-Cagebox-Attempt") != "2" {
		t.Errorf("order or attempts: %v %v", h.bodies, h.got[0].Header)
	}
	h.mu.Unlock()
	if Backoff(1) != time.Second || Backoff(3) != 4*time.Second || Backoff(40) != maxBackoff {
		t.Errorf("backoff: %v %v %v", Backoff(1), Backoff(3), Backoff(40))
	}
}

func TestQueueFullAndRestart(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.CreateTenant(context.Background(), &store.Tenant{ID: "t1", Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	// A service whose guest never answers (a sleeping sandbox that cannot
	// be woken yet): deliveries stay queued.
	svc := New(Config{Store: db, BaseURL: "https://hooks.test", MaxPending: 2,
		Secret: func(context.Context, string, string) ([]byte, func(), error) {
			return []byte(hookSecret), func() {}, nil
		},
		Deliver: func(context.Context, string, int, *http.Request) (int, error) { return 0, errors.New("asleep") }})
	w, err := svc.Add(context.Background(), "t1", "sb-1", &api.WebhookRequest{Name: "gh", Port: 8080, Path: "/hook", Verify: "github", Secret: "GH_HOOK"})
	if err != nil {
		t.Fatal(err)
	}
	edge := httptest.NewServer(svc)
	defer edge.Close()
	h := &harness{t: t}
	for i := 1; i <= 3; i++ {
		b := fmt.Sprintf(`{"n":%d}`, i)
		code, _ := h.post(edge.URL+"/w/"+w.Token, b, "X-Hub-Signature-256", ghSign(b), "X-GitHub-Delivery", fmt.Sprint("q-", i))
		want := 202
		if i == 3 {
			want = 503
		}
		if code != want {
			t.Fatalf("delivery %d: %d, want %d", i, code, want)
		}
	}
	// A new service on the same store (a daemon restart) delivers what
	// the old one queued, and still refuses the replay of one of them.
	h2 := newHarness(t, db)
	h2.waitDelivered(2)
	b := `{"n":1}`
	if code, _ := h2.post(h2.edge.URL+"/w/"+w.Token, b, "X-Hub-Signature-256", ghSign(b), "X-GitHub-Delivery", "q-1"); code != 401 {
		t.Errorf("replay after a restart: %d, want 401", code)
	}
}

// heldDue holds the dispatcher's next read of due deliveries, once
// armed, after it has read them: the list goes stale meanwhile.
type heldDue struct {
	store.Store
	mu      sync.Mutex
	armed   bool
	held    chan struct{} // closed when a read is held
	release chan struct{}
}

func (h *heldDue) DueDeliveries(ctx context.Context, sandboxID string, now time.Time, limit int) ([]*store.Delivery, error) {
	ds, err := h.Store.DueDeliveries(ctx, sandboxID, now, limit)
	h.mu.Lock()
	hold := h.armed && sandboxID == ""
	if hold {
		h.armed = false
	}
	h.mu.Unlock()
	if hold {
		close(h.held)
		<-h.release
	}
	return ds, err
}

// TestNoDeliveryTwice: the dispatcher read its due list while a delivery
// was under way, and that delivery finished before the list was acted on:
// it is not delivered again (at-least-once allows a retry after a failure,
// not a second delivery of one the guest accepted).
func TestNoDeliveryTwice(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.CreateTenant(context.Background(), &store.Tenant{ID: "t1", Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	st := &heldDue{Store: db}
	var mu sync.Mutex
	got := map[string]int{} // X-Cagebox-Delivery → deliveries
	entered := make(chan string, 8)
	finish := make(chan struct{})
	svc := New(Config{Store: st, BaseURL: "https://hooks.test",
		Secret: func(context.Context, string, string) ([]byte, func(), error) {
			return []byte(hookSecret), func() {}, nil
		},
		Deliver: func(_ context.Context, _ string, _ int, req *http.Request) (int, error) {
			id := req.Header.Get("X-Cagebox-Delivery")
			mu.Lock()
			got[id]++
			first := len(got) == 1 && got[id] == 1
			mu.Unlock()
			entered <- id
			if first {
				<-finish
			}
			return http.StatusNoContent, nil
		}})
	edge := httptest.NewServer(svc)
	t.Cleanup(edge.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	w, err := svc.Add(context.Background(), "t1", "sb-1", &api.WebhookRequest{Name: "gh", Port: 8080, Path: "/hook", Verify: "github", Secret: "GH_HOOK"})
	if err != nil {
		t.Fatal(err)
	}
	post := func(i int) {
		b := fmt.Sprintf(`{"n":%d}`, i)
		req, _ := http.NewRequest("POST", edge.URL+"/w/"+w.Token, strings.NewReader(b))
		req.Header.Set("X-Hub-Signature-256", ghSign(b))
		req.Header.Set("X-GitHub-Delivery", fmt.Sprint("d-", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("delivery %d: %s", i, resp.Status)
		}
	}
	post(1)
	first := <-entered // under way, held by the guest
	post(2)
	st.mu.Lock()
	st.armed, st.held, st.release = true, make(chan struct{}), make(chan struct{})
	held, release := st.held, st.release
	st.mu.Unlock()
	svc.Kick()
	<-held // the dispatcher has read a due list naming the first delivery
	close(finish)
	// The first delivery finishes and frees its sandbox.
	deadline := time.Now().Add(10 * time.Second)
	for {
		svc.mu.Lock()
		busy := svc.busy["sb-1"]
		svc.mu.Unlock()
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first delivery never finished")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	select {
	case id := <-entered:
		if id == first {
			t.Fatalf("delivery %s reached the guest twice", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second delivery never came")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Errorf("deliveries: %v, want two, once each", got)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("delivery %s reached the guest %d times", id, n)
		}
	}
}

// TestReplaysRefused: a delivery re-sent with a fresh unsigned delivery id,
// its hex signature re-cased, other blanks or extra signatures beside the
// good one is a replay (401, nothing queued), in each scheme; a new
// delivery is accepted.
func TestReplaysRefused(t *testing.T) {
	h := newHarness(t, nil)
	sig := func(msg string) string {
		m := hmac.New(sha256.New, []byte(hookSecret))
		m.Write([]byte(msg))
		return hex.EncodeToString(m.Sum(nil))
	}
	ts := fmt.Sprint(time.Now().Unix())
	ts2 := fmt.Sprint(time.Now().Unix() - 1)
	for i, tc := range []struct {
		verify, body string
		first        []string
		replays      [][]string
		fresh        []string // a new delivery of the same body (nil: another body, signed like the first)
	}{
		{"github", `{"n":"gh"}`,
			[]string{"X-Hub-Signature-256", "sha256=" + sig(`{"n":"gh"}`), "X-GitHub-Delivery", "d-1"},
			[][]string{
				{"X-Hub-Signature-256", "sha256=" + sig(`{"n":"gh"}`), "X-GitHub-Delivery", "d-2"},
				{"X-Hub-Signature-256", "sha256=" + sig(`{"n":"gh"}`)},
				{"X-Hub-Signature-256", "sha256=" + strings.ToUpper(sig(`{"n":"gh"}`)), "X-GitHub-Delivery", "d-3"},
				{"X-Hub-Signature-256", "  sha256=" + sig(`{"n":"gh"}`) + " ", "X-GitHub-Delivery", "d-4"},
				{"X-Hub-Signature-256", "SHA256=" + sig(`{"n":"gh"}`), "X-GitHub-Delivery", "d-5"},
			}, nil},
		{"stripe", `{"n":"st"}`,
			[]string{"Stripe-Signature", "t=" + ts + ",v1=" + sig(ts+`.{"n":"st"}`)},
			[][]string{
				{"Stripe-Signature", "t=" + ts + ",v1=" + strings.ToUpper(sig(ts+`.{"n":"st"}`))},
				{"Stripe-Signature", "t=" + ts + ", v1=" + sig(ts+`.{"n":"st"}`) + ",v1=" + strings.Repeat("0", 64)},
				{"Stripe-Signature", "v1=" + sig(ts+`.{"n":"st"}`) + ",t=" + ts + ",v0=ab"},
			},
			[]string{"Stripe-Signature", "t=" + ts2 + ",v1=" + sig(ts2+`.{"n":"st"}`)}},
		{"slack", `{"n":"sl"}`,
			[]string{"X-Slack-Request-Timestamp", ts, "X-Slack-Signature", "v0=" + sig("v0:"+ts+`:{"n":"sl"}`)},
			[][]string{
				{"X-Slack-Request-Timestamp", ts, "X-Slack-Signature", "v0=" + strings.ToUpper(sig("v0:"+ts+`:{"n":"sl"}`))},
				{"X-Slack-Request-Timestamp", " " + ts + " ", "X-Slack-Signature", " v0=" + sig("v0:"+ts+`:{"n":"sl"}`)},
			},
			[]string{"X-Slack-Request-Timestamp", ts2, "X-Slack-Signature", "v0=" + sig("v0:"+ts2+`:{"n":"sl"}`)}},
		{"hmac:header=X-Sig,prefix=sha256=,id-header=X-Id", `{"n":"hm"}`,
			[]string{"X-Sig", "sha256=" + sig(`{"n":"hm"}`), "X-Id", "a"},
			[][]string{
				{"X-Sig", "sha256=" + sig(`{"n":"hm"}`), "X-Id", "b"},
				{"X-Sig", "sha256=" + strings.ToUpper(sig(`{"n":"hm"}`))},
			}, nil},
	} {
		w, err := h.svc.Add(context.Background(), "t1", "sb-1", &api.WebhookRequest{Name: fmt.Sprint("w", i), Port: 8080, Path: "/hook", Verify: tc.verify, Secret: "GH_HOOK"})
		if err != nil {
			t.Fatal(err)
		}
		url := h.edge.URL + "/w/" + w.Token
		if code, resp := h.post(url, tc.body, tc.first...); code != http.StatusAccepted {
			t.Fatalf("%s: the delivery: %d %s", tc.verify, code, resp)
		}
		for i, hdr := range tc.replays {
			if code, resp := h.post(url, tc.body, hdr...); code != http.StatusUnauthorized {
				t.Errorf("%s: replay %d (%q): %d %s, want 401", tc.verify, i, hdr, code, resp)
			}
		}
		fresh, body := tc.fresh, tc.body
		if fresh == nil {
			// Another body, signed like the first.
			body = strings.Replace(tc.body, `"}`, `2"}`, 1)
			fresh = append([]string(nil), tc.first...)
			for i := 1; i < len(fresh); i += 2 {
				fresh[i] = strings.Replace(fresh[i], sig(tc.body), sig(body), 1)
			}
		}
		if code, resp := h.post(url, body, fresh...); code != http.StatusAccepted {
			t.Errorf("%s: a new delivery: %d %s", tc.verify, code, resp)
		}
	}
	h.waitDelivered(8) // the accepted ones, two per scheme
}

// TestDeliveryDropsCageboxHeaders: a sender's header that a guest's
// server would read as one of cagebox's (X_Cagebox_… is HTTP_X_CAGEBOX_…
// to CGI, WSGI and PHP) does not reach the guest.
func TestDeliveryDropsCageboxHeaders(t *testing.T) {
	h := newHarness(t, nil)
	_, url := h.add("gh")
	body := `{"n":"hdr"}`
	if code, resp := h.post(url, body, "X-Hub-Signature-256", ghSign(body), "X_Cagebox_Webhook_Verified", "forged",
		"x-cagebox-attempt", "99", "Cookie", "cagebox_session=s"); code != http.StatusAccepted {
		t.Fatalf("delivery: %d %s", code, resp)
	}
	h.waitDelivered(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.got[0]
	for k, vs := range r.Header {
		if strings.Contains(strings.ToLower(k), "cagebox_") || k == "Cookie" {
			t.Errorf("the guest got %s: %q", k, vs)
		}
	}
	if r.Header.Get("X-Cagebox-Webhook-Verified") != "github" || r.Header.Get("X-Cagebox-Attempt") != "1" {
		t.Errorf("cagebox's own headers: %v", r.Header)
	}
}
