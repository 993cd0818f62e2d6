package deploy_test

import (
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/kube/kubetest"
)

// TestApplyToAPIServer creates everything kustomization.yaml lists, then
// the guide's examples, on a real kube-apiserver (envtest): its
// validation (the CRDs' schemas, the pod specs, RBAC) takes more than
// strict decoding checks.
func TestApplyToAPIServer(t *testing.T) {
	start := time.Now()
	// No CRDs preinstalled: kustomization.yaml's own are applied below.
	_, cfg := kubetest.Env(t, func(e *envtest.Environment) { e.CRDDirectoryPaths = nil })
	t.Logf("control plane ready in %v", time.Since(start).Round(time.Millisecond))
	k, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	create := func(what string, objs []runtime.Object) {
		t.Helper()
		for _, o := range objs {
			co, ok := o.(client.Object)
			if !ok {
				t.Fatalf("%s: %T is not an object", what, o)
			}
			// Server-side validation, then the real create (so later
			// objects find the CRDs and namespaces).
			if err := k.Create(ctx, co.DeepCopyObject().(client.Object), client.DryRunAll); err != nil {
				t.Errorf("%s: %T %s: dry run: %v", what, o, co.GetName(), err)
				continue
			}
			if err := k.Create(ctx, co); err != nil {
				t.Errorf("%s: %T %s: %v", what, o, co.GetName(), err)
			}
		}
	}
	create("deploy/", manifests(t))

	// The CRDs are served (established) before the examples use them.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := k.RESTMapper().RESTMapping(schemaKind("extensions.agents.x-k8s.io", "SandboxTemplate"), "v1beta1")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SandboxTemplate not served: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "agents"}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(b, -1) {
		create("docs/kubernetes.md", decodeDocs(t, "docs/kubernetes.md", m[1]))
	}

	// The node agent's ServiceAccount may write its Lease and nothing
	// else; the controller may read Secrets by name only.
	for _, c := range []struct {
		sa, verb, group, res, ns string
		want                     bool
	}{
		{"cagebox-node", "create", "coordination.k8s.io", "leases", fleet.DefaultNamespace, true},
		{"cagebox-node", "update", "coordination.k8s.io", "leases", fleet.DefaultNamespace, true},
		{"cagebox-node", "create", "coordination.k8s.io", "leases", "default", false},
		{"cagebox-node", "get", "", "secrets", fleet.DefaultNamespace, false},
		{"cagebox-node", "list", "agents.x-k8s.io", "sandboxes", "agents", false},
		{"cagebox-controller", "get", "", "secrets", "agents", true},
		{"cagebox-controller", "list", "", "secrets", "agents", false},
		{"cagebox-controller", "watch", "", "secrets", "", false},
		{"cagebox-controller", "get", "", "namespaces", "", true},
		{"cagebox-controller", "patch", "", "namespaces", "", false},
		{"cagebox-controller", "create", "agents.x-k8s.io", "sandboxes", "agents", true},
		{"cagebox-controller", "watch", "coordination.k8s.io", "leases", fleet.DefaultNamespace, true},
		{"cagebox-controller", "update", "coordination.k8s.io", "leases", fleet.DefaultNamespace, false},
		{"cagebox-controller", "create", "", "pods", "agents", false},
	} {
		if got := can(t, k, c.sa, c.verb, c.group, c.res, c.ns); got != c.want {
			t.Errorf("%s %s %s/%s in %q: allowed %v, want %v", c.sa, c.verb, c.group, c.res, c.ns, got, c.want)
		}
	}
}
