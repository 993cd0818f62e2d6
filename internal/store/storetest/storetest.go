// Package storetest is the conformance suite every store.Store
// implementation must pass:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return openFresh(t) })
//	}
//
// newStore must return a freshly opened, empty store (apart from the seeded
// admin tenant) each time it is called; Run closes it when the subtest ends.
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/store"
)

// Run runs the conformance suite against stores made by newStore.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"AdminTenantSeeded", testAdminSeeded},
		{"Tenants", testTenants},
		{"TimesNormalised", testTimesNormalised},
		{"APIKeys", testAPIKeys},
		{"APIKeyRevoke", testAPIKeyRevoke},
		{"SandboxCreateGet", testSandboxCreateGet},
		{"SandboxErrors", testSandboxErrors},
		{"SandboxTenantIsolation", testSandboxTenantIsolation},
		{"SandboxUpdate", testSandboxUpdate},
		{"SandboxTouch", testSandboxTouch},
		{"SandboxDelete", testSandboxDelete},
		{"SandboxLabels", testSandboxLabels},
		{"SandboxUnowned", testSandboxUnowned},
		{"Events", testEvents},
		{"EventPaging", testEventPaging},
		{"EventBatch", testEventBatch},
		{"EventTenantIsolation", testEventTenantIsolation},
		{"DeleteEventsBefore", testDeleteEventsBefore},
		{"ConcurrentWrites", testConcurrentWrites},
		{"ConcurrentReadWrite", testConcurrentReadWrite},
		{"CanceledContext", testCanceledContext},
		{"PolicyVersions", testPolicyVersions},
		{"NamedPolicies", testNamedPolicies},
		{"Approvals", testApprovals},
		{"BudgetUsage", testBudgetUsage},
		{"Freezes", testFreezes},
		{"Tools", testTools},
		{"Webhooks", testWebhooks},
		{"Relays", testRelays},
		{"Volumes", testVolumes},
		{"Snapshots", testSnapshots},
		{"Ports", testPorts},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tt.fn(t, s)
		})
	}
}

// base is a fixed time with sub-microsecond digits and a non-UTC zone, so
// tests see normalisation.
var base = time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.FixedZone("X", 3600))

func ctx(t *testing.T) context.Context { return t.Context() }

func mustTenant(t *testing.T, s store.Store, id string) *store.Tenant {
	t.Helper()
	tn := &store.Tenant{ID: id, Name: "tenant " + id}
	if err := s.CreateTenant(ctx(t), tn); err != nil {
		t.Fatalf("CreateTenant(%q): %v", id, err)
	}
	return tn
}

func newSandbox(id, tenant string) *store.Sandbox {
	return &store.Sandbox{
		ID: id, TenantID: tenant, Runtime: "container", Image: "busybox", Status: "creating",
		Spec: json.RawMessage(`{"image":"busybox","env":{"A":"1"}}`),
	}
}

func mustSandbox(t *testing.T, s store.Store, id, tenant string) *store.Sandbox {
	t.Helper()
	sb := newSandbox(id, tenant)
	if err := s.CreateSandbox(ctx(t), sb); err != nil {
		t.Fatalf("CreateSandbox(%q): %v", id, err)
	}
	return sb
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want %v", what, err, want)
	}
}

func jsonEqual(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(x, y)
}

