package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/store"
)

func testPolicyVersions(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTenant(t, s, "t1")
	for g := int64(1); g <= 3; g++ {
		v := &store.PolicyVersion{SandboxID: "sb-1", TenantID: "t1", Generation: g, Document: json.RawMessage(`{"version":1,"rules":[]}`), Actor: "api:t1", Ref: "base"}
		if err := s.AppendPolicyVersion(ctx, v); err != nil {
			t.Fatalf("append %d: %v", g, err)
		}
	}
	err := s.AppendPolicyVersion(ctx, &store.PolicyVersion{SandboxID: "sb-1", TenantID: "t1", Generation: 3, Document: json.RawMessage(`{}`)})
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate generation: %v, want ErrConflict", err)
	}
	vs, err := s.ListPolicyVersions(ctx, "t1", "sb-1")
	if err != nil || len(vs) != 3 || vs[0].Generation != 1 || vs[2].Generation != 3 || vs[2].Actor != "api:t1" {
		t.Fatalf("list: %v %+v", err, vs)
	}
	if vs, _ := s.ListPolicyVersions(ctx, "other", "sb-1"); len(vs) != 0 {
		t.Fatal("another tenant sees the history")
	}
	latest, err := s.LatestPolicyVersion(ctx, "sb-1")
	if err != nil || latest.Generation != 3 || latest.Ref != "base" {
		t.Fatalf("latest: %v %+v", err, latest)
	}
	if _, err := s.LatestPolicyVersion(ctx, "sb-none"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("latest of none: %v", err)
	}
	// Racing writers for one generation: exactly one wins.
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.AppendPolicyVersion(ctx, &store.PolicyVersion{SandboxID: "sb-1", TenantID: "t1", Generation: 4, Document: json.RawMessage(`{}`)}) == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d writers won generation 4", wins)
	}
}

func testNamedPolicies(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTenant(t, s, "t1")
	p := &store.NamedPolicy{TenantID: "t1", Name: "base", Document: json.RawMessage(`{"version":1}`)}
	if err := s.PutNamedPolicy(ctx, p, 0); err != nil || p.Generation != 1 {
		t.Fatalf("create: %v gen %d", err, p.Generation)
	}
	if err := s.PutNamedPolicy(ctx, &store.NamedPolicy{TenantID: "t1", Name: "base", Document: json.RawMessage(`{}`)}, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("create twice: %v", err)
	}
	if err := s.PutNamedPolicy(ctx, &store.NamedPolicy{TenantID: "t1", Name: "base", Document: json.RawMessage(`{}`)}, 7); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale generation: %v", err)
	}
	u := &store.NamedPolicy{TenantID: "t1", Name: "base", Document: json.RawMessage(`{"version":2}`)}
	if err := s.PutNamedPolicy(ctx, u, 1); err != nil || u.Generation != 2 {
		t.Fatalf("update: %v gen %d", err, u.Generation)
	}
	for _, gen := range []int64{3, -1} {
		if err := s.PutNamedPolicy(ctx, &store.NamedPolicy{TenantID: "t1", Name: "none", Document: json.RawMessage(`{}`)}, gen); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("update missing (if generation %d): %v", gen, err)
		}
	}
	if err := s.PutNamedPolicy(ctx, &store.NamedPolicy{TenantID: "admin", Name: "base", Document: json.RawMessage(`{}`)}, -1); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("update of another tenant's: %v", err)
	}
	got, err := s.GetNamedPolicy(ctx, "t1", "base")
	if err != nil || got.Generation != 2 || string(got.Document) != `{"version":2}` {
		t.Fatalf("get: %v %+v", err, got)
	}
	if _, err := s.GetNamedPolicy(ctx, "admin", "base"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("other tenant: %v", err)
	}
	if ps, err := s.ListNamedPolicies(ctx, "t1"); err != nil || len(ps) != 1 {
		t.Fatalf("list: %v %d", err, len(ps))
	}
	if err := s.DeleteNamedPolicy(ctx, "admin", "base"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete as another tenant: %v", err)
	}
	if err := s.DeleteNamedPolicy(ctx, "t1", "base"); err != nil {
		t.Fatal(err)
	}
}

