package controller

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/util/retry"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/kube/fleet"
)

func (e *env) getClaim(name string) *extv1beta1.SandboxClaim {
	e.t.Helper()
	var cl extv1beta1.SandboxClaim
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: testNS, Name: name}, &cl); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		e.t.Fatal(err)
	}
	return &cl
}

func (e *env) getPool(name string) *extv1beta1.SandboxWarmPool {
	e.t.Helper()
	var wp extv1beta1.SandboxWarmPool
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: testNS, Name: name}, &wp); err != nil {
		e.t.Fatal(err)
	}
	return &wp
}

// createTemplatePool creates template tpl (one container of image) and its
// warm pool pool of replicas.
func (e *env) createTemplatePool(tpl, image, pool string, replicas int32) {
	e.t.Helper()
	t := &extv1beta1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: tpl, Namespace: testNS},
		Spec: extv1beta1.SandboxTemplateSpec{SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{PodTemplate: sandboxv1beta1.PodTemplate{
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: image}}},
		}}},
	}
	wp := &extv1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: pool, Namespace: testNS},
		Spec:       extv1beta1.SandboxWarmPoolSpec{Replicas: ptr.To(replicas), TemplateRef: extv1beta1.SandboxTemplateRef{Name: tpl}},
	}
	for _, o := range []client.Object{t, wp} {
		if err := e.c.Create(e.ctx, o); err != nil {
			e.t.Fatal(err)
		}
	}
}

func poolSize(ts []api.PoolTarget) int {
	n := 0
	for _, t := range ts {
		n += t.Size
	}
	return n
}