func timePtrEqual(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

func sandboxDiff(got, want *store.Sandbox) string {
	var d []string
	add := func(f string, g, w any) { d = append(d, fmt.Sprintf("%s: got %v, want %v", f, g, w)) }
	if got.ID != want.ID {
		add("ID", got.ID, want.ID)
	}
	if got.TenantID != want.TenantID {
		add("TenantID", got.TenantID, want.TenantID)
	}
	if got.Runtime != want.Runtime {
		add("Runtime", got.Runtime, want.Runtime)
	}
	if got.Image != want.Image {
		add("Image", got.Image, want.Image)
	}
	if got.Status != want.Status {
		add("Status", got.Status, want.Status)
	}
	if !jsonEqual(got.Spec, want.Spec) {
		add("Spec", string(got.Spec), string(want.Spec))
	}
	if !jsonEqual(got.State, want.State) {
		add("State", string(got.State), string(want.State))
	}
	if got.Error != want.Error {
		add("Error", got.Error, want.Error)
	}
	if !got.CreatedAt.Equal(want.CreatedAt) {
		add("CreatedAt", got.CreatedAt, want.CreatedAt)
	}
	if !got.UpdatedAt.Equal(want.UpdatedAt) {
		add("UpdatedAt", got.UpdatedAt, want.UpdatedAt)
	}
	if !timePtrEqual(got.ExpiresAt, want.ExpiresAt) {
		add("ExpiresAt", got.ExpiresAt, want.ExpiresAt)
	}
	if got.IdleTimeout != want.IdleTimeout {
		add("IdleTimeout", got.IdleTimeout, want.IdleTimeout)
	}
	if !got.LastActive.Equal(want.LastActive) {
		add("LastActive", got.LastActive, want.LastActive)
	}
	if !reflect.DeepEqual(got.Labels, want.Labels) && (len(got.Labels) > 0 || len(want.Labels) > 0) {
		add("Labels", got.Labels, want.Labels)
	}
	if len(d) == 0 {
		return ""
	}
	return fmt.Sprint(d)
}

func ids[T any](xs []*T, id func(*T) string) []string {
	out := []string{}
	for _, x := range xs {
		out = append(out, id(x))
	}
	return out
}

func sandboxIDs(xs []*store.Sandbox) []string {
	return ids(xs, func(s *store.Sandbox) string { return s.ID })
}

// ---- tenants ----

func testAdminSeeded(t *testing.T, s store.Store) {
	a, err := s.GetTenant(ctx(t), store.AdminTenantID)
	if err != nil {
		t.Fatalf("GetTenant(admin): %v", err)
	}
	if a.ID != "admin" || a.Name != "admin" || a.CreatedAt.IsZero() {
		t.Errorf("admin tenant = %+v", a)
	}
	err = s.CreateTenant(ctx(t), &store.Tenant{ID: store.AdminTenantID, Name: "again"})
	wantErr(t, "CreateTenant(admin)", err, store.ErrConflict)
}

func testTenants(t *testing.T, s store.Store) {
	// Inserted out of CreatedAt order; listed in CreatedAt order.
	tb := &store.Tenant{ID: "b", Name: "Bee", MinIsolation: "hypervisor", Untrusted: true, CreatedAt: base.Add(2 * time.Hour)}
	ta := &store.Tenant{ID: "a", Name: "Ay", CreatedAt: base.Add(time.Hour)}
	for _, tn := range []*store.Tenant{tb, ta} {
		if err := s.CreateTenant(ctx(t), tn); err != nil {
			t.Fatalf("CreateTenant(%q): %v", tn.ID, err)
		}
	}
	got, err := s.GetTenant(ctx(t), "b")
	if err != nil {
		t.Fatalf("GetTenant(b): %v", err)
	}
	if got.ID != "b" || got.Name != "Bee" || got.MinIsolation != "hypervisor" || !got.Untrusted || !got.CreatedAt.Equal(tb.CreatedAt) {
		t.Errorf("GetTenant(b) = %+v, want %+v", got, tb)
	}

	_, err = s.GetTenant(ctx(t), "nope")
	wantErr(t, "GetTenant(nope)", err, store.ErrNotFound)
	err = s.CreateTenant(ctx(t), &store.Tenant{ID: "a", Name: "dup"})
	wantErr(t, "CreateTenant(dup)", err, store.ErrConflict)

	// CreatedAt defaults to now.
	before := time.Now().Add(-time.Second)
	tc := &store.Tenant{ID: "c", Name: "Sea"}
	if err := s.CreateTenant(ctx(t), tc); err != nil {
		t.Fatalf("CreateTenant(c): %v", err)
	}
	if tc.CreatedAt.Before(before) || tc.CreatedAt.After(time.Now().Add(time.Second)) {
		t.Errorf("CreateTenant set CreatedAt %v, want about now", tc.CreatedAt)
	}

	list, err := s.ListTenants(ctx(t))
	if err != nil {
		t.Fatalf("ListTenants: %v", err)
	}
	var order []string
	for _, tn := range list {
		if tn.ID != store.AdminTenantID {
			order = append(order, tn.ID)
		}
	}
	// c (now) < a (2030) < b.
	if want := []string{"c", "a", "b"}; !reflect.DeepEqual(order, want) {
		t.Errorf("ListTenants order = %v, want %v", order, want)
	}
	if len(list) != 4 {
		t.Errorf("ListTenants returned %d tenants, want 4 (admin, a, b, c)", len(list))
	}
}

func testTimesNormalised(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	exp := base.Add(time.Hour)
	sb := newSandbox("sb1", "t1")
	sb.CreatedAt = base
	sb.LastActive = base.Add(time.Minute)
	sb.ExpiresAt = &exp
	if err := s.CreateSandbox(ctx(t), sb); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	for name, tm := range map[string]time.Time{"CreatedAt": sb.CreatedAt, "LastActive": sb.LastActive, "ExpiresAt": *sb.ExpiresAt, "UpdatedAt": sb.UpdatedAt} {
		if tm.Location() != time.UTC {
			t.Errorf("%s written back in %v, want UTC", name, tm.Location())
		}
		if tm.Nanosecond()%1000 != 0 {
			t.Errorf("%s written back as %v, want microsecond precision", name, tm)
		}
	}
	if want := base.UTC().Truncate(time.Microsecond); !sb.CreatedAt.Equal(want) {
		t.Errorf("CreatedAt written back as %v, want %v", sb.CreatedAt, want)
	}
	got, err := s.GetSandbox(ctx(t), "", "sb1")
	if err != nil {
		t.Fatalf("GetSandbox: %v", err)
	}
	if d := sandboxDiff(got, sb); d != "" {
		t.Errorf("GetSandbox after create: %s", d)
	}
	if got.CreatedAt.Location() != time.UTC {
		t.Errorf("GetSandbox CreatedAt in %v, want UTC", got.CreatedAt.Location())
	}
}

// ---- API keys ----

func hash(s string) []byte {
	h := make([]byte, 32)
	copy(h, s)
	return h
}

func testAPIKeys(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustTenant(t, s, "t2")
	k1 := &store.APIKey{ID: "k1", TenantID: "t1", Hash: hash("one"), Prefix: "cbx_one1", CreatedAt: base}
	k2 := &store.APIKey{ID: "k2", TenantID: "t1", Hash: hash("two"), Prefix: "cbx_two2", CreatedAt: base.Add(-time.Hour)}
	k3 := &store.APIKey{ID: "k3", TenantID: "t2", Hash: hash("three"), Prefix: "cbx_thr3"}
	for _, k := range []*store.APIKey{k1, k2, k3} {
		if err := s.CreateAPIKey(ctx(t), k); err != nil {
			t.Fatalf("CreateAPIKey(%q): %v", k.ID, err)
		}
	}
	if k3.CreatedAt.IsZero() {
		t.Error("CreateAPIKey left CreatedAt zero")
	}

	got, err := s.APIKeyByHash(ctx(t), hash("one"))
	if err != nil {
		t.Fatalf("APIKeyByHash(one): %v", err)
	}
	if got.ID != "k1" || got.TenantID != "t1" || !bytes.Equal(got.Hash, k1.Hash) || got.Prefix != "cbx_one1" ||
		!got.CreatedAt.Equal(k1.CreatedAt) || got.RevokedAt != nil {
		t.Errorf("APIKeyByHash(one) = %+v, want %+v", got, k1)
	}
	_, err = s.APIKeyByHash(ctx(t), hash("nope"))
	wantErr(t, "APIKeyByHash(unknown)", err, store.ErrNotFound)

	err = s.CreateAPIKey(ctx(t), &store.APIKey{ID: "k1", TenantID: "t1", Hash: hash("other"), Prefix: "x"})
	wantErr(t, "CreateAPIKey(dup id)", err, store.ErrConflict)
	err = s.CreateAPIKey(ctx(t), &store.APIKey{ID: "k9", TenantID: "t2", Hash: hash("one"), Prefix: "x"})
	wantErr(t, "CreateAPIKey(dup hash)", err, store.ErrConflict)
	err = s.CreateAPIKey(ctx(t), &store.APIKey{ID: "k8", TenantID: "ghost", Hash: hash("ghost"), Prefix: "x"})
	wantErr(t, "CreateAPIKey(unknown tenant)", err, store.ErrNotFound)

	list, err := s.ListAPIKeys(ctx(t), "t1")
	if err != nil {
		t.Fatalf("ListAPIKeys(t1): %v", err)
	}
	if got, want := ids(list, func(k *store.APIKey) string { return k.ID }), []string{"k2", "k1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("ListAPIKeys(t1) = %v, want %v", got, want)
	}
	all, err := s.ListAPIKeys(ctx(t), "")
	if err != nil {
		t.Fatalf("ListAPIKeys(all): %v", err)
	}
	if len(all) != 3 {
		t.Errorf("ListAPIKeys(all) returned %d keys, want 3", len(all))
	}
	none, err := s.ListAPIKeys(ctx(t), "ghost")
	if err != nil || len(none) != 0 {
		t.Errorf("ListAPIKeys(ghost) = %v, %v; want empty", none, err)
	}
}

func testAPIKeyRevoke(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	k := &store.APIKey{ID: "k1", TenantID: "t1", Hash: hash("one"), Prefix: "cbx_one1"}
	if err := s.CreateAPIKey(ctx(t), k); err != nil {
		t.Fatalf("CreateAPIKey: %v", err)
	}
	before := time.Now().Add(-time.Second)
	if err := s.RevokeAPIKey(ctx(t), "k1"); err != nil {
		t.Fatalf("RevokeAPIKey: %v", err)
	}
	_, err := s.APIKeyByHash(ctx(t), hash("one"))
	wantErr(t, "APIKeyByHash(revoked)", err, store.ErrNotFound)

	list, err := s.ListAPIKeys(ctx(t), "t1")
	if err != nil || len(list) != 1 {
		t.Fatalf("ListAPIKeys = %v, %v; want the revoked key", list, err)
	}
	first := list[0].RevokedAt
	if first == nil || first.Before(before) || first.After(time.Now().Add(time.Second)) {
		t.Fatalf("RevokedAt = %v, want about now", first)
	}

	// Revoking again keeps the first time.
	time.Sleep(2 * time.Millisecond)
	if err := s.RevokeAPIKey(ctx(t), "k1"); err != nil {
		t.Fatalf("RevokeAPIKey(again): %v", err)
	}
	list, err = s.ListAPIKeys(ctx(t), "t1")
	if err != nil || len(list) != 1 || list[0].RevokedAt == nil || !list[0].RevokedAt.Equal(*first) {
		t.Errorf("after second revoke: %v, %v; want RevokedAt %v", list, err, first)
	}

	wantErr(t, "RevokeAPIKey(unknown)", s.RevokeAPIKey(ctx(t), "nope"), store.ErrNotFound)
}

// ---- sandboxes ----

func testSandboxCreateGet(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	exp := base.Add(24 * time.Hour)
	sb := &store.Sandbox{
		ID: "sb1", TenantID: "t1", Runtime: "qemu", Image: "debian:12", Status: "running",
		Spec:        json.RawMessage(`{"image":"debian:12","cpus":2,"env":{"K":"v"}}`),
		State:       json.RawMessage(`{"pid":1234,"socket":"/run/x.sock"}`),
		Error:       "",
		CreatedAt:   base,
		ExpiresAt:   &exp,
		IdleTimeout: 90 * time.Second,
		LastActive:  base.Add(time.Second),
	}
	before := time.Now().Add(-time.Second)
	if err := s.CreateSandbox(ctx(t), sb); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	if sb.UpdatedAt.Before(before) || sb.UpdatedAt.After(time.Now().Add(time.Second)) {
		t.Errorf("UpdatedAt = %v, want about now", sb.UpdatedAt)
	}
	for _, tenant := range []string{"", "t1"} {
		got, err := s.GetSandbox(ctx(t), tenant, "sb1")
		if err != nil {
			t.Fatalf("GetSandbox(%q, sb1): %v", tenant, err)
		}
		if d := sandboxDiff(got, sb); d != "" {
			t.Errorf("GetSandbox(%q, sb1): %s", tenant, d)
		}
	}

	// Defaults: CreatedAt now, LastActive = CreatedAt, empty JSON nil.
	bare := &store.Sandbox{ID: "sb2", TenantID: "t1", Runtime: "container", Image: "busybox", Status: "creating"}
	if err := s.CreateSandbox(ctx(t), bare); err != nil {
		t.Fatalf("CreateSandbox(minimal): %v", err)
	}
	if bare.CreatedAt.Before(before) || !bare.LastActive.Equal(bare.CreatedAt) {
		t.Errorf("defaults: CreatedAt %v LastActive %v, want now and equal", bare.CreatedAt, bare.LastActive)
	}
	got, err := s.GetSandbox(ctx(t), "t1", "sb2")
	if err != nil {
		t.Fatalf("GetSandbox(sb2): %v", err)
	}
	if d := sandboxDiff(got, bare); d != "" {
		t.Errorf("GetSandbox(sb2): %s", d)
	}
	if got.Spec != nil || got.State != nil || got.ExpiresAt != nil {
		t.Errorf("GetSandbox(sb2): Spec %q State %q ExpiresAt %v, want nil", got.Spec, got.State, got.ExpiresAt)
	}
}

func testSandboxErrors(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustSandbox(t, s, "sb1", "t1")

	wantErr(t, "CreateSandbox(dup)", s.CreateSandbox(ctx(t), newSandbox("sb1", "t1")), store.ErrConflict)
	wantErr(t, "CreateSandbox(unknown tenant)", s.CreateSandbox(ctx(t), newSandbox("sb2", "ghost")), store.ErrNotFound)
	_, err := s.GetSandbox(ctx(t), "", "sb2")
	wantErr(t, "GetSandbox(not created)", err, store.ErrNotFound)
	_, err = s.GetSandbox(ctx(t), "t1", "nope")
	wantErr(t, "GetSandbox(missing)", err, store.ErrNotFound)
	wantErr(t, "UpdateSandbox(missing)", s.UpdateSandbox(ctx(t), newSandbox("nope", "t1")), store.ErrNotFound)
	wantErr(t, "TouchSandbox(missing)", s.TouchSandbox(ctx(t), "nope", time.Now()), store.ErrNotFound)
	wantErr(t, "DeleteSandbox(missing)", s.DeleteSandbox(ctx(t), "nope"), store.ErrNotFound)

	bad := newSandbox("sb3", "t1")
	bad.Spec = json.RawMessage(`{not json`)
	if err := s.CreateSandbox(ctx(t), bad); err == nil {
		t.Error("CreateSandbox with invalid JSON spec succeeded")
	}
}

// testSandboxUnowned: a row of no tenant (a pooled sandbox) is no one's
// until BindSandbox gives it a tenant, once.
func testSandboxUnowned(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustSandbox(t, s, "a1", "t1")
	p := newSandbox("p1", "")
	p.Status = "pooled"
	if err := s.CreateSandbox(ctx(t), p); err != nil {
		t.Fatalf("CreateSandbox(no tenant): %v", err)
	}
	for _, tenant := range []string{"", "t1"} {
		_, err := s.GetSandbox(ctx(t), tenant, "p1")
		wantErr(t, fmt.Sprintf("GetSandbox(%q, p1 of no tenant)", tenant), err, store.ErrNotFound)
		rs, err := s.ListSandboxes(ctx(t), tenant)
		if err != nil || !slices.Equal(sandboxIDs(rs), []string{"a1"}) {
			t.Errorf("ListSandboxes(%q) = %v, %v; want [a1]", tenant, sandboxIDs(rs), err)
		}
		rs, err = s.ListSandboxesLabeled(ctx(t), tenant, nil)
		if err != nil || !slices.Equal(sandboxIDs(rs), []string{"a1"}) {
			t.Errorf("ListSandboxesLabeled(%q) = %v, %v; want [a1]", tenant, sandboxIDs(rs), err)
		}
	}
	rs, err := s.ListUnownedSandboxes(ctx(t))
	if err != nil || !slices.Equal(sandboxIDs(rs), []string{"p1"}) {
		t.Fatalf("ListUnownedSandboxes = %v, %v; want [p1]", sandboxIDs(rs), err)
	}
	if d := sandboxDiff(rs[0], p); d != "" {
		t.Errorf("ListUnownedSandboxes: %s", d)
	}
	// An update by id reaches it (the runtime's state, recorded by make).
	p.State = json.RawMessage(`{"runtime":"container"}`)
	if err := s.UpdateSandbox(ctx(t), p); err != nil {
		t.Fatalf("UpdateSandbox(no tenant): %v", err)
	}
	if p.TenantID != "" {
		t.Errorf("UpdateSandbox gave the row tenant %q", p.TenantID)
	}
	// Binding: unknown tenant, no tenant, missing row.
	b := newSandbox("p1", "ghost")
	wantErr(t, "BindSandbox(unknown tenant)", s.BindSandbox(ctx(t), b), store.ErrNotFound)
	wantErr(t, "BindSandbox(no tenant)", s.BindSandbox(ctx(t), newSandbox("p1", "")), store.ErrNotFound)
	wantErr(t, "BindSandbox(missing)", s.BindSandbox(ctx(t), newSandbox("nope", "t1")), store.ErrNotFound)
	wantErr(t, "BindSandbox(a row of a tenant)", s.BindSandbox(ctx(t), newSandbox("a1", "t1")), store.ErrNotFound)

	b = newSandbox("p1", "t1")
	b.Status, b.Labels = "running", map[string]string{"k": "v"}
	b.State = p.State
	b.CreatedAt = base.Add(time.Hour)
	if err := s.BindSandbox(ctx(t), b); err != nil {
		t.Fatalf("BindSandbox: %v", err)
	}
	got, err := s.GetSandbox(ctx(t), "t1", "p1")
	if err != nil {
		t.Fatalf("GetSandbox(t1, p1) after bind: %v", err)
	}
	if d := sandboxDiff(got, b); d != "" {
		t.Errorf("GetSandbox after bind: %s", d)
	}
	wantErr(t, "BindSandbox(twice)", s.BindSandbox(ctx(t), newSandbox("p1", "t1")), store.ErrNotFound)
	if rs, err := s.ListUnownedSandboxes(ctx(t)); err != nil || len(rs) != 0 {
		t.Errorf("ListUnownedSandboxes after bind = %v, %v; want none", sandboxIDs(rs), err)
	}
}

func testSandboxTenantIsolation(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustTenant(t, s, "t2")
	// Interleave tenants and insert out of CreatedAt order.
	for i, c := range []struct {
		id, tenant string
		at         time.Duration
	}{
		{"a3", "t1", 3}, {"b1", "t2", 1}, {"a1", "t1", 1}, {"b2", "t2", 2}, {"a2", "t1", 2},
	} {
		sb := newSandbox(c.id, c.tenant)
		sb.CreatedAt = base.Add(c.at * time.Minute).Add(time.Duration(i) * time.Microsecond)
		if err := s.CreateSandbox(ctx(t), sb); err != nil {
			t.Fatalf("CreateSandbox(%q): %v", c.id, err)
		}
	}

	_, err := s.GetSandbox(ctx(t), "t2", "a1")
	wantErr(t, "GetSandbox(t2, a1 of t1)", err, store.ErrNotFound)
	_, err = s.GetSandbox(ctx(t), "ghost", "a1")
	wantErr(t, "GetSandbox(ghost, a1)", err, store.ErrNotFound)
	if _, err := s.GetSandbox(ctx(t), "", "a1"); err != nil {
		t.Errorf("GetSandbox(admin, a1): %v", err)
	}

	for _, c := range []struct {
		tenant string
		want   []string
	}{
		{"t1", []string{"a1", "a2", "a3"}},
		{"t2", []string{"b1", "b2"}},
		{"", []string{"b1", "a1", "b2", "a2", "a3"}},
		{"ghost", []string{}},
	} {
		list, err := s.ListSandboxes(ctx(t), c.tenant)
		if err != nil {
			t.Fatalf("ListSandboxes(%q): %v", c.tenant, err)
		}
		if got := sandboxIDs(list); !reflect.DeepEqual(got, c.want) {
			t.Errorf("ListSandboxes(%q) = %v, want %v", c.tenant, got, c.want)
		}
	}

	// An update naming the wrong tenant finds nothing and changes nothing.
	sb, err := s.GetSandbox(ctx(t), "t1", "a1")
	if err != nil {
		t.Fatal(err)
	}
	sb.TenantID = "t2"
	sb.Status = "stopped"
	wantErr(t, "UpdateSandbox(wrong tenant)", s.UpdateSandbox(ctx(t), sb), store.ErrNotFound)
	got, err := s.GetSandbox(ctx(t), "t1", "a1")
	if err != nil || got.Status != "creating" || got.TenantID != "t1" {
		t.Errorf("after wrong-tenant update: %+v, %v; want unchanged", got, err)
	}
}

func testSandboxUpdate(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	orig := mustSandbox(t, s, "sb1", "t1")
	time.Sleep(2 * time.Millisecond)

	exp := base.Add(time.Hour)
	upd := *orig
	upd.Runtime = "gvisor"
	upd.Image = "alpine"
	upd.Status = "failed"
	upd.Spec = json.RawMessage(`{"image":"alpine"}`)
	upd.State = json.RawMessage(`{"pid":42}`)
	upd.Error = "boot timed out"
	upd.ExpiresAt = &exp
	upd.IdleTimeout = 5 * time.Minute
	upd.LastActive = orig.LastActive.Add(time.Minute)
	upd.CreatedAt = base // ignored: CreatedAt never changes
	if err := s.UpdateSandbox(ctx(t), &upd); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	if !upd.CreatedAt.Equal(orig.CreatedAt) {
		t.Errorf("UpdateSandbox wrote back CreatedAt %v, want the original %v", upd.CreatedAt, orig.CreatedAt)
	}
	if !upd.UpdatedAt.After(orig.UpdatedAt) {
		t.Errorf("UpdatedAt %v not after the create's %v", upd.UpdatedAt, orig.UpdatedAt)
	}
	got, err := s.GetSandbox(ctx(t), "t1", "sb1")
	if err != nil {
		t.Fatalf("GetSandbox: %v", err)
	}
	if d := sandboxDiff(got, &upd); d != "" {
		t.Errorf("after update: %s", d)
	}

	// Clearing optional fields.
	upd.ExpiresAt = nil
	upd.State = nil
	upd.Error = ""
	if err := s.UpdateSandbox(ctx(t), &upd); err != nil {
		t.Fatalf("UpdateSandbox(clear): %v", err)
	}
	got, err = s.GetSandbox(ctx(t), "", "sb1")
	if err != nil {
		t.Fatalf("GetSandbox: %v", err)
	}
	if d := sandboxDiff(got, &upd); d != "" {
		t.Errorf("after clearing update: %s", d)
	}

	// An empty TenantID matches any tenant and is filled in.
	upd2 := *got
	upd2.TenantID = ""
	upd2.Status = "running"
	if err := s.UpdateSandbox(ctx(t), &upd2); err != nil {
		t.Fatalf("UpdateSandbox(tenant \"\"): %v", err)
	}
	if upd2.TenantID != "t1" {
		t.Errorf("UpdateSandbox(tenant \"\") wrote back TenantID %q, want t1", upd2.TenantID)
	}

	// A stale LastActive does not move it backwards.
	stale := *got
	stale.LastActive = orig.LastActive
	if err := s.UpdateSandbox(ctx(t), &stale); err != nil {
		t.Fatalf("UpdateSandbox(stale): %v", err)
	}
	if !stale.LastActive.Equal(upd.LastActive) {
		t.Errorf("stale update wrote back LastActive %v, want %v", stale.LastActive, upd.LastActive)
	}

	bad := *got
	bad.State = json.RawMessage(`{`)
	if err := s.UpdateSandbox(ctx(t), &bad); err == nil {
		t.Error("UpdateSandbox with invalid JSON state succeeded")
	}
}

func testSandboxTouch(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	sb := mustSandbox(t, s, "sb1", "t1")
	later := sb.LastActive.Add(time.Hour).Add(123 * time.Nanosecond)
	if err := s.TouchSandbox(ctx(t), "sb1", later); err != nil {
		t.Fatalf("TouchSandbox: %v", err)
	}
	get := func() time.Time {
		got, err := s.GetSandbox(ctx(t), "", "sb1")
		if err != nil {
			t.Fatalf("GetSandbox: %v", err)
		}
		return got.LastActive
	}
	if got, want := get(), store.NormTime(later); !got.Equal(want) {
		t.Errorf("LastActive = %v, want %v", got, want)
	}
	if err := s.TouchSandbox(ctx(t), "sb1", sb.LastActive); err != nil {
		t.Fatalf("TouchSandbox(earlier): %v", err)
	}
	if got, want := get(), store.NormTime(later); !got.Equal(want) {
		t.Errorf("LastActive after an earlier touch = %v, want unchanged %v", got, want)
	}
}

func testSandboxDelete(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustSandbox(t, s, "sb1", "t1")
	mustSandbox(t, s, "sb2", "t1")
	if err := s.AppendEvent(ctx(t), &store.Event{TenantID: "t1", SandboxID: "sb1", Kind: "created"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx(t), "sb1"); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	_, err := s.GetSandbox(ctx(t), "", "sb1")
	wantErr(t, "GetSandbox(deleted)", err, store.ErrNotFound)
	wantErr(t, "DeleteSandbox(again)", s.DeleteSandbox(ctx(t), "sb1"), store.ErrNotFound)
	list, err := s.ListSandboxes(ctx(t), "t1")
	if err != nil || !reflect.DeepEqual(sandboxIDs(list), []string{"sb2"}) {
		t.Errorf("ListSandboxes after delete = %v, %v; want [sb2]", sandboxIDs(list), err)
	}
	ev, err := s.ListEvents(ctx(t), "t1", "sb1", 0, 0)
	if err != nil || len(ev) != 1 {
		t.Errorf("events of a deleted sandbox = %v, %v; want them kept", ev, err)
	}
	// The ID can be reused.
	mustSandbox(t, s, "sb1", "t1")
}

// ---- events ----

func testEvents(t *testing.T, s store.Store) {
	before := time.Now().Add(-time.Second)
	e1 := &store.Event{TenantID: "t1", SandboxID: "sb1", Kind: "sandbox.created", Data: json.RawMessage(`{"runtime":"qemu"}`)}
	e2 := &store.Event{Time: base, TenantID: "t1", Kind: "key.created"}
	e3 := &store.Event{Kind: "daemon.started"}
	for _, e := range []*store.Event{e1, e2, e3} {
		if err := s.AppendEvent(ctx(t), e); err != nil {
			t.Fatalf("AppendEvent(%q): %v", e.Kind, err)
		}
	}
	if !(e1.Seq > 0 && e2.Seq > e1.Seq && e3.Seq > e2.Seq) {
		t.Errorf("seqs %d, %d, %d: want positive and increasing", e1.Seq, e2.Seq, e3.Seq)
	}
	if e1.Time.Before(before) || e1.Time.After(time.Now().Add(time.Second)) {
		t.Errorf("AppendEvent set Time %v, want about now", e1.Time)
	}
	if want := store.NormTime(base); !e2.Time.Equal(want) {
		t.Errorf("AppendEvent kept Time %v, want %v", e2.Time, want)
	}

	all, err := s.ListEvents(ctx(t), "", "", 0, 0)
	if err != nil {
		t.Fatalf("ListEvents: %v", err)
	}
	want := []*store.Event{e1, e2, e3}
	if len(all) != len(want) {
		t.Fatalf("ListEvents returned %d events, want %d", len(all), len(want))
	}
	for i, got := range all {
		w := want[i]
		if got.Seq != w.Seq || !got.Time.Equal(w.Time) || got.TenantID != w.TenantID || got.SandboxID != w.SandboxID ||
			got.Kind != w.Kind || !jsonEqual(got.Data, w.Data) {
			t.Errorf("event %d = %+v, want %+v", i, got, w)
		}
	}

	bySandbox, err := s.ListEvents(ctx(t), "", "sb1", 0, 0)
	if err != nil || len(bySandbox) != 1 || bySandbox[0].Seq != e1.Seq {
		t.Errorf("ListEvents(sandbox sb1) = %v, %v; want [e1]", bySandbox, err)
	}
	byTenant, err := s.ListEvents(ctx(t), "t1", "", 0, 0)
	if err != nil || len(byTenant) != 2 {
		t.Errorf("ListEvents(tenant t1) = %v, %v; want 2", byTenant, err)
	}
	none, err := s.ListEvents(ctx(t), "", "", e3.Seq, 10)
	if err != nil || len(none) != 0 {
		t.Errorf("ListEvents(after last) = %v, %v; want none", none, err)
	}

	if err := s.AppendEvent(ctx(t), &store.Event{Kind: "bad", Data: json.RawMessage(`{`)}); err == nil {
		t.Error("AppendEvent with invalid JSON succeeded")
	}
}

func testEventPaging(t *testing.T, s store.Store) {
	const n = 25
	var want []int64
	for i := range n {
		tenant := "t1"
		if i%3 == 0 {
			tenant = "t2"
		}
		e := &store.Event{TenantID: tenant, SandboxID: fmt.Sprintf("sb%d", i%2), Kind: "tick", Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
		if err := s.AppendEvent(ctx(t), e); err != nil {
			t.Fatalf("AppendEvent: %v", err)
		}
		if tenant == "t1" {
			want = append(want, e.Seq)
		}
	}
	for _, limit := range []int{1, 4, 7, 100} {
		var got []int64
		after := int64(0)
		for pages := 0; ; pages++ {
			if pages > n+1 {
				t.Fatalf("limit %d: paging does not end", limit)
			}
			page, err := s.ListEvents(ctx(t), "t1", "", after, limit)
			if err != nil {
				t.Fatalf("ListEvents: %v", err)
			}
			if len(page) > limit {
				t.Fatalf("limit %d: page of %d", limit, len(page))
			}
			if len(page) == 0 {
				break
			}
			for _, e := range page {
				if e.TenantID != "t1" {
					t.Fatalf("ListEvents(t1) returned an event of %q", e.TenantID)
				}
				got = append(got, e.Seq)
			}
			after = page[len(page)-1].Seq
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("limit %d: paged seqs %v, want %v", limit, got, want)
		}
	}
	// Both filters together.
	both, err := s.ListEvents(ctx(t), "t2", "sb1", 0, 0)
	if err != nil {
		t.Fatalf("ListEvents(t2, sb1): %v", err)
	}
	for _, e := range both {
		if e.TenantID != "t2" || e.SandboxID != "sb1" {
			t.Errorf("ListEvents(t2, sb1) returned %+v", e)
		}
	}
	if len(both) != 4 { // i = 3, 9, 15, 21
		t.Errorf("ListEvents(t2, sb1) returned %d events, want 4", len(both))
	}
}

func testEventTenantIsolation(t *testing.T, s store.Store) {
	// The same sandbox ID under two tenants (IDs are not secret; the
	// tenant filter must still hold).
	for _, e := range []*store.Event{
		{TenantID: "t1", SandboxID: "sb", Kind: "a"},
		{TenantID: "t2", SandboxID: "sb", Kind: "b"},
		{TenantID: "t2", SandboxID: "other", Kind: "c"},
	} {
		if err := s.AppendEvent(ctx(t), e); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ListEvents(ctx(t), "t1", "sb", 0, 0)
	if err != nil || len(got) != 1 || got[0].Kind != "a" {
		t.Errorf("ListEvents(t1, sb) = %v, %v; want only t1's event", got, err)
	}
	got, err = s.ListEvents(ctx(t), "t1", "other", 0, 0)
	if err != nil || len(got) != 0 {
		t.Errorf("ListEvents(t1, other) = %v, %v; want none", got, err)
	}
	got, err = s.ListEvents(ctx(t), "t2", "", 0, 0)
	if err != nil || len(got) != 2 {
		t.Errorf("ListEvents(t2) = %v, %v; want 2", got, err)
	}
}

// ---- concurrency ----

func testConcurrentWrites(t *testing.T, s store.Store) {
	const workers, writes = 50, 20
	mustTenant(t, s, "t1")
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range writes {
				id := fmt.Sprintf("w%02d-%02d", w, i)
				var err error
				switch i % 4 {
				case 0, 1:
					err = s.CreateSandbox(ctx(t), newSandbox(id, "t1"))
				case 2:
					err = s.AppendEvent(ctx(t), &store.Event{TenantID: "t1", SandboxID: id, Kind: "tick"})
				case 3:
					err = s.CreateTenant(ctx(t), &store.Tenant{ID: id, Name: id})
				}
				if err != nil {
					t.Errorf("write %s: %v", id, err)
				}
			}
		})
	}
	wg.Wait()

	sbs, err := s.ListSandboxes(ctx(t), "t1")
	if err != nil {
		t.Fatal(err)
	}
	evs, err := s.ListEvents(ctx(t), "t1", "", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	tns, err := s.ListTenants(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(sbs), workers*writes/2; got != want {
		t.Errorf("%d sandboxes after concurrent writes, want %d", got, want)
	}
	if got, want := len(evs), workers*writes/4; got != want {
		t.Errorf("%d events after concurrent writes, want %d", got, want)
	}
	if got, want := len(tns), workers*writes/4+2; got != want { // + admin, t1
		t.Errorf("%d tenants after concurrent writes, want %d", got, want)
	}
	seen := map[int64]bool{}
	for i, e := range evs {
		if seen[e.Seq] || (i > 0 && e.Seq <= evs[i-1].Seq) {
			t.Errorf("event seqs not strictly increasing at %d: %d", i, e.Seq)
		}
		seen[e.Seq] = true
	}
}

func testConcurrentReadWrite(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustSandbox(t, s, "sb", "t1")
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, err := s.GetSandbox(ctx(t), "t1", "sb"); err != nil {
					t.Errorf("GetSandbox during writes: %v", err)
					return
				}
				if _, err := s.ListEvents(ctx(t), "t1", "", 0, 10); err != nil {
					t.Errorf("ListEvents during writes: %v", err)
					return
				}
			}
		})
	}
	start := time.Now()
	for i := range 200 {
		if err := s.TouchSandbox(ctx(t), "sb", start.Add(time.Duration(i)*time.Millisecond)); err != nil {
			t.Errorf("TouchSandbox: %v", err)
		}
		if err := s.AppendEvent(ctx(t), &store.Event{TenantID: "t1", Kind: "tick"}); err != nil {
			t.Errorf("AppendEvent: %v", err)
		}
	}
	close(done)
	wg.Wait()
	got, err := s.GetSandbox(ctx(t), "", "sb")
	if err != nil {
		t.Fatal(err)
	}
	if want := store.NormTime(start.Add(199 * time.Millisecond)); !got.LastActive.Equal(want) {
		t.Errorf("LastActive = %v, want %v", got.LastActive, want)
	}
}

