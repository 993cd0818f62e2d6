// Package controller is `cagebox controller`: controller-runtime
// reconcilers that run the agent-sandbox API (Sandbox, SandboxClaim,
// SandboxWarmPool, with SandboxTemplate as the blueprint) on cagebox node
// agents. It reads the nodes from their Leases (internal/kube/fleet is
// the contract), places each Sandbox on one node (best of K by free
// memory, warm pools first for claims) and creates it there through the
// node's API, keeps a finalizer until the node sandbox is gone, places
// sandboxes again when their node's lease expires, spreads warm pool
// replicas over the nodes (PUT /v1/pools), and removes node sandboxes
// whose object is gone.
//
// Credentials from Kubernetes Secrets go to the node inline and only
// there: never into an object, a status, an Event, a log line or an error.
package controller

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/kube/kubetypes"
	"github.com/cagebox/cagebox/isolation"
)

// Config configures the controller.
type Config struct {
	// Namespace holds the node Leases (fleet.DefaultNamespace).
	Namespace string
	// Dial returns a node's API (TCPDialer in production).
	Dial Dialer
	// BestOf is how many eligible nodes a placement samples (default 2).
	BestOf int
	// IngressDomain, when set, makes fleet URLs https://PORT-ID.DOMAIN/
	// and serviceFQDN ID.DOMAIN (the fleet router serves them); else a
	// Sandbox shows its node's own URLs.
	IngressDomain string
	// Resync is how often the controller re-checks unplaced sandboxes,
	// node liveness and strays on the nodes (default 5s).
	Resync time.Duration
	// Log receives the controller's own log lines (default slog.Default).
	Log *slog.Logger
	// MinIsolation is the fleet's isolation floor: no sandbox is placed
	// on a weaker runtime, whatever its template asks. A namespace's own
	// floor (annotation fleet.AnnIsolationFloor on the Namespace object,
	// which its users usually cannot edit) raises it for that namespace.
	MinIsolation isolation.Class
	// ImageMap maps the OCI references templates name to cagebox images
	// (upstream's runtime images to one the nodes have); a reference it
	// does not map is pulled by the node (images.go).
	ImageMap ImageMap
}

// Controller reconciles the agent-sandbox objects onto cagebox nodes.
type Controller struct {
	cfg       Config
	log       *slog.Logger
	c         client.Client
	apiReader client.Reader
	rec       recorder.EventRecorder
	reg       *registry

	sandboxEvents chan event.GenericEvent
	poolEvents    chan event.GenericEvent
	gcNow         chan struct{}

	// stripes serialise placement and garbage collection per object UID.
	stripes [64]sync.Mutex

	// mu guards the fields below.
	mu sync.Mutex
	// nodeLive is each node's liveness as the lease watcher last saw it.
	nodeLive map[string]bool
	// inflight is the node a placement of an object is being made on,
	// until its status records it (a retry goes to the same node).
	inflight map[types.UID]string
	// pushed is the pool targets last sent to each node, and when.
	pushed map[string]pushedPools
	// pullRefs is the reference each pulled image name was made from;
	// pulled the "ENDPOINT NAME" pairs the nodes have pulled.
	pullRefs map[string]string
	pulled   map[string]bool
	// onNode caches SandboxOnNode's answers by Sandbox UID.
	onNode map[types.UID]nodeSandbox
	rng    *rand.Rand
}

// Index names of the cache's field indexes.
const (
	indexNode = "cagebox.nodeName" // Sandbox status.nodeName, "-" when unplaced
	indexUID  = "cagebox.uid"      // Sandbox metadata.uid
	indexID   = "cagebox.id"       // Sandbox cagebox sandbox id (annotation)
)

// New returns a controller for cfg; SetupWithManager starts it.
func New(cfg Config) *Controller {
	if cfg.Namespace == "" {
		cfg.Namespace = fleet.DefaultNamespace
	}
	if cfg.BestOf < 1 {
		cfg.BestOf = 2
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Controller{
		cfg:           cfg,
		log:           cfg.Log,
		sandboxEvents: make(chan event.GenericEvent, 256),
		poolEvents:    make(chan event.GenericEvent, 256),
		gcNow:         make(chan struct{}, 1),
		nodeLive:      map[string]bool{},
		inflight:      map[types.UID]string{},
		pushed:        map[string]pushedPools{},
		pullRefs:      map[string]string{},
		pulled:        map[string]bool{},
		onNode:        map[types.UID]nodeSandbox{},
		rng:           rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x6361676562)),
	}
}

