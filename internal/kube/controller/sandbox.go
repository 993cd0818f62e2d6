package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/kube/fleet"
)

// Condition reasons the controller sets on a Sandbox (besides the
// SpecError ones).
const (
	ReasonRunning       = "Running"
	ReasonUnschedulable = "Unschedulable"
	ReasonNodeLost      = "NodeLost"
	ReasonNodeRefused   = "NodeRefused"
	ReasonCreateFailed  = "CreateFailed"
)

// Launch annotation values.
const (
	LaunchWarm = sandboxv1beta1.SandboxLaunchTypeWarm
	LaunchCold = sandboxv1beta1.SandboxLaunchTypeCold
)

const (
	nodeCallTimeout   = 30 * time.Second
	nodeCreateTimeout = 2 * time.Minute
)

func (c *Controller) reconcileSandbox(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var sb sandboxv1beta1.Sandbox
	if err := c.c.Get(ctx, req.NamespacedName, &sb); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !sb.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, c.finalizeSandbox(ctx, &sb)
	}
	if !controllerutil.ContainsFinalizer(&sb, fleet.Finalizer) {
		patch := client.MergeFromWithOptions(sb.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(&sb, fleet.Finalizer)
		if err := c.c.Patch(ctx, &sb, patch); err != nil {
			return reconcile.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}
	now := time.Now()
	next := c.cfg.Resync
	if st := sb.Spec.ShutdownTime; st != nil {
		if !now.Before(st.Time) {
			return reconcile.Result{}, c.expireSandbox(ctx, &sb)
		}
		next = min(next, st.Sub(now)+50*time.Millisecond)
	}
	if meta.IsStatusConditionTrue(sb.Status.Conditions, string(sandboxv1beta1.SandboxConditionFinished)) {
		return reconcile.Result{}, nil
	}
	if sb.Status.NodeName != "" {
		n, ok, err := c.reg.Node(ctx, sb.Status.NodeName)
		if err != nil {
			return reconcile.Result{}, err
		}
		if ok && n.Live(now) {
			if sb.Annotations[fleet.AnnSandboxID] == "" {
				// The cache may lag behind our own annotation write; if
				// the apiserver has no id either, a crash came between the
				// status and the annotations: find the sandbox on its node.
				fresh, err := c.fresh(ctx, &sb)
				if err != nil || fresh == nil {
					return reconcile.Result{}, err
				}
				if fresh.Annotations[fleet.AnnSandboxID] == "" && fresh.Status.NodeName == n.Name {
					return reconcile.Result{Requeue: true}, c.recoverPlacement(ctx, fresh, n)
				}
				return reconcile.Result{Requeue: true}, nil
			}
			// The lease watcher reports the node's loss; this requeue is
			// the safety net (and the shutdown timer).
			if st := sb.Spec.ShutdownTime; st != nil {
				return reconcile.Result{RequeueAfter: min(next, time.Until(n.Expires)+100*time.Millisecond)}, nil
			}
			return reconcile.Result{RequeueAfter: max(next, time.Until(n.Expires)+100*time.Millisecond)}, nil
		}
		return reconcile.Result{Requeue: true}, c.nodeLost(ctx, &sb)
	}
	res, err := c.place(ctx, &sb)
	if res.RequeueAfter == 0 && !res.Requeue && err == nil {
		res.RequeueAfter = next
	} else if res.RequeueAfter > next {
		res.RequeueAfter = next
	}
	return res, err
}

// place puts an unplaced Sandbox on a node.
func (c *Controller) place(ctx context.Context, sb *sandboxv1beta1.Sandbox) (reconcile.Result, error) {
	spec, err := c.translate(ctx, c.apiReader, sb)
	if err == nil {
		err = c.raiseFloor(ctx, sb.Namespace, spec, nil)
	}
	if err != nil {
		var se *SpecError
		if !errors.As(err, &se) {
			return reconcile.Result{}, err
		}
		if c.setReady(ctx, sb, metav1.ConditionFalse, se.Reason, se.Message) {
			c.rec.Eventf(sb, nil, corev1.EventTypeWarning, se.Reason, "Translate", "%s", se.Message)
		}
		return reconcile.Result{RequeueAfter: c.cfg.Resync}, nil
	}
	unlock := c.lockUID(sb.UID)
	defer unlock()
	// The cache may not show a placement just written: decide on the
	// apiserver's copy.
	fresh, err := c.fresh(ctx, sb)
	if err != nil || fresh == nil {
		return reconcile.Result{}, err
	}
	if fresh.Status.NodeName != "" || !fresh.DeletionTimestamp.IsZero() {
		return reconcile.Result{Requeue: true}, nil
	}
	sb = fresh

	live, err := c.reg.Live(ctx, time.Now())
	if err != nil {
		return reconcile.Result{}, err
	}
	warm := sb.Annotations[fleet.AnnPool] != ""
	var cand candidate
	c.mu.Lock()
	prev := c.inflight[sb.UID]
	c.mu.Unlock()
	found := false
	if prev != "" {
		// An earlier attempt went to prev: go there again so a create
		// that succeeded unseen is found instead of made twice.
		for _, n := range live {
			if n.Name == prev {
				if rt := resolveRuntime(n.Capacity, spec.Req.Runtime, spec.Floor); rt != "" {
					cand, found = candidate{node: n, runtime: rt, poolClass: spec.PoolClass(rt)}, true
				}
			}
		}
	}
	if !found {
		c.mu.Lock()
		var why string
		cand, why, found = choose(live, spec, warm, c.cfg.BestOf, c.reg, c.rng)
		c.mu.Unlock()
		if !found {
			if c.setReady(ctx, sb, metav1.ConditionFalse, ReasonUnschedulable, why) {
				c.rec.Eventf(sb, nil, corev1.EventTypeWarning, ReasonUnschedulable, "Place", "%s", why)
			}
			return reconcile.Result{RequeueAfter: c.cfg.Resync}, nil
		}
	}
	c.mu.Lock()
	c.inflight[sb.UID] = cand.node.Name
	c.mu.Unlock()

	node, err := c.cfg.Dial(cand.node.Endpoint)
	if err != nil {
		return reconcile.Result{}, err
	}
	v, launch, err := c.pullAndCreate(ctx, cand.node.Endpoint, node, sb, spec, cand.runtime)
	if err != nil {
		kind := nodeErrKind(err)
		if kind == "invalid" || kind == "denied" || kind == "not_found" || kind == "conflict" {
			c.forget(sb)
			msg := fmt.Sprintf("node %s refused the sandbox (%s): %v", cand.node.Name, kind, err)
			if c.setReady(ctx, sb, metav1.ConditionFalse, ReasonNodeRefused, msg) {
				c.rec.Eventf(sb, nil, corev1.EventTypeWarning, ReasonNodeRefused, "Create", "%s", msg)
			}
			return reconcile.Result{RequeueAfter: c.cfg.Resync}, nil
		}
		c.setReady(ctx, sb, metav1.ConditionFalse, ReasonCreateFailed, fmt.Sprintf("create on node %s: %v", cand.node.Name, err))
		return reconcile.Result{}, fmt.Errorf("create on node %s: %w", cand.node.Name, err)
	}
	pc := ""
	if v.Pooled {
		pc = cand.poolClass
	}
	c.reg.recordPlacement(cand.node.Name, placement{at: time.Now(), memory: spec.Memory(), poolClass: pc})
	if err := c.recordPlaced(ctx, sb, cand.node, v, launch); err != nil {
		return reconcile.Result{}, err
	}
	c.forget(sb)
	c.log.Info("sandbox placed", "object", sb.Namespace+"/"+sb.Name, "node", cand.node.Name, "sandbox", v.ID, "runtime", v.Runtime, "launch", launch)
	c.rec.Eventf(sb, nil, corev1.EventTypeNormal, "Placed", "Create", "running on node %s as %s (%s, %s start)", cand.node.Name, v.ID, v.Runtime, launch)
	return reconcile.Result{}, nil
}

// fresh is sb as the apiserver has it now (nil: deleted).
func (c *Controller) fresh(ctx context.Context, sb *sandboxv1beta1.Sandbox) (*sandboxv1beta1.Sandbox, error) {
	var f sandboxv1beta1.Sandbox
	if err := c.apiReader.Get(ctx, client.ObjectKeyFromObject(sb), &f); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if f.UID != sb.UID {
		return nil, nil
	}
	return &f, nil
}

func (c *Controller) forget(sb *sandboxv1beta1.Sandbox) {
	c.mu.Lock()
	delete(c.inflight, sb.UID)
	c.mu.Unlock()
}

// createOn creates sb's sandbox on node, or finds the one an earlier
// attempt made (by the uid label).
// pullAndCreate has the node pull the spec's image if it is a reference,
// then creates the sandbox there.
func (c *Controller) pullAndCreate(ctx context.Context, endpoint string, node NodeAPI, sb *sandboxv1beta1.Sandbox, spec *Spec, runtime string) (*api.Sandbox, string, error) {
	if spec.PullRef != "" {
		if err := c.ensureImage(ctx, endpoint, node, spec.PullRef, spec.Req.Image); err != nil {
			return nil, "", err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, nodeCreateTimeout)
	defer cancel()
	v, launch, err := c.createOn(cctx, node, sb, spec, runtime)
	if err != nil && spec.PullRef != "" && isNotFound(err) {
		// The node may have lost the image: pull again next time.
		c.forgetPulls(endpoint)
	}
	return v, launch, err
}

func (c *Controller) createOn(ctx context.Context, node NodeAPI, sb *sandboxv1beta1.Sandbox, spec *Spec, runtime string) (*api.Sandbox, string, error) {
	have, err := node.ListLabeled(ctx, uidLabels(sb))
	if err != nil {
		return nil, "", fmt.Errorf("list the node's sandboxes: %w", err)
	}
	if len(have) > 0 {
		sort.Slice(have, func(i, j int) bool { return have[i].CreatedAt.Before(have[j].CreatedAt) })
		for _, extra := range have[1:] {
			if err := node.Remove(ctx, extra.ID); err != nil && !isNotFound(err) {
				c.log.Warn("remove a duplicate node sandbox", "sandbox", extra.ID, "err", err)
			}
		}
		launch := sb.Annotations[fleet.AnnLaunch]
		if launch == "" {
			launch = LaunchCold
		}
		return &have[0], launch, nil
	}
	req := *spec.Req
	req.Runtime = runtime
	v, err := node.Create(ctx, &req)
	if err != nil {
		return nil, "", err
	}
	if v.Pooled {
		return v, LaunchWarm, nil
	}
	return v, LaunchCold, nil
}

func uidLabels(sb *sandboxv1beta1.Sandbox) map[string]string {
	return map[string]string{fleet.LabelManagedBy: fleet.ManagedBy, fleet.LabelUID: string(sb.UID)}
}

// recordPlaced writes a placement: the status (node, address, Ready)
// first, then the annotations (id, launch, URLs).
func (c *Controller) recordPlaced(ctx context.Context, sb *sandboxv1beta1.Sandbox, n Node, v *api.Sandbox, launch string) error {
	orig := sb.DeepCopy()
	sb.Status.NodeName = n.Name
	sb.Status.PodIPs = nil
	if v.Network != nil && v.Network.Address != "" {
		sb.Status.PodIPs = []string{v.Network.Address}
	}
	sb.Status.ServiceFQDN = ""
	if c.cfg.IngressDomain != "" {
		sb.Status.ServiceFQDN = v.ID + "." + c.cfg.IngressDomain
	}
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{
		Type: string(sandboxv1beta1.SandboxConditionReady), Status: metav1.ConditionTrue,
		Reason: ReasonRunning, ObservedGeneration: sb.Generation,
		Message: fmt.Sprintf("running on node %s as %s (%s)", n.Name, v.ID, v.Runtime),
	})
	if err := c.c.Status().Patch(ctx, sb, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("record placement on %s in status: %w", n.Name, err)
	}
	return c.annotatePlacement(ctx, sb, v, launch)
}

func (c *Controller) annotatePlacement(ctx context.Context, sb *sandboxv1beta1.Sandbox, v *api.Sandbox, launch string) error {
	orig := sb.DeepCopy()
	if sb.Annotations == nil {
		sb.Annotations = map[string]string{}
	}
	sb.Annotations[fleet.AnnSandboxID] = v.ID
	sb.Annotations[fleet.AnnLaunch] = launch
	if urls := c.urls(v); urls != "" {
		sb.Annotations[fleet.AnnURLs] = urls
	} else {
		delete(sb.Annotations, fleet.AnnURLs)
	}
	if err := c.c.Patch(ctx, sb, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("record placement in annotations: %w", err)
	}
	return nil
}

// urls are v's published ports as the fleet serves them.
func (c *Controller) urls(v *api.Sandbox) string {
	var out []string
	for _, p := range v.Ports {
		switch {
		case c.cfg.IngressDomain != "":
			out = append(out, "https://"+strconv.Itoa(p.Port)+"-"+v.ID+"."+c.cfg.IngressDomain+"/")
		case p.URL != "":
			out = append(out, p.URL)
		}
	}
	return strings.Join(out, ",")
}

// recoverPlacement finds a placed Sandbox's node sandbox by its uid label
// and writes the annotations; none there: the placement is cleared.
func (c *Controller) recoverPlacement(ctx context.Context, sb *sandboxv1beta1.Sandbox, n Node) error {
	node, err := c.cfg.Dial(n.Endpoint)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	have, err := node.ListLabeled(cctx, uidLabels(sb))
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if len(have) == 0 {
		return c.clearPlacement(ctx, sb, metav1.ConditionFalse, ReasonNodeLost, fmt.Sprintf("node %s no longer runs the sandbox; placing it again", n.Name))
	}
	return c.annotatePlacement(ctx, sb, &have[0], LaunchCold)
}

// nodeLost handles a Sandbox whose node's lease expired: Ready=False
// NodeLost, an Event, and the placement cleared so the next reconcile
// places it again (a new sandbox; the old one is removed by the garbage
// collector if that node returns).
func (c *Controller) nodeLost(ctx context.Context, sb *sandboxv1beta1.Sandbox) error {
	// Act once, on the apiserver's copy (the cache may still show a
	// placement this controller already cleared).
	fresh, err := c.fresh(ctx, sb)
	if err != nil || fresh == nil || fresh.Status.NodeName != sb.Status.NodeName {
		return err
	}
	sb = fresh
	node, id := sb.Status.NodeName, sb.Annotations[fleet.AnnSandboxID]
	msg := fmt.Sprintf("node %s lost its lease; placing the sandbox again (sandbox %s there is removed if the node returns)", node, id)
	c.log.Warn("sandbox's node lost", "object", sb.Namespace+"/"+sb.Name, "node", node, "sandbox", id)
	c.rec.Eventf(sb, nil, corev1.EventTypeWarning, ReasonNodeLost, "Replace", "%s", msg)
	return c.clearPlacement(ctx, sb, metav1.ConditionFalse, ReasonNodeLost, msg)
}

// clearPlacement forgets sb's node sandbox: annotations first (so a
// crash leaves a status the next reconcile still acts on), then status.
func (c *Controller) clearPlacement(ctx context.Context, sb *sandboxv1beta1.Sandbox, status metav1.ConditionStatus, reason, msg string) error {
	orig := sb.DeepCopy()
	for _, k := range []string{fleet.AnnSandboxID, fleet.AnnURLs, fleet.AnnLaunch} {
		delete(sb.Annotations, k)
	}
	if !equality.Semantic.DeepEqual(orig.Annotations, sb.Annotations) {
		if err := c.c.Patch(ctx, sb, client.MergeFrom(orig)); err != nil {
			return fmt.Errorf("clear placement annotations: %w", err)
		}
	}
	orig = sb.DeepCopy()
	sb.Status.NodeName, sb.Status.PodIPs, sb.Status.ServiceFQDN = "", nil, ""
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{
		Type: string(sandboxv1beta1.SandboxConditionReady), Status: status, Reason: reason, Message: msg, ObservedGeneration: sb.Generation,
	})
	if err := c.c.Status().Patch(ctx, sb, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("clear placement status: %w", err)
	}
	return nil
}

