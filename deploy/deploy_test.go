package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/cagebox/cagebox/deploy/crdgen"
	"github.com/cagebox/cagebox/internal/kube/fleet"
)

// scheme has every type the manifests and the guide use.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, sandboxv1beta1.AddToScheme, extv1beta1.AddToScheme,
	} {
		utilruntime.Must(add(s))
	}
	return s
}()

// decoder decodes strictly: an unknown or duplicate field is an error.
var decoder = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()

// decodeDocs decodes every YAML document of b (comment-only ones apart).
func decodeDocs(t *testing.T, name string, b []byte) []runtime.Object {
	t.Helper()
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var out []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if empty(doc) {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: document %d: %v", name, len(out)+1, err)
		}
		out = append(out, obj)
	}
}

func empty(doc []byte) bool {
	for _, l := range strings.Split(string(doc), "\n") {
		if l = strings.TrimSpace(l); l != "" && l != "---" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// kustomization is the part of kustomize's Kustomization we use; strict
// parsing fails on anything else, so a new field gets a look here.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images"`
}

// manifests decodes every resource kustomization.yaml lists, checking
// that it lists every manifest in deploy/.
func manifests(t *testing.T) []runtime.Object {
	t.Helper()
	b, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml: %s %s", k.APIVersion, k.Kind)
	}
	onDisk, _ := filepath.Glob("*.yaml")
	crds, _ := filepath.Glob("crds/*.yaml")
	onDisk = slices.DeleteFunc(append(onDisk, crds...), func(s string) bool { return s == "kustomization.yaml" })
	listed := slices.Clone(k.Resources)
	sort.Strings(onDisk)
	sort.Strings(listed)
	if !slices.Equal(onDisk, listed) {
		t.Errorf("kustomization.yaml lists %v; deploy/ has %v", listed, onDisk)
	}
	var out []runtime.Object
	for _, name := range k.Resources {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, decodeDocs(t, name, b)...)
	}
	return out
}

func TestCRDsAreGenerated(t *testing.T) {
	dir, version, err := crdgen.Source()
	if err != nil {
		t.Fatal(err)
	}
	want, err := crdgen.Generate(dir, version)
	if err != nil {
		t.Fatal(err)
	}
	have, _ := filepath.Glob("crds/*.yaml")
	if len(have) != len(want) {
		t.Errorf("deploy/crds has %d files, the generator makes %d: run `go generate ./deploy/`", len(have), len(want))
	}
	for name, b := range want {
		got, err := os.ReadFile(filepath.Join("crds", name))
		if err != nil || !bytes.Equal(got, b) {
			t.Errorf("deploy/crds/%s is not the generator's output (%v): run `go generate ./deploy/`", name, err)
		}
	}
}

func TestCRDs(t *testing.T) {
	var kinds []string
	for _, obj := range manifests(t) {
		crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
		if !ok {
			continue
		}
		kinds = append(kinds, crd.Spec.Names.Kind)
		if g := crd.Spec.Group; g != sandboxv1beta1.GroupVersion.Group && g != extv1beta1.GroupVersion.Group {
			t.Errorf("%s: group %s", crd.Name, g)
		}
		if c := crd.Spec.Conversion; c != nil && c.Strategy != apiextensionsv1.NoneConverter {
			t.Errorf("%s: conversion %+v; we serve v1beta1 only, without a webhook", crd.Name, c)
		}
		if len(crd.Spec.Versions) != 1 {
			t.Errorf("%s: %d versions, want v1beta1 only", crd.Name, len(crd.Spec.Versions))
			continue
		}
		v := crd.Spec.Versions[0]
		if v.Name != "v1beta1" || !v.Served || !v.Storage || v.Deprecated || v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			t.Errorf("%s: version %s served %v storage %v deprecated %v schema %v", crd.Name, v.Name, v.Served, v.Storage, v.Deprecated, v.Schema != nil)
		}
	}
	sort.Strings(kinds)
	if want := []string{"Sandbox", "SandboxClaim", "SandboxTemplate", "SandboxWarmPool"}; !slices.Equal(kinds, want) {
		t.Errorf("CRDs for %v, want %v", kinds, want)
	}
}

