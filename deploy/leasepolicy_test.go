package deploy_test

import (
	"context"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/kube/kubetest"
)

// TestNodeWritesOnlyItsOwnLease: with deploy/'s RBAC and admission
// policy on a real kube-apiserver, node a's agent (its ServiceAccount,
// with the node name the apiserver adds from its pod-bound token) creates
// and renews its own Lease, but cannot create or take over node b's, nor
// write a Lease that claims b under its own name; a token with no node
// writes none.
func TestNodeWritesOnlyItsOwnLease(t *testing.T) {
	_, cfg := kubetest.Env(t, func(e *envtest.Environment) { e.CRDDirectoryPaths = nil })
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, o := range manifests(t) {
		switch o.(type) {
		case *corev1.Namespace, *corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding,
			*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			if err := admin.Create(ctx, o.(client.Object)); err != nil {
				t.Fatalf("%T: %v", o, err)
			}
		}
	}
	nodeAgent := func(node string) client.Client {
		c := rest.CopyConfig(cfg)
		c.Impersonate = rest.ImpersonationConfig{
			UserName: "system:serviceaccount:" + fleet.DefaultNamespace + ":cagebox-node",
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + fleet.DefaultNamespace, "system:authenticated"},
		}
		if node != "" {
			c.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
		}
		k, err := client.New(c, client.Options{Scheme: scheme})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	lease := func(name, node string) *coordinationv1.Lease {
		now := metav1.NewMicroTime(time.Now())
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fleet.DefaultNamespace, Labels: map[string]string{fleet.NodeLabel: node}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(15)), RenewTime: &now},
		}
	}
	a, b := nodeAgent("a"), nodeAgent("b")

	// The policy is enforced once the apiserver has loaded it, which
	// nothing announces: wait until node a's create of b's Lease is
	// refused (on today's RBAC alone it never is).
	deadline := time.Now().Add(time.Minute)
	for {
		err := a.Create(ctx, lease(fleet.LeaseName("b"), "b"), client.DryRunAll)
		if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) {
			t.Logf("refused: %v", err)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node a may create node b's Lease: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Each node creates and renews its own.
	la, lb := lease(fleet.LeaseName("a"), "a"), lease(fleet.LeaseName("b"), "b")
	if err := a.Create(ctx, la); err != nil {
		t.Fatalf("node a creates its own Lease: %v", err)
	}
	if err := b.Create(ctx, lb); err != nil {
		t.Fatalf("node b creates its own Lease: %v", err)
	}
	now := metav1.NewMicroTime(time.Now())
	la.Spec.RenewTime = &now
	if err := a.Update(ctx, la); err != nil {
		t.Fatalf("node a renews its own Lease: %v", err)
	}

	refused := func(what string, err error) {
		t.Helper()
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want refused", what, err)
		}
	}
	// Take over b's Lease (as the node agent does with a stale one).
	stolen := lb.DeepCopy()
	stolen.Labels[fleet.NodeLabel], stolen.Spec.HolderIdentity = "a", ptr.To("a")
	refused("node a takes over node b's Lease", a.Update(ctx, stolen))
	refused("node a renews node b's Lease", a.Update(ctx, lb.DeepCopy()))
	// Its own Lease, claiming b.
	claim := la.DeepCopy()
	claim.Labels[fleet.NodeLabel] = "b"
	refused("node a's Lease labelled node b", a.Update(ctx, claim))
	claim = la.DeepCopy()
	claim.Spec.HolderIdentity = ptr.To("b")
	refused("node a's Lease held by node b", a.Update(ctx, claim))
	refused("node a creates a Lease for b under another name", a.Create(ctx, lease("cagebox-node-x", "b")))
	refused("node a deletes node b's Lease", a.Delete(ctx, lb.DeepCopy()))
	// A token not bound to a pod (no node) writes nothing.
	refused("a token with no node", nodeAgent("").Create(ctx, lease(fleet.LeaseName("c"), "c")))

	var got coordinationv1.Lease
	if err := admin.Get(ctx, client.ObjectKeyFromObject(lb), &got); err != nil {
		t.Fatal(err)
	}
	if got.Labels[fleet.NodeLabel] != "b" || *got.Spec.HolderIdentity != "b" {
		t.Errorf("node b's Lease changed: %v %v", got.Labels, *got.Spec.HolderIdentity)
	}
}
