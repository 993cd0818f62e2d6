package controller

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cagebox/cagebox/internal/kube/fleet"
)

// Node is a node agent as its Lease announces it.
type Node struct {
	Name     string
	Endpoint string
	Ingress  string
	Capacity fleet.Capacity
	// CapacityErr is why the capacity annotation could not be read (such
	// a node gets no sandboxes).
	CapacityErr error
	// Expires is renewTime + leaseDurationSeconds.
	Expires time.Time
}

// Live reports whether the node's lease is current at now and it
// announces an endpoint.
func (n Node) Live(now time.Time) bool {
	return n.Endpoint != "" && now.Before(n.Expires)
}

// leaseNode is the node a Lease speaks for, or "" when its claims
// disagree: its name must be fleet.LeaseName of its fleet.NodeLabel, and
// its holder (when set) that node. A node agent can write only its own
// Lease (deploy/node-lease-policy.yaml checks its credential's node), so
// a Lease that names another node than the one its name says was not
// written by that node's agent and draws no sandboxes to anyone.
func leaseNode(l *coordinationv1.Lease) string {
	node := l.Labels[fleet.NodeLabel]
	if node == "" || l.Name != fleet.LeaseName(node) {
		return ""
	}
	if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != node {
		return ""
	}
	return node
}

// nodeFromLease reads a node's Lease (Name "" for a Lease whose identity
// claims disagree: leaseNode).
func nodeFromLease(l *coordinationv1.Lease) Node {
	n := Node{Name: leaseNode(l)}
	if n.Name == "" {
		return n
	}
	n.Endpoint = l.Annotations[fleet.AnnEndpoint]
	n.Ingress = l.Annotations[fleet.AnnIngress]
	n.Capacity, n.CapacityErr = fleet.ParseCapacity(l.Annotations[fleet.AnnCapacity])
	if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
		n.Expires = l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
	}
	return n
}

// registry reads nodes from the Lease cache (synced before any
// reconciler runs, so a controller restart never takes a live node for a
// lost one) and remembers what the controller placed on each node since
// its last capacity report.
type registry struct {
	c  client.Reader
	ns string

	// mu guards placed.
	mu     sync.Mutex
	placed map[string][]placement
}

// placement is a sandbox the controller put on a node, counted against
// the node's reported capacity until a report newer than it arrives.
type placement struct {
	at     time.Time
	memory int64
	// poolClass is the pool class it was expected to take a warm sandbox
	// of ("" for none).
	poolClass string
}

func newRegistry(c client.Reader, ns string) *registry {
	return &registry{c: c, ns: ns, placed: map[string][]placement{}}
}

// Nodes is every node with a lease, sorted by name.
func (r *registry) Nodes(ctx context.Context) ([]Node, error) {
	var leases coordinationv1.LeaseList
	if err := r.c.List(ctx, &leases, client.InNamespace(r.ns), client.HasLabels{fleet.NodeLabel}); err != nil {
		return nil, fmt.Errorf("list node leases: %w", err)
	}
	out := make([]Node, 0, len(leases.Items))
	for i := range leases.Items {
		if n := nodeFromLease(&leases.Items[i]); n.Name != "" {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Live is the live nodes at now.
func (r *registry) Live(ctx context.Context, now time.Time) ([]Node, error) {
	all, err := r.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, n := range all {
		if n.Live(now) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Node is the node named name (ok false: no lease).
func (r *registry) Node(ctx context.Context, name string) (Node, bool, error) {
	var l coordinationv1.Lease
	err := r.c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: fleet.LeaseName(name)}, &l)
	if err != nil {
		if client.IgnoreNotFound(err) == nil {
			return Node{}, false, nil
		}
		return Node{}, false, fmt.Errorf("node lease %s: %w", name, err)
	}
	n := nodeFromLease(&l)
	if n.Name != name {
		return Node{}, false, nil // not what the node's agent wrote
	}
	return n, true, nil
}

// recordPlacement counts p against node until its next capacity report.
func (r *registry) recordPlacement(node string, p placement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.placed[node] = append(r.placed[node], p)
}

// sinceReport is the memory placed on n, and the warm sandboxes of
// poolClass expected to be taken from it, after its capacity report.
func (r *registry) sinceReport(n Node, poolClass string) (memory int64, pooled int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := r.placed[n.Name][:0]
	for _, p := range r.placed[n.Name] {
		if !p.at.After(n.Capacity.At) {
			continue // the report counts it
		}
		keep = append(keep, p)
		memory += p.memory
		if poolClass != "" && p.poolClass == poolClass {
			pooled++
		}
	}
	r.placed[n.Name] = keep
	return memory, pooled
}
