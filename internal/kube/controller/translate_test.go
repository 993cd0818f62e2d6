package controller

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/kube/kubetypes"
	"github.com/cagebox/cagebox/isolation"
)

func TestTranslate(t *testing.T) {
	secrets := fake.NewClientBuilder().WithScheme(kubetypes.Scheme).WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "keys", Namespace: testNS},
		Data:       map[string][]byte{"openai": []byte("sk-value"), "empty": nil},
	}).Build()
	ref := func(name, key string, optional bool) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key, Optional: ptr.To(optional)}}
	}
	hosts := func(env, h string) map[string]string { return map[string]string{fleet.AnnSecretHostsPrefix + env: h} }
	cases := []struct {
		name   string
		ann    map[string]string
		ctr    corev1.Container
		rc     string
		reason string // a SpecError reason, or "" for success
		check  func(t *testing.T, s *Spec)
	}{
		{name: "defaults", ctr: corev1.Container{Name: "m"}, check: func(t *testing.T, s *Spec) {
			if s.Req.Runtime != "auto" || s.Req.Image != DefaultImage || s.Req.MemoryBytes != 0 || s.Floor != 0 {
				t.Errorf("%+v", s.Req)
			}
			if s.Memory() != isolation.DefaultMemoryBytes {
				t.Errorf("memory %d", s.Memory())
			}
		}},
		{name: "runtime class, requests as limits", rc: "gvisor", ctr: corev1.Container{Name: "m", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("300Mi"), corev1.ResourceCPU: resource.MustParse("2")},
		}}, check: func(t *testing.T, s *Spec) {
			if s.Req.Runtime != "gvisor" || s.Req.MemoryBytes != 300<<20 || s.Req.CPUs != 2 {
				t.Errorf("%+v", s.Req)
			}
			if c := s.PoolClass("gvisor"); !strings.HasPrefix(c, "gvisor:default:300m") {
				t.Errorf("pool class %q", c)
			}
		}},
		{name: "secret inline", ann: hosts("OPENAI_API_KEY", "api.openai.com, *.openai.azure.com"),
			ctr: corev1.Container{Name: "m", Env: []corev1.EnvVar{{Name: "OPENAI_API_KEY", ValueFrom: ref("keys", "openai", false)}}},
			check: func(t *testing.T, s *Spec) {
				if len(s.Req.Secrets) != 1 || s.Req.Secrets[0].Value != "sk-value" || strings.Join(s.Req.Secrets[0].Hosts, "|") != "api.openai.com|*.openai.azure.com" || len(s.Req.Env) != 0 {
					t.Errorf("secrets %d env %v", len(s.Req.Secrets), s.Req.Env)
				}
			}},
		{name: "vault reference", ann: hosts("GH", "api.github.com"),
			ctr: corev1.Container{Name: "m", Env: []corev1.EnvVar{{Name: "GH", Value: "vault:github"}}},
			check: func(t *testing.T, s *Spec) {
				// Scoped to the object's namespace: never another's key.
				if len(s.Req.Secrets) != 1 || s.Req.Secrets[0].Secret != "ns_"+strings.ReplaceAll(testNS, "-", "_")+"__github" || s.Req.Secrets[0].Value != "" {
					t.Errorf("%+v", s.Req.Secrets)
				}
			}},
		{name: "vault: without hosts is a plain value", ctr: corev1.Container{Name: "m", Env: []corev1.EnvVar{{Name: "X", Value: "vault:k"}}},
			check: func(t *testing.T, s *Spec) {
				if len(s.Req.Secrets) != 0 || s.Req.Env[0] != "X=vault:k" {
					t.Errorf("%+v", s.Req)
				}
			}},
		{name: "optional missing secret is skipped", ann: hosts("A", "h"),
			ctr: corev1.Container{Name: "m", Env: []corev1.EnvVar{{Name: "A", ValueFrom: ref("none", "k", true)}}},
			check: func(t *testing.T, s *Spec) {
				if len(s.Req.Secrets) != 0 {
					t.Errorf("%+v", s.Req.Secrets)
				}
			}},
		{name: "hosts missing", ctr: corev1.Container{Name: "m", Env: []corev1.EnvVar{{Name: "A", ValueFrom: ref("keys", "openai", false)}}}, reason: ReasonSecretHostsMissing},
		{name: "secret missing", ann: hosts("A", "h"), ctr: corev1.Container{Name: "m", Env: []corev1.EnvVar{{Name: "A", ValueFrom: ref("none", "k", false)}}}, reason: ReasonSecretNotFound},
		{name: "key missing", ann: hosts("A", "h"), ctr: corev1.Container{Name: "m", Env: []corev1.EnvVar{{Name: "A", ValueFrom: ref("keys", "nope", false)}}}, reason: ReasonSecretKeyNotFound},
		{name: "key empty", ann: hosts("A", "h"), ctr: corev1.Container{Name: "m", Env: []corev1.EnvVar{{Name: "A", ValueFrom: ref("keys", "empty", false)}}}, reason: ReasonSecretKeyNotFound},
		{name: "hosts on a plain value", ann: hosts("A", "h"), ctr: corev1.Container{Name: "m", Env: []corev1.EnvVar{{Name: "A", Value: "plain"}}}, reason: ReasonInvalidTemplate},
		{name: "configmap ref", ctr: corev1.Container{Name: "m", Env: []corev1.EnvVar{{Name: "A", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{Key: "k"}}}}}, reason: ReasonInvalidTemplate},
		{name: "envFrom", ctr: corev1.Container{Name: "m", EnvFrom: []corev1.EnvFromSource{{}}}, reason: ReasonInvalidTemplate},
		{name: "bad floor", ann: map[string]string{fleet.AnnIsolationFloor: "strong"}, ctr: corev1.Container{Name: "m"}, reason: ReasonInvalidTemplate},
		{name: "bad policy", ann: map[string]string{fleet.AnnPolicy: "rules: [unclosed"}, ctr: corev1.Container{Name: "m"}, reason: ReasonInvalidTemplate},
		{name: "public port not a containerPort", ann: map[string]string{fleet.AnnPublicPorts: "80"}, ctr: corev1.Container{Name: "m"}, reason: ReasonInvalidTemplate},
		{name: "floor and ports", ann: map[string]string{fleet.AnnIsolationFloor: "app-kernel", fleet.AnnPublicPorts: "80"},
			ctr: corev1.Container{Name: "m", Ports: []corev1.ContainerPort{{ContainerPort: 80}, {ContainerPort: 81}}},
			check: func(t *testing.T, s *Spec) {
				if s.Floor != isolation.AppKernel || len(s.Req.Publish) != 2 || !s.Req.Publish[0].Public || s.Req.Publish[1].Public {
					t.Errorf("floor %v publish %+v", s.Floor, s.Req.Publish)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb := newSandbox("x", tc.ann, tc.ctr)
			sb.UID = "u-1"
			if tc.rc != "" {
				sb.Spec.PodTemplate.Spec.RuntimeClassName = &tc.rc
			}
			s, err := Translate(context.Background(), secrets, sb)
			if tc.reason != "" {
				var se *SpecError
				if !errors.As(err, &se) || se.Reason != tc.reason {
					t.Fatalf("err %v, want reason %s", err, tc.reason)
				}
				if strings.Contains(se.Message, "sk-value") {
					t.Fatal("message holds the secret value")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Req.Labels[fleet.LabelUID] != "u-1" || s.Req.Labels[fleet.LabelManagedBy] != fleet.ManagedBy {
				t.Errorf("labels %v", s.Req.Labels)
			}
			tc.check(t, s)
		})
	}
}

func TestClaimBlueprint(t *testing.T) {
	tpl := func(policy extv1beta1.EnvVarsInjectionPolicy) *extv1beta1.SandboxTemplate {
		return &extv1beta1.SandboxTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: "t"},
			Spec: extv1beta1.SandboxTemplateSpec{EnvVarsInjectionPolicy: policy, SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{PodTemplate: sandboxv1beta1.PodTemplate{
				ObjectMeta: sandboxv1beta1.PodMetadata{Annotations: map[string]string{fleet.AnnSecretHostsPrefix + "TOKEN": "h"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Env: []corev1.EnvVar{
					{Name: "A", Value: "1"},
					{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "k"}}},
				}}}},
			}}},
		}
	}
	claim := func(env ...extv1beta1.EnvVar) *extv1beta1.SandboxClaim {
		return &extv1beta1.SandboxClaim{Spec: extv1beta1.SandboxClaimSpec{Env: env}}
	}
	cases := []struct {
		name    string
		policy  extv1beta1.EnvVarsInjectionPolicy
		claim   *extv1beta1.SandboxClaim
		refused string
		env     string
	}{
		{"no env, default policy", "", claim(), "", "A=1"},
		{"env, default policy (Disallowed)", "", claim(extv1beta1.EnvVar{Name: "B", Value: "2"}), "Disallowed", ""},
		{"allowed adds", extv1beta1.EnvVarsInjectionPolicyAllowed, claim(extv1beta1.EnvVar{Name: "B", Value: "2"}), "", "A=1 B=2"},
		{"allowed does not override", extv1beta1.EnvVarsInjectionPolicyAllowed, claim(extv1beta1.EnvVar{Name: "A", Value: "9"}), "does not let a claim override", ""},
		{"overrides", extv1beta1.EnvVarsInjectionPolicyOverrides, claim(extv1beta1.EnvVar{Name: "A", Value: "9"}), "", "A=9"},
		{"never a credential", extv1beta1.EnvVarsInjectionPolicyOverrides, claim(extv1beta1.EnvVar{Name: "TOKEN", Value: "mine"}), "credential", ""},
		{"other container", extv1beta1.EnvVarsInjectionPolicyOverrides, claim(extv1beta1.EnvVar{Name: "B", ContainerName: "side"}), "not the sandbox's container", ""},
		{"reserved annotation", "", &extv1beta1.SandboxClaim{Spec: extv1beta1.SandboxClaimSpec{AdditionalPodMetadata: sandboxv1beta1.PodMetadata{Annotations: map[string]string{fleet.AnnPolicy: "{}"}}}}, fleet.AnnPolicy, ""},
		{"volumes", "", &extv1beta1.SandboxClaim{Spec: extv1beta1.SandboxClaimSpec{VolumeClaimTemplates: []sandboxv1beta1.PersistentVolumeClaimTemplate{{}}}}, "persistent volumes", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bp, err := ClaimBlueprint(tpl(tc.policy), tc.claim)
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("err %v, want one saying %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var env []string
			for _, e := range bp.PodTemplate.Spec.Containers[0].Env {
				if e.ValueFrom == nil {
					env = append(env, e.Name+"="+e.Value)
				}
			}
			if got := strings.Join(env, " "); got != tc.env {
				t.Errorf("env %q, want %q", got, tc.env)
			}
		})
	}
}