// A SandboxWarmPool's replicas are spread over the live nodes that offer
// its runtime (PUT /v1/pools), its status counts what they report ready;
// a claim gets a Sandbox named after it, owned by it, served warm from a
// node's pool with the claim's env; deleting the claim removes both.
func TestClaimFromWarmPool(t *testing.T) {
	e := startEnv(t, Config{})
	a := e.addNode("a", 8<<30, "gvisor", rtContainer, rtGVisor)
	b := e.addNode("b", 8<<30, "container", rtContainer)
	c := e.addNode("c", 8<<30, "qemu", rtQEMU)

	rc := "container"
	tpl := &extv1beta1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "py", Namespace: testNS},
		Spec: extv1beta1.SandboxTemplateSpec{
			EnvVarsInjectionPolicy: extv1beta1.EnvVarsInjectionPolicyOverrides,
			SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{PodTemplate: sandboxv1beta1.PodTemplate{
				ObjectMeta: sandboxv1beta1.PodMetadata{Annotations: map[string]string{fleet.AnnAllow: "pypi.org"}},
				Spec: corev1.PodSpec{RuntimeClassName: &rc, Containers: []corev1.Container{{
					Name: "main", Image: "python",
					Env:       []corev1.EnvVar{{Name: "GREETING", Value: "hi"}},
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}},
				}}},
			}},
		},
	}
	wp := &extv1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: "wp", Namespace: testNS},
		Spec:       extv1beta1.SandboxWarmPoolSpec{Replicas: ptr.To(int32(3)), TemplateRef: extv1beta1.SandboxTemplateRef{Name: "py"}},
	}
	for _, o := range []client.Object{tpl, wp} {
		if err := e.c.Create(e.ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	e.eventually(30*time.Second, "pool targets on a and b", func() bool {
		ta, _ := a.poolTargets()
		tb, _ := b.poolTargets()
		return poolSize(ta)+poolSize(tb) == 3 && poolSize(ta) > 0 && poolSize(tb) > 0
	})
	if tc, sets := c.poolTargets(); len(tc) != 0 || sets != 0 {
		t.Errorf("node c (no container runtime) got pool targets %+v", tc)
	}
	ta, _ := a.poolTargets()
	if want := (api.PoolTarget{Runtime: "container", Image: "python", MemoryBytes: 256 << 20, Size: ta[0].Size}); ta[0] != want {
		t.Errorf("target on a %+v, want %+v", ta[0], want)
	}
	e.eventually(30*time.Second, "pool status 3/3", func() bool {
		st := e.getPool("wp").Status
		return st.Replicas == 3 && st.ReadyReplicas == 3 && st.ObservedGeneration == e.getPool("wp").Generation
	})
	_, setsA := a.poolTargets()

	cl := &extv1beta1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "job1", Namespace: testNS},
		Spec: extv1beta1.SandboxClaimSpec{
			WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: "wp"},
			Env:         []extv1beta1.EnvVar{{Name: "GREETING", Value: "yo"}, {Name: "TASK", Value: "42"}},
		},
	}
	t0 := time.Now()
	if err := e.c.Create(e.ctx, cl); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the claim ready", func() bool {
		got := e.getClaim("job1")
		r := meta.FindStatusCondition(got.Status.Conditions, condReady)
		return r != nil && r.Status == metav1.ConditionTrue && len(got.Status.SandboxStatus.PodIPs) == 1
	})
	t.Logf("claim ready in %v", time.Since(t0).Round(time.Millisecond))
	got := e.getClaim("job1")
	if got.Status.SandboxStatus.Name != "job1" {
		t.Errorf("claim status %+v", got.Status.SandboxStatus)
	}
	sb := e.getSandbox("job1")
	if ref := metav1.GetControllerOf(sb); ref == nil || ref.UID != got.UID || ref.Kind != "SandboxClaim" {
		t.Errorf("owner %+v", sb.OwnerReferences)
	}
	if sb.Annotations[fleet.AnnPool] != testNS+"/wp" || sb.Annotations[fleet.AnnLaunch] != LaunchWarm {
		t.Errorf("annotations %v, want the pool and a warm launch", sb.Annotations)
	}
	if n := sb.Status.NodeName; n != "a" && n != "b" {
		t.Fatalf("placed on %q", n)
	}
	node := map[string]*fakeNode{"a": a, "b": b}[sb.Status.NodeName]
	reqs := node.createRequests()
	if len(reqs) != 1 || reqs[0].Runtime != "container" || reqs[0].MemoryBytes != 256<<20 {
		t.Fatalf("creates %+v", reqs)
	}
	if env := strings.Join(reqs[0].Env, " "); env != "GREETING=yo TASK=42" {
		t.Errorf("env %q, want the claim's override and addition", env)
	}

	// A claim may not loosen the template's egress policy.
	bad := &extv1beta1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "sneaky", Namespace: testNS},
		Spec: extv1beta1.SandboxClaimSpec{
			WarmPoolRef:           extv1beta1.SandboxWarmPoolRef{Name: "wp"},
			AdditionalPodMetadata: sandboxv1beta1.PodMetadata{Annotations: map[string]string{fleet.AnnAllow: "evil.example"}},
		},
	}
	if err := e.c.Create(e.ctx, bad); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the sneaky claim refused", func() bool {
		r := meta.FindStatusCondition(e.getClaim("sneaky").Status.Conditions, condReady)
		return r != nil && r.Reason == ReasonInvalidMetadata && strings.Contains(r.Message, fleet.AnnAllow)
	})
	if e.getSandbox("sneaky") != nil {
		t.Error("a Sandbox was made for the refused claim")
	}

	// Deleting the claim deletes its Sandbox and the node sandbox.
	if err := e.c.Delete(e.ctx, got); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "claim and sandbox gone", func() bool {
		return e.getClaim("job1") == nil && e.getSandbox("job1") == nil
	})
	if ids := node.live(); len(ids) != 0 {
		t.Errorf("node sandboxes left: %v", ids)
	}

	// Scaling the pool to zero empties the nodes' targets.
	p := e.getPool("wp")
	p.Spec.Replicas = ptr.To(int32(0))
	if err := e.c.Update(e.ctx, p); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "targets emptied", func() bool {
		ta, sets := a.poolTargets()
		tb, _ := b.poolTargets()
		return len(ta) == 0 && len(tb) == 0 && sets > setsA
	})
}

// The node's pool targets follow the nodes: a new node takes a share.
func TestWarmPoolRespreadsWhenNodesChange(t *testing.T) {
	e := startEnv(t, Config{})
	a := e.addNode("a", 8<<30, "container", rtContainer)
	e.createTemplatePool("t", "busybox", "p", 4)
	e.eventually(30*time.Second, "4 on a", func() bool { ta, _ := a.poolTargets(); return poolSize(ta) == 4 })
	b := e.addNode("b", 8<<30, "container", rtContainer)
	e.eventually(30*time.Second, "2 and 2", func() bool {
		ta, _ := a.poolTargets()
		tb, _ := b.poolTargets()
		return poolSize(ta) == 2 && poolSize(tb) == 2
	})
	e.kill("b")
	e.eventually(30*time.Second, "4 on a again", func() bool { ta, _ := a.poolTargets(); return poolSize(ta) == 4 })
}

