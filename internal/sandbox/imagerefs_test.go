package sandbox

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

// TestImageRefsPruneOrphans: in an image cache shared by homes, a
// reference belongs to a sandbox that exists in a home that exists, or is
// dropped: that of a removed home, of a sandbox its (stopped) home's store
// has destroyed or never had. A live sandbox's reference protects the
// image; so do references of a home whose daemon answers (it may be making
// a sandbox not yet in its store) and references that name no home.
func TestImageRefsPruneOrphans(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	cache := &image.Cache{Dir: filepath.Join(root, "images")}
	img, err := cache.BuildBusybox(ctx, "busybox")
	if err != nil {
		t.Skipf("busybox image: %v", err)
	}
	home := func(name string) string {
		h := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Join(h, "sandboxes"), 0o700); err != nil {
			t.Fatal(err)
		}
		return h
	}
	// A stopped daemon's home: its store has one live and one destroyed
	// sandbox.
	stopped := home("stopped")
	st, err := sqlite.Open(filepath.Join(stopped, "cagebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	for id, status := range map[string]string{"sb-live": StatusRunning, "sb-destroyed": StatusDestroyed} {
		if err := st.CreateSandbox(ctx, &store.Sandbox{ID: id, TenantID: store.AdminTenantID, Runtime: "fake", Image: "busybox", Status: status}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	// A running daemon's home (it answers on its socket) with no store
	// record yet for its sandbox being made.
	running := home("running")
	l, err := net.Listen("unix", filepath.Join(running, "cagebox.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// A home that was removed.
	removed := home("removed")

	acquire := func(h, id string) {
		t.Helper()
		if err := cache.AcquireFor(img, "o"+filepath.Base(h)[:3], filepath.Join(h, "sandboxes"), id); err != nil {
			t.Fatal(err)
		}
	}
	acquire(stopped, "sb-live")
	acquire(stopped, "sb-destroyed")
	acquire(stopped, "sb-unknown")
	acquire(running, "sb-making")
	acquire(removed, "sb-gone")
	if err := cache.Acquire(img, "legacy", "sb-legacy"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(removed); err != nil {
		t.Fatal(err)
	}

	n, err := cache.PruneOrphans(ImageRefAlive)
	if err != nil || n != 3 {
		t.Fatalf("PruneOrphans = %d, %v; want 3 dropped", n, err)
	}
	holders, _ := cache.Holders("busybox")
	want := []string{"sb-legacy.legacy", "sb-live.osto", "sb-making.orun"}
	if len(holders) != len(want) {
		t.Fatalf("holders %v, want %v", holders, want)
	}
	for i := range want {
		if holders[i] != want[i] {
			t.Fatalf("holders %v, want %v", holders, want)
		}
	}
	if err := cache.Remove("busybox"); !errors.Is(err, image.ErrInUse) {
		t.Fatalf("Remove with live holders = %v, want ErrInUse", err)
	}
	// The live ones go: the image can go.
	for _, h := range []struct{ owner, id string }{{"osto", "sb-live"}, {"orun", "sb-making"}, {"legacy", "sb-legacy"}} {
		if err := cache.Release(h.owner, h.id); err != nil {
			t.Fatal(err)
		}
	}
	if err := cache.Remove("busybox"); err != nil {
		t.Fatalf("Remove after every holder went: %v", err)
	}
}
