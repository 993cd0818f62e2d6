// Package kubetypes registers the Kubernetes API types the controller and
// node agent use in one scheme: the core and coordination groups and the
// agent-sandbox project's own v1beta1 types (sigs.k8s.io/agent-sandbox,
// pinned in go.mod), which are imported, not copied.
package kubetypes

import (
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// Scheme holds every type cagebox reads or writes on the apiserver.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(corev1.AddToScheme(Scheme))
	utilruntime.Must(coordinationv1.AddToScheme(Scheme))
	utilruntime.Must(sandboxv1beta1.AddToScheme(Scheme))
	utilruntime.Must(extv1beta1.AddToScheme(Scheme))
}
