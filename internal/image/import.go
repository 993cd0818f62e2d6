package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cagebox/cagebox/internal/statedir"
)

// ImportOptions configure Cache.Import.
type ImportOptions struct {
	Name  string // "" = derived from the archive's tag (DeriveName)
	Force bool   // replace an existing image of that name
	Limits
	Log *slog.Logger
}

// Archive formats Import reads.
const (
	FormatDockerArchive = "docker-archive" // `docker save`
	FormatOCILayout     = "oci-layout"     // an OCI image layout as a tar
)

// Import installs the image in r, a tar of a `docker save` archive or of an
// OCI image layout (index.json, oci-layout, blobs/; a multi-platform index
// gives its linux/amd64 image), unpacked as safely as a pull. The archive is
// first copied to a spool file in the cache (bounded by the limits), because
// both formats need random access. On failure nothing is left behind.
func (c *Cache) Import(ctx context.Context, r io.Reader, opts ImportOptions) (*Image, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if opts.Name != "" {
		if err := ValidateName(opts.Name); err != nil {
			return nil, err
		}
	}
	lim := opts.Limits.WithDefaults()
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	if err := statedir.Make(c.Dir); err != nil {
		return nil, fmt.Errorf("create image cache: %w", err)
	}
	spool, err := os.MkdirTemp(c.Dir, ".import-")
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	defer os.RemoveAll(spool)
	archive := filepath.Join(spool, "archive.tar")
	// An archive holds at most the files the limits allow plus their tar
	// framing and the manifests and configs.
	maxArchive := lim.MaxBytes + lim.MaxFiles*2048 + 64<<20
	if err := spoolTo(ctx, archive, r, maxArchive); err != nil {
		return nil, err
	}
	format, err := detectFormat(archive)
	if err != nil {
		return nil, err
	}
	src := &ociSource{}
	var tag string
	switch format {
	case FormatOCILayout:
		dir := filepath.Join(spool, "layout")
		if err := extractLayout(ctx, archive, dir); err != nil {
			return nil, err
		}
		idx, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			return nil, fmt.Errorf("import: %w: read the OCI layout: %v", ErrInvalid, err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, fmt.Errorf("import: %w: read index.json: %v", ErrInvalid, err)
		}
		tag = layoutTag(im.Manifests)
		img, h, err := pickPlatform(idx, 0)
		if err != nil {
			return nil, fmt.Errorf("import: %w", err)
		}
		src.img, src.platformDigest, src.checkManifest = img, h.String(), true
		// index.json itself has no digest; the manifest it names (one
		// image) or the index inside it is what identifies the image.
		src.manifestDigest = h.String()
		if len(im.Manifests) == 1 {
			src.manifestDigest = im.Manifests[0].Digest.String()
			if im.Manifests[0].MediaType.IsIndex() {
				if err := checkBlob(dir, im.Manifests[0].Digest.Hex); err != nil {
					return nil, err
				}
			}
		}
		if src.manifestDigest == src.platformDigest {
			src.platformDigest = ""
		}
	case FormatDockerArchive:
		opener := func() (io.ReadCloser, error) { return os.Open(archive) }
		m, err := tarball.LoadManifest(opener)
		if err != nil {
			return nil, fmt.Errorf("import: %w: read manifest.json: %v", ErrInvalid, err)
		}
		if len(m) != 1 {
			return nil, fmt.Errorf("import: %w: the archive holds %d images; save one image per archive", ErrInvalid, len(m))
		}
		if len(m[0].RepoTags) > 0 {
			tag = m[0].RepoTags[0]
		}
		img, err := tarball.Image(opener, nil)
		if err != nil {
			return nil, fmt.Errorf("import: %w: %v", ErrInvalid, err)
		}
		// A docker archive has no manifest of its own (one made up from it
		// would need every layer compressed); its tree digest identifies it.
		src.img = img
	}
	src.source = "import " + format
	imgName := opts.Name
	if imgName == "" {
		ref, err := name.ParseReference(tag)
		if tag == "" || err != nil {
			return nil, fmt.Errorf("import: %w: the archive names no image; give a name with --name", ErrInvalid)
		}
		if imgName, err = DeriveName(ref); err != nil {
			return nil, err
		}
		src.source += " " + ref.Name()
	}
	log = log.With("image", imgName, "format", format)
	img, err := c.installOCI(ctx, imgName, src, opts.Force, lim, log)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	log.Info("image imported", "size", img.SizeBytes, "took", time.Since(start).Round(time.Millisecond))
	return img, nil
}