func testCanceledContext(t *testing.T, s store.Store) {
	c, cancel := context.WithCancel(ctx(t))
	cancel()
	if err := s.CreateTenant(c, &store.Tenant{ID: "x", Name: "x"}); err == nil {
		t.Error("CreateTenant with a canceled context succeeded")
	}
	if _, err := s.ListTenants(c); err == nil {
		t.Error("ListTenants with a canceled context succeeded")
	}
	// The store still works afterwards.
	if _, err := s.GetTenant(ctx(t), store.AdminTenantID); err != nil {
		t.Errorf("GetTenant after canceled calls: %v", err)
	}
	if err := s.CreateTenant(ctx(t), &store.Tenant{ID: "x", Name: "x"}); err != nil {
		t.Errorf("CreateTenant after a canceled call: %v", err)
	}
}

func testEventBatch(t *testing.T, s store.Store) {
	first := &store.Event{TenantID: "t1", Kind: "single"}
	if err := s.AppendEvent(ctx(t), first); err != nil {
		t.Fatal(err)
	}
	var batch []*store.Event
	for i := 0; i < 300; i++ {
		batch = append(batch, &store.Event{TenantID: "t1", SandboxID: "sb", Kind: "batch", Data: []byte(`{"i":` + strconv.Itoa(i) + `}`)})
	}
	if err := s.AppendEvents(ctx(t), batch); err != nil {
		t.Fatalf("AppendEvents: %v", err)
	}
	prev := first.Seq
	for i, e := range batch {
		if e.Seq <= prev || e.Time.IsZero() {
			t.Fatalf("event %d: seq %d after %d, time %v", i, e.Seq, prev, e.Time)
		}
		prev = e.Seq
	}
	got, err := s.ListEvents(ctx(t), "t1", "sb", 0, 0)
	if err != nil || len(got) != 300 {
		t.Fatalf("listed %d events, %v", len(got), err)
	}
	// All or nothing: a bad event anywhere fails the whole batch.
	bad := []*store.Event{{TenantID: "t1", Kind: "ok"}, {TenantID: "t1", Kind: "bad", Data: []byte("{not json")}}
	if err := s.AppendEvents(ctx(t), bad); err == nil {
		t.Fatal("a batch with invalid JSON was accepted")
	}
	if bad[0].Seq != 0 {
		t.Fatal("a failed batch set Seq")
	}
	if got, _ := s.ListEvents(ctx(t), "t1", "", 0, 0); len(got) != 301 {
		t.Fatalf("failed batch left %d events, want 301", len(got))
	}
}

