package controller

import (
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/util/retry"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/isolation"
)

func newSandbox(name string, ann map[string]string, ctr corev1.Container) *sandboxv1beta1.Sandbox {
	return &sandboxv1beta1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: sandboxv1beta1.SandboxSpec{SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{
			PodTemplate: sandboxv1beta1.PodTemplate{
				ObjectMeta: sandboxv1beta1.PodMetadata{Annotations: ann},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{ctr}},
			},
		}},
	}
}

func (e *env) getSandbox(name string) *sandboxv1beta1.Sandbox {
	e.t.Helper()
	var sb sandboxv1beta1.Sandbox
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: testNS, Name: name}, &sb); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		e.t.Fatal(err)
	}
	return &sb
}

func readyOf(sb *sandboxv1beta1.Sandbox) *metav1.Condition {
	if sb == nil {
		return nil
	}
	return meta.FindStatusCondition(sb.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady))
}

// A Sandbox is placed on the one node that offers its runtime at its
// floor, created there with the fleet labels and a concrete runtime,
// and shows where it runs; deleting it removes the node sandbox first.
func TestSandboxPlacedThenDeleted(t *testing.T) {
	e := startEnv(t, Config{IngressDomain: "fleet.test"})
	small := e.addNode("small", 8<<30, "container", rtContainer)
	vm := e.addNode("vm", 4<<30, "container", rtContainer, rtGVisor, rtQEMU)

	sb := newSandbox("web", map[string]string{
		fleet.AnnIsolationFloor: "hypervisor",
		fleet.AnnAllow:          "api.example.com, pypi.org",
		fleet.AnnPolicy:         "rules:\n- host: example.org\n  action: allow\n",
		fleet.AnnPublicPorts:    "8080",
	}, corev1.Container{
		Name: "main", Image: "busybox",
		Env:   []corev1.EnvVar{{Name: "MODE", Value: "test"}},
		Ports: []corev1.ContainerPort{{ContainerPort: 8080}, {ContainerPort: 9000}},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("1Gi"), corev1.ResourceCPU: resource.MustParse("1500m"),
		}},
	})
	if err := e.c.Create(e.ctx, sb); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	e.eventually(30*time.Second, "the sandbox placed", func() bool {
		s := e.getSandbox("web")
		return s.Annotations[fleet.AnnSandboxID] != "" && s.Status.NodeName != ""
	})
	t.Logf("placed in %v", time.Since(t0).Round(time.Millisecond))
	got := e.getSandbox("web")
	if got.Status.NodeName != "vm" {
		t.Fatalf("placed on %q, want vm (the only node with a hypervisor runtime)", got.Status.NodeName)
	}
	if !controllerutil.ContainsFinalizer(got, fleet.Finalizer) {
		t.Errorf("finalizers %v, want %s", got.Finalizers, fleet.Finalizer)
	}
	id := got.Annotations[fleet.AnnSandboxID]
	if r := readyOf(got); r == nil || r.Status != metav1.ConditionTrue || r.Reason != ReasonRunning {
		t.Errorf("Ready %+v", r)
	}
	if got.Annotations[fleet.AnnLaunch] != LaunchCold {
		t.Errorf("launch %q, want cold (no pool)", got.Annotations[fleet.AnnLaunch])
	}
	wantURLs := "https://8080-" + id + ".fleet.test/,https://9000-" + id + ".fleet.test/"
	if got.Annotations[fleet.AnnURLs] != wantURLs {
		t.Errorf("urls %q, want %q", got.Annotations[fleet.AnnURLs], wantURLs)
	}
	if got.Status.ServiceFQDN != id+".fleet.test" || len(got.Status.PodIPs) != 1 {
		t.Errorf("status %+v", got.Status)
	}
	if len(small.live()) != 0 {
		t.Errorf("small node got sandboxes %v", small.live())
	}
	reqs := vm.createRequests()
	if len(reqs) != 1 {
		t.Fatalf("%d creates on vm, want 1", len(reqs))
	}
	r := reqs[0]
	if r.Runtime != "qemu" || r.Image != "busybox" || r.MemoryBytes != 1<<30 || r.CPUs != 1.5 {
		t.Errorf("create %+v", r)
	}
	if r.Labels[fleet.LabelUID] != string(got.UID) || r.Labels[fleet.LabelManagedBy] != fleet.ManagedBy || r.Labels[fleet.LabelName] != "web" || r.Labels[fleet.LabelNamespace] != testNS {
		t.Errorf("labels %v", r.Labels)
	}
	if strings.Join(r.Allow, ",") != "api.example.com,pypi.org" || !strings.Contains(string(r.Policy), `"host":"example.org"`) {
		t.Errorf("allow %v policy %s", r.Allow, r.Policy)
	}
	if len(r.Env) != 1 || r.Env[0] != "MODE=test" {
		t.Errorf("env %v", r.Env)
	}
	if len(r.Publish) != 2 || !r.Publish[0].Public || r.Publish[1].Public {
		t.Errorf("publish %+v", r.Publish)
	}
	if addr, ok := e.ctl.LookupIngress(id); !ok || addr != "vm.test:8443" {
		t.Errorf("LookupIngress(%s) = %q, %v", id, addr, ok)
	}
	// Another tenant's object claiming the same id in its annotations
	// (it may write those, not the status) changes nothing.
	forger := newSandbox("forger", nil, corev1.Container{Name: "main"})
	forger.Annotations = map[string]string{fleet.AnnSandboxID: id}
	forger.Spec.PodTemplate.Spec.RuntimeClassName = ptr.To("firecracker")
	if err := e.c.Create(e.ctx, forger); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the forger unschedulable", func() bool {
		r := readyOf(e.getSandbox("forger"))
		return r != nil && r.Reason == ReasonUnschedulable
	})
	if addr, ok := e.ctl.LookupIngress(id); !ok || addr != "vm.test:8443" {
		t.Errorf("LookupIngress(%s) with a forged annotation = %q, %v", id, addr, ok)
	}
	if _, ok := e.ctl.LookupIngress("nope"); ok {
		t.Error("LookupIngress of an unknown id")
	}

	// A second reconcile (resync) neither creates again nor moves it.
	time.Sleep(1500 * time.Millisecond)
	if n := len(vm.createRequests()); n != 1 {
		t.Fatalf("%d creates after resyncs, want 1", n)
	}

	if err := e.c.Delete(e.ctx, got); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the object gone", func() bool { return e.getSandbox("web") == nil })
	if ids := vm.live(); len(ids) != 0 {
		t.Fatalf("node sandboxes left after the delete: %v", ids)
	}
}

