package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cagebox/cagebox/internal/tarx"
)

type options struct {
	kind       string
	binDir     string
	baseRootfs string
	baseImage  string
	out        string
	tag        string
	format     string
	created    time.Time
	tmp        string // scratch directory of one run
}

// Where things go in the images.
const (
	// serverBin is the full build (make build's bin/cagebox-server):
	// every command in-process, so the images need no second binary; it
	// is installed as cagebox.
	serverBin = "cagebox-server"
	binPath   = "usr/local/bin/cagebox"
	agentPath = "usr/local/bin/cagebox-agent"
	nonroot   = 65532
)

// nodeTools are what the node image's base should bring (the daemon's
// runtimes and host tools); a -base-rootfs lacking one gets a warning.
var nodeTools = []string{"runc", "runsc", "nft", "ip", "qemu-system-x86_64", "mkfs.ext4", "openssl"}

func run(o options) (string, error) {
	tmp, err := os.MkdirTemp("", "cagebox-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	o.tmp = tmp
	img, err := build(o)
	if err != nil {
		return "", err
	}
	if err := write(img, o.tag, o.out, o.format); err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return d.String(), nil
}

// build makes the image o describes.
func build(o options) (v1.Image, error) {
	switch o.kind {
	case "controller":
		if o.baseRootfs != "" || o.baseImage != "" {
			return nil, errors.New("the controller image has no base (-base-rootfs and -base-image are for -kind node)")
		}
		return controllerImage(o)
	case "node":
		return nodeImage(o)
	default:
		return nil, fmt.Errorf("-kind %q: want controller or node", o.kind)
	}
}

func controllerImage(o options) (v1.Image, error) {
	bin := filepath.Join(o.binDir, serverBin)
	arch, err := staticBinary(bin)
	if err != nil {
		return nil, err
	}
	layer, err := filesLayer(o.created, []file{
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "home/nonroot", dir: true, mode: 0o700, uid: nonroot},
		{name: binPath, mode: 0o755, src: bin},
	})
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer, History: v1.History{
		Created: v1.Time{Time: o.created}, CreatedBy: "deploy/image -kind controller", Comment: "bin/cagebox-server as cagebox",
	}})
	if err != nil {
		return nil, err
	}
	return mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      v1.Time{Time: o.created},
		Config: v1.Config{
			Entrypoint: []string{"/" + binPath, "controller"},
			User:       fmt.Sprintf("%d:%d", nonroot, nonroot),
			WorkingDir: "/home/nonroot",
			Env:        []string{"PATH=/usr/local/bin", "HOME=/home/nonroot"},
			Labels: map[string]string{
				"org.opencontainers.image.title":       "cagebox-controller",
				"org.opencontainers.image.description": "cagebox fleet controller and ingress router",
			},
		},
		RootFS:  mustRootFS(img),
		History: mustHistory(img),
	})
}

func nodeImage(o options) (v1.Image, error) {
	bin := filepath.Join(o.binDir, serverBin)
	agent := filepath.Join(o.binDir, "cagebox-agent")
	arch, err := staticBinary(bin)
	if err != nil {
		return nil, err
	}
	if _, err := staticBinary(agent); err != nil {
		return nil, err
	}
	var base v1.Image
	switch {
	case o.baseRootfs != "" && o.baseImage != "":
		return nil, errors.New("give -base-rootfs or -base-image, not both")
	case o.baseRootfs != "":
		base, err = rootfsImage(o.baseRootfs, o.created, arch, o.tmp)
		if err != nil {
			return nil, err
		}
		for _, tool := range missingTools(o.baseRootfs) {
			fmt.Fprintf(os.Stderr, "image: warning: %s has no %s (the node agent's runtimes and network need it; docs/kubernetes.md lists the packages)\n", o.baseRootfs, tool)
		}
	case o.baseImage != "":
		base, err = loadImage(o.baseImage, o.tmp)
		if err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("the node image needs a base with runc, runsc, qemu and nftables: give -base-rootfs DIR or -base-image TAR (or build deploy/image/Dockerfile's node target with docker)")
	}
	layer, err := filesLayer(o.created, []file{
		{name: binPath, mode: 0o755, src: bin},
		{name: agentPath, mode: 0o755, src: agent},
	})
	if err != nil {
		return nil, err
	}
	mt, err := base.MediaType()
	if err != nil {
		return nil, err
	}
	lt := types.OCILayer
	if mt == types.DockerManifestSchema2 {
		lt = types.DockerLayer
	}
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: lt, History: v1.History{
		Created: v1.Time{Time: o.created}, CreatedBy: "deploy/image -kind node", Comment: "bin/cagebox-server as cagebox, bin/cagebox-agent",
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: o.created}
	cf.Config.Entrypoint = []string{"/" + binPath}
	cf.Config.Cmd = []string{"node"}
	cf.Config.User = "0:0"
	cf.Config.WorkingDir = "/"
	if !hasEnv(cf.Config.Env, "PATH") {
		cf.Config.Env = append(cf.Config.Env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	if cf.Config.Labels == nil {
		cf.Config.Labels = map[string]string{}
	}
	cf.Config.Labels["org.opencontainers.image.title"] = "cagebox-node"
	cf.Config.Labels["org.opencontainers.image.description"] = "cagebox node agent (the daemon with runtimes, egress gateway, ingress)"
	return mutate.ConfigFile(img, cf)
}

func hasEnv(env []string, k string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, k+"=") {
			return true
		}
	}
	return false
}

func mustRootFS(img v1.Image) v1.RootFS {
	cf, _ := img.ConfigFile()
	return cf.RootFS
}

