package daemon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

// imageServer serves the API (as the admin, over a unix socket) with an
// image cache of its own, and an in-process registry on loopback.
func imageServer(t *testing.T) (c *client.Client, cache *image.Cache, reg string) {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "cagebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cache = &image.Cache{Dir: filepath.Join(dir, "images")}
	srv := NewServer(st, nil, cache, nil, slog.New(slog.DiscardHandler))
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ConnContext: func(ctx context.Context, _ net.Conn) context.Context { return ViaUnix(ctx) }}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	r := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(r.Close)
	return client.Unix(sock), cache, strings.TrimPrefix(r.URL, "http://")
}

func pushImage(t *testing.T, ref string, img v1.Image) string {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	return d.String()
}

func withArch(t *testing.T, img v1.Image, arch string) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"A=1"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestImagePullAndImportAPI: the routes answer the image, or a 4xx that
// says what is wrong, and a failure leaves nothing in the cache.
func TestImagePullAndImportAPI(t *testing.T) {
	c, cache, reg := imageServer(t)
	ctx := context.Background()
	img, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	img = withArch(t, img, "amd64")
	digest := pushImage(t, reg+"/lib/tool:1.0", img)
	pushImage(t, reg+"/lib/arm:1", withArch(t, img, "arm64"))

	got, err := c.PullImage(ctx, &api.PullImageRequest{Ref: reg + "/lib/tool:1.0"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "tool-1.0" || got.ManifestDigest != digest || got.Config == nil || got.Config.Env[0] != "A=1" || got.Digest == "" {
		t.Fatalf("pulled %+v", got)
	}
	l, err := c.Images(ctx)
	if err != nil || len(l) != 1 || l[0].ManifestDigest != digest {
		t.Fatalf("images: %+v %v", l, err)
	}

	var archive bytes.Buffer
	tag, _ := name.NewTag("example.com/x/saved:2")
	if err := tarball.Write(tag, img, &archive); err != nil {
		t.Fatal(err)
	}
	imp, err := c.ImportImage(ctx, bytes.NewReader(archive.Bytes()), api.ImportImageOptions{})
	if err != nil || imp.Name != "saved-2" || imp.Digest != got.Digest {
		t.Fatalf("import: %+v %v (same layers as the pull: same tree digest %s)", imp, err, got.Digest)
	}

	for _, tc := range []struct {
		name   string
		call   func() error
		status int
		sub    string
	}{
		{"unknown ref", func() error {
			_, err := c.PullImage(ctx, &api.PullImageRequest{Ref: reg + "/lib/nope:1"})
			return err
		}, 404, "no such image"},
		{"no linux/amd64", func() error {
			_, err := c.PullImage(ctx, &api.PullImageRequest{Ref: reg + "/lib/arm:1"})
			return err
		}, 400, "linux/amd64"},
		{"limits", func() error {
			_, err := c.PullImage(ctx, &api.PullImageRequest{Ref: reg + "/lib/tool:1.0", Name: "small", MaxFiles: 1})
			return err
		}, 400, "max-files"},
		{"exists", func() error {
			_, err := c.PullImage(ctx, &api.PullImageRequest{Ref: reg + "/lib/tool:1.0", Name: "saved-2"})
			return err
		}, 409, "--force"},
		{"bad json", func() error {
			_, err := c.PullImage(ctx, &api.PullImageRequest{Ref: "", Name: "x"})
			return err
		}, 400, "reference"},
		{"negative limit", func() error {
			_, err := c.PullImage(ctx, &api.PullImageRequest{Ref: reg + "/lib/tool:1.0", MaxBytes: -1})
			return err
		}, 400, "negative"},
		{"private plain http", func() error {
			_, err := c.PullImage(ctx, &api.PullImageRequest{Ref: "192.168.0.1:5000/x:1"})
			return err
		}, 400, "loopback"},
		{"import garbage", func() error {
			_, err := c.ImportImage(ctx, strings.NewReader("garbage"), api.ImportImageOptions{Name: "g"})
			return err
		}, 400, "tar"},
		{"import without a name", func() error {
			_, err := c.ImportImage(ctx, bytes.NewReader(untaggedArchive(t)), api.ImportImageOptions{})
			return err
		}, 400, "--name"},
		{"import over the limit", func() error {
			_, err := c.ImportImage(ctx, bytes.NewReader(archive.Bytes()), api.ImportImageOptions{Name: "tiny", MaxBytes: 16, MaxFiles: 4})
			return err
		}, 400, "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var ae *client.Error
			if !errors.As(err, &ae) || ae.Status != tc.status || !strings.Contains(ae.Msg, tc.sub) {
				t.Fatalf("err = %v; want %d containing %q", err, tc.status, tc.sub)
			}
		})
	}
	ents, _ := os.ReadDir(cache.Dir)
	var left []string
	for _, e := range ents {
		if !image.IsLockFile(e.Name()) {
			left = append(left, e.Name())
		}
	}
	if strings.Join(left, ",") != "saved-2,tool-1.0" {
		t.Fatalf("cache holds %v after the failures; want only saved-2 and tool-1.0", left)
	}
}

// untaggedArchive is a docker archive that records no tag.
func untaggedArchive(t *testing.T) []byte {
	t.Helper()
	img, _ := random.Image(64, 1)
	img = withArch(t, img, "amd64")
	var buf bytes.Buffer
	if err := tarball.Write(nil, img, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