// A Sandbox no node can run waits with Ready=False Unschedulable and a
// message naming what the nodes offer; a node that offers it places it.
func TestSandboxUnschedulableUntilANodeOffersIt(t *testing.T) {
	e := startEnv(t, Config{})
	e.addNode("a", 8<<30, "container", rtContainer)
	rc := "gvisor"
	sb := newSandbox("g", nil, corev1.Container{Name: "main"})
	sb.Spec.PodTemplate.Spec.RuntimeClassName = &rc
	if err := e.c.Create(e.ctx, sb); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "Ready=False Unschedulable", func() bool {
		r := readyOf(e.getSandbox("g"))
		return r != nil && r.Reason == ReasonUnschedulable
	})
	msg := readyOf(e.getSandbox("g")).Message
	if !strings.Contains(msg, "runtime gvisor") || !strings.Contains(msg, "a: container(namespaces)") {
		t.Errorf("message %q should say what is wanted and what node a offers", msg)
	}
	// b's first create answer is lost after b made the sandbox: the retry
	// finds it by its uid label instead of making a second one.
	b := newFakeNode("b")
	b.loseAnswer = true
	e.addFakeNode(b, 8<<30, "gvisor", rtContainer, rtGVisor)
	e.eventually(30*time.Second, "placed on b", func() bool {
		s := e.getSandbox("g")
		return s.Status.NodeName == "b" && s.Annotations[fleet.AnnSandboxID] != ""
	})
	if r := b.createRequests(); len(r) != 1 || r[0].Image != DefaultImage || r[0].Runtime != "gvisor" {
		t.Errorf("creates on b %+v", r)
	}
	if ids := b.live(); len(ids) != 1 || ids[0] != e.getSandbox("g").Annotations[fleet.AnnSandboxID] {
		t.Errorf("b runs %v for %s", ids, e.getSandbox("g").Annotations[fleet.AnnSandboxID])
	}
}

