package controller

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/cagebox/cagebox/api"
	cbclient "github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/kube/fleet"
)

// upstream's sample template image (examples/hpa-swp-scaling of
// sigs.k8s.io/agent-sandbox v1.0.3).
const upstreamImage = "us-central1-docker.pkg.dev/k8s-staging-images/agent-sandbox/python-runtime-sandbox:latest-main"

func TestImageMapAndNames(t *testing.T) {
	m, err := ParseImageMap([]string{
		"us-central1-docker.pkg.dev/k8s-staging-images/agent-sandbox/python-runtime-sandbox=python",
		"ghcr.io/x/tool:2=tool2",
	})
	if err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string]string{
		upstreamImage: "python",
		"us-central1-docker.pkg.dev/k8s-staging-images/agent-sandbox/python-runtime-sandbox@sha256:" + strings.Repeat("a", 64): "python",
		"ghcr.io/x/tool:2": "tool2",
		"ghcr.io/x/tool:2@sha256:" + strings.Repeat("b", 64): "tool2",
		"ghcr.io/x/tool:3": "",
	} {
		if got, _ := m.Lookup(ref); got != want {
			t.Errorf("Lookup(%s) = %q, want %q", ref, got, want)
		}
	}
	for _, bad := range []string{"noequals", "a=", "a=Bad/Name"} {
		if _, err := ParseImageMap([]string{bad}); err == nil {
			t.Errorf("ParseImageMap(%q) accepted", bad)
		}
	}
	for img, want := range map[string]bool{"python": false, "python@sha256:" + strings.Repeat("c", 64): false, "alpine:3.20": true, "ghcr.io/x/y": true} {
		if IsReference(img) != want {
			t.Errorf("IsReference(%s) = %v", img, !want)
		}
	}
	pinned := "ghcr.io/x/tool:2@sha256:" + strings.Repeat("d", 64)
	names := map[string]bool{}
	for _, ref := range []string{upstreamImage, "ghcr.io/x/tool:2", pinned, "ghcr.io/y/tool:2", "REG.example/A_B/C..D:Tag_1"} {
		n := PulledName(ref)
		if err := image.ValidateName(n); err != nil {
			t.Errorf("PulledName(%s) = %s: %v", ref, n, err)
		}
		if names[n] {
			t.Errorf("PulledName(%s) = %s twice", ref, n)
		}
		names[n] = true
	}
	if n := PulledName(upstreamImage); !strings.HasPrefix(n, "python-runtime-sandbox-latest-main-") {
		t.Errorf("PulledName(%s) = %s", upstreamImage, n)
	}
}