// TestRBAC checks least privilege.
func TestRBAC(t *testing.T) {
	objs := manifests(t)
	roles := map[string][]rbacv1.PolicyRule{} // "Role/ns/name" or "ClusterRole/name"
	var bindings []struct {
		kind, ns string
		ref      rbacv1.RoleRef
		subjects []rbacv1.Subject
	}
	sas := map[string]bool{}
	for _, obj := range objs {
		switch o := obj.(type) {
		case *rbacv1.Role:
			roles["Role/"+o.Namespace+"/"+o.Name] = o.Rules
		case *rbacv1.ClusterRole:
			roles["ClusterRole/"+o.Name] = o.Rules
			if o.AggregationRule != nil {
				t.Errorf("ClusterRole %s aggregates", o.Name)
			}
		case *rbacv1.RoleBinding:
			bindings = append(bindings, struct {
				kind, ns string
				ref      rbacv1.RoleRef
				subjects []rbacv1.Subject
			}{"RoleBinding", o.Namespace, o.RoleRef, o.Subjects})
		case *rbacv1.ClusterRoleBinding:
			bindings = append(bindings, struct {
				kind, ns string
				ref      rbacv1.RoleRef
				subjects []rbacv1.Subject
			}{"ClusterRoleBinding", "", o.RoleRef, o.Subjects})
		case *corev1.ServiceAccount:
			sas[o.Namespace+"/"+o.Name] = true
		}
	}
	for name, rules := range roles {
		for _, r := range rules {
			for _, list := range [][]string{r.Verbs, r.Resources, r.APIGroups, r.ResourceNames} {
				if slices.Contains(list, "*") {
					t.Errorf("%s: a rule with \"*\": %+v", name, r)
				}
			}
			if len(r.NonResourceURLs) > 0 {
				t.Errorf("%s: non-resource URLs %v", name, r.NonResourceURLs)
			}
			for _, v := range r.Verbs {
				if v == "escalate" || v == "bind" || v == "impersonate" || v == "deletecollection" {
					t.Errorf("%s: verb %s", name, v)
				}
			}
			for _, res := range r.Resources {
				if res == "secrets" || strings.HasPrefix(res, "secrets/") {
					if !slices.Equal(r.Verbs, []string{"get"}) || res != "secrets" {
						t.Errorf("%s: %s verbs %v, want exactly [get] (no list/watch: they return every Secret's value)", name, res, r.Verbs)
					}
				}
				if slices.Contains([]string{"pods/exec", "pods/attach", "nodes/proxy", "serviceaccounts/token", "roles", "clusterroles", "rolebindings", "clusterrolebindings"}, res) {
					t.Errorf("%s: may touch %s", name, res)
				}
			}
		}
	}
	// Who gets what.
	grants := map[string][]rbacv1.PolicyRule{} // SA → rules
	for _, b := range bindings {
		key := b.ref.Kind + "/" + b.ref.Name
		if b.ref.Kind == "Role" {
			key = "Role/" + b.ns + "/" + b.ref.Name
		}
		if b.kind == "RoleBinding" && b.ref.Kind == "ClusterRole" {
			t.Errorf("RoleBinding in %s to ClusterRole %s: write a Role", b.ns, b.ref.Name)
		}
		rules, ok := roles[key]
		if !ok {
			t.Errorf("%s binds %s, which deploy/ does not define", b.kind, key)
		}
		for _, s := range b.subjects {
			if s.Kind != rbacv1.ServiceAccountKind || !sas[s.Namespace+"/"+s.Name] {
				t.Errorf("%s to %s: subject %+v is not one of our ServiceAccounts", b.kind, key, s)
			}
			grants[s.Name] = append(grants[s.Name], rules...)
			if s.Name == "cagebox-node" && (b.kind != "RoleBinding" || b.ns != fleet.DefaultNamespace) {
				t.Errorf("the node agent is bound by a %s in %q; its rights must be namespaced to %s", b.kind, b.ns, fleet.DefaultNamespace)
			}
		}
	}
	// The node agent: its Lease, nothing else.
	for _, r := range grants["cagebox-node"] {
		if !slices.Equal(r.APIGroups, []string{"coordination.k8s.io"}) || !slices.Equal(r.Resources, []string{"leases"}) {
			t.Errorf("node agent may touch %v %v", r.APIGroups, r.Resources)
		}
		for _, v := range r.Verbs {
			if !slices.Contains([]string{"get", "create", "update", "patch"}, v) {
				t.Errorf("node agent has leases %s", v)
			}
		}
	}
	if len(grants["cagebox-node"]) == 0 {
		t.Error("the node agent may not write its Lease")
	}
	// The controller reads Secrets by name and writes no Lease.
	can := func(sa, group, res, verb string) bool {
		for _, r := range grants[sa] {
			if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, res) && slices.Contains(r.Verbs, verb) {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		group, res, verb string
		want             bool
	}{
		{"", "secrets", "get", true},
		{"", "secrets", "list", false},
		{"", "secrets", "watch", false},
		{"", "namespaces", "get", true},
		{"", "namespaces", "update", false},
		{"agents.x-k8s.io", "sandboxes", "create", true},
		{"agents.x-k8s.io", "sandboxes", "delete", true},
		{"agents.x-k8s.io", "sandboxes/finalizers", "update", true},
		{"agents.x-k8s.io", "sandboxes/status", "update", true},
		{"extensions.agents.x-k8s.io", "sandboxclaims", "watch", true},
		{"extensions.agents.x-k8s.io", "sandboxclaims/status", "update", true},
		{"extensions.agents.x-k8s.io", "sandboxwarmpools/status", "update", true},
		{"extensions.agents.x-k8s.io", "sandboxtemplates", "watch", true},
		{"extensions.agents.x-k8s.io", "sandboxtemplates", "update", false},
		{"extensions.agents.x-k8s.io", "sandboxclaims", "delete", true}, // lifecycle shutdownPolicy Delete
		{"extensions.agents.x-k8s.io", "sandboxwarmpools", "delete", false},
		{"extensions.agents.x-k8s.io", "sandboxtemplates", "delete", false},
		{"coordination.k8s.io", "leases", "watch", true},
		{"coordination.k8s.io", "leases", "update", false},
		{"", "events", "create", true},
		{"", "pods", "get", false},
	} {
		if got := can("cagebox-controller", c.group, c.res, c.verb); got != c.want {
			t.Errorf("controller %s %s/%s: %v, want %v", c.verb, c.group, c.res, got, c.want)
		}
	}
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// checkEnvRefs: every $(VAR) in a container's args is one of its env vars
// (Kubernetes leaves an unknown one as it is, silently).
func checkEnvRefs(t *testing.T, what string, cs []corev1.Container) {
	for _, c := range cs {
		env := map[string]bool{}
		for _, e := range c.Env {
			env[e.Name] = true
		}
		for _, a := range append(slices.Clone(c.Command), c.Args...) {
			for _, m := range varRef.FindAllStringSubmatch(a, -1) {
				if !env[m[1]] {
					t.Errorf("%s container %s: $(%s) in %q is not in its env", what, c.Name, m[1], a)
				}
			}
		}
	}
}

func TestNodeDaemonSet(t *testing.T) {
	var ds *appsv1.DaemonSet
	for _, obj := range manifests(t) {
		if d, ok := obj.(*appsv1.DaemonSet); ok {
			ds = d
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet")
	}
	spec := ds.Spec.Template.Spec
	if ds.Namespace != fleet.DefaultNamespace || spec.ServiceAccountName != "cagebox-node" || !spec.HostNetwork {
		t.Errorf("namespace %s, service account %s, hostNetwork %v", ds.Namespace, spec.ServiceAccountName, spec.HostNetwork)
	}
	checkEnvRefs(t, "DaemonSet", append(slices.Clone(spec.InitContainers), spec.Containers...))
	c := spec.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the node agent is not privileged")
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["NODE_NAME"] != "spec.nodeName" || env["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("downward API env %v", env)
	}
	args := strings.Join(c.Args, " ")
	for _, a := range []string{"node ", "--admin-key-file=", "--node-name=$(NODE_NAME)", "--namespace=$(POD_NAMESPACE)", "--listen=", "--tls-cert=", "--advertise-url=https://", "--advertise-ingress=", "--ingress-domain="} {
		if !strings.Contains(args, a) {
			t.Errorf("node args lack %q: %s", a, args)
		}
	}
	hostPaths := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.HostPath.Path] = true
		}
	}
	for _, p := range []string{"/var/lib/cagebox", "/dev/kvm", "/sys/fs/cgroup"} {
		if !hostPaths[p] {
			t.Errorf("no hostPath %s", p)
		}
	}
	if c.ReadinessProbe == nil || c.LivenessProbe == nil || c.Resources.Requests.Memory().IsZero() {
		t.Error("the node agent needs probes and resource requests")
	}
}

