package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// putImage installs an image NAME whose tree holds one file saying gen, as
// a build does (temp dir beside the cache, then install).
func putImage(t *testing.T, c *Cache, name, gen string) *Image {
	t.Helper()
	tmp, err := os.MkdirTemp(c.Dir, ".build-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(tmp, rootfsDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, rootfsDir, "gen"), []byte(gen), 0o644); err != nil {
		t.Fatal(err)
	}
	img := &Image{Name: name, CreatedAt: time.Now().UTC(), Source: "test", Digest: "sha256:" + strings.Repeat(fmt.Sprintf("%x", len(gen)%16), 8) + gen}
	if err := writeMetadata(tmp, img); err != nil {
		t.Fatal(err)
	}
	if err := c.install(tmp, c.dir(name)); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestRemoveRefusesImageInUse(t *testing.T) {
	c := &Cache{Dir: t.TempDir()}
	img := putImage(t, c, "app", "1")
	if err := c.Acquire(img, "t", "sb-one"); err != nil {
		t.Fatal(err)
	}
	err := c.Remove("app")
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "sb-one") {
		t.Fatalf("Remove of an image in use = %v, want ErrInUse naming sb-one", err)
	}
	if b, err := os.ReadFile(filepath.Join(img.Path, "gen")); err != nil || string(b) != "1" {
		t.Fatalf("the tree in use was touched: %q %v", b, err)
	}
	if h, _ := c.Holders("app"); len(h) != 1 || h[0] != "sb-one.t" {
		t.Errorf("Holders = %v", h)
	}
	if err := c.Release("t", "sb-one"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release("t", "sb-one"); err != nil {
		t.Errorf("second Release: %v", err)
	}
	if err := c.Remove("app"); err != nil {
		t.Fatalf("Remove after the last release: %v", err)
	}
	if _, err := c.Get("app"); !errors.Is(err, ErrNotFound) {
		t.Errorf("image still there: %v", err)
	}
}

func TestForceReplaceRetiresTreeInUse(t *testing.T) {
	c := &Cache{Dir: t.TempDir()}
	old := putImage(t, c, "app", "1")
	// A sandbox's view of the tree: an open directory, as an overlay
	// lower layer or gVisor's gofer holds it.
	d, err := os.Open(old.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := c.Acquire(old, "t", "sb-old"); err != nil {
		t.Fatal(err)
	}
	nw := putImage(t, c, "app", "2")
	if nw.Digest == old.Digest {
		t.Fatal("test images share a digest")
	}
	// The sandbox still reads its own tree.
	if b, err := os.ReadFile(filepath.Join("/proc/self/fd", fmt.Sprint(d.Fd()), "gen")); err != nil || string(b) != "1" {
		t.Fatalf("the old tree was changed under its sandbox: %q %v", b, err)
	}
	if n, _ := c.Retired(); n != 1 {
		t.Fatalf("retired trees = %d, want 1", n)
	}
	// New sandboxes get the new tree and hold it, not the old one.
	if h, _ := c.Holders("app"); len(h) != 0 {
		t.Errorf("the new tree inherited holders %v", h)
	}
	if err := c.Remove("app"); err != nil {
		t.Fatalf("Remove of the unused new tree: %v", err)
	}
	// Acquiring with the stale view is refused: it would hold a tree that
	// is no longer the image.
	if err := c.Acquire(old, "t", "sb-late"); err == nil {
		t.Fatal("Acquire of a replaced image succeeded")
	}
	if err := c.Release("t", "sb-old"); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Retired(); n != 0 {
		t.Errorf("retired tree not deleted after its last release (%d left)", n)
	}
}

func TestAcquireStaleImageIsBusy(t *testing.T) {
	c := &Cache{Dir: t.TempDir()}
	a := putImage(t, c, "app", "1")
	putImage(t, c, "app", "22")
	if err := c.Acquire(a, "t", "sb-x"); !errors.Is(err, ErrBusy) {
		t.Fatalf("Acquire of a replaced image = %v, want ErrBusy", err)
	}
	for _, bad := range []string{"", "../x", "a/b", ".hidden", "a.b"} {
		if err := c.Acquire(a, "t", bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Acquire(holder %q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestPruneRefs(t *testing.T) {
	c := &Cache{Dir: t.TempDir()}
	img := putImage(t, c, "app", "1")
	for _, h := range []string{"sb-live", "sb-dead"} {
		if err := c.Acquire(img, "t", h); err != nil {
			t.Fatal(err)
		}
	}
	putImage(t, c, "app", "2") // retires the tree the two hold
	img2, _ := c.Get("app")
	if err := c.Acquire(img2, "t", "sb-dead2"); err != nil {
		t.Fatal(err)
	}
	// Another daemon sharing the cache: its references are its own.
	if err := c.Acquire(img2, "other", "sb-dead2"); err != nil {
		t.Fatal(err)
	}
	live := func(h string) bool { return h == "sb-live" }
	if err := c.PruneRefs("t", live); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Retired(); n != 1 {
		t.Errorf("retired = %d, want 1 (sb-live still holds it)", n)
	}
	if h, _ := c.Holders("app"); len(h) != 1 || h[0] != "sb-dead2.other" {
		t.Errorf("holders after pruning owner t = %v, want only the other daemon's", h)
	}
	if err := c.PruneRefs("t", func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Retired(); n != 0 {
		t.Errorf("retired = %d after every holder died", n)
	}
}

// TestRefsRaceWithReplace: sandboxes acquiring while the image is replaced
// again and again. Every successful Acquire must have put its reference
// beside the very tree it read, so that tree is never deleted under it.
func TestRefsRaceWithReplace(t *testing.T) {
	c := &Cache{Dir: t.TempDir()}
	putImage(t, c, "app", "g0")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(stop)
		for i := 1; i <= 30; i++ {
			tmp, err := os.MkdirTemp(c.Dir, ".build-app-")
			if err == nil {
				err = os.MkdirAll(filepath.Join(tmp, rootfsDir), 0o755)
			}
			if err == nil {
				err = writeMetadata(tmp, &Image{Name: "app", CreatedAt: time.Now().UTC(), Digest: fmt.Sprintf("sha256:g%d", i)})
			}
			if err == nil {
				err = c.install(tmp, c.dir("app"))
			}
			if err != nil {
				t.Errorf("replace %d: %v", i, err)
				return
			}
		}
	}()
	type held struct{ holder, digest string }
	var mu sync.Mutex
	var got []held
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				img, err := c.Get("app")
				if err != nil {
					continue // between a removal and an install never happens here, but be safe
				}
				h := fmt.Sprintf("sb-%d-%d", w, i)
				if err := c.Acquire(img, "t", h); err != nil {
					if !errors.Is(err, ErrBusy) {
						t.Errorf("Acquire: %v", err)
					}
					continue
				}
				mu.Lock()
				got = append(got, held{h, img.Digest})
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if len(got) == 0 {
		t.Fatal("no Acquire succeeded")
	}
	// Find each holder's reference and check the tree beside it.
	for _, g := range got {
		// (Glob's * matches the dot of .retired-* too.)
		m, _ := filepath.Glob(filepath.Join(c.Dir, "*", refsDir, g.holder+".t"))
		if len(m) != 1 {
			t.Fatalf("holder %s: %d references (%v)", g.holder, len(m), m)
		}
		dir := filepath.Dir(filepath.Dir(m[0]))
		b, err := os.ReadFile(filepath.Join(dir, metadataFile))
		if err != nil {
			t.Fatal(err)
		}
		var img Image
		if err := json.Unmarshal(b, &img); err != nil {
			t.Fatal(err)
		}
		if img.Digest != g.digest {
			t.Fatalf("holder %s acquired %s but its reference is beside %s", g.holder, g.digest, img.Digest)
		}
	}
	// Every tree someone holds still exists; the others are gone.
	if err := c.PruneRefs("t", func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Retired(); n != 0 {
		t.Errorf("%d retired trees left after all released", n)
	}
	t.Logf("%d acquisitions across 30 replacements", len(got))
}