func TestResolveRuntime(t *testing.T) {
	gvisorDown := fleet.RuntimeInfo{Name: "gvisor", Class: "app-kernel", Available: false}
	cases := []struct {
		cap     fleet.Capacity
		runtime string
		floor   isolation.Class
		want    string
	}{
		{fleet.Capacity{Runtimes: []fleet.RuntimeInfo{rtContainer, rtGVisor}, DefaultRuntime: "gvisor"}, "auto", 0, "gvisor"},
		{fleet.Capacity{Runtimes: []fleet.RuntimeInfo{rtContainer, rtGVisor}, DefaultRuntime: "container"}, "", isolation.AppKernel, "gvisor"},
		{fleet.Capacity{Runtimes: []fleet.RuntimeInfo{rtContainer, rtGVisor, rtQEMU}, DefaultRuntime: "container"}, "auto", isolation.AppKernel, "qemu"},
		{fleet.Capacity{Runtimes: []fleet.RuntimeInfo{rtContainer, gvisorDown}}, "gvisor", 0, ""},
		{fleet.Capacity{Runtimes: []fleet.RuntimeInfo{rtContainer}}, "container", isolation.Hypervisor, ""},
		{fleet.Capacity{Runtimes: []fleet.RuntimeInfo{rtQEMU}}, "qemu", isolation.Hypervisor, "qemu"},
	}
	for i, tc := range cases {
		if got := resolveRuntime(tc.cap, tc.runtime, tc.floor); got != tc.want {
			t.Errorf("%d: resolve(%q, %v) = %q, want %q", i, tc.runtime, tc.floor, got, tc.want)
		}
	}
}