// A credential from a Kubernetes Secret reaches the node inline and is
// nowhere else: not in any object, status, Event or log line. Missing
// hosts, Secrets or keys stop the sandbox with a condition saying what
// to fix, and no node call.
func TestSecretValueOnlyReachesTheNode(t *testing.T) {
	const value = "ghp_S3CRET-value-that-must-not-leak-7f3a9c"
	e := startEnv(t, Config{})
	n := e.addNode("a", 8<<30, "container", rtContainer)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "gh", Namespace: testNS},
		Data:       map[string][]byte{"token": []byte(value)},
	}
	if err := e.c.Create(e.ctx, sec); err != nil {
		t.Fatal(err)
	}
	fromSecret := func(name, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: "GITHUB_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key,
		}}}
	}
	hosts := map[string]string{fleet.AnnSecretHostsPrefix + "GITHUB_TOKEN": "api.github.com"}
	cases := []struct {
		name   string
		ann    map[string]string
		env    corev1.EnvVar
		reason string
		says   string
	}{
		{"ok", hosts, fromSecret("gh", "token"), ReasonRunning, ""},
		{"nohosts", nil, fromSecret("gh", "token"), ReasonSecretHostsMissing, fleet.AnnSecretHostsPrefix + "GITHUB_TOKEN"},
		{"nosecret", hosts, fromSecret("nope", "token"), ReasonSecretNotFound, "Secret agents/nope does not exist"},
		{"nokey", hosts, fromSecret("gh", "other"), ReasonSecretKeyNotFound, "has no key other"},
	}
	for _, tc := range cases {
		if err := e.c.Create(e.ctx, newSandbox(tc.name, tc.ann, corev1.Container{Name: "main", Env: []corev1.EnvVar{tc.env}})); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range cases {
		e.eventually(30*time.Second, tc.name+" Ready "+tc.reason, func() bool {
			r := readyOf(e.getSandbox(tc.name))
			return r != nil && r.Reason == tc.reason
		})
		if r := readyOf(e.getSandbox(tc.name)); !strings.Contains(r.Message, tc.says) {
			t.Errorf("%s: message %q should say %q", tc.name, r.Message, tc.says)
		}
	}
	reqs := n.createRequests()
	if len(reqs) != 1 {
		t.Fatalf("%d creates, want 1 (only the complete spec reaches a node)", len(reqs))
	}
	want := api.SecretBinding{Name: "GITHUB_TOKEN", Value: value, Hosts: []string{"api.github.com"}}
	if s := reqs[0].Secrets; len(s) != 1 || s[0].Name != want.Name || s[0].Value != want.Value || strings.Join(s[0].Hosts, ",") != "api.github.com" {
		t.Errorf("secrets sent %d bindings, want %s bound to api.github.com", len(s), want.Name)
	}
	for _, env := range reqs[0].Env {
		if strings.Contains(env, value) {
			t.Error("the value went into the guest's env")
		}
	}

	// Give the controller a few resyncs to write whatever it writes.
	time.Sleep(2 * time.Second)
	var dump []any
	var sbs sandboxv1beta1.SandboxList
	var evs corev1.EventList
	var leases coordinationv1.LeaseList
	var claims extv1beta1.SandboxClaimList
	for _, l := range []client.ObjectList{&sbs, &evs, &leases, &claims} {
		if err := e.c.List(e.ctx, l); err != nil {
			t.Fatal(err)
		}
		dump = append(dump, l)
	}
	b, _ := json.Marshal(dump)
	if strings.Contains(string(b), value) {
		t.Fatal("the secret value is in an object or Event")
	}
	if len(evs.Items) == 0 || !strings.Contains(string(b), ReasonSecretHostsMissing) {
		t.Errorf("expected Events (incl. %s) to search, got %d", ReasonSecretHostsMissing, len(evs.Items))
	}
	if strings.Contains(e.logs.String(), value) {
		t.Fatal("the secret value is in the controller's log")
	}
}

