package deploy_test

import (
	"testing"

	"github.com/google/cel-go/cel"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// TestLeasePolicyDecides evaluates node-lease-policy.yaml's expressions
// with CEL as the apiserver would (plain CEL, requests as maps): node a
// may write its own Lease only. TestNodeWritesOnlyItsOwnLease checks the
// same on a real apiserver when one can be started.
func TestLeasePolicyDecides(t *testing.T) {
	env, err := cel.NewEnv(cel.Variable("request", cel.DynType), cel.Variable("object", cel.DynType), cel.Variable("variables", cel.DynType))
	if err != nil {
		t.Fatal(err)
	}
	var p *admissionregistrationv1.ValidatingAdmissionPolicy
	for _, o := range manifests(t) {
		if v, ok := o.(*admissionregistrationv1.ValidatingAdmissionPolicy); ok && v.Name == "cagebox-node-lease" {
			p = v
		}
	}
	if p == nil || len(p.Spec.Variables) != 1 {
		t.Fatal("no cagebox-node-lease policy with one variable")
	}
	eval := func(expr string, act map[string]any) any {
		t.Helper()
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			t.Fatalf("%q: %v", expr, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := prg.Eval(act)
		if err != nil {
			t.Fatalf("%q: %v", expr, err)
		}
		return out.Value()
	}
	lease := func(name, label, holder string) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": name, "labels": map[string]any{"cagebox.dev/node": label}}, "spec": map[string]any{"holderIdentity": holder}}
	}
	user := map[string]any{"username": "system:serviceaccount:cagebox-system:cagebox-node", "extra": map[string]any{"authentication.kubernetes.io/node-name": []any{"a"}}}
	noNode := map[string]any{"username": "system:serviceaccount:cagebox-system:cagebox-node"}
	for _, tc := range []struct {
		name  string
		user  map[string]any
		op    string
		obj   map[string]any
		allow bool
	}{
		{"own lease", user, "UPDATE", lease("cagebox-node-a", "a", "a"), true},
		{"own lease, create", user, "CREATE", lease("cagebox-node-a", "a", "a"), true},
		{"b's lease", user, "UPDATE", lease("cagebox-node-b", "b", "b"), false},
		{"take over b's", user, "UPDATE", lease("cagebox-node-b", "a", "a"), false},
		{"own name, labelled b", user, "UPDATE", lease("cagebox-node-a", "b", "a"), false},
		{"own name, held by b", user, "UPDATE", lease("cagebox-node-a", "a", "b"), false},
		{"no node in the token", noNode, "CREATE", lease("cagebox-node-a", "a", "a"), false},
		{"delete", user, "DELETE", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := map[string]any{"userInfo": tc.user, "operation": tc.op}
			act := map[string]any{"request": req, "object": tc.obj}
			for _, m := range p.Spec.MatchConditions {
				if eval(m.Expression, act) != true {
					t.Fatalf("match condition %s does not match", m.Name)
				}
			}
			act["variables"] = map[string]any{p.Spec.Variables[0].Name: eval(p.Spec.Variables[0].Expression, act)}
			allowed := true
			for _, v := range p.Spec.Validations {
				if eval(v.Expression, act) != true {
					allowed = false
				}
			}
			if allowed != tc.allow {
				t.Errorf("allowed %v, want %v", allowed, tc.allow)
			}
		})
	}
}