func TestControllerDeployment(t *testing.T) {
	var d *appsv1.Deployment
	for _, obj := range manifests(t) {
		if o, ok := obj.(*appsv1.Deployment); ok {
			d = o
		}
	}
	if d == nil {
		t.Fatal("no Deployment")
	}
	spec := d.Spec.Template.Spec
	checkEnvRefs(t, "Deployment", spec.Containers)
	ps := spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser != 65532 ||
		ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v: want non-root 65532, seccomp RuntimeDefault", ps)
	}
	if spec.HostNetwork || spec.HostPID || spec.ServiceAccountName != "cagebox-controller" {
		t.Errorf("hostNetwork %v hostPID %v serviceAccount %s", spec.HostNetwork, spec.HostPID, spec.ServiceAccountName)
	}
	for _, c := range spec.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 ||
			(sc.Privileged != nil && *sc.Privileged) {
			t.Errorf("container %s security context %+v", c.Name, sc)
		}
		if c.ReadinessProbe == nil || c.LivenessProbe == nil || c.ReadinessProbe.HTTPGet == nil {
			t.Errorf("container %s: no HTTP probes (--health)", c.Name)
		}
		args := strings.Join(c.Args, " ")
		for _, a := range []string{"--node-key-file=", "--node-ca=", "--health=", "--namespace=$(POD_NAMESPACE)"} {
			if !strings.Contains(args, a) {
				t.Errorf("controller args lack %q: %s", a, args)
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("controller mounts host path %s", v.HostPath.Path)
		}
		// The controller gets the node CA's certificate, not its key.
		if v.Secret != nil && v.Secret.SecretName == "cagebox-node-ca" {
			if len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != "ca.crt" {
				t.Errorf("controller mounts %+v of the node CA Secret; want ca.crt only", v.Secret.Items)
			}
		}
	}
}

