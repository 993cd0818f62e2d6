//go:build linux

package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/ingress"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

// heldPorts holds ListPorts, when armed, until released: a lookup that
// read the store, stopped before it could cache what it read.
type heldPorts struct {
	store.Store
	read    chan struct{} // armed: closed once ListPorts has read
	release chan struct{}
}

func (h *heldPorts) ListPorts(ctx context.Context, tenant, id string) ([]*store.Port, error) {
	ps, err := h.Store.ListPorts(ctx, tenant, id)
	if h.read != nil {
		read, release := h.read, h.release
		h.read = nil
		close(read)
		<-release
	}
	return ps, err
}

// TestPortCache: ingress resolves from the cache, and a change to a
// sandbox's ports (a rotated token, a removed port) is seen by the next
// lookup, also by one that read the store just before the change.
func TestPortCache(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	h := &heldPorts{Store: db}
	m := New(Config{Store: h, StateDir: t.TempDir()})
	t.Cleanup(m.Close)

	put := func(token string) {
		t.Helper()
		if err := db.PutPort(ctx, &store.Port{SandboxID: "sb1", TenantID: store.AdminTenantID, Port: 8080, TokenHash: ingress.HashToken(token)}); err != nil {
			t.Fatal(err)
		}
		m.ports.forgetPorts("sb1")
	}
	hash := func() []byte {
		t.Helper()
		ps, err := m.ports.publishedPorts(ctx, "sb1")
		if err != nil {
			t.Fatal(err)
		}
		if ps[8080] == nil {
			return nil
		}
		return ps[8080].TokenHash
	}

	put("one")
	if got := hash(); !bytes.Equal(got, ingress.HashToken("one")) {
		t.Fatalf("first lookup: %x", got)
	}
	// Cached: a store change the manager did not make is not seen...
	if err := db.PutPort(ctx, &store.Port{SandboxID: "sb1", TenantID: store.AdminTenantID, Port: 8080, TokenHash: ingress.HashToken("sneaky")}); err != nil {
		t.Fatal(err)
	}
	if got := hash(); !bytes.Equal(got, ingress.HashToken("one")) {
		t.Fatalf("cached lookup: %x, want the first token's hash", got)
	}
	// ...and one it made is.
	put("two")
	if got := hash(); !bytes.Equal(got, ingress.HashToken("two")) {
		t.Fatalf("after rotation: %x, want the new token's hash", got)
	}

	// A lookup that read the store before a rotation does not cache the
	// old token after it.
	m.ports.forgetPorts("sb1")
	h.read, h.release = make(chan struct{}), make(chan struct{})
	read := h.read
	stale := make(chan []byte)
	go func() { stale <- hash() }()
	<-read
	put("three")
	close(h.release)
	if got := <-stale; !bytes.Equal(got, ingress.HashToken("two")) {
		t.Fatalf("the held lookup answered %x, want what it read (two)", got)
	}
	if got := hash(); !bytes.Equal(got, ingress.HashToken("three")) {
		t.Fatalf("after a rotation during a lookup: %x, want the new token's hash", got)
	}

	// Removed: gone at once.
	if err := db.DeletePort(ctx, "", "sb1", 8080); err != nil {
		t.Fatal(err)
	}
	m.ports.forgetPorts("sb1")
	if got := hash(); got != nil {
		t.Fatalf("removed port still resolves: %x", got)
	}
}

// TestPortRevoke: every change to a port's access tells the ingress
// listener, which cuts what is under way to it: a publish (a new token),
// an unpublish, an expiry, and (every port) the sandbox's destruction.
func TestPortRevoke(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	now := time.Now()
	m := New(Config{Store: db, StateDir: t.TempDir(), Now: func() time.Time { return now }})
	t.Cleanup(m.Close)
	if err := db.CreateSandbox(ctx, &store.Sandbox{ID: "sb1", TenantID: store.AdminTenantID, Runtime: "fake", Image: "busybox", Status: StatusRunning}); err != nil {
		t.Fatal(err)
	}
	var got []string
	m.ports.SetIngress(&Ingress{
		URL:      func(string, uint16) string { return "" },
		PathURL:  func(string, uint16) string { return "" },
		OnRevoke: func(id string, port uint16) { got = append(got, fmt.Sprintf("%s:%d", id, port)) },
	})
	check := func(what string, want ...string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s: revoked %v, want %v", what, got, want)
		}
		got = nil
	}
	if _, err := m.ports.AddPort(ctx, "", "sb1", api.PortSpec{Port: 8080}); err != nil {
		t.Fatal(err)
	}
	check("publish", "sb1:8080")
	if _, err := m.ports.AddPort(ctx, "", "sb1", api.PortSpec{Port: 8080}); err != nil {
		t.Fatal(err)
	}
	check("publish again (a new token)", "sb1:8080")
	if err := m.ports.RemovePort(ctx, "", "sb1", 8080); err != nil {
		t.Fatal(err)
	}
	check("unpublish", "sb1:8080")
	if err := m.ports.RemovePort(ctx, "", "sb1", 8080); err == nil {
		t.Fatal("unpublished twice")
	}
	check("unpublish an unpublished port")
	if _, err := m.ports.AddPort(ctx, "", "sb1", api.PortSpec{Port: 9000, TTL: "1m"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ports.AddPort(ctx, "", "sb1", api.PortSpec{Port: 9001}); err != nil {
		t.Fatal(err)
	}
	got = nil
	m.ports.reapPorts(ctx)
	check("before expiry")
	now = now.Add(time.Minute)
	m.ports.reapPorts(ctx)
	check("expiry", "sb1:9000")
	m.ports.dropPorts("sb1")
	check("destroy", "sb1:0")
}