// When a node's lease expires its sandboxes go Ready=False NodeLost and
// are placed again on another node (a new sandbox, an Event); when the
// node returns, the stale sandbox there is removed. A Sandbox deleted
// while its node is gone loses its finalizer at once.
func TestNodeLossPlacesAgain(t *testing.T) {
	e := startEnv(t, Config{Resync: 500 * time.Millisecond})
	a := e.addNode("a", 16<<30, "container", rtContainer)
	b := e.addNode("b", 1<<30, "container", rtContainer)
	for _, name := range []string{"one", "two"} {
		if err := e.c.Create(e.ctx, newSandbox(name, nil, corev1.Container{Name: "main"})); err != nil {
			t.Fatal(err)
		}
	}
	e.eventually(30*time.Second, "both placed", func() bool {
		return e.getSandbox("one").Status.NodeName != "" && e.getSandbox("two").Status.NodeName != ""
	})
	// Best of 2 by free memory: both on a.
	if n1, n2 := e.getSandbox("one").Status.NodeName, e.getSandbox("two").Status.NodeName; n1 != "a" || n2 != "a" {
		t.Fatalf("placed on %s and %s, want a (more free memory)", n1, n2)
	}
	oldID := e.getSandbox("one").Annotations[fleet.AnnSandboxID]
	// "two" is deleted while a is gone: the finalizer goes without a node call.
	e.kill("a")
	t0 := time.Now()
	e.eventually(30*time.Second, "one placed on b", func() bool {
		s := e.getSandbox("one")
		return s.Status.NodeName == "b" && s.Annotations[fleet.AnnSandboxID] != ""
	})
	t.Logf("re-placed %v after the last renewal", time.Since(t0).Round(time.Millisecond))
	one := e.getSandbox("one")
	if one.Annotations[fleet.AnnSandboxID] == oldID {
		t.Fatal("same sandbox id after re-placement")
	}
	if r := readyOf(one); r.Status != metav1.ConditionTrue {
		t.Errorf("Ready %+v after re-placement", r)
	}
	var evs corev1.EventList
	if err := e.c.List(e.ctx, &evs, client.InNamespace(testNS)); err != nil {
		t.Fatal(err)
	}
	lost := false
	for _, ev := range evs.Items {
		if ev.Reason == ReasonNodeLost && ev.InvolvedObject.Name == "one" {
			lost = true
		}
	}
	if !lost {
		t.Errorf("no NodeLost event for one among %d events", len(evs.Items))
	}
	if err := e.c.Delete(e.ctx, e.getSandbox("two")); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "two gone while its node is down", func() bool { return e.getSandbox("two") == nil })

	// a returns: its two stale sandboxes are garbage collected.
	if got := len(a.live()); got != 2 {
		t.Fatalf("node a holds %d sandboxes while down, want 2", got)
	}
	e.resume("a")
	e.eventually(30*time.Second, "stale sandboxes on a removed", func() bool { return len(a.live()) == 0 })
	if ids := b.live(); len(ids) != 1 || ids[0] != e.getSandbox("one").Annotations[fleet.AnnSandboxID] {
		t.Errorf("b runs %v", ids)
	}
}