func mustHistory(img v1.Image) []v1.History {
	cf, _ := img.ConfigFile()
	return cf.History
}

// staticBinary checks that p is a statically linked ELF executable (the
// images have no C library) and returns its architecture as OCI names it.
func staticBinary(p string) (string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", fmt.Errorf("%s: %w (build it with `make build`)", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return "", fmt.Errorf("%s is dynamically linked; the images need static binaries: build with CGO_ENABLED=0 (make build)", p)
		}
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	default:
		return "", fmt.Errorf("%s: architecture %v not supported", p, f.Machine)
	}
}

// file is one entry of a layer made here.
type file struct {
	name string // relative, slash-separated
	dir  bool
	mode int64
	uid  int
	data []byte // content, or
	src  string // a file to copy
}

// filesLayer is a layer holding files (and their parent directories),
// owned by root unless said, timestamped t.
func filesLayer(t time.Time, files []file) (v1.Layer, error) {
	for i, f := range files {
		if f.src != "" {
			b, err := os.ReadFile(f.src)
			if err != nil {
				return nil, err
			}
			files[i].data = b
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		parts := strings.Split(f.name, "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/")
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: t, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		if f.dir {
			dirs[f.name] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: f.name + "/", Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: t, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, Size: int64(len(f.data)), ModTime: t, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}

// rootfsImage is a one-layer image of the directory dir (its tar made
// once in tmp, without access/change times and owner names, so the layer
// depends on the tree's content, modes, owners and mtimes only).
func rootfsImage(dir string, t time.Time, arch, tmp string) (v1.Image, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("-base-rootfs: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("-base-rootfs %s: not a directory", dir)
	}
	tf := filepath.Join(tmp, "rootfs.tar")
	if err := normalizedTar(dir, tf); err != nil {
		return nil, fmt.Errorf("-base-rootfs %s: %w", dir, err)
	}
	layer, err := tarball.LayerFromFile(tf)
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer, History: v1.History{
		Created: v1.Time{Time: t}, CreatedBy: "deploy/image -base-rootfs", Comment: filepath.Base(dir),
	}})
	if err != nil {
		return nil, err
	}
	return mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: arch, OS: "linux", Created: v1.Time{Time: t},
		RootFS: mustRootFS(img), History: mustHistory(img),
	})
}

// normalizedTar writes dir as a tar (tarx.Create) to out, dropping the
// headers' access and change times and user/group names.
func normalizedTar(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarx.Create(pw, dir)) }()
	defer pr.Close()
	tr := tar.NewReader(pr)
	tw := tar.NewWriter(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		h.AccessTime, h.ChangeTime, h.Uname, h.Gname = time.Time{}, time.Time{}, "", ""
		h.PAXRecords = nil
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// missingTools lists nodeTools found in none of the rootfs's bin dirs.
func missingTools(root string) []string {
	var out []string
	for _, tool := range nodeTools {
		found := false
		for _, d := range []string{"usr/sbin", "usr/bin", "sbin", "bin", "usr/local/bin", "usr/local/sbin"} {
			if _, err := os.Lstat(filepath.Join(root, d, tool)); err == nil {
				found = true
				break
			}
		}
		if !found {
			out = append(out, tool)
		}
	}
	return out
}

// loadImage reads a base image tarball: docker save's format, or an OCI
// image layout tarred (oci-archive) with one image in it.
func loadImage(p, tmp string) (v1.Image, error) {
	oci, err := tarHas(p, "oci-layout")
	if err != nil {
		return nil, fmt.Errorf("-base-image %s: %w", p, err)
	}
	if !oci {
		img, err := tarball.ImageFromPath(p, nil)
		if err != nil {
			return nil, fmt.Errorf("-base-image %s: %w (want a docker archive with one image, or an OCI archive)", p, err)
		}
		return img, nil
	}
	// The layout's blobs are read lazily while the image is written: the
	// directory lives as long as the run.
	dir := filepath.Join(tmp, "base")
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := tarx.Extract(f, dir, tarx.Limits{MaxBytes: 16 << 30}); err != nil {
		return nil, fmt.Errorf("-base-image %s: %w", p, err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("-base-image %s: %w", p, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var imgs []v1.Hash
	for _, m := range im.Manifests {
		if m.MediaType.IsImage() && (m.Platform == nil || m.Platform.Architecture == runtime.GOARCH || m.Platform.Architecture == "") {
			imgs = append(imgs, m.Digest)
		}
	}
	if len(imgs) != 1 {
		return nil, fmt.Errorf("-base-image %s: %d images in the OCI archive, want one", p, len(imgs))
	}
	return idx.Image(imgs[0])
}

// tarHas reports whether the tar file p has an entry named name.
func tarHas(p, name string) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if strings.TrimPrefix(h.Name, "./") == name {
			return true, nil
		}
	}
}

// write writes img to out as format, named tag.
func write(img v1.Image, tag, out, format string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", tag, err)
	}
	tmp := out + ".part"
	defer os.RemoveAll(tmp)
	switch format {
	case "docker":
		if err := tarball.WriteToFile(tmp, ref, img); err != nil {
			return err
		}
	case "oci":
		dir, err := os.MkdirTemp("", "cagebox-image-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		lp, err := layout.Write(dir, empty.Index)
		if err != nil {
			return err
		}
		if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": ref.Name(),
			"io.containerd.image.name":          ref.Name(),
		})); err != nil {
			return err
		}
		f, err := os.Create(tmp)
		if err != nil {
			return err
		}
		if err := tarx.Create(f, dir); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("-format %q: want oci or docker", format)
	}
	return os.Rename(tmp, out)
}
