package controller

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cagebox/cagebox/internal/kube/fleet"
)

// TestLeaseIdentity: a Lease speaks for a node only when its name, node
// label and holder agree; one that claims another node (a compromised
// node's agent writing a Lease for its neighbour) is no node at all.
func TestLeaseIdentity(t *testing.T) {
	lease := func(name, label string, holder *string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fleet.DefaultNamespace}}
		if label != "" {
			l.Labels = map[string]string{fleet.NodeLabel: label}
		}
		l.Spec.HolderIdentity = holder
		return l
	}
	for _, tc := range []struct {
		name string
		l    *coordinationv1.Lease
		want string
	}{
		{"consistent", lease("cagebox-node-a", "a", ptr.To("a")), "a"},
		{"no holder yet", lease("cagebox-node-a", "a", nil), "a"},
		{"label claims another node", lease("cagebox-node-a", "b", ptr.To("b")), ""},
		{"holder claims another node", lease("cagebox-node-a", "a", ptr.To("b")), ""},
		{"no label, holder only", lease("cagebox-node-b", "", ptr.To("b")), ""},
		{"not a node lease name", lease("other", "a", ptr.To("a")), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := nodeFromLease(tc.l).Name; got != tc.want {
				t.Errorf("node %q, want %q", got, tc.want)
			}
		})
	}
}
