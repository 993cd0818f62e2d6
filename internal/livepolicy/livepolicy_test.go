package livepolicy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/safedial"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

type recorder struct {
	mu     sync.Mutex
	events []api.EventKind
}

func (r *recorder) emit(_, _ string, ev api.EventPayload) {
	r.mu.Lock()
	r.events = append(r.events, ev.EventKind())
	r.mu.Unlock()
}

func (r *recorder) has(kind api.EventKind) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range r.events {
		if k == kind {
			return true
		}
	}
	return false
}

func openStore(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "cagebox.db")
	}
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func parse(t testing.TB, src string) *policy.Document {
	t.Helper()
	d, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func newSandbox(t testing.TB, src string) (*Registry, *Sandbox, *recorder, store.Store) {
	t.Helper()
	st := openStore(t, "")
	rec := &recorder{}
	g := New(Config{Store: st, Emit: rec.emit, WebhookKey: []byte("k")})
	s, err := g.Attach(context.Background(), "sb-1", "t1", parse(t, src), "", false)
	if err != nil {
		t.Fatal(err)
	}
	return g, s, rec, st
}

func get(host, method, path string) *policy.Request {
	return &policy.Request{Host: host, Port: 443, Method: method, Path: path, BodySize: -1}
}

func decide(t *testing.T, s *Sandbox, r *policy.Request) policy.Decision {
	t.Helper()
	d, err := s.Decide(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSetAppliesToTheNextRequest(t *testing.T) {
	_, s, rec, st := newSandbox(t, "version: 1\nrules: [{name: gh, host: api.github.com, action: allow}]")
	if d := decide(t, s, get("example.com", "GET", "/")); d.Allow {
		t.Fatal("allowed before the change")
	}
	gen, err := s.Set(context.Background(), parse(t, "version: 1\nrules: [{name: ex, host: example.com, action: allow}]"), 1, "api:t1", "")
	if err != nil || gen != 2 {
		t.Fatalf("set: %v gen %d", err, gen)
	}
	if d := decide(t, s, get("example.com", "GET", "/")); !d.Allow || d.Rule != "ex" {
		t.Fatalf("after: %+v", d)
	}
	if !s.NamesHost("example.com") || s.NamesHost("api.github.com") {
		t.Fatal("DNS did not follow the change")
	}
	// A stale generation is a conflict and changes nothing.
	_, err = s.Set(context.Background(), parse(t, "version: 1\nrules: []"), 1, "api:t1", "")
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("stale If-Match: %v", err)
	}
	// An invalid document is refused with the field and changes nothing.
	_, err = s.Update(context.Background(), 0, "api:t1", "", func(d *policy.Document) (*policy.Document, error) {
		d.Rules = append(d.Rules, policy.Rule{Host: "*.com", Action: "allow"})
		return d, nil
	})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "rules[1].host") {
		t.Fatalf("invalid: %v", err)
	}
	doc, gen, _ := s.Policy()
	if gen != 2 || len(doc.Rules) != 1 {
		t.Fatalf("after refused edits: gen %d rules %d", gen, len(doc.Rules))
	}
	vs, _ := st.ListPolicyVersions(context.Background(), "t1", "sb-1")
	if len(vs) != 2 || vs[1].Actor != "api:t1" {
		t.Fatalf("history: %+v", vs)
	}
	if !rec.has(api.EventPolicyChanged) {
		t.Fatal("no policy.changed event")
	}
}

func TestConcurrentUpdatesSerialise(t *testing.T) {
	_, s, _, _ := newSandbox(t, "version: 1\nrules: []")
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Update(context.Background(), 0, "t", "", func(d *policy.Document) (*policy.Document, error) {
				d.Rules = append(d.Rules, policy.Rule{Host: "h" + strconv.Itoa(len(d.Rules)) + ".example.com", Action: "allow"})
				return d, nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	doc, gen, _ := s.Policy()
	if gen != 21 || len(doc.Rules) != 20 {
		t.Fatalf("gen %d, %d rules; want 21, 20 (no edit lost)", gen, len(doc.Rules))
	}
}

var op = Actor{Principal: Admin, By: "api:admin"}

func TestFreezeAndThaw(t *testing.T) {
	st := openStore(t, "")
	var closed []string
	var mu sync.Mutex
	g := New(Config{Store: st, CloseConns: func(id string) int { mu.Lock(); closed = append(closed, id); mu.Unlock(); return 1 }})
	doc := parse(t, "version: 1\nrules: [{host: a.example.com, action: allow}]")
	a, _ := g.Attach(context.Background(), "sb-a", "t1", doc, "", false)
	b, _ := g.Attach(context.Background(), "sb-b", "t2", doc, "", false)
	if ids, _ := g.Freeze(context.Background(), Scope{Tenant: "t1"}, op); len(ids) != 1 || ids[0] != "sb-a" {
		t.Fatalf("freeze tenant: %v", ids)
	}
	if d := decide(t, a, get("a.example.com", "GET", "/")); d.Allow || d.Rule != RuleFreeze {
		t.Fatalf("frozen: %+v", d)
	}
	if a.NamesHost("a.example.com") || !b.NamesHost("a.example.com") {
		t.Fatal("DNS of the frozen tenant must refuse, the other's not")
	}
	if d := decide(t, b, get("a.example.com", "GET", "/")); !d.Allow {
		t.Fatal("another tenant was frozen")
	}
	g.Freeze(context.Background(), Scope{All: true}, op)
	if d := decide(t, b, get("a.example.com", "GET", "/")); d.Allow {
		t.Fatal("freeze all")
	}
	// A sandbox attached while everything is frozen is frozen too.
	c, _ := g.Attach(context.Background(), "sb-c", "t3", doc, "", false)
	if !c.Frozen() {
		t.Fatal("new sandbox not frozen under freeze all")
	}
	g.Thaw(context.Background(), Scope{All: true}, op)
	if d := decide(t, a, get("a.example.com", "GET", "/")); !d.Allow {
		t.Fatalf("after thaw: %+v", d)
	}
	g.Freeze(context.Background(), Scope{Sandbox: "sb-b"}, op)
	if !b.Frozen() || a.Frozen() {
		t.Fatal("freeze one")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(closed) != 4 {
		t.Fatalf("connections closed for %v", closed)
	}
}

const holdDoc = `
version: 2
rules:
  - {name: risky, host: api.github.com, methods: [DELETE], action: hold, timeout: 3s}
  - {name: gh, host: api.github.com, action: allow}
`

// waitPending returns the id of the sandbox's pending approval.
func waitPending(t *testing.T, st store.Store) string {
	t.Helper()
	for i := 0; i < 300; i++ {
		as, _ := st.ListApprovals(context.Background(), "", "", store.ApprovalPending, 0)
		if len(as) > 0 {
			return as[0].ID
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no pending approval")
	return ""
}

func TestHoldApprovedAndRemembered(t *testing.T) {
	g, s, rec, st := newSandbox(t, holdDoc)
	res := make(chan policy.Decision, 1)
	go func() {
		d, _ := s.Decide(context.Background(), get("api.github.com", "DELETE", "/repos/a/b"))
		res <- d
	}()
	id := waitPending(t, st)
	// Another tenant cannot decide it.
	if _, err := g.Decide(context.Background(), "t2", id, true, false, "api:t2", ""); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("other tenant: %v", err)
	}
	if _, err := g.Decide(context.Background(), "t1", id, true, true, "api:t1", "ok"); err != nil {
		t.Fatal(err)
	}
	d := <-res
	if !d.Allow || d.Rule != "risky" {
		t.Fatalf("approved: %+v", d)
	}
	// Deciding again is a conflict.
	if _, err := g.Decide(context.Background(), "t1", id, false, false, "api:t1", ""); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("twice: %v", err)
	}
	// Remembered: the same request is allowed without a hold now.
	if d := decide(t, s, get("api.github.com", "DELETE", "/repos/a/b")); !d.Allow || d.Rule != "approval:"+id {
		t.Fatalf("remembered: %+v", d)
	}
	// Another path is still held.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if d, _ := s.Decide(ctx, get("api.github.com", "DELETE", "/repos/a/c")); d.Allow {
		t.Fatal("another path was not held")
	}
	if !rec.has(api.EventApprovalPending) || !rec.has(api.EventApprovalDecided) {
		t.Fatal("approval events")
	}
}

func TestHoldTimesOut(t *testing.T) {
	_, s, _, st := newSandbox(t, strings.Replace(holdDoc, "3s", "100ms", 1))
	start := time.Now()
	d := decide(t, s, get("api.github.com", "DELETE", "/x"))
	if d.Allow || d.Rule != "risky" || !strings.Contains(d.Reason, "no decision within 100ms") {
		t.Fatalf("timeout: %+v", d)
	}
	if el := time.Since(start); el < 100*time.Millisecond || el > 2*time.Second {
		t.Fatalf("held %v", el)
	}
	as, _ := st.ListApprovals(context.Background(), "t1", "", "", 0)
	if len(as) != 1 || as[0].State != store.ApprovalExpired {
		t.Fatalf("approval after timeout: %+v", as)
	}
}

func TestHoldByWebhook(t *testing.T) {
	daemonKey := []byte("webhook-key")
	key := WebhookKey(daemonKey, "t1") // the tenant's key, not the daemon's
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		ts, _ := strconv.ParseInt(r.Header.Get(HeaderTimestamp), 10, 64)
		if r.Header.Get(HeaderSignature) != Sign(key, ts, body) {
			http.Error(w, "bad signature", 401)
			return
		}
		var wr WebhookRequest
		_ = json.Unmarshal(body, &wr)
		dec := "deny"
		if strings.HasPrefix(wr.Request.Path, "/ok") && wr.Request.Preview == "amount=5&token=ph_placeholder" {
			dec = "allow"
		}
		_ = json.NewEncoder(w).Encode(WebhookAnswer{Decision: dec})
	}))
	defer srv.Close()
	st := openStore(t, "")
	// The receiver is on loopback: only the operator's flag lets a
	// tenant's URL reach it (--tenant-urls-allow-private).
	g := New(Config{Store: st, WebhookKey: daemonKey, WebhookClient: safedial.New(safedial.Config{AllowPrivate: true}).HTTPClient(nil)})
	s, err := g.Attach(context.Background(), "sb-1", "t1", parse(t, holdDoc+"approval: {webhook: '"+srv.URL+"/hook', timeout: 2s}\n"), "", false)
	if err != nil {
		t.Fatal(err)
	}
	withBody := get("api.github.com", "DELETE", "/ok/1")
	withBody.Peek = func(n int) []byte { return []byte("amount=5&token=ph_placeholder")[:min(n, 29)] }
	if d := decide(t, s, withBody); !d.Allow {
		t.Fatalf("webhook allow: %+v", d)
	}
	if d := decide(t, s, get("api.github.com", "DELETE", "/no")); d.Allow {
		t.Fatalf("webhook deny: %+v", d)
	}
	// A webhook with the wrong key answers 401: denied, not hanging, and
	// the status is not shown to the guest.
	g.cfg.WebhookKey = []byte("other")
	if d := decide(t, s, get("api.github.com", "DELETE", "/ok/2")); d.Allow || strings.Contains(d.Reason, "401") || !strings.Contains(d.Reason, webhookBadAnswer) {
		t.Fatalf("failing webhook: %+v", d)
	}
	// Another tenant's sandbox, same receiver: its requests are signed
	// with its own key, which this receiver (holding t1's) refuses.
	g.cfg.WebhookKey = daemonKey
	s2, err := g.Attach(context.Background(), "sb-2", "t2", parse(t, holdDoc+"approval: {webhook: '"+srv.URL+"/hook', timeout: 2s}\n"), "", false)
	if err != nil {
		t.Fatal(err)
	}
	if d := decide(t, s2, withBody); d.Allow {
		t.Fatalf("another tenant's webhook request verified with t1's key: %+v", d)
	}
	if calls.Load() != 4 {
		t.Fatalf("%d webhook calls", calls.Load())
	}
}

