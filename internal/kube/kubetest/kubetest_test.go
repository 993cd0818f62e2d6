package kubetest_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cagebox/cagebox/internal/kube/kubetest"
)

// deploy/crds are served (v1beta1 only, no conversion webhook: deploy's
// tests check they are the generator's output) and the four kinds
// round-trip through the apiserver.
func TestStartServesTheAgentSandboxKinds(t *testing.T) {
	t0 := time.Now()
	_, c := kubetest.Start(t)
	t.Logf("control plane ready in %v", time.Since(t0).Round(time.Millisecond))
	ctx := context.Background()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "t"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	sb := &sandboxv1beta1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "t"},
		Spec: sandboxv1beta1.SandboxSpec{SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{
			PodTemplate: sandboxv1beta1.PodTemplate{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}},
		}},
	}
	objs := []client.Object{
		sb,
		&extv1beta1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Name: "tpl", Namespace: "t"}, Spec: extv1beta1.SandboxTemplateSpec{SandboxBlueprint: sb.Spec.SandboxBlueprint}},
		&extv1beta1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Name: "wp", Namespace: "t"}, Spec: extv1beta1.SandboxWarmPoolSpec{TemplateRef: extv1beta1.SandboxTemplateRef{Name: "tpl"}}},
		&extv1beta1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: "cl", Namespace: "t"}, Spec: extv1beta1.SandboxClaimSpec{WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: "wp"}}},
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}
	var got sandboxv1beta1.Sandbox
	if err := c.Get(ctx, client.ObjectKey{Namespace: "t", Name: "a"}, &got); err != nil {
		t.Fatal(err)
	}
	if got.APIVersion != "" && got.APIVersion != "agents.x-k8s.io/v1beta1" {
		t.Fatalf("apiVersion %q", got.APIVersion)
	}
	if img := got.Spec.PodTemplate.Spec.Containers[0].Image; img != "busybox" {
		t.Fatalf("image %q after a round trip", img)
	}
}