// ManagerOptions configure NewManager.
type ManagerOptions struct {
	// Namespace holds the node Leases; the cache watches Leases there
	// only (and Sandboxes, claims, pools and templates everywhere).
	Namespace string
	// Health is the address of /healthz and /readyz ("" or "0": none).
	Health string
	// Metrics is the address of controller-runtime's /metrics ("" or
	// "0": off).
	Metrics string
	// LeaderElect runs one active controller among replicas (a Lease
	// "cagebox-controller" in Namespace).
	LeaderElect bool
	// SkipNameValidation lets one process run several managers (tests).
	SkipNameValidation bool
}

// NewManager is a controller-runtime manager with kubetypes.Scheme, its
// cache narrowed to what the controller reads.
func NewManager(cfg *rest.Config, o ManagerOptions) (manager.Manager, error) {
	if o.Namespace == "" {
		o.Namespace = fleet.DefaultNamespace
	}
	metrics := o.Metrics
	if metrics == "" {
		metrics = "0"
	}
	health := o.Health
	if health == "" {
		health = "0"
	}
	if cfg.QPS == 0 {
		// client-go's default (5/s) would throttle a busy fleet; rely on
		// the apiserver's priority and fairness, as controller-runtime's
		// own GetConfig does.
		cfg = rest.CopyConfig(cfg)
		cfg.QPS, cfg.Burst = -1, 0
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  kubetypes.Scheme,
		Metrics:                 metricsserver.Options{BindAddress: metrics},
		HealthProbeBindAddress:  health,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        "cagebox-controller",
		LeaderElectionNamespace: o.Namespace,
		Controller:              config.Controller{SkipNameValidation: &o.SkipNameValidation},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{o.Namespace: {}}},
		}},
	})
	if err != nil {
		return nil, err
	}
	if health != "0" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("cache", func(r *http.Request) error {
			if !mgr.GetCache().WaitForCacheSync(r.Context()) {
				return errors.New("cache not synced")
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// SetupWithManager registers the indexes, the reconcilers and the
// garbage collector with mgr.
func (c *Controller) SetupWithManager(ctx context.Context, mgr manager.Manager) error {
	if c.cfg.Dial == nil {
		return errors.New("controller: no node dialer")
	}
	c.c = mgr.GetClient()
	c.apiReader = mgr.GetAPIReader()
	c.rec = mgr.GetEventRecorder("cagebox-controller")
	c.reg = newRegistry(mgr.GetClient(), c.cfg.Namespace)

	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &sandboxv1beta1.Sandbox{}, indexNode, func(o client.Object) []string {
		n := o.(*sandboxv1beta1.Sandbox).Status.NodeName
		if n == "" {
			n = "-"
		}
		return []string{n}
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &sandboxv1beta1.Sandbox{}, indexUID, func(o client.Object) []string {
		return []string{string(o.GetUID())}
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &sandboxv1beta1.Sandbox{}, indexID, func(o client.Object) []string {
		// With a fleet domain the id is taken from the status (which
		// only the controller writes), else from the annotation.
		sb := o.(*sandboxv1beta1.Sandbox)
		if d := c.cfg.IngressDomain; d != "" {
			if id, ok := strings.CutSuffix(sb.Status.ServiceFQDN, "."+d); ok && id != "" {
				return []string{id}
			}
			return nil
		}
		if id := sb.Annotations[fleet.AnnSandboxID]; id != "" {
			return []string{id}
		}
		return nil
	}); err != nil {
		return err
	}

	if err := ctrl.NewControllerManagedBy(mgr).Named("cagebox-node-lease").
		For(&coordinationv1.Lease{}).
		Complete(reconcile.Func(c.reconcileLease)); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("cagebox-sandbox").
		For(&sandboxv1beta1.Sandbox{}).
		WatchesRawSource(source.Channel(c.sandboxEvents, handler.EnqueueRequestsFromMapFunc(c.sandboxesForNode))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 16}).
		Complete(reconcile.Func(c.reconcileSandbox)); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("cagebox-sandboxclaim").
		For(&extv1beta1.SandboxClaim{}).
		Owns(&sandboxv1beta1.Sandbox{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 8}).
		Complete(reconcile.Func(c.reconcileClaim)); err != nil {
		return err
	}
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: poolsKey}}}
	})
	if err := ctrl.NewControllerManagedBy(mgr).Named("cagebox-warmpool").
		Watches(&extv1beta1.SandboxWarmPool{}, all).
		Watches(&extv1beta1.SandboxTemplate{}, all).
		WatchesRawSource(source.Channel(c.poolEvents, all)).
		Complete(reconcile.Func(c.reconcilePools)); err != nil {
		return err
	}
	return mgr.Add(manager.RunnableFunc(c.runGC))
}