func testDeleteEventsBefore(t *testing.T, s store.Store) {
	// 10 old events (base + i minutes) of two tenants, interleaved in seq
	// order with 5 new ones, and one exactly at the cut.
	cut := store.NormTime(base.Add(time.Hour)) // stored times are normalised: "at the cut" is exact
	var old, keep []*store.Event
	for i := range 10 {
		tenant := []string{"t1", "t2"}[i%2]
		o := &store.Event{Time: base.Add(time.Duration(i) * time.Minute), TenantID: tenant, SandboxID: "sb", Kind: "old"}
		old = append(old, o)
		if err := s.AppendEvent(ctx(t), o); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			n := &store.Event{Time: cut.Add(time.Duration(i) * time.Second), TenantID: tenant, Kind: "new"}
			keep = append(keep, n)
			if err := s.AppendEvent(ctx(t), n); err != nil {
				t.Fatal(err)
			}
		}
	}
	at := &store.Event{Time: cut, TenantID: "t1", Kind: "at-cut"}
	if err := s.AppendEvent(ctx(t), at); err != nil {
		t.Fatal(err)
	}
	keep = append(keep, at)

	// Batches of 4: the oldest first, never more than the limit.
	var deleted []int64
	for _, want := range []int64{4, 4, 2, 0} {
		before, err := s.ListEvents(ctx(t), "", "", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		n, err := s.DeleteEventsBefore(ctx(t), cut, 4)
		if err != nil {
			t.Fatalf("DeleteEventsBefore: %v", err)
		}
		if n != want {
			t.Fatalf("DeleteEventsBefore deleted %d, want %d", n, want)
		}
		after, err := s.ListEvents(ctx(t), "", "", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(before)-len(after)) != n {
			t.Fatalf("%d events before, %d after, but %d reported deleted", len(before), len(after), n)
		}
		present := map[int64]bool{}
		for _, e := range after {
			present[e.Seq] = true
		}
		for _, e := range before {
			if !present[e.Seq] {
				deleted = append(deleted, e.Seq)
			}
		}
	}
	if len(deleted) != len(old) {
		t.Fatalf("deleted %v, want the %d old events", deleted, len(old))
	}
	for i, o := range old {
		if deleted[i] != o.Seq {
			t.Fatalf("deletion order %v, want oldest first (%d at %d)", deleted, o.Seq, i)
		}
	}
	rest, err := s.ListEvents(ctx(t), "", "", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rest) != len(keep) {
		t.Fatalf("%d events left, want %d (the new ones and the one at the cut)", len(rest), len(keep))
	}
	for _, e := range rest {
		if e.Time.Before(cut) {
			t.Errorf("event %d at %v survived a cut at %v", e.Seq, e.Time, cut)
		}
	}

	// limit <= 0 deletes everything before the cut at once.
	n, err := s.DeleteEventsBefore(ctx(t), cut.Add(time.Minute), 0)
	if err != nil || n != int64(len(keep)) {
		t.Fatalf("DeleteEventsBefore(no limit) = %d, %v; want %d", n, err, len(keep))
	}
	if rest, _ := s.ListEvents(ctx(t), "", "", 0, 0); len(rest) != 0 {
		t.Fatalf("%d events left after deleting all", len(rest))
	}
}