func spoolTo(ctx context.Context, path string, r io.Reader, max int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	defer f.Close()
	n, err := io.Copy(f, &ctxReader{ctx: ctx, r: io.LimitReader(r, max+1)})
	if err != nil {
		return fmt.Errorf("import: read the archive: %w", err)
	}
	if n > max {
		return fmt.Errorf("import: %w: the archive is larger than %d bytes (raise --max-bytes)", ErrLimit, max)
	}
	return f.Close()
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, context.Cause(c.ctx)
	}
	return c.r.Read(p)
}

// detectFormat looks at the archive's top-level names: an OCI layout has
// oci-layout and index.json (docker save since Docker 25 writes both kinds;
// the OCI layout is preferred), a docker archive manifest.json.
func detectFormat(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", fmt.Errorf("import: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	seen := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("import: %w: not a tar archive (want the output of `docker save` or a tar of an OCI layout): %v", ErrInvalid, err)
		}
		n := filepath.Clean("/" + hdr.Name)[1:]
		seen[n] = true
	}
	switch {
	case seen["oci-layout"] && seen["index.json"]:
		return FormatOCILayout, nil
	case seen["manifest.json"]:
		return FormatDockerArchive, nil
	}
	return "", fmt.Errorf("import: %w: the archive has neither manifest.json (docker save) nor oci-layout and index.json (an OCI layout)", ErrInvalid)
}

var layoutNameRE = regexp.MustCompile(`^(oci-layout|index\.json|blobs/sha256/[0-9a-f]{64})$`)

// extractLayout writes the OCI layout files of the archive into dir: only
// oci-layout, index.json and blobs/sha256/HEX, as regular files of fixed
// names, so nothing in the (untrusted) archive chooses a path. Other
// entries are ignored.
func extractLayout(ctx context.Context, archive, dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o700); err != nil {
		return fmt.Errorf("import: %w", err)
	}
	f, err := os.Open(archive)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("import: %w: read the archive: %v", ErrInvalid, err)
		}
		n := filepath.Clean("/" + hdr.Name)[1:]
		if !layoutNameRE.MatchString(n) || (hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeRegA) { //nolint:staticcheck // TypeRegA: old writers
			continue
		}
		out, err := os.OpenFile(filepath.Join(dir, n), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("import: %w: %s: %v", ErrInvalid, n, err)
		}
		_, err = io.Copy(out, &ctxReader{ctx: ctx, r: tr})
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("import: %s: %w", n, err)
		}
	}
}

// checkBlob verifies a layout blob against its name.
func checkBlob(dir, hexDigest string) error {
	b, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", hexDigest))
	if err != nil {
		return fmt.Errorf("import: %w: blob sha256:%s: %v", ErrInvalid, hexDigest, err)
	}
	if sha256Hex(b) != hexDigest {
		return fmt.Errorf("import: %w: digest mismatch: blob sha256:%s does not match its digest", ErrInvalid, hexDigest)
	}
	return nil
}

// layoutTag is the reference an OCI layout's index.json records for its
// image: containerd's and Docker's io.containerd.image.name, else an
// org.opencontainers.image.ref.name that is a whole reference (it is often
// only a tag).
func layoutTag(ds []v1.Descriptor) string {
	for _, k := range []string{"io.containerd.image.name", "org.opencontainers.image.ref.name"} {
		for _, d := range ds {
			if v := d.Annotations[k]; v != "" && (k == "io.containerd.image.name" || strings.ContainsAny(v, "/:")) {
				return v
			}
		}
	}
	return ""
}