// setReady sets the Ready condition; changed is false when it already
// said that (so an Event is emitted once per change).
func (c *Controller) setReady(ctx context.Context, sb *sandboxv1beta1.Sandbox, status metav1.ConditionStatus, reason, msg string) (changed bool) {
	orig := sb.DeepCopy()
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{
		Type: string(sandboxv1beta1.SandboxConditionReady), Status: status, Reason: reason, Message: msg, ObservedGeneration: sb.Generation,
	})
	if equality.Semantic.DeepEqual(orig.Status, sb.Status) {
		return false
	}
	if err := c.c.Status().Patch(ctx, sb, client.MergeFrom(orig)); err != nil {
		c.log.Error("write Ready condition", "object", sb.Namespace+"/"+sb.Name, "reason", reason, "err", err)
		return false
	}
	return true
}

// removeOnNode removes every sandbox of sb's uid on node n.
func (c *Controller) removeOnNode(ctx context.Context, sb *sandboxv1beta1.Sandbox, n Node) error {
	node, err := c.cfg.Dial(n.Endpoint)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	have, err := node.ListLabeled(cctx, uidLabels(sb))
	if err != nil {
		return fmt.Errorf("list sandboxes on node %s: %w", n.Name, err)
	}
	for _, v := range have {
		if err := node.Remove(cctx, v.ID); err != nil && !isNotFound(err) {
			return fmt.Errorf("remove sandbox %s on node %s: %w", v.ID, n.Name, err)
		}
		c.log.Info("node sandbox removed", "object", sb.Namespace+"/"+sb.Name, "node", n.Name, "sandbox", v.ID)
	}
	return nil
}

