package controller

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/isolation"
)

// fakeNode is an in-memory node API for the reconciler tests: it keeps
// sandboxes and pool targets, fills pools at once, and serves a create
// from a pool when the class matches, like the daemon. The real node
// (the daemon's routes and client.NewTCP) is covered by the lead's
// multi-node e2e; this fake stands in because no node agent runs here.
type fakeNode struct {
	name string

	// mu guards the fields below.
	mu        sync.Mutex
	sandboxes map[string]*api.Sandbox
	creates   []api.CreateSandboxRequest // as received, secret values included
	targets   []api.PoolTarget
	ready     map[string]int // pool class → ready sandboxes
	claims    map[string]uint64
	sets      int
	nextID    int
	failNext  error
	// loseAnswer makes the next create succeed on the node but fail for
	// the caller (a timeout after the node acted).
	loseAnswer bool
	// pulls are the image pulls asked for; pullErr fails those of a ref;
	// ops is "pull NAME", "create IMAGE" and "pools IMAGE" in order.
	pulls   []api.PullImageRequest
	pullErr map[string]error
	ops     []string
}

func newFakeNode(name string) *fakeNode {
	return &fakeNode{name: name, sandboxes: map[string]*api.Sandbox{}, ready: map[string]int{}, claims: map[string]uint64{}}
}

func notFound(id string) error {
	return &client.Error{Status: http.StatusNotFound, Kind: "not_found", Msg: "sandbox " + id + " not found"}
}

func (n *fakeNode) Create(ctx context.Context, req *api.CreateSandboxRequest) (*api.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.failNext; err != nil {
		n.failNext = nil
		return nil, err
	}
	if req.Runtime == "" || req.Runtime == "auto" {
		return nil, &client.Error{Status: 400, Kind: "invalid", Msg: "the controller must send a concrete runtime"}
	}
	if name, _, _ := strings.Cut(req.Image, "@"); name != "" {
		if err := image.ValidateName(name); err != nil {
			return nil, &client.Error{Status: 400, Kind: "invalid", Msg: err.Error()}
		}
	}
	n.ops = append(n.ops, "create "+req.Image)
	n.creates = append(n.creates, *req)
	n.nextID++
	id := fmt.Sprintf("%s-sb%d", n.name, n.nextID)
	cls := pool.ClassOf(req.Runtime, req.Image, isolation.Resources{MemoryBytes: req.MemoryBytes, CPUs: req.CPUs}).String()
	v := &api.Sandbox{
		ID: id, Runtime: req.Runtime, Image: req.Image, Status: "running", CreatedAt: time.Now(),
		Network: &api.Network{Address: fmt.Sprintf("10.%d.0.2", n.nextID)},
		Labels:  req.Labels,
	}
	if n.ready[cls] > 0 {
		n.ready[cls]--
		n.claims[cls]++
		v.Pooled = true
	}
	for _, p := range req.Publish {
		v.Ports = append(v.Ports, api.Port{Port: p.Port, Public: p.Public, URL: fmt.Sprintf("https://%d-%s.%s.node.test/", p.Port, id, n.name)})
	}
	n.sandboxes[id] = v
	if n.loseAnswer {
		n.loseAnswer = false
		return nil, context.DeadlineExceeded
	}
	cp := *v
	return &cp, nil
}

func (n *fakeNode) ListLabeled(ctx context.Context, labels map[string]string) ([]api.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []api.Sandbox
next:
	for _, v := range n.sandboxes {
		for k, want := range labels {
			if v.Labels[k] != want {
				continue next
			}
		}
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (n *fakeNode) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	v, ok := n.sandboxes[id]
	if !ok {
		return nil, notFound(id)
	}
	cp := *v
	return &cp, nil
}

func (n *fakeNode) Remove(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.sandboxes[id]; !ok {
		return notFound(id)
	}
	delete(n.sandboxes, id)
	return nil
}

func (n *fakeNode) SetPools(ctx context.Context, req *api.SetPoolsRequest) (*api.Pools, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sets++
	for _, t := range req.Targets {
		n.ops = append(n.ops, "pools "+t.Image)
	}
	n.targets = append([]api.PoolTarget(nil), req.Targets...)
	n.ready = map[string]int{}
	for _, t := range req.Targets {
		n.ready[n.class(t)] = t.Size // filled at once
	}
	return n.poolsLocked(), nil
}

func (n *fakeNode) PullImage(ctx context.Context, req *api.PullImageRequest) (*api.Image, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pulls = append(n.pulls, *req)
	if err := n.pullErr[req.Ref]; err != nil {
		return nil, err
	}
	n.ops = append(n.ops, "pull "+req.Name)
	return &api.Image{Name: req.Name}, nil
}

func (n *fakeNode) history() (pulls []api.PullImageRequest, ops []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]api.PullImageRequest(nil), n.pulls...), append([]string(nil), n.ops...)
}

func (n *fakeNode) class(t api.PoolTarget) string {
	return pool.ClassOf(t.Runtime, t.Image, isolation.Resources{MemoryBytes: t.MemoryBytes}).String()
}

func (n *fakeNode) Pools(ctx context.Context) (*api.Pools, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.poolsLocked(), nil
}

func (n *fakeNode) poolsLocked() *api.Pools {
	out := &api.Pools{}
	for _, t := range n.targets {
		c := n.class(t)
		out.Pools = append(out.Pools, api.PoolStatus{
			Class: c, Runtime: t.Runtime, Image: t.Image,
			MemoryBytes: isolation.Resources{MemoryBytes: t.MemoryBytes}.WithDefaults().MemoryBytes,
			Target:      t.Size, Ready: n.ready[c], Claims: n.claims[c],
		})
	}
	return out
}

// live is the ids of the node's sandboxes.
func (n *fakeNode) live() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var ids []string
	for id := range n.sandboxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (n *fakeNode) createRequests() []api.CreateSandboxRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]api.CreateSandboxRequest(nil), n.creates...)
}

func (n *fakeNode) poolTargets() ([]api.PoolTarget, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]api.PoolTarget(nil), n.targets...), n.sets
}

// capacity is the node's report: runtimes as given, its pools.
func (n *fakeNode) capacity(runtimes []fleet.RuntimeInfo, def string, free int64) fleet.Capacity {
	p, _ := n.Pools(context.Background())
	n.mu.Lock()
	count := len(n.sandboxes)
	n.mu.Unlock()
	return fleet.Capacity{
		Runtimes: runtimes, DefaultRuntime: def,
		MemoryTotal: 64 << 30, MemoryAvailable: free,
		Sandboxes: count, Pools: p.Pools, At: time.Now(),
	}
}

// fakeFleet is the fake nodes by endpoint.
type fakeFleet struct {
	mu    sync.Mutex
	nodes map[string]*fakeNode
}

func (f *fakeFleet) Dial(endpoint string) (NodeAPI, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.nodes[endpoint]
	if !ok {
		return nil, fmt.Errorf("no fake node at %s", endpoint)
	}
	return n, nil
}