// testSandboxLabels: labels round-trip, survive UpdateSandbox, and
// ListSandboxesLabeled matches sandboxes carrying every label asked for,
// within the tenant.
func testSandboxLabels(t *testing.T, s store.Store) {
	mustTenant(t, s, "t1")
	mustTenant(t, s, "t2")
	mk := func(id, tenant string, labels map[string]string) *store.Sandbox {
		t.Helper()
		sb := newSandbox(id, tenant)
		sb.Labels = labels
		if err := s.CreateSandbox(ctx(t), sb); err != nil {
			t.Fatalf("CreateSandbox(%s): %v", id, err)
		}
		return sb
	}
	a := mk("a", "t1", map[string]string{"cagebox.dev/uid": "u-1", "app": "web", "empty": ""})
	mk("b", "t1", map[string]string{"cagebox.dev/uid": "u-2", "app": "web"})
	mk("c", "t1", nil)
	mk("d", "t2", map[string]string{"cagebox.dev/uid": "u-1", "app": "web"})

	got, err := s.GetSandbox(ctx(t), "t1", "a")
	if err != nil {
		t.Fatal(err)
	}
	if d := sandboxDiff(got, a); d != "" {
		t.Errorf("GetSandbox(a): %s", d)
	}
	if got, _ := s.GetSandbox(ctx(t), "", "c"); got.Labels != nil {
		t.Errorf("no labels read back as %v, want nil", got.Labels)
	}
	// UpdateSandbox leaves labels alone.
	got.Status, got.Labels = "stopped", map[string]string{"app": "changed"}
	if err := s.UpdateSandbox(ctx(t), got); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSandbox(ctx(t), "", "a"); got.Labels["app"] != "web" || len(got.Labels) != 3 {
		t.Errorf("labels after UpdateSandbox: %v, want the created ones", got.Labels)
	}

	for _, tc := range []struct {
		tenant string
		labels map[string]string
		want   []string
	}{
		{"", nil, []string{"a", "b", "c", "d"}},
		{"t1", nil, []string{"a", "b", "c"}},
		{"", map[string]string{"app": "web"}, []string{"a", "b", "d"}},
		{"t1", map[string]string{"app": "web"}, []string{"a", "b"}},
		{"", map[string]string{"cagebox.dev/uid": "u-1"}, []string{"a", "d"}},
		{"t2", map[string]string{"cagebox.dev/uid": "u-1", "app": "web"}, []string{"d"}},
		{"", map[string]string{"cagebox.dev/uid": "u-1", "app": "db"}, []string{}},
		{"", map[string]string{"empty": ""}, []string{"a"}},
		{"", map[string]string{"app": ""}, []string{}},
		{"", map[string]string{"missing": "x"}, []string{}},
	} {
		l, err := s.ListSandboxesLabeled(ctx(t), tc.tenant, tc.labels)
		if err != nil {
			t.Fatalf("ListSandboxesLabeled(%q, %v): %v", tc.tenant, tc.labels, err)
		}
		if g := sandboxIDs(l); !reflect.DeepEqual(g, tc.want) {
			t.Errorf("ListSandboxesLabeled(%q, %v) = %v, want %v", tc.tenant, tc.labels, g, tc.want)
		}
	}
}