func testApprovals(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTenant(t, s, "t1")
	a := &store.Approval{ID: "ap-1", TenantID: "t1", SandboxID: "sb-1", Rule: "risky", Request: json.RawMessage(`{"method":"DELETE"}`), Deadline: time.Now().Add(time.Minute)}
	if err := s.CreateApproval(ctx, a); err != nil || a.State != store.ApprovalPending {
		t.Fatalf("create: %v %q", err, a.State)
	}
	_ = s.CreateApproval(ctx, &store.Approval{ID: "ap-2", TenantID: "t1", SandboxID: "sb-2", Rule: "r", Deadline: time.Now()})
	if _, err := s.DecideApproval(ctx, "admin2", "ap-1", store.ApprovalAllowed, "x", "", false); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("decide as another tenant: %v", err)
	}
	got, err := s.DecideApproval(ctx, "t1", "ap-1", store.ApprovalAllowed, "api:t1", "looks fine", true)
	if err != nil || got.State != store.ApprovalAllowed || !got.Remember || got.DecidedAt == nil || got.DecidedBy != "api:t1" {
		t.Fatalf("decide: %v %+v", err, got)
	}
	if _, err := s.DecideApproval(ctx, "t1", "ap-1", store.ApprovalDenied, "x", "", false); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("decide twice: %v", err)
	}
	if ps, _ := s.ListApprovals(ctx, "t1", "", store.ApprovalPending, 0); len(ps) != 1 || ps[0].ID != "ap-2" {
		t.Fatalf("pending: %+v", ps)
	}
	if ps, _ := s.ListApprovals(ctx, "t1", "sb-1", "", 0); len(ps) != 1 {
		t.Fatalf("by sandbox: %+v", ps)
	}
	n, err := s.ExpirePendingApprovals(ctx, "daemon restarted")
	if err != nil || n != 1 {
		t.Fatalf("expire: %v %d", err, n)
	}
	if a, _ := s.GetApproval(ctx, "t1", "ap-2"); a.State != store.ApprovalExpired || a.Reason != "daemon restarted" {
		t.Fatalf("expired: %+v", a)
	}
}

func testBudgetUsage(t *testing.T, s store.Store) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.AddBudgetUsage(ctx, store.BudgetUsage{SandboxID: "sb-1", Budget: "llm", Requests: 1, BytesUp: 10, SpendMicros: 1500}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	u, err := s.AddBudgetUsage(ctx, store.BudgetUsage{SandboxID: "sb-1", Budget: "llm", BytesDown: 5})
	if err != nil || u.Requests != 20 || u.BytesUp != 200 || u.BytesDown != 5 || u.SpendMicros != 30000 {
		t.Fatalf("totals: %v %+v", err, u)
	}
	if us, _ := s.ListBudgetUsage(ctx, "sb-1"); len(us) != 1 {
		t.Fatalf("list: %+v", us)
	}
	if err := s.DeletePolicyState(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if us, _ := s.ListBudgetUsage(ctx, "sb-1"); len(us) != 0 {
		t.Fatalf("after delete: %+v", us)
	}
}

func testFreezes(t *testing.T, s store.Store) {
	ctx := context.Background()
	if fs, err := s.ListFreezes(ctx); err != nil || len(fs) != 0 {
		t.Fatalf("fresh store: %v %+v", err, fs)
	}
	all := &store.Freeze{Scope: store.FreezeAll, Owner: "admin", CreatedAt: base}
	ten := &store.Freeze{Scope: store.FreezeTenant, Target: "t1", Owner: "t1"}
	sb := &store.Freeze{Scope: store.FreezeSandbox, Target: "sb-1", TenantID: "t1", Owner: "admin"}
	sb2 := &store.Freeze{Scope: store.FreezeSandbox, Target: "sb-2", TenantID: "t1", Owner: "t1"}
	for _, f := range []*store.Freeze{all, ten, sb, sb2} {
		if err := s.PutFreeze(ctx, f); err != nil {
			t.Fatalf("put %+v: %v", f, err)
		}
	}
	if !all.CreatedAt.Equal(store.NormTime(base)) || ten.CreatedAt.IsZero() {
		t.Fatalf("times: %v %v", all.CreatedAt, ten.CreatedAt)
	}
	// Freezing a scope again replaces its record (the owner may change).
	if err := s.PutFreeze(ctx, &store.Freeze{Scope: store.FreezeTenant, Target: "t1", Owner: "admin"}); err != nil {
		t.Fatal(err)
	}
	fs, err := s.ListFreezes(ctx)
	if err != nil || len(fs) != 4 {
		t.Fatalf("list: %v %+v", err, fs)
	}
	got := map[string]*store.Freeze{}
	for _, f := range fs {
		got[f.Scope+"/"+f.Target] = f
	}
	if f := got["tenant/t1"]; f == nil || f.Owner != "admin" {
		t.Fatalf("tenant freeze after a second put: %+v", f)
	}
	if f := got["sandbox/sb-1"]; f == nil || f.TenantID != "t1" || f.Owner != "admin" {
		t.Fatalf("sandbox freeze: %+v", f)
	}
	if f := got["all/"]; f == nil || f.Owner != "admin" || !f.CreatedAt.Equal(all.CreatedAt) {
		t.Fatalf("freeze of all: %+v", f)
	}
	// Deleting several at once; one that is not recorded is no error.
	if err := s.DeleteFreezes(ctx, []*store.Freeze{{Scope: store.FreezeAll}, {Scope: store.FreezeTenant, Target: "t1"}, {Scope: store.FreezeTenant, Target: "none"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteFreezes(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// A removed sandbox's freeze goes with its policy state.
	if err := s.DeletePolicyState(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	fs, err = s.ListFreezes(ctx)
	if err != nil || len(fs) != 1 || fs[0].Target != "sb-2" || fs[0].Owner != "t1" {
		t.Fatalf("after deletes: %v %+v", err, fs)
	}
}