// TestWebhookKeyPerTenant: each tenant's key differs, and none is the
// daemon's key.
func TestWebhookKeyPerTenant(t *testing.T) {
	root := []byte("daemon-key")
	a, b := WebhookKey(root, "t1"), WebhookKey(root, "t2")
	if string(a) == string(b) || string(a) == string(root) || len(a) != 64 {
		t.Fatalf("keys %q %q", a, b)
	}
	if string(WebhookKey(root, "t1")) != string(a) {
		t.Fatal("the key is not stable")
	}
}

// TestWebhookSSRF: with the default client (package safedial), a policy's
// approval webhook cannot reach the host's loopback — a server there is
// never called — nor learn anything from it: whatever the address, port or
// answer, the reason the guest sees is one fixed text.
func TestWebhookSSRF(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "internal secret answer", 500)
	}))
	defer srv.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + closed.Addr().String()
	closed.Close()
	st := openStore(t, "")
	g := New(Config{Store: st, WebhookKey: []byte("k")})
	var reasons []string
	for i, u := range []string{srv.URL + "/hook", strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) + "/hook", closedURL + "/hook", "https://169.254.169.254/latest", "https://[::1]:1/x"} {
		s, err := g.Attach(context.Background(), fmt.Sprintf("sb-%d", i), "t1", parse(t, holdDoc+"approval: {webhook: '"+u+"', timeout: 2s}\n"), "", false)
		if err != nil {
			t.Fatal(err)
		}
		d := decide(t, s, get("api.github.com", "DELETE", "/ok/1"))
		if d.Allow || !strings.Contains(d.Reason, webhookUnreachable) {
			t.Errorf("%s: %+v, want denied: %s", u, d, webhookUnreachable)
		}
		reasons = append(reasons, strings.Split(d.Reason, " (ap-")[0])
	}
	for _, r := range reasons[1:] {
		if r != reasons[0] {
			t.Errorf("reasons differ by target (an oracle): %q vs %q", r, reasons[0])
		}
	}
	if calls.Load() != 0 {
		t.Fatalf("the loopback server was called %d times", calls.Load())
	}
}