// A template's full image reference runs: one the operator mapped runs
// as the cagebox image it names (no pull); any other is pulled by the
// node through its OCI path (under PulledName, digest and all) before the
// create or the warm pool that needs it; a pull the node refuses shows
// on the Sandbox.
func TestTemplateImageReferences(t *testing.T) {
	m, err := ParseImageMap([]string{"us-central1-docker.pkg.dev/k8s-staging-images/agent-sandbox/python-runtime-sandbox=python"})
	if err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, Config{ImageMap: m})
	n := e.addNode("a", 8<<30, "container", rtContainer)
	missing := "ghcr.io/example/nope:1"
	n.mu.Lock()
	n.pullErr = map[string]error{missing: &cbclient.Error{Status: http.StatusNotFound, Kind: "not_found", Msg: "pull " + missing + ": no such image"}}
	n.mu.Unlock()

	pinned := "ghcr.io/example/tool:1.0@sha256:" + strings.Repeat("e", 64)
	for name, img := range map[string]string{"mapped": upstreamImage, "pulled": pinned, "missing": missing} {
		if err := e.c.Create(e.ctx, newSandbox(name, nil, corev1.Container{Name: "main", Image: img})); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"mapped", "pulled"} {
		e.eventually(30*time.Second, name+" ready", func() bool {
			r := readyOf(e.getSandbox(name))
			return r != nil && r.Status == metav1.ConditionTrue
		})
	}
	e.eventually(30*time.Second, "missing refused", func() bool {
		r := readyOf(e.getSandbox("missing"))
		return r != nil && r.Reason == ReasonNodeRefused && strings.Contains(r.Message, missing)
	})
	pulls, ops := n.history()
	want := PulledName(pinned)
	if i, j := slices.Index(ops, "pull "+want), slices.Index(ops, "create "+want); i < 0 || j < i {
		t.Errorf("node ops %v: want pull %s before its create", ops, want)
	}
	if !slices.Contains(ops, "create python") {
		t.Errorf("node ops %v: want the mapped image created as python", ops)
	}
	for _, p := range pulls {
		if strings.Contains(p.Ref, "python-runtime-sandbox") {
			t.Errorf("the mapped image was pulled: %+v", p)
		}
	}
	if !slices.ContainsFunc(pulls, func(p api.PullImageRequest) bool { return p.Ref == pinned && p.Name == want }) {
		t.Errorf("pulls %+v: want %s (with its digest) as %s", pulls, pinned, want)
	}

	// A warm pool of a template with a reference: the node pulls it
	// before it is given the pool target.
	poolRef := "ghcr.io/example/runtime:v2"
	e.createTemplatePool("rt", poolRef, "rtp", 2)
	pn := PulledName(poolRef)
	e.eventually(30*time.Second, "pool target of the pulled image", func() bool {
		ts, _ := n.poolTargets()
		return poolSize(ts) == 2 && ts[0].Image == pn
	})
	_, ops = n.history()
	if i, j := slices.Index(ops, "pull "+pn), slices.Index(ops, "pools "+pn); i < 0 || j < i {
		t.Errorf("node ops %v: want pull %s before the pool target", ops, pn)
	}
	cl := &extv1beta1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "rtc", Namespace: testNS},
		Spec:       extv1beta1.SandboxClaimSpec{WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: "rtp"}},
	}
	if err := e.c.Create(e.ctx, cl); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the claim served warm", func() bool {
		sb := e.getSandbox("rtc")
		r := readyOf(sb)
		return r != nil && r.Status == metav1.ConditionTrue && sb.Annotations[fleet.AnnLaunch] == LaunchWarm
	})
}

// What a claim asks that cagebox refuses carries the reason upstream's
// controller gives it, which the official Python client fails fast on.
func TestClaimRefusalReasons(t *testing.T) {
	e := startEnv(t, Config{})
	e.addNode("a", 8<<30, "container", rtContainer)
	e.createTemplatePool("t", "python", "wp", 1)
	ref := extv1beta1.SandboxWarmPoolRef{Name: "wp"}
	cases := map[string]struct {
		spec   extv1beta1.SandboxClaimSpec
		reason string
	}{
		"env":      {extv1beta1.SandboxClaimSpec{WarmPoolRef: ref, Env: []extv1beta1.EnvVar{{Name: "A", Value: "1"}}}, "EnvVarsInjectionRejected"},
		"metadata": {extv1beta1.SandboxClaimSpec{WarmPoolRef: ref, AdditionalPodMetadata: sandboxv1beta1.PodMetadata{Annotations: map[string]string{fleet.AnnAllow: "x.example"}}}, "InvalidMetadata"},
		"volumes":  {extv1beta1.SandboxClaimSpec{WarmPoolRef: ref, VolumeClaimTemplates: []sandboxv1beta1.PersistentVolumeClaimTemplate{{EmbeddedObjectMetadata: sandboxv1beta1.EmbeddedObjectMetadata{Name: "data"}}}}, "VolumeClaimTemplatesError"},
		"nopool":   {extv1beta1.SandboxClaimSpec{WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: "nope"}}, "WarmPoolNotFound"},
	}
	for name, tc := range cases {
		if err := e.c.Create(e.ctx, &extv1beta1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}, Spec: tc.spec}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for name, tc := range cases {
		e.eventually(30*time.Second, name+" refused with "+tc.reason, func() bool {
			r := meta.FindStatusCondition(e.getClaim(name).Status.Conditions, condReady)
			return r != nil && r.Status == metav1.ConditionFalse && r.Reason == tc.reason
		})
		if e.getSandbox(name) != nil {
			t.Errorf("%s: a Sandbox was made for a refused claim", name)
		}
	}
}
