package controller

import (
	"context"
	"fmt"
	"hash/fnv"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/isolation"
)

// poolsKey is the one request of the warm pool reconciler: every change
// recomputes all pools' spread, since nodes' targets are sums over pools.
const poolsKey = "cagebox-warm-pools"

// pushedPools is what the controller last sent a node.
type pushedPools struct {
	targets []api.PoolTarget
	at      time.Time
}

// poolClassKey is what a node's pool target names.
type poolClassKey struct {
	runtime, image string
	memory         int64
}

// PoolSpec is the translated blueprint of a warm pool's template (its
// env left out: a pooled sandbox gets env and credentials when claimed).
func PoolSpec(ctx context.Context, tpl *extv1beta1.SandboxTemplate) (*Spec, error) {
	sb := &sandboxv1beta1.Sandbox{Spec: sandboxv1beta1.SandboxSpec{SandboxBlueprint: *tpl.Spec.SandboxBlueprint.DeepCopy()}}
	sb.Name, sb.Namespace = tpl.Name, tpl.Namespace
	for i := range sb.Spec.PodTemplate.Spec.Containers {
		sb.Spec.PodTemplate.Spec.Containers[i].Env = nil
		sb.Spec.PodTemplate.Spec.Containers[i].EnvFrom = nil
	}
	return Translate(ctx, nil, sb)
}

