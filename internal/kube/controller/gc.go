package controller

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/kube/fleet"
)

// runGC removes node sandboxes the controller made whose Sandbox object
// is gone, or placed elsewhere (a node that returns after its sandboxes
// were placed again): every Resync, and when a node (re)appears.
func (c *Controller) runGC(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-c.gcNow:
		}
		c.collect(ctx)
	}
}

// collect is one garbage collection pass over the live nodes.
func (c *Controller) collect(ctx context.Context) {
	live, err := c.reg.Live(ctx, time.Now())
	if err != nil {
		c.log.Error("gc: list nodes", "err", err)
		return
	}
	for _, n := range live {
		node, err := c.cfg.Dial(n.Endpoint)
		if err != nil {
			c.log.Error("gc: dial node", "node", n.Name, "err", err)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
		have, err := node.ListLabeled(cctx, map[string]string{fleet.LabelManagedBy: fleet.ManagedBy})
		cancel()
		if err != nil {
			c.log.Warn("gc: list node sandboxes", "node", n.Name, "err", err)
			continue
		}
		for i := range have {
			c.collectOne(ctx, n, node, &have[i])
		}
	}
}

// collectOne removes v from node n unless a Sandbox object still owns it
// there. Under the object's UID lock, with the object read from the
// apiserver (not the cache), so a placement in flight is never undone.
func (c *Controller) collectOne(ctx context.Context, n Node, node NodeAPI, v *api.Sandbox) {
	uid := types.UID(v.Labels[fleet.LabelUID])
	if uid == "" {
		return
	}
	unlock := c.lockUID(uid)
	defer unlock()
	c.mu.Lock()
	inflight := c.inflight[uid]
	c.mu.Unlock()
	if inflight == n.Name {
		return
	}
	if c.ownedInCache(ctx, uid, n.Name, v) {
		return
	}
	keep, why := c.owned(ctx, uid, n.Name, v)
	if keep {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	if err := node.Remove(cctx, v.ID); err != nil && !isNotFound(err) {
		c.log.Warn("gc: remove node sandbox", "node", n.Name, "sandbox", v.ID, "err", err)
		return
	}
	c.log.Info("gc: node sandbox removed", "node", n.Name, "sandbox", v.ID, "why", why,
		"object", v.Labels[fleet.LabelNamespace]+"/"+v.Labels[fleet.LabelName])
}

// ownedInCache is the cheap check: the cached object of uid is placed on
// node as v.
func (c *Controller) ownedInCache(ctx context.Context, uid types.UID, node string, v *api.Sandbox) bool {
	var list sandboxv1beta1.SandboxList
	if err := c.c.List(ctx, &list, client.MatchingFields{indexUID: string(uid)}); err != nil || len(list.Items) != 1 {
		return false
	}
	sb := &list.Items[0]
	return sb.Status.NodeName == node && sb.Annotations[fleet.AnnSandboxID] == v.ID
}

// owned reports whether a Sandbox object of uid is placed on node as
// sandbox v (or is unplaced and may yet adopt it), and if not why.
func (c *Controller) owned(ctx context.Context, uid types.UID, node string, v *api.Sandbox) (bool, string) {
	var sb sandboxv1beta1.Sandbox
	key := client.ObjectKey{Namespace: v.Labels[fleet.LabelNamespace], Name: v.Labels[fleet.LabelName]}
	err := c.apiReader.Get(ctx, key, &sb)
	if err != nil && !apierrors.IsNotFound(err) {
		return true, "" // cannot tell: keep
	}
	if err != nil || sb.UID != uid {
		// The name label may be truncated: look the uid up in the cache.
		var list sandboxv1beta1.SandboxList
		if lerr := c.c.List(ctx, &list, client.MatchingFields{indexUID: string(uid)}); lerr != nil {
			return true, ""
		}
		if len(list.Items) == 0 {
			return false, "its Sandbox object is gone"
		}
		sb = list.Items[0]
	}
	if !sb.DeletionTimestamp.IsZero() {
		return true, "" // the finalizer removes it
	}
	if sb.Status.NodeName == "" {
		return false, "its Sandbox object is not placed (it will be placed again)"
	}
	if sb.Status.NodeName != node {
		return false, "its Sandbox object was placed again on node " + sb.Status.NodeName
	}
	if id := sb.Annotations[fleet.AnnSandboxID]; id != "" && id != v.ID {
		return false, "its Sandbox object runs as " + id + " on this node"
	}
	return true, ""
}