// shutdownTime with policy Retain removes the node sandbox and keeps the
// object Finished; with Delete the object goes.
func TestSandboxShutdownTime(t *testing.T) {
	e := startEnv(t, Config{})
	n := e.addNode("a", 8<<30, "container", rtContainer)
	keep := newSandbox("keep", nil, corev1.Container{Name: "main"})
	del := newSandbox("del", nil, corev1.Container{Name: "main"})
	del.Spec.ShutdownPolicy = ptr.To(sandboxv1beta1.ShutdownPolicyDelete)
	for _, sb := range []*sandboxv1beta1.Sandbox{keep, del} {
		if err := e.c.Create(e.ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	// Running first, then the shutdown time comes (set at create, a
	// loaded machine might reconcile them only after it passed).
	e.eventually(30*time.Second, "both running", func() bool { return len(n.live()) == 2 })
	at := metav1.NewTime(time.Now().Add(time.Second))
	for _, name := range []string{"keep", "del"} {
		// The controller writes the object too: retry on a conflict.
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			sb := e.getSandbox(name)
			sb.Spec.ShutdownTime = &at
			return e.c.Update(e.ctx, sb)
		}); err != nil {
			t.Fatal(err)
		}
	}
	e.eventually(30*time.Second, "del gone and keep finished", func() bool {
		k := e.getSandbox("keep")
		return e.getSandbox("del") == nil && k != nil && meta.IsStatusConditionTrue(k.Status.Conditions, string(sandboxv1beta1.SandboxConditionFinished))
	})
	if ids := n.live(); len(ids) != 0 {
		t.Errorf("node sandboxes left: %v", ids)
	}
	if k := e.getSandbox("keep"); k.Status.NodeName != "" || readyOf(k).Reason != sandboxv1beta1.SandboxReasonExpired {
		t.Errorf("kept object %+v", k.Status)
	}
}

// The operator's floors bound what a template may ask: the fleet's
// (Config.MinIsolation) and a Namespace's annotation. A template asking
// for a weaker class waits Unschedulable and then goes to a node that
// meets the floor; one naming a runtime below the floor is never placed.
func TestIsolationFloors(t *testing.T) {
	e := startEnv(t, Config{MinIsolation: isolation.AppKernel})
	e.addNode("a", 8<<30, "container", rtContainer)
	// A namespace the operator marked hypervisor.
	if err := e.c.Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "untrusted",
		Annotations: map[string]string{fleet.AnnIsolationFloor: "hypervisor"}}}); err != nil {
		t.Fatal(err)
	}
	rc := "container"
	named := newSandbox("named", nil, corev1.Container{Name: "main"})
	named.Spec.PodTemplate.Spec.RuntimeClassName = &rc
	low := newSandbox("low", map[string]string{fleet.AnnIsolationFloor: "namespaces"}, corev1.Container{Name: "main"})
	auto := newSandbox("auto", nil, corev1.Container{Name: "main"})
	auto.Namespace = "untrusted"
	for _, sb := range []*sandboxv1beta1.Sandbox{named, low, auto} {
		if err := e.c.Create(e.ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	get := func(ns, name string) *sandboxv1beta1.Sandbox {
		var sb sandboxv1beta1.Sandbox
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: ns, Name: name}, &sb); err != nil {
			t.Fatal(err)
		}
		return &sb
	}
	unschedulable := func(ns, name string) func() bool {
		return func() bool {
			r := readyOf(get(ns, name))
			return r != nil && r.Reason == ReasonUnschedulable
		}
	}
	// Node a's container runtime is below every floor here.
	e.eventually(30*time.Second, "named Unschedulable", unschedulable(testNS, "named"))
	e.eventually(30*time.Second, "low Unschedulable (fleet floor app-kernel)", unschedulable(testNS, "low"))
	e.eventually(30*time.Second, "auto Unschedulable (namespace floor hypervisor)", unschedulable("untrusted", "auto"))
	// A gVisor node meets the fleet's floor, not the namespace's.
	b := e.addNode("b", 8<<30, "gvisor", rtContainer, rtGVisor)
	e.eventually(30*time.Second, "low placed on b", func() bool { return get(testNS, "low").Status.NodeName == "b" })
	c := e.addNode("c", 8<<30, "qemu", rtQEMU)
	e.eventually(30*time.Second, "auto placed on the hypervisor node", func() bool { return get("untrusted", "auto").Status.NodeName == "c" })
	if r := b.createRequests(); len(r) != 1 || r[0].Runtime != "gvisor" {
		t.Errorf("creates on b %+v: want low alone, as gvisor", r)
	}
	if r := c.createRequests(); len(r) != 1 || r[0].Runtime != "qemu" {
		t.Errorf("creates on c %+v: want auto alone, as qemu", r)
	}
	// Runtime container is below the fleet's floor: never placed, with b
	// and c offering it (b) or not.
	if sb := get(testNS, "named"); sb.Status.NodeName != "" || readyOf(sb).Reason != ReasonUnschedulable {
		t.Errorf("named: node %q ready %+v", sb.Status.NodeName, readyOf(sb))
	}
}