func TestRestartExpiresPendingApprovals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cagebox.db")
	st := openStore(t, path)
	g := New(Config{Store: st})
	s, _ := g.Attach(context.Background(), "sb-1", "t1", parse(t, holdDoc), "", false)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, _ = s.Decide(ctx, get("api.github.com", "DELETE", "/x")) }()
	id := waitPending(t, st)
	cancel()
	// The guest went away: the approval is expired, not left pending.
	for i := 0; ; i++ {
		a, _ := st.GetApproval(context.Background(), "", id)
		if a.State == store.ApprovalExpired {
			break
		}
		if i > 200 {
			t.Fatalf("state %q after the guest left", a.State)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A pending approval left by a daemon that died is expired at start.
	_ = st.CreateApproval(context.Background(), &store.Approval{ID: "ap-old", TenantID: "t1", SandboxID: "sb-1", Rule: "risky", Deadline: time.Now().Add(time.Hour)})
	g2 := New(Config{Store: st})
	if err := g2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a, _ := st.GetApproval(context.Background(), "", "ap-old"); a.State != store.ApprovalExpired || !strings.Contains(a.Reason, "restarted") {
		t.Fatalf("after restart: %+v", a)
	}
}

const budgetDoc = `
version: 2
prices: {gpt-4o: {input: 2.5, output: 10}}
rules:
  - {name: llm, host: api.openai.com, action: allow}
  - {name: gh, host: api.github.com, action: allow}
budgets:
  - {name: calls, hosts: [api.openai.com], requests: 10}
  - {name: spend, rules: [llm], spend: 0.01}
`

func TestBudgetExactUnderConcurrencyAndSurvivesRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cagebox.db")
	st := openStore(t, path)
	rec := &recorder{}
	g := New(Config{Store: st, Emit: rec.emit})
	s, err := g.Attach(context.Background(), "sb-1", "t1", parse(t, budgetDoc), "", false)
	if err != nil {
		t.Fatal(err)
	}
	var allowed atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d, _ := s.Decide(context.Background(), get("api.openai.com", "POST", "/v1/chat/completions")); d.Allow {
				allowed.Add(1)
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != 10 {
		t.Fatalf("%d requests allowed with a cap of 10", allowed.Load())
	}
	d := decide(t, s, get("api.openai.com", "GET", "/v1/models"))
	if d.Allow || d.Rule != "budget:calls" || !strings.Contains(d.Reason, "10 of 10 requests") {
		t.Fatalf("spent: %+v", d)
	}
	if !rec.has(api.EventPolicyBudgetExhausted) {
		t.Fatal("no budget event")
	}
	// Other hosts are outside the budget.
	if d := decide(t, s, get("api.github.com", "GET", "/")); !d.Allow {
		t.Fatalf("github: %+v", d)
	}
	// A restarted daemon still knows.
	g2 := New(Config{Store: st})
	s2, err := g2.Attach(context.Background(), "sb-1", "t1", nil, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if d := decide(t, s2, get("api.openai.com", "GET", "/")); d.Allow || d.Rule != "budget:calls" {
		t.Fatalf("after restart: %+v", d)
	}
}

func TestSpendBudget(t *testing.T) {
	_, s, _, _ := newSandbox(t, strings.Replace(budgetDoc, "requests: 10", "requests: 1000", 1))
	r := get("api.openai.com", "POST", "/v1/chat/completions")
	if d := decide(t, s, r); !d.Allow {
		t.Fatal(d)
	}
	// 1000 input + 1000 output tokens of gpt-4o: $0.0125.
	s.Account(context.Background(), r.Host, "llm", 100, 200, 12500)
	d := decide(t, s, r)
	if d.Allow || d.Rule != "budget:spend" || !strings.Contains(d.Reason, "$0.0125 of $0.01") {
		t.Fatalf("spend: %+v", d)
	}
	us := s.Usage()
	if len(us) != 2 || us[1].Spent != 0.0125 || us[1].Used.BytesDown != 200 || !us[1].Exhausted {
		t.Fatalf("usage: %+v", us)
	}
}

func TestRateBudget(t *testing.T) {
	_, s, _, _ := newSandbox(t, "version: 2\nrules: [{host: a.example.com, action: allow}]\nbudgets: [{name: rps, rate: 1, burst: 3}]")
	n := 0
	for i := 0; i < 10; i++ {
		if decide(t, s, get("a.example.com", "GET", "/")).Allow {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("%d allowed at once with burst 3", n)
	}
}

func TestStripeTrigger(t *testing.T) {
	_, s, rec, _ := newSandbox(t, `
version: 2
rules:
  - {name: charge, host: api.stripe.com, methods: [POST], paths: [/v1/charges], action: allow}
  - {name: stripe, host: api.stripe.com, action: allow}
  - {name: github, host: api.github.com, action: allow}
triggers:
  - {name: lock, after: charge, do: {only: [api.stripe.com]}}
`)
	if !decide(t, s, get("api.github.com", "GET", "/")).Allow {
		t.Fatal("github before the charge")
	}
	if !decide(t, s, get("api.stripe.com", "POST", "/v1/charges")).Allow {
		t.Fatal("charge")
	}
	if d := decide(t, s, get("api.github.com", "GET", "/")); d.Allow || d.Rule != policy.RuleOnly {
		t.Fatalf("github after the charge: %+v", d)
	}
	if !decide(t, s, get("api.stripe.com", "GET", "/v1/balance")).Allow {
		t.Fatal("stripe after the charge")
	}
	if s.NamesHost("api.github.com") {
		t.Fatal("github still resolves")
	}
	_, gen, _ := s.Policy()
	if gen != 2 || !rec.has(api.EventPolicyTrigger) {
		t.Fatalf("gen %d", gen)
	}
}

func TestTriggerActsAndFailsClosed(t *testing.T) {
	st := openStore(t, "")
	acted := make(chan policy.TriggerAction, 1)
	g := New(Config{Store: st, Act: func(_ context.Context, _, _ string, a policy.TriggerAction) error {
		acted <- a
		if a.Pause {
			return errors.New("cannot pause")
		}
		return nil
	}})
	s, _ := g.Attach(context.Background(), "sb-1", "t1", parse(t, `
version: 2
rules: [{name: up, host: upload.example.com, action: allow}, {name: other, host: a.example.com, action: allow}]
triggers: [{name: t, when: 'request.method == "PUT" && request.size > 1000', do: {revoke: [TOKEN], pause: true}}]
`), "", false)
	r := get("upload.example.com", "PUT", "/f")
	r.BodySize = 5000
	if !decide(t, s, r).Allow {
		t.Fatal("the request that fires a trigger is allowed")
	}
	a := <-acted
	if len(a.Revoke) != 1 || !a.Pause {
		t.Fatalf("acted: %+v", a)
	}
	// The pause failed: the sandbox is frozen rather than left open.
	for i := 0; !s.Frozen(); i++ {
		if i > 200 {
			t.Fatal("not frozen after a failed trigger")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRefSurvivesRestart: which named policy a sandbox follows is recorded
// with each generation, so a restarted daemon neither forgets it nor
// brings back one an explicit replace dropped.
func TestRefSurvivesRestart(t *testing.T) {
	st := openStore(t, "")
	g := New(Config{Store: st})
	doc := parse(t, "version: 1\nrules: [{host: a.example.com, action: allow}]")
	s, err := g.Attach(context.Background(), "sb-1", "t1", doc, "base", false)
	if err != nil || s.Ref() != "base" {
		t.Fatalf("attach: %v ref %q", err, s.Ref())
	}
	if _, err := s.Set(context.Background(), doc, 0, "policy:base", ""); err != nil || s.Ref() != "base" {
		t.Fatalf("a named policy's edit keeps the ref: %v %q", err, s.Ref())
	}
	recovered := func() string {
		s2, err := New(Config{Store: st}).Attach(context.Background(), "sb-1", "t1", nil, "stale", true)
		if err != nil {
			t.Fatal(err)
		}
		return s2.Ref()
	}
	if r := recovered(); r != "base" {
		t.Fatalf("after restart: %q", r)
	}
	if _, err := s.Replace(context.Background(), doc, 0, "api:t1", "", ""); err != nil || s.Ref() != "" {
		t.Fatalf("replace: %v %q", err, s.Ref())
	}
	if r := recovered(); r != "" {
		t.Fatalf("after an explicit replace and a restart: %q", r)
	}
}

// TestFreezeOwner: a freeze belongs to whoever made it. A tenant cannot
// thaw (at any scope) what the admin froze, its tenant thaw leaves the
// admin's sandbox-level freezes in place, its own freeze of an
// admin-frozen sandbox does not make the freeze its own, and the refusal
// names who froze it.
func TestFreezeOwner(t *testing.T) {
	st := openStore(t, "")
	g := New(Config{Store: st})
	doc := parse(t, "version: 1\nrules: [{host: a.example.com, action: allow}]")
	a, _ := g.Attach(context.Background(), "sb-a", "t1", doc, "", false)
	b, _ := g.Attach(context.Background(), "sb-b", "t1", doc, "", false)
	t1 := Actor{Principal: "t1", By: "api:t1"}
	t2 := Actor{Principal: "t2", By: "api:t2"}
	refused := func(err error, who string) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrDenied) || !strings.Contains(err.Error(), who) || !strings.Contains(err.Error(), "only") {
			t.Fatalf("thaw: %v; want ErrDenied naming %s", err, who)
		}
	}

	// The admin freezes sandbox a: the tenant can neither thaw it, nor
	// take the freeze over by freezing it again, nor lift it by thawing
	// its tenant.
	if _, err := g.Freeze(context.Background(), Scope{Sandbox: "sb-a"}, op); err != nil {
		t.Fatal(err)
	}
	_, _, err := g.Thaw(context.Background(), Scope{Sandbox: "sb-a"}, t1)
	refused(err, "frozen by the admin")
	if _, err := g.Freeze(context.Background(), Scope{Sandbox: "sb-a"}, t1); err != nil {
		t.Fatal(err)
	}
	_, _, err = g.Thaw(context.Background(), Scope{Sandbox: "sb-a"}, t1)
	refused(err, "frozen by the admin")
	if _, err := g.Freeze(context.Background(), Scope{Tenant: "t1"}, t1); err != nil {
		t.Fatal(err)
	}
	ids, still, err := g.Thaw(context.Background(), Scope{Tenant: "t1"}, t1)
	if err != nil || !slices.Equal(ids, []string{"sb-b"}) || !slices.Equal(still, []string{"sb-a"}) {
		t.Fatalf("tenant thaw of its own tenant: thawed %v, still %v, %v; want [sb-b], [sb-a]", ids, still, err)
	}
	if !a.Frozen() || b.Frozen() {
		t.Fatalf("after the tenant's thaw: a frozen %v (want true), b frozen %v (want false)", a.Frozen(), b.Frozen())
	}
	if _, _, err := g.Thaw(context.Background(), Scope{Sandbox: "sb-a"}, op); err != nil || a.Frozen() {
		t.Fatalf("the admin thaws its own freeze: %v, frozen %v", err, a.Frozen())
	}

	// The admin freezes the tenant: the tenant thaws neither it nor one
	// of its sandboxes out of it.
	g.Freeze(context.Background(), Scope{Tenant: "t1"}, op)
	_, _, err = g.Thaw(context.Background(), Scope{Tenant: "t1"}, t1)
	refused(err, "frozen by the admin")
	_, _, err = g.Thaw(context.Background(), Scope{Sandbox: "sb-b"}, t1)
	refused(err, "frozen by the admin")
	if !a.Frozen() || !b.Frozen() {
		t.Fatal("a refused thaw changed something")
	}
	if _, _, err := g.Thaw(context.Background(), Scope{Tenant: "t1"}, op); err != nil || a.Frozen() || b.Frozen() {
		t.Fatalf("the admin's thaw: %v", err)
	}

	// Freeze all: a tenant's thaw of its tenant or sandbox is refused.
	if _, err := g.Freeze(context.Background(), Scope{All: true}, t1); !errors.Is(err, errdefs.ErrDenied) {
		t.Fatalf("a tenant froze all: %v", err)
	}
	g.Freeze(context.Background(), Scope{All: true}, op)
	_, _, err = g.Thaw(context.Background(), Scope{Tenant: "t1"}, t1)
	refused(err, "frozen by the admin")
	_, _, err = g.Thaw(context.Background(), Scope{All: true}, t1)
	refused(err, "frozen by the admin")
	g.Thaw(context.Background(), Scope{All: true}, op)

	// A tenant's own freeze is its own to thaw, and the admin's; another
	// principal's refusal names the tenant.
	g.Freeze(context.Background(), Scope{Sandbox: "sb-a"}, t1)
	_, _, err = g.Thaw(context.Background(), Scope{Sandbox: "sb-a"}, t2)
	refused(err, "frozen by tenant t1")
	if _, _, err := g.Thaw(context.Background(), Scope{Sandbox: "sb-a"}, t1); err != nil || a.Frozen() {
		t.Fatalf("the tenant thaws its own freeze: %v", err)
	}
	g.Freeze(context.Background(), Scope{Tenant: "t1"}, t1)
	if _, _, err := g.Thaw(context.Background(), Scope{Tenant: "t1"}, op); err != nil || a.Frozen() {
		t.Fatalf("the admin thaws a tenant's freeze: %v", err)
	}
}

// TestFreezesSurviveRestart: every freeze — of a sandbox, a tenant, all —
// is back after a restart (a new Registry over the same store) with its
// owner, so a tenant still cannot thaw what the admin froze; a removed
// sandbox's freeze goes with it; and a record the daemon cannot read
// stops the start rather than thaw.
func TestFreezesSurviveRestart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "cagebox.db")
	st := openStore(t, path)
	doc := parse(t, "version: 1\nrules: [{host: a.example.com, action: allow}]")
	t1 := Actor{Principal: "t1", By: "api:t1"}
	t2 := Actor{Principal: "t2", By: "api:t2"}
	// start is a daemon start: a new Registry, Start, then the
	// sandboxes re-attached as recovery does.
	start := func() (*Registry, map[string]*Sandbox) {
		t.Helper()
		g := New(Config{Store: st})
		if err := g.Start(ctx); err != nil {
			t.Fatal(err)
		}
		sbs := map[string]*Sandbox{}
		for _, sb := range []struct{ id, tenant string }{{"sb-a", "t1"}, {"sb-b", "t1"}, {"sb-c", "t2"}, {"sb-d", "t3"}} {
			s, err := g.Attach(ctx, sb.id, sb.tenant, doc, "", true)
			if err != nil {
				t.Fatal(err)
			}
			sbs[sb.id] = s
		}
		return g, sbs
	}
	frozen := func(sbs map[string]*Sandbox) (ids []string) {
		for id, s := range sbs {
			if s.Frozen() {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		return ids
	}
	refused := func(err error) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrDenied) || !strings.Contains(err.Error(), "frozen by the admin") {
			t.Fatalf("thaw after a restart: %v; want ErrDenied, frozen by the admin", err)
		}
	}

	g, _ := start()
	must := func(_ []string, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(g.Freeze(ctx, Scope{Sandbox: "sb-a"}, op)) // the admin's
	must(g.Freeze(ctx, Scope{Sandbox: "sb-a"}, t1)) // stays the admin's
	must(g.Freeze(ctx, Scope{Sandbox: "sb-b"}, t1)) // the tenant's own
	must(g.Freeze(ctx, Scope{Tenant: "t2"}, op))    // the admin's

	g, sbs := start()
	if got := frozen(sbs); !slices.Equal(got, []string{"sb-a", "sb-b", "sb-c"}) {
		t.Fatalf("frozen after a restart: %v; want [sb-a sb-b sb-c]", got)
	}
	if d := decide(t, sbs["sb-a"], get("a.example.com", "GET", "/")); d.Allow || d.Rule != RuleFreeze {
		t.Fatalf("sb-a after a restart: %+v", d)
	}
	_, _, err := g.Thaw(ctx, Scope{Sandbox: "sb-a"}, t1)
	refused(err)
	_, _, err = g.Thaw(ctx, Scope{Tenant: "t2"}, t2)
	refused(err)
	_, _, err = g.Thaw(ctx, Scope{Sandbox: "sb-c"}, t2)
	refused(err)
	// The tenant's thaw of its tenant lifts its own freeze, not the
	// admin's.
	ids, still, err := g.Thaw(ctx, Scope{Tenant: "t1"}, t1)
	if err != nil || !slices.Equal(ids, []string{"sb-b"}) || !slices.Equal(still, []string{"sb-a"}) {
		t.Fatalf("tenant thaw after a restart: %v %v %v; want [sb-b] [sb-a]", ids, still, err)
	}

	// A thaw is recorded too: what was thawed stays thawed.
	g, sbs = start()
	if got := frozen(sbs); !slices.Equal(got, []string{"sb-a", "sb-c"}) {
		t.Fatalf("frozen after a thaw and a restart: %v; want [sb-a sb-c]", got)
	}
	must(g.Freeze(ctx, Scope{All: true}, op))
	g, sbs = start()
	if got := frozen(sbs); len(got) != 4 {
		t.Fatalf("frozen after freeze all and a restart: %v", got)
	}
	_, _, err = g.Thaw(ctx, Scope{Sandbox: "sb-d"}, Actor{Principal: "t3", By: "api:t3"})
	refused(err)
	if _, _, err := g.Thaw(ctx, Scope{All: true}, op); err != nil {
		t.Fatal(err)
	}
	g, sbs = start()
	if got := frozen(sbs); len(got) != 0 {
		t.Fatalf("frozen after the admin's thaw of all and a restart: %v", got)
	}

	// A removed sandbox's freeze goes with it; one detached by a daemon
	// that stops stays.
	must(g.Freeze(ctx, Scope{Sandbox: "sb-c"}, op))
	must(g.Freeze(ctx, Scope{Sandbox: "sb-d"}, op))
	g.Detach(ctx, "sb-c", true)
	g.Detach(ctx, "sb-d", false)
	fs, err := st.ListFreezes(ctx)
	if err != nil || len(fs) != 1 || fs[0].Target != "sb-d" {
		t.Fatalf("freezes after removing sb-c: %v %+v; want sb-d's only", err, fs)
	}

	// A damaged record stops the start.
	if err := st.PutFreeze(ctx, &store.Freeze{Scope: "tenant", Target: "t9"}); err != nil {
		t.Fatal(err)
	}
	if err := New(Config{Store: st}).Start(ctx); err == nil || !strings.Contains(err.Error(), "no owner") {
		t.Fatalf("start over a freeze with no owner: %v; want an error", err)
	}
}
