package deploy_test

import (
	"context"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cagebox/cagebox/internal/kube/fleet"
)

func schemaKind(group, kind string) schema.GroupKind {
	return schema.GroupKind{Group: group, Kind: kind}
}

// can asks the apiserver whether service account sa may do verb.
func can(t *testing.T, k client.Client, sa, verb, group, res, ns string) bool {
	t.Helper()
	r := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + fleet.DefaultNamespace + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + fleet.DefaultNamespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: verb, Group: group, Resource: res,
		},
	}}
	if err := k.Create(context.Background(), r); err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return r.Status.Allowed
}