// A claim's shutdownTime: Retain keeps the claim Finished and deletes its
// Sandbox (and the node sandbox); Delete deletes the claim.
func TestClaimShutdownTime(t *testing.T) {
	e := startEnv(t, Config{})
	n := e.addNode("a", 8<<30, "container", rtContainer)
	tpl := &extv1beta1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: testNS},
		Spec: extv1beta1.SandboxTemplateSpec{SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{PodTemplate: sandboxv1beta1.PodTemplate{
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}},
		}}},
	}
	wp := &extv1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: testNS},
		Spec:       extv1beta1.SandboxWarmPoolSpec{Replicas: ptr.To(int32(0)), TemplateRef: extv1beta1.SandboxTemplateRef{Name: "t"}},
	}
	claim := func(name string, p extv1beta1.ShutdownPolicy) *extv1beta1.SandboxClaim {
		return &extv1beta1.SandboxClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
			Spec: extv1beta1.SandboxClaimSpec{
				WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: "p"},
				Lifecycle:   &extv1beta1.Lifecycle{ShutdownPolicy: p},
			},
		}
	}
	for _, o := range []client.Object{tpl, wp, claim("keep", extv1beta1.ShutdownPolicyRetain), claim("drop", extv1beta1.ShutdownPolicyDelete)} {
		if err := e.c.Create(e.ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// Both run first (with a shutdown time set at create, a loaded
	// machine could reconcile them only after it passed: correctly never
	// made, and a flaky test); then their shutdown time comes.
	e.eventually(30*time.Second, "both claims running", func() bool { return len(n.live()) == 2 })
	e.eventually(30*time.Second, "keep's launch annotation", func() bool {
		sb := e.getSandbox("keep")
		return sb != nil && sb.Annotations[fleet.AnnLaunch] != ""
	})
	if launch := e.getSandbox("keep").Annotations[fleet.AnnLaunch]; launch != LaunchCold {
		t.Errorf("launch %q with an empty pool, want cold", launch)
	}
	at := metav1.NewTime(time.Now().Add(time.Second))
	for _, name := range []string{"keep", "drop"} {
		// The controller writes the object too: retry on a conflict.
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c := e.getClaim(name)
			c.Spec.Lifecycle.ShutdownTime = &at
			return e.c.Update(e.ctx, c)
		}); err != nil {
			t.Fatal(err)
		}
	}
	e.eventually(30*time.Second, "keep finished, drop gone", func() bool {
		k := e.getClaim("keep")
		return e.getClaim("drop") == nil && k != nil && meta.IsStatusConditionTrue(k.Status.Conditions, string(sandboxv1beta1.SandboxConditionFinished)) &&
			e.getSandbox("keep") == nil && e.getSandbox("drop") == nil
	})
	if r := meta.FindStatusCondition(e.getClaim("keep").Status.Conditions, condReady); r.Reason != extv1beta1.ClaimExpiredReason {
		t.Errorf("Ready %+v", r)
	}
	e.eventually(30*time.Second, "node sandboxes removed", func() bool { return len(n.live()) == 0 })
}

// Many claims at once against pools spread over three nodes: every one
// is served warm (the controller counts the warm sandboxes it took since
// each node's last report) and the pools are drawn down evenly.
func TestManyClaimsServedWarm(t *testing.T) {
	const claims, replicas = 40, 48
	e := startEnv(t, Config{BestOf: 2})
	nodes := []*fakeNode{
		e.addNode("a", 8<<30, "container", rtContainer),
		e.addNode("b", 8<<30, "container", rtContainer),
		e.addNode("c", 8<<30, "container", rtContainer),
	}
	e.createTemplatePool("t", "busybox", "p", int32(replicas))
	e.eventually(30*time.Second, "pools ready", func() bool { return e.getPool("p").Status.ReadyReplicas == replicas })
	t0 := time.Now()
	for i := 0; i < claims; i++ {
		cl := &extv1beta1.SandboxClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "c" + fmt.Sprint(i), Namespace: testNS},
			Spec:       extv1beta1.SandboxClaimSpec{WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: "p"}},
		}
		if err := e.c.Create(e.ctx, cl); err != nil {
			t.Fatal(err)
		}
	}
	e.eventually(30*time.Second, "all claims ready", func() bool {
		var list extv1beta1.SandboxClaimList
		if err := e.c.List(e.ctx, &list, client.InNamespace(testNS)); err != nil {
			return false
		}
		ready := 0
		for _, cl := range list.Items {
			if meta.IsStatusConditionTrue(cl.Status.Conditions, condReady) {
				ready++
			}
		}
		return ready == claims
	})
	d := time.Since(t0)
	t.Logf("%d claims ready in %v (%.0f claims/s through the controller; fake nodes)", claims, d.Round(time.Millisecond), float64(claims)/d.Seconds())
	var sbs sandboxv1beta1.SandboxList
	if err := e.c.List(e.ctx, &sbs, client.InNamespace(testNS)); err != nil {
		t.Fatal(err)
	}
	cold := 0
	for _, sb := range sbs.Items {
		if sb.Annotations[fleet.AnnLaunch] != LaunchWarm {
			cold++
		}
	}
	if cold != 0 {
		t.Errorf("%d of %d claims started cold with %d warm sandboxes in the pools", cold, claims, replicas)
	}
	for _, n := range nodes {
		if got := len(n.live()); got < claims/3-4 || got > claims/3+4 {
			t.Errorf("node %s runs %d of %d", n.name, got, claims)
		}
	}
}