// reconcileLease follows one node's lease: it tells the sandbox and pool
// reconcilers when the node comes or goes (a lease expires without an
// event, so the watcher requeues itself for the expiry) and the pool
// reconciler of every capacity report.
func (c *Controller) reconcileLease(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.Namespace != c.cfg.Namespace || !strings.HasPrefix(req.Name, fleet.LeasePrefix) {
		return reconcile.Result{}, nil
	}
	var l coordinationv1.Lease
	var n Node
	err := c.c.Get(ctx, req.NamespacedName, &l)
	switch {
	case err == nil:
		if _, ok := l.Labels[fleet.NodeLabel]; !ok {
			return reconcile.Result{}, nil
		}
		if n = nodeFromLease(&l); n.Name == "" {
			c.log.Warn("ignoring a node lease whose name, node label and holder disagree", "lease", req.Name)
			return reconcile.Result{}, nil
		}
	case client.IgnoreNotFound(err) == nil:
		n = Node{Name: strings.TrimPrefix(req.Name, fleet.LeasePrefix)}
	default:
		return reconcile.Result{}, err
	}
	now := time.Now()
	live := n.Live(now)
	c.mu.Lock()
	was, known := c.nodeLive[n.Name]
	c.nodeLive[n.Name] = live
	c.mu.Unlock()
	stub := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
	if !known || was != live {
		if live {
			c.log.Info("node live", "node", n.Name, "endpoint", n.Endpoint, "expires", n.Expires)
			c.triggerGC()
		} else if known {
			c.log.Warn("node lost: its lease expired", "node", n.Name, "expired", n.Expires)
		}
		c.send(ctx, c.sandboxEvents, stub)
	}
	c.send(ctx, c.poolEvents, stub)
	if live {
		return reconcile.Result{RequeueAfter: time.Until(n.Expires) + 100*time.Millisecond}, nil
	}
	return reconcile.Result{}, nil
}

func (c *Controller) send(ctx context.Context, ch chan event.GenericEvent, o client.Object) {
	select {
	case ch <- event.GenericEvent{Object: o}:
	case <-ctx.Done():
	}
}

func (c *Controller) triggerGC() {
	select {
	case c.gcNow <- struct{}{}:
	default:
	}
}