// Spread assigns replicas over nodes (sorted by name) evenly, starting at
// an offset derived from key so that pools' remainders do not all land on
// the first node.
func Spread(key string, replicas int, nodes []string) map[string]int {
	out := map[string]int{}
	if replicas <= 0 || len(nodes) == 0 {
		return out
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	start := int(h.Sum32() % uint32(len(nodes)))
	for i := 0; i < replicas; i++ {
		out[nodes[(start+i)%len(nodes)]]++
	}
	return out
}

func (c *Controller) reconcilePools(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	live, err := c.reg.Live(ctx, time.Now())
	if err != nil {
		return reconcile.Result{}, err
	}
	var pools extv1beta1.SandboxWarmPoolList
	if err := c.c.List(ctx, &pools); err != nil {
		return reconcile.Result{}, fmt.Errorf("list warm pools: %w", err)
	}
	sort.Slice(pools.Items, func(i, j int) bool {
		a, b := &pools.Items[i], &pools.Items[j]
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	desired := map[string]map[poolClassKey]int{}
	floors := map[string]isolation.Class{}
	for i := range pools.Items {
		wp := &pools.Items[i]
		replicas, ready := 0, 0
		if wp.DeletionTimestamp.IsZero() {
			replicas, ready = c.spreadPool(ctx, wp, live, desired, floors)
		}
		orig := wp.DeepCopy()
		wp.Status.Replicas, wp.Status.ReadyReplicas = int32(replicas), int32(ready)
		wp.Status.ObservedGeneration = wp.Generation
		if !equality.Semantic.DeepEqual(orig.Status, wp.Status) {
			if err := c.c.Status().Patch(ctx, wp, client.MergeFrom(orig)); err != nil {
				c.log.Error("warm pool status", "pool", wp.Namespace+"/"+wp.Name, "err", err)
			}
		}
	}
	var failed error
	for _, n := range live {
		if err := c.pushPools(ctx, n, desired[n.Name]); err != nil {
			c.log.Error("set node pools", "node", n.Name, "err", err)
			failed = err
		}
	}
	if failed != nil {
		return reconcile.Result{}, failed
	}
	return reconcile.Result{RequeueAfter: c.cfg.Resync}, nil
}

// spreadPool adds wp's replicas to desired and returns how many it
// assigned and how many of those the nodes report ready.
func (c *Controller) spreadPool(ctx context.Context, wp *extv1beta1.SandboxWarmPool, live []Node, desired map[string]map[poolClassKey]int, floors map[string]isolation.Class) (replicas, ready int) {
	var tpl extv1beta1.SandboxTemplate
	if err := c.c.Get(ctx, client.ObjectKey{Namespace: wp.Namespace, Name: wp.Spec.TemplateRef.Name}, &tpl); err != nil {
		c.log.Warn("warm pool's template", "pool", wp.Namespace+"/"+wp.Name, "template", wp.Spec.TemplateRef.Name, "err", err)
		return 0, 0
	}
	spec, err := PoolSpec(ctx, &tpl)
	if err == nil {
		err = c.resolveImage(spec)
	}
	if err == nil {
		err = c.raiseFloor(ctx, wp.Namespace, spec, floors)
	}
	if err != nil {
		c.log.Warn("warm pool's template cannot be run", "pool", wp.Namespace+"/"+wp.Name, "template", tpl.Name, "err", err)
		return 0, 0
	}
	want := 1
	if wp.Spec.Replicas != nil {
		want = int(*wp.Spec.Replicas)
	}
	runtimes := map[string]string{}
	var names []string
	for _, n := range live {
		if n.CapacityErr != nil {
			continue
		}
		if rt := resolveRuntime(n.Capacity, spec.Req.Runtime, spec.Floor); rt != "" {
			runtimes[n.Name] = rt
			names = append(names, n.Name)
		}
	}
	byName := map[string]Node{}
	for _, n := range live {
		byName[n.Name] = n
	}
	for name, k := range Spread(wp.Namespace+"/"+wp.Name, want, names) {
		rt := runtimes[name]
		key := poolClassKey{runtime: rt, image: spec.Req.Image, memory: spec.Memory()}
		if desired[name] == nil {
			desired[name] = map[poolClassKey]int{}
		}
		desired[name][key] += k
		replicas += k
		ready += min(k, byName[name].Capacity.PoolReady(spec.PoolClass(rt)))
	}
	return replicas, ready
}

// pushPools sends node n its pool targets when they differ from what was
// last sent, or from what it reports after a newer capacity report (a
// restarted node forgets its targets).
func (c *Controller) pushPools(ctx context.Context, n Node, want map[poolClassKey]int) error {
	targets := make([]api.PoolTarget, 0, len(want))
	for k, size := range want {
		targets = append(targets, api.PoolTarget{Runtime: k.runtime, Image: k.image, MemoryBytes: k.memory, Size: size})
	}
	sortTargets(targets)
	var reported []api.PoolTarget
	for _, p := range n.Capacity.Pools {
		if p.Target > 0 {
			mem := isolation.Resources{MemoryBytes: p.MemoryBytes}.WithDefaults().MemoryBytes
			reported = append(reported, api.PoolTarget{Runtime: p.Runtime, Image: p.Image, MemoryBytes: mem, Size: p.Target})
		}
	}
	sortTargets(reported)
	c.mu.Lock()
	last, sent := c.pushed[n.Name]
	c.mu.Unlock()
	switch {
	case sent && equalTargets(last.targets, targets) && (!n.Capacity.At.After(last.at) || equalTargets(reported, targets)):
		return nil
	case !sent && equalTargets(reported, targets):
		return nil
	}
	node, err := c.cfg.Dial(n.Endpoint)
	if err != nil {
		return err
	}
	for _, p := range c.pullsFor(targets) {
		if err := c.ensureImage(ctx, n.Endpoint, node, p[0], p[1]); err != nil {
			return fmt.Errorf("node %s: warm pool image: %w", n.Name, err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	if _, err := node.SetPools(cctx, &api.SetPoolsRequest{Targets: targets}); err != nil {
		return fmt.Errorf("PUT /v1/pools on node %s: %w", n.Name, err)
	}
	c.mu.Lock()
	c.pushed[n.Name] = pushedPools{targets: targets, at: time.Now()}
	c.mu.Unlock()
	c.log.Info("node pools set", "node", n.Name, "targets", len(targets))
	return nil
}

func sortTargets(t []api.PoolTarget) {
	sort.Slice(t, func(i, j int) bool {
		a, b := t[i], t[j]
		if a.Runtime != b.Runtime {
			return a.Runtime < b.Runtime
		}
		if a.Image != b.Image {
			return a.Image < b.Image
		}
		return a.MemoryBytes < b.MemoryBytes
	})
}

func equalTargets(a, b []api.PoolTarget) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
