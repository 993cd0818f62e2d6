package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/image/unpack"
)

// ErrExists means an image of that name exists and the request did not ask
// to replace it.
var ErrExists = errors.New("image exists")

// Limits of an OCI pull or import (see package unpack).
type Limits = unpack.Limits

// ErrLimit means an image is larger than the limits allow.
var ErrLimit = unpack.ErrLimit

// ErrUnsafe means a layer holds an entry that could escape the image root.
var ErrUnsafe = unpack.ErrUnsafe

// Config is what an OCI image's config says about running it. cagebox
// records it; sandboxes do not use it yet (a sandbox runs what exec asks,
// with the environment the create request gives).
type Config struct {
	Env        []string `json:"env,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// The platform cagebox runs.
var platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// maxLayers bounds the layers of one image (Docker's own limit is 127).
const maxLayers = 256

// PullOptions configure Cache.Pull.
type PullOptions struct {
	Ref   string // a reference: [REGISTRY/]REPO[:TAG][@sha256:HEX]
	Name  string // "" = derived from Ref (DeriveName)
	Force bool   // replace an image of that name pulled from something else
	Limits
	Log *slog.Logger
	// Transport reaches the registry (nil: http.DefaultTransport).
	Transport http.RoundTripper
}

// Pull fetches the image Ref from its registry (anonymously; for a
// multi-platform index, its linux/amd64 image), verifies every blob against
// its digest, unpacks its layers safely (package unpack) and installs it in
// the cache under Name. If an image of that name was pulled from the same
// manifest it is returned unchanged; one from anything else is replaced only
// with Force. On failure nothing is left behind.
//
// Plain HTTP is used only for registries on loopback addresses (localhost,
// 127.0.0.0/8, ::1); every other registry must serve HTTPS with a
// certificate the host trusts (go-containerregistry would also speak plain
// HTTP to private addresses; cagebox refuses to).
func (c *Cache) Pull(ctx context.Context, opts PullOptions) (*Image, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	ref, err := ParseRef(opts.Ref)
	if err != nil {
		return nil, err
	}
	imgName := opts.Name
	if imgName == "" {
		if imgName, err = DeriveName(ref); err != nil {
			return nil, err
		}
	}
	if err := ValidateName(imgName); err != nil {
		return nil, err
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("image", imgName, "ref", ref.Name())
	start := time.Now()
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuth(authn.Anonymous),
		remote.WithPlatform(platform),
		remote.WithUserAgent("cagebox"),
	}
	if opts.Transport != nil {
		ropts = append(ropts, remote.WithTransport(opts.Transport))
	}
	desc, err := remote.Get(ref, ropts...)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("pull %s: %w", ref.Name(), context.Cause(ctx))
		}
		return nil, registryErr(ref, err)
	}
	src := &ociSource{manifestDigest: desc.Digest.String(), source: "oci " + ref.Name()}
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, registryErr(ref, err)
		}
		img, d, err := pickPlatform(idx, 0)
		if err != nil {
			return nil, fmt.Errorf("pull %s: %w", ref.Name(), err)
		}
		src.img, src.platformDigest = img, d.String()
	case desc.MediaType.IsImage():
		img, err := desc.Image()
		if err != nil {
			return nil, registryErr(ref, err)
		}
		src.img = img
	default:
		return nil, fmt.Errorf("pull %s: %w: its manifest is of type %q, not an image or an image index", ref.Name(), ErrInvalid, desc.MediaType)
	}
	img, err := c.installOCI(ctx, imgName, src, opts.Force, opts.Limits, log)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref.Name(), err)
	}
	log.Info("image pulled", "digest", src.manifestDigest, "size", img.SizeBytes, "took", time.Since(start).Round(time.Millisecond))
	return img, nil
}

// ParseRef parses an image reference (docker.io is the default registry,
// latest the default tag). A registry on a loopback address is reached over
// plain HTTP; a registry name that go-containerregistry would also reach
// over plain HTTP (a private IP, *.localhost) is refused.
func ParseRef(s string) (name.Reference, error) {
	if s == "" {
		return nil, fmt.Errorf("%w: no image reference (e.g. docker.io/library/alpine:3.20)", ErrInvalid)
	}
	ref, err := name.ParseReference(s)
	if err != nil {
		return nil, fmt.Errorf("%w: image reference %q: %v", ErrInvalid, s, err)
	}
	if isLoopback(ref.Context().RegistryStr()) {
		return name.ParseReference(s, name.Insecure)
	}
	if ref.Context().Scheme() != "https" {
		return nil, fmt.Errorf("%w: registry %s would be reached over plain HTTP, which cagebox allows only on loopback; serve it over HTTPS", ErrInvalid, ref.Context().RegistryStr())
	}
	return ref, nil
}

func isLoopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

var nameJunk = regexp.MustCompile(`[^a-z0-9._-]+`)

// DeriveName is the cache name of an image pulled without --name: the last
// component of the repository, then "-" and the tag unless the tag is
// "latest" (docker.io/library/alpine:3.20 → alpine-3.20,
// ghcr.io/org/tool → tool), or "-" and the first 12 hex digits of the digest
// for a reference by digest; lowercased, characters outside [a-z0-9._-]
// replaced by "-", at most 63 characters.
func DeriveName(ref name.Reference) (string, error) {
	repo := ref.Context().RepositoryStr()
	base := repo[strings.LastIndex(repo, "/")+1:]
	switch r := ref.(type) {
	case name.Tag:
		if t := r.TagStr(); t != "latest" {
			base += "-" + t
		}
	case name.Digest:
		if _, hex, ok := strings.Cut(r.DigestStr(), ":"); ok && len(hex) >= 12 {
			base += "-" + hex[:12]
		}
	}
	n := nameJunk.ReplaceAllString(strings.ToLower(base), "-")
	n = strings.TrimLeft(n, "._-")
	n = strings.ReplaceAll(n, "..", ".")
	if len(n) > 63 {
		n = strings.TrimRight(n[:63], "._-")
	}
	if err := ValidateName(n); err != nil {
		return "", fmt.Errorf("%w: cannot derive an image name from %q: give one with --name", ErrInvalid, ref.String())
	}
	return n, nil
}

// registryErr turns a registry failure into an error of a known kind that
// says what to do.
func registryErr(ref name.Reference, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
				return fmt.Errorf("pull %s: %w: the registry has no such image (check the repository and tag): %v", ref.Name(), ErrNotFound, err)
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return fmt.Errorf("pull %s: %w: the registry refused anonymous access (cagebox pulls public images only; for a private one, `docker save` it and use `cagebox image import`): %v", ref.Name(), ErrInvalid, err)
			}
		}
		switch te.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("pull %s: %w: the registry has no such image (check the repository and tag): %v", ref.Name(), ErrNotFound, err)
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("pull %s: %w: the registry refused anonymous access (cagebox pulls public images only; for a private one, `docker save` it and use `cagebox image import`): %v", ref.Name(), ErrInvalid, err)
		}
		return fmt.Errorf("pull %s: %w: the registry answered %d: %v", ref.Name(), errdefs.ErrUnavailable, te.StatusCode, err)
	}
	if strings.Contains(err.Error(), "error verifying") || strings.Contains(err.Error(), "does not match") {
		return fmt.Errorf("pull %s: %w: digest mismatch: the registry sent content that does not match its digest: %v", ref.Name(), ErrInvalid, err)
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &ne) || errors.As(err, &oe) {
		return fmt.Errorf("pull %s: %w: cannot reach the registry (check the name and the host's network): %v", ref.Name(), errdefs.ErrUnavailable, err)
	}
	return fmt.Errorf("pull %s: %w", ref.Name(), err)
}

// pickPlatform returns the linux/amd64 image of idx (looking into nested
// indexes, two levels at most) and its manifest digest.
func pickPlatform(idx v1.ImageIndex, depth int) (v1.Image, v1.Hash, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("read image index: %w", err)
	}
	var offered []string
	for _, d := range im.Manifests {
		if d.Platform != nil {
			offered = append(offered, d.Platform.String())
		}
		switch {
		case d.MediaType.IsImage():
			if d.Platform != nil && !d.Platform.Satisfies(platform) {
				continue
			}
			if d.Platform == nil && isAttestation(d) {
				continue
			}
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("image %s: %w", d.Digest, err)
			}
			if d.Platform == nil { // no platform in the index: ask the config
				cf, err := img.ConfigFile()
				if err != nil {
					return nil, v1.Hash{}, fmt.Errorf("image %s config: %w", d.Digest, err)
				}
				if !configPlatformOK(cf) {
					offered = append(offered, cf.OS+"/"+cf.Architecture)
					continue
				}
			}
			return img, d.Digest, nil
		case d.MediaType.IsIndex() && depth < 2:
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("index %s: %w", d.Digest, err)
			}
			img, h, err := pickPlatform(child, depth+1)
			if err == nil {
				return img, h, nil
			}
			if !errors.Is(err, ErrInvalid) {
				return nil, v1.Hash{}, err
			}
		}
	}
	if len(offered) == 0 {
		offered = []string{"none"}
	}
	return nil, v1.Hash{}, fmt.Errorf("%w: no linux/amd64 image in the index (it offers: %s); cagebox runs linux/amd64 images only", ErrInvalid, strings.Join(offered, ", "))
}

func isAttestation(d v1.Descriptor) bool {
	return d.Annotations["vnd.docker.reference.type"] == "attestation-manifest"
}

func configPlatformOK(cf *v1.ConfigFile) bool {
	// An empty OS or architecture is what some tools write for "any".
	return (cf.OS == "" || cf.OS == platform.OS) && (cf.Architecture == "" || cf.Architecture == platform.Architecture)
}

// ociSource is an image to install with what is recorded about it.
type ociSource struct {
	img            v1.Image
	source         string // Image.Source
	manifestDigest string // the manifest (or index) the reference named; "" if none
	platformDigest string // the linux/amd64 manifest chosen from an index
	// checkManifest: img's manifest and config are not verified by the
	// library (an OCI layout on disk); check them against their digests.
	checkManifest bool
}

// installOCI unpacks src into a new image dir and installs it as name.
func (c *Cache) installOCI(ctx context.Context, imgName string, src *ociSource, force bool, lim Limits, log *slog.Logger) (*Image, error) {
	lim = lim.WithDefaults()
	cf, layers, err := readImage(src)
	if err != nil {
		return nil, err
	}
	unlock, err := c.lock(ctx, imgName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if old, err := c.load(imgName); err == nil {
		if src.manifestDigest != "" && old.ManifestDigest == src.manifestDigest && old.Source == src.source {
			log.Info("image up to date", "digest", old.ManifestDigest)
			return old, nil
		}
		if !force {
			return nil, fmt.Errorf("%w: an image %s exists (%s); pass --force to replace it or --name to pick another name", ErrExists, imgName, old.Source)
		}
	}
	var img *Image
	err = c.buildInto(ctx, imgName, func(tmp, rootfs string) error {
		// Only root may reach the tree: it may hold setuid files (see
		// package unpack), which no host user must be able to run.
		if err := os.Chmod(tmp, 0o700); err != nil {
			return err
		}
		tUnpack := time.Now()
		u, err := unpack.New(rootfs, lim, log)
		if err != nil {
			return err
		}
		defer u.Close()
		for i, l := range layers {
			if err := applyLayer(ctx, u, i, l, cf.RootFS.DiffIDs[i]); err != nil {
				return err
			}
		}
		if err := u.Finish(); err != nil {
			return err
		}
		st := u.Stats()
		if len(st.Dropped) > 0 {
			log.Info("layer entries dropped (device nodes, fifos and extended attributes are not unpacked)", "dropped", st.Dropped)
		}
		img = &Image{
			Name:           imgName,
			CreatedAt:      time.Now().UTC().Truncate(time.Second),
			Source:         src.source,
			ManifestDigest: src.manifestDigest,
			PlatformDigest: src.platformDigest,
			Config: &Config{
				Env: cf.Config.Env, Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd,
				WorkingDir: cf.Config.WorkingDir, User: cf.Config.User,
			},
		}
		unpacked := time.Since(tUnpack)
		tDigest := time.Now()
		img.Digest, img.SizeBytes, err = digestTree(ctx, rootfs)
		if err != nil {
			return err
		}
		log.Info("image unpacked", "layers", len(layers), "files", st.Files, "bytes", st.Bytes, "whiteouts", st.Whiteouts,
			"fetch_and_unpack", unpacked.Round(time.Millisecond), "digest", time.Since(tDigest).Round(time.Millisecond))
		return writeMetadata(tmp, img)
	})
	if err != nil {
		return nil, err
	}
	img.Path = filepath.Join(c.dir(imgName), rootfsDir)
	return img, nil
}

// readImage reads and checks an image's config and layer list.
func readImage(src *ociSource) (*v1.ConfigFile, []v1.Layer, error) {
	img := src.img
	if src.checkManifest {
		raw, err := img.RawManifest()
		if err != nil {
			return nil, nil, fmt.Errorf("read manifest: %w", err)
		}
		if d := sha256Hex(raw); src.platformDigest != "" && "sha256:"+d != src.platformDigest || src.platformDigest == "" && src.manifestDigest != "" && "sha256:"+d != src.manifestDigest {
			return nil, nil, fmt.Errorf("%w: digest mismatch: the manifest's content (sha256:%s) does not match its digest", ErrInvalid, d)
		}
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, nil, fmt.Errorf("read manifest: %w", err)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return nil, nil, fmt.Errorf("read image config: %w", err)
	}
	if m.Config.Digest.Algorithm == "sha256" && m.Config.Digest.Hex != sha256Hex(rawCfg) {
		return nil, nil, fmt.Errorf("%w: digest mismatch: the image config does not match its digest %s", ErrInvalid, m.Config.Digest)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, nil, fmt.Errorf("read image config: %w", err)
	}
	if !configPlatformOK(cf) {
		return nil, nil, fmt.Errorf("%w: the image is %s/%s; cagebox runs linux/amd64 images only", ErrInvalid, cf.OS, cf.Architecture)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, nil, fmt.Errorf("read layers: %w", err)
	}
	if len(layers) > maxLayers {
		return nil, nil, fmt.Errorf("%w: %d layers (at most %d)", ErrLimit, len(layers), maxLayers)
	}
	if len(layers) != len(cf.RootFS.DiffIDs) {
		return nil, nil, fmt.Errorf("%w: the manifest lists %d layers, the config %d", ErrInvalid, len(layers), len(cf.RootFS.DiffIDs))
	}
	for i, l := range layers {
		mt, err := l.MediaType()
		if err != nil {
			return nil, nil, fmt.Errorf("layer %d: %w", i, err)
		}
		if !mt.IsLayer() && mt != types.MediaType("") {
			return nil, nil, fmt.Errorf("%w: layer %d has media type %q, which is not a filesystem layer", ErrInvalid, i, mt)
		}
	}
	return cf, layers, nil
}

// applyLayer unpacks layer i and checks its uncompressed content against
// the config's diff ID (the chain of digests: reference → manifest →
// config → diff IDs). The compressed blob is checked by the library as it
// streams (remote) — that is why Apply reads each layer to its very end.
func applyLayer(ctx context.Context, u *unpack.Unpacker, i int, l v1.Layer, diffID v1.Hash) error {
	digest, _ := l.Digest()
	rc, err := l.Uncompressed()
	if err != nil {
		return layerErr(ctx, i, digest, err)
	}
	defer rc.Close()
	h := sha256.New()
	if err := u.Apply(ctx, io.TeeReader(rc, h)); err != nil {
		if errors.Is(err, unpack.ErrLimit) || errors.Is(err, unpack.ErrUnsafe) || ctx.Err() != nil {
			return fmt.Errorf("layer %d (%s): %w", i, digest, err)
		}
		return layerErr(ctx, i, digest, err)
	}
	if err := rc.Close(); err != nil {
		return layerErr(ctx, i, digest, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); diffID.String() != got {
		return fmt.Errorf("%w: digest mismatch: layer %d (%s) unpacks to %s, but the image config says %s: the layer is corrupt or was tampered with", ErrInvalid, i, digest, got, diffID)
	}
	return nil
}

// layerErr classifies an error reading layer content: content that does
// not match its digest (the library's verifying reader reports "error
// verifying"; it has no exported error type), corrupt compression, or a
// transport failure.
func layerErr(ctx context.Context, i int, digest v1.Hash, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("layer %d (%s): %w", i, digest, context.Cause(ctx))
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "error verifying"):
		return fmt.Errorf("%w: digest mismatch: layer %d (%s) does not match its digest: the registry or file is corrupt or was tampered with: %v", ErrInvalid, i, digest, err)
	case strings.Contains(msg, "gzip") || strings.Contains(msg, "flate") || strings.Contains(msg, "zstd") || strings.Contains(msg, "archive/tar") || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: layer %d (%s) is corrupt: %v", ErrInvalid, i, digest, err)
	}
	var te *transport.Error
	var ne net.Error
	if errors.As(err, &te) || errors.As(err, &ne) {
		return fmt.Errorf("layer %d (%s): %w: fetching it failed: %v", i, digest, errdefs.ErrUnavailable, err)
	}
	return fmt.Errorf("layer %d (%s): %w", i, digest, err)
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