// sandboxesForNode is the Sandboxes placed on a node that came or went,
// and every unplaced one.
func (c *Controller) sandboxesForNode(ctx context.Context, o client.Object) []reconcile.Request {
	var out []reconcile.Request
	for _, key := range []string{o.GetName(), "-"} {
		var list sandboxv1beta1.SandboxList
		if err := c.c.List(ctx, &list, client.MatchingFields{indexNode: key}); err != nil {
			c.log.Error("list sandboxes of a node", "node", key, "err", err)
			continue
		}
		for i := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

// lockUID serialises work on the object uid (placement against GC).
func (c *Controller) lockUID(uid types.UID) func() {
	h := fnv.New32a()
	h.Write([]byte(uid))
	m := &c.stripes[h.Sum32()%uint32(len(c.stripes))]
	m.Lock()
	return m.Unlock
}

// LookupIngress is the ingress address of the node that runs cagebox
// sandbox id (for the fleet router); ok is false when no live node does.
func (c *Controller) LookupIngress(id string) (string, bool) {
	if c.c == nil {
		return "", false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list sandboxv1beta1.SandboxList
	if err := c.c.List(ctx, &list, client.MatchingFields{indexID: id}); err != nil {
		return "", false
	}
	// Anyone who may create a Sandbox may write any annotation, but not
	// the status: only a placed object (status.nodeName, which the
	// controller writes) counts, so a forged id cannot hide the real one.
	node := ""
	for i := range list.Items {
		if nn := list.Items[i].Status.NodeName; nn != "" {
			if node != "" {
				return "", false
			}
			node = nn
		}
	}
	if node == "" {
		return "", false
	}
	n, ok, err := c.reg.Node(ctx, node)
	if err != nil || !ok || !n.Live(time.Now()) || n.Ingress == "" {
		return "", false
	}
	return n.Ingress, true
}

// floor is the isolation floor an object of namespace ns gets at the
// least: the fleet's, raised by the Namespace's annotation. A template's
// own annotation can only raise it further. An unreadable Namespace or a
// bad annotation is an error (never a lower floor).
func (c *Controller) floor(ctx context.Context, ns string) (isolation.Class, error) {
	floor := c.cfg.MinIsolation
	var n corev1.Namespace
	if err := c.apiReader.Get(ctx, client.ObjectKey{Name: ns}, &n); err != nil {
		return 0, fmt.Errorf("namespace %s: %w", ns, err)
	}
	if v := strings.TrimSpace(n.Annotations[fleet.AnnIsolationFloor]); v != "" {
		cl, err := isolation.ParseClass(v)
		if err != nil {
			return 0, specErr(ReasonInvalidTemplate, "namespace %s: annotation %s: %q: want namespaces, app-kernel or hypervisor (ask the operator to fix it)", ns, fleet.AnnIsolationFloor, v)
		}
		if cl > floor {
			floor = cl
		}
	}
	return floor, nil
}

// raiseFloor applies the namespace's floor to spec. memo, if not nil,
// keeps each namespace's floor for the rest of one pass (the warm-pool
// pass runs at every lease renewal: one read per namespace, not per pool).
func (c *Controller) raiseFloor(ctx context.Context, ns string, spec *Spec, memo map[string]isolation.Class) error {
	f, ok := memo[ns]
	if !ok {
		var err error
		if f, err = c.floor(ctx, ns); err != nil {
			return err
		}
		if memo != nil {
			memo[ns] = f
		}
	}
	if f > spec.Floor {
		spec.Floor = f
	}
	return nil
}

// ErrNotRunning is SandboxOnNode's answer for a Sandbox that is not
// placed and ready.
var ErrNotRunning = errors.New("not placed and ready")

// SandboxOnNode is where Sandbox ns/name runs: its node's API and the node
// sandbox's id. The id is the node's own answer for the Sandbox's UID
// label (which only the controller sets), never the object's annotation
// (which whoever may edit the Sandbox could point at another one).
func (c *Controller) SandboxOnNode(ctx context.Context, ns, name string) (NodeAPI, string, error) {
	var sb sandboxv1beta1.Sandbox
	if err := c.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sb); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "", fmt.Errorf("sandbox %s/%s: %w", ns, name, ErrNotRunning)
		}
		return nil, "", err
	}
	if sb.Status.NodeName == "" || !meta.IsStatusConditionTrue(sb.Status.Conditions, condReady) {
		return nil, "", fmt.Errorf("sandbox %s/%s: %w", ns, name, ErrNotRunning)
	}
	n, ok, err := c.reg.Node(ctx, sb.Status.NodeName)
	if err != nil {
		return nil, "", err
	}
	if !ok || !n.Live(time.Now()) {
		return nil, "", fmt.Errorf("sandbox %s/%s: node %s is not live: %w", ns, name, sb.Status.NodeName, ErrNotRunning)
	}
	node, err := c.cfg.Dial(n.Endpoint)
	if err != nil {
		return nil, "", err
	}
	c.mu.Lock()
	id, cached := c.onNode[sb.UID]
	c.mu.Unlock()
	// A re-placement rewrites the annotation: then ask the node again
	// (a forged annotation only costs a lookup).
	if cached && id.node == n.Name && id.id == sb.Annotations[fleet.AnnSandboxID] {
		return node, id.id, nil
	}
	have, err := node.ListLabeled(ctx, uidLabels(&sb))
	if err != nil {
		return nil, "", fmt.Errorf("node %s: %w", n.Name, err)
	}
	if len(have) == 0 {
		return nil, "", fmt.Errorf("sandbox %s/%s: node %s has no sandbox for it: %w", ns, name, n.Name, ErrNotRunning)
	}
	c.mu.Lock()
	if len(c.onNode) > 10000 {
		clear(c.onNode)
	}
	c.onNode[sb.UID] = nodeSandbox{node: n.Name, id: have[0].ID}
	c.mu.Unlock()
	return node, have[0].ID, nil
}

type nodeSandbox struct{ node, id string }