// finalizeSandbox removes a deleted Sandbox's node sandbox, then its
// finalizer. A node that is gone keeps its sandbox until it returns and
// the garbage collector removes it.
func (c *Controller) finalizeSandbox(ctx context.Context, sb *sandboxv1beta1.Sandbox) error {
	if !controllerutil.ContainsFinalizer(sb, fleet.Finalizer) {
		return nil
	}
	unlock := c.lockUID(sb.UID)
	defer unlock()
	// A placement that finished just before the delete may not be in
	// the cache yet.
	if f, err := c.fresh(ctx, sb); err != nil {
		return err
	} else if f == nil {
		return nil
	} else {
		sb = f
	}
	nodeName := sb.Status.NodeName
	c.mu.Lock()
	if nodeName == "" {
		nodeName = c.inflight[sb.UID]
	}
	delete(c.inflight, sb.UID)
	c.mu.Unlock()
	if nodeName != "" {
		n, ok, err := c.reg.Node(ctx, nodeName)
		if err != nil {
			return err
		}
		if ok && n.Live(time.Now()) {
			if err := c.removeOnNode(ctx, sb, n); err != nil {
				return err
			}
		} else {
			c.log.Warn("deleted sandbox's node is gone; its node sandbox is removed when the node returns", "object", sb.Namespace+"/"+sb.Name, "node", nodeName)
		}
	}
	patch := client.MergeFromWithOptions(sb.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(sb, fleet.Finalizer)
	if err := c.c.Patch(ctx, sb, patch); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}

// expireSandbox applies spec.lifecycle once shutdownTime has passed:
// Delete deletes the object; Retain (the default) removes the node
// sandbox and marks the object Finished.
func (c *Controller) expireSandbox(ctx context.Context, sb *sandboxv1beta1.Sandbox) error {
	if p := sb.Spec.ShutdownPolicy; p != nil && *p == sandboxv1beta1.ShutdownPolicyDelete {
		c.log.Info("sandbox expired; deleting it", "object", sb.Namespace+"/"+sb.Name)
		return client.IgnoreNotFound(c.c.Delete(ctx, sb))
	}
	if meta.IsStatusConditionTrue(sb.Status.Conditions, string(sandboxv1beta1.SandboxConditionFinished)) {
		return nil
	}
	if sb.Status.NodeName != "" {
		n, ok, err := c.reg.Node(ctx, sb.Status.NodeName)
		if err != nil {
			return err
		}
		if ok && n.Live(time.Now()) {
			unlock := c.lockUID(sb.UID)
			err := c.removeOnNode(ctx, sb, n)
			unlock()
			if err != nil {
				return err
			}
		}
	}
	msg := "spec.shutdownTime has passed; the node sandbox is removed (shutdownPolicy Retain keeps this object)"
	if err := c.clearPlacement(ctx, sb, metav1.ConditionFalse, sandboxv1beta1.SandboxReasonExpired, msg); err != nil {
		return err
	}
	orig := sb.DeepCopy()
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{
		Type: string(sandboxv1beta1.SandboxConditionFinished), Status: metav1.ConditionTrue,
		Reason: sandboxv1beta1.SandboxReasonExpired, Message: msg, ObservedGeneration: sb.Generation,
	})
	if err := c.c.Status().Patch(ctx, sb, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("mark finished: %w", err)
	}
	c.rec.Eventf(sb, nil, corev1.EventTypeNormal, sandboxv1beta1.SandboxReasonExpired, "Expire", "%s", msg)
	return nil
}