func TestChoose(t *testing.T) {
	now := time.Now()
	node := func(name string, free int64, ready int, rts ...fleet.RuntimeInfo) Node {
		c := fleet.Capacity{Runtimes: rts, DefaultRuntime: rts[0].Name, MemoryAvailable: free, At: now}
		if ready > 0 {
			c.Pools = append(c.Pools, apiPool("container:default", ready))
		}
		return Node{Name: name, Endpoint: "https://" + name, Capacity: c, Expires: now.Add(time.Minute)}
	}
	spec := &Spec{Req: &apiReq{Runtime: "container", Image: "default"}}
	reg := newRegistry(nil, "")
	rng := rand.New(rand.NewPCG(1, 2))
	live := []Node{node("a", 1<<30, 0, rtContainer), node("b", 8<<30, 0, rtContainer), node("c", 2<<30, 1, rtContainer), node("q", 64<<30, 0, rtQEMU)}

	// Best of all (K = 4): the most free memory among those with the runtime.
	if c, _, ok := choose(live, spec, false, 4, reg, rng); !ok || c.node.Name != "b" || c.runtime != "container" {
		t.Fatalf("chose %+v", c)
	}
	// A claim goes where a warm sandbox of its class is ready.
	if c, _, ok := choose(live, spec, true, 4, reg, rng); !ok || c.node.Name != "c" || !c.poolReady {
		t.Fatalf("warm choice %+v", c)
	}
	// Once the controller took c's one warm sandbox (before c's next
	// report), the next claim goes by memory.
	reg.recordPlacement("c", placement{at: now.Add(time.Second), memory: 512 << 20, poolClass: "container:default"})
	if c, _, _ := choose(live, spec, true, 4, reg, rng); c.node.Name != "b" {
		t.Fatalf("after the pool was used: %s", c.node.Name)
	}
	// Memory placed since the report counts against a node.
	reg.recordPlacement("b", placement{at: now.Add(time.Second), memory: 7 << 30})
	if c, _, _ := choose(live, spec, false, 4, reg, rng); c.node.Name != "c" {
		t.Fatalf("with 7 GiB placed on b since its report: %s", c.node.Name)
	}
	// Best of 1 is a random eligible node: never q.
	seen := map[string]bool{}
	for i := 0; i < 50; i++ {
		c, _, _ := choose(live, spec, false, 1, reg, rng)
		seen[c.node.Name] = true
	}
	if seen["q"] || len(seen) != 3 {
		t.Errorf("best of 1 chose %v", seen)
	}
	if _, why, ok := choose(live, &Spec{Req: &apiReq{Runtime: "firecracker"}}, false, 2, reg, rng); ok || !strings.Contains(why, "runtime firecracker") || !strings.Contains(why, "q: qemu(hypervisor)") {
		t.Errorf("no node: %q", why)
	}
	if _, why, ok := choose(nil, spec, false, 2, reg, rng); ok || !strings.Contains(why, "no live cagebox node") {
		t.Errorf("no nodes: %q", why)
	}
}

