package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"

	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/image"
)

// A container image in a pod template is either a cagebox image name
// ("python", "default", "python@sha256:…": an image the nodes already
// have) or a full OCI reference (REGISTRY/REPO[:TAG][@sha256:…], anything
// with a slash or a tag), which upstream's templates use. A reference is
// first looked up in the operator's ImageMap (upstream's runtime images
// mapped to a cagebox image); otherwise the node pulls it through its OCI
// path (POST /v1/images/pull) under a name derived from the reference
// before the sandbox or warm pool that needs it is made.

// nodePullTimeout bounds one image pull on a node.
const nodePullTimeout = 10 * time.Minute

// ImageMap maps image references to cagebox image names. A key matches a
// template's image exactly, or the image without its digest, or the
// image's repository (without tag and digest): the most specific wins.
type ImageMap map[string]string

// ParseImageMap reads REF=IMAGE entries (the controller's --image-map).
func ParseImageMap(entries []string) (ImageMap, error) {
	m := ImageMap{}
	for _, e := range entries {
		ref, img, ok := strings.Cut(e, "=")
		ref, img = strings.TrimSpace(ref), strings.TrimSpace(img)
		if !ok || ref == "" || img == "" {
			return nil, fmt.Errorf("image map %q: want REF=IMAGE (e.g. registry.k8s.io/agent-sandbox/python-runtime-sandbox=python)", e)
		}
		name, _, _ := strings.Cut(img, "@")
		if err := image.ValidateName(name); err != nil {
			return nil, fmt.Errorf("image map %q: %s is no cagebox image name: %w", e, img, err)
		}
		if _, dup := m[ref]; dup {
			return nil, fmt.Errorf("image map: %s is mapped twice", ref)
		}
		m[ref] = img
	}
	return m, nil
}

// Lookup is the cagebox image ref maps to.
func (m ImageMap) Lookup(ref string) (string, bool) {
	noDigest, _, _ := strings.Cut(ref, "@")
	repo := noDigest
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	for _, k := range []string{ref, noDigest, repo} {
		if img, ok := m[k]; ok {
			return img, true
		}
	}
	return "", false
}

// IsReference reports whether a container image is an OCI reference
// rather than a cagebox image name: it has a slash or a tag.
func IsReference(img string) bool {
	name, _, _ := strings.Cut(img, "@")
	return strings.ContainsAny(name, "/:")
}

// PulledName is the cagebox image name a node pulls ref under: the
// repository's last element and the tag, made a valid name, and a hash
// of the whole reference (two references never share a name; a digest
// pin gives its own).
func PulledName(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	noDigest, _, _ := strings.Cut(ref, "@")
	base := noDigest
	if i := strings.LastIndex(base, "/"); i >= 0 {
		base = base[i+1:]
	}
	base = strings.ToLower(strings.ReplaceAll(base, ":", "-"))
	var b strings.Builder
	for _, r := range base {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	s := strings.Trim(strings.ReplaceAll(b.String(), "..", "."), "._-")
	if len(s) > 50 {
		s = strings.Trim(s[:50], "._-")
	}
	if s == "" {
		s = "oci"
	}
	return s + "-" + hex.EncodeToString(sum[:])[:12]
}

// resolveImage turns the template's image into the cagebox image the
// node runs: the operator's mapping, or (for a reference) the name the
// node pulls it under, recorded so placements and pool pushes pull it
// first.
func (c *Controller) resolveImage(spec *Spec) error {
	img := spec.Req.Image
	if mapped, ok := c.cfg.ImageMap.Lookup(img); ok {
		spec.Req.Image = mapped
		return nil
	}
	if !IsReference(img) {
		return nil
	}
	if _, err := image.ParseRef(img); err != nil {
		return specErr(ReasonInvalidTemplate, "image %q: %v", img, err)
	}
	name := PulledName(img)
	spec.PullRef, spec.Req.Image = img, name
	c.mu.Lock()
	c.pullRefs[name] = img
	c.mu.Unlock()
	return nil
}

// translate is Translate with the image resolved.
func (c *Controller) translate(ctx context.Context, secrets client.Reader, sb *sandboxv1beta1.Sandbox) (*Spec, error) {
	spec, err := Translate(ctx, secrets, sb)
	if err != nil {
		return nil, err
	}
	if err := c.resolveImage(spec); err != nil {
		return nil, err
	}
	return spec, nil
}

// ensureImage has the node at endpoint pull ref as name unless it did
// already (for this controller). An image of that name already there
// (an earlier pull of a tag that has moved since) is used as it is.
func (c *Controller) ensureImage(ctx context.Context, endpoint string, node NodeAPI, ref, name string) error {
	key := endpoint + " " + name
	c.mu.Lock()
	done := c.pulled[key]
	c.mu.Unlock()
	if done {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, nodePullTimeout)
	defer cancel()
	start := time.Now()
	if _, err := node.PullImage(pctx, &api.PullImageRequest{Ref: ref, Name: name}); err != nil && nodeErrKind(err) != "conflict" {
		return fmt.Errorf("pull image %s: %w", ref, err)
	}
	c.log.Info("node pulled image", "endpoint", endpoint, "ref", ref, "image", name, "took", time.Since(start))
	c.mu.Lock()
	c.pulled[key] = true
	c.mu.Unlock()
	return nil
}

// forgetPulls drops what the controller knows endpoint pulled (a node
// that lost an image, e.g. a fresh one behind the same endpoint).
func (c *Controller) forgetPulls(endpoint string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.pulled {
		if strings.HasPrefix(k, endpoint+" ") {
			delete(c.pulled, k)
		}
	}
}

// pullsFor are the references behind the pulled images among targets,
// sorted by image name.
func (c *Controller) pullsFor(targets []api.PoolTarget) [][2]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out [][2]string
	seen := map[string]bool{}
	for _, t := range targets {
		if ref, ok := c.pullRefs[t.Image]; ok && !seen[t.Image] {
			seen[t.Image] = true
			out = append(out, [2]string{ref, t.Image})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][1] < out[j][1] })
	return out
}