// TestNamespaced: every namespaced object is in cagebox-system.
func TestNamespaced(t *testing.T) {
	for _, obj := range manifests(t) {
		switch o := obj.(type) {
		case *apiextensionsv1.CustomResourceDefinition, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *corev1.Namespace,
			*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
		default:
			m, ok := o.(interface{ GetNamespace() string })
			if !ok || m.GetNamespace() != fleet.DefaultNamespace {
				t.Errorf("%T not in %s", o, fleet.DefaultNamespace)
			}
		}
	}
}

// TestDocsExamples decodes the YAML examples of docs/kubernetes.md
// strictly: the guide's objects are ones the apiserver takes.
func TestDocsExamples(t *testing.T) {
	b, err := os.ReadFile("../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(b, -1)
	kinds := map[string]int{}
	for i, m := range blocks {
		for _, obj := range decodeDocs(t, "docs/kubernetes.md block "+string(rune('1'+i)), m[1]) {
			kinds[obj.GetObjectKind().GroupVersionKind().Kind]++
			if tmpl, ok := obj.(*extv1beta1.SandboxTemplate); ok {
				ann := tmpl.Spec.PodTemplate.ObjectMeta.Annotations
				for _, e := range tmpl.Spec.PodTemplate.Spec.Containers[0].Env {
					if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && ann[fleet.AnnSecretHostsPrefix+e.Name] == "" {
						t.Errorf("template %s: env %s from a Secret without %s%s", tmpl.Name, e.Name, fleet.AnnSecretHostsPrefix, e.Name)
					}
				}
			}
		}
	}
	for _, k := range []string{"SandboxTemplate", "SandboxWarmPool", "SandboxClaim", "Secret"} {
		if kinds[k] == 0 {
			t.Errorf("docs/kubernetes.md has no %s example (found %v)", k, kinds)
		}
	}
}