func TestSpread(t *testing.T) {
	nodes := []string{"a", "b", "c"}
	got := Spread("ns/p", 7, nodes)
	total, most, least := 0, 0, 99
	for _, n := range nodes {
		total += got[n]
		most, least = max(most, got[n]), min(least, got[n])
	}
	if total != 7 || most-least > 1 {
		t.Errorf("spread %v", got)
	}
	if again := Spread("ns/p", 7, nodes); again["a"] != got["a"] || again["b"] != got["b"] {
		t.Error("not deterministic")
	}
	if len(Spread("x", 3, nil)) != 0 || len(Spread("x", 0, nodes)) != 0 {
		t.Error("nothing to spread")
	}
}

type apiReq = api.CreateSandboxRequest

func apiPool(class string, ready int) api.PoolStatus {
	return api.PoolStatus{Class: class, Ready: ready, Target: ready}
}

// Node vault names are per namespace and never collide across them.
func TestVaultName(t *testing.T) {
	if got := VaultName("team-a", "GH"); got != "ns_team_a__GH" {
		t.Fatalf("VaultName = %q", got)
	}
	// "a--b" with "c" would meet "a" with "b__c": such keys are refused.
	for _, k := range []string{"b__c", "_c", "", "a-b", "a.b"} {
		if validVaultKey(k) {
			t.Errorf("vault key %q accepted", k)
		}
	}
	for _, k := range []string{"GH", "gh_token", "K1"} {
		if !validVaultKey(k) {
			t.Errorf("vault key %q refused", k)
		}
	}
}
