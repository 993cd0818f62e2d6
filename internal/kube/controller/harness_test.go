package controller

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/kube/kubetest"
	"github.com/cagebox/cagebox/internal/syncbuf"
	"github.com/cagebox/cagebox/isolation"
)

const testNS = "agents"

var (
	rtContainer = fleet.RuntimeInfo{Name: "container", Class: isolation.Namespaces.String(), Available: true}
	rtGVisor    = fleet.RuntimeInfo{Name: "gvisor", Class: isolation.AppKernel.String(), Available: true}
	rtQEMU      = fleet.RuntimeInfo{Name: "qemu", Class: isolation.Hypervisor.String(), Available: true}
)

// env is a control plane, the controller under test in a manager, and
// fake nodes announced by leases the test renews.
type env struct {
	t     *testing.T
	ctx   context.Context
	c     client.Client
	fleet *fakeFleet
	ctl   *Controller
	logs  *syncbuf.Buffer

	mu     sync.Mutex
	leases map[string]*nodeLease
}

type nodeLease struct {
	node     *fakeNode
	runtimes []fleet.RuntimeInfo
	def      string
	free     int64
	stop     chan struct{}
	stopped  bool
}

var quietRuntime sync.Once

func startEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	// controller-runtime's own log (our controller logs to cfg.Log).
	quietRuntime.Do(func() { ctrllog.SetLogger(logr.Discard()) })
	rc, c := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	for _, ns := range []string{fleet.DefaultNamespace, testNS} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{t: t, ctx: ctx, c: c, fleet: &fakeFleet{nodes: map[string]*fakeNode{}}, logs: &syncbuf.Buffer{}, leases: map[string]*nodeLease{}}
	mgr, err := NewManager(rc, ManagerOptions{Namespace: fleet.DefaultNamespace, SkipNameValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Namespace = fleet.DefaultNamespace
	cfg.Dial = e.fleet.Dial
	if cfg.Resync == 0 {
		cfg.Resync = time.Second
	}
	cfg.Log = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.ctl = New(cfg)
	if err := e.ctl.SetupWithManager(ctx, mgr); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		e.mu.Lock()
		for _, l := range e.leases {
			if !l.stopped {
				close(l.stop)
				l.stopped = true
			}
		}
		e.mu.Unlock()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("manager: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("manager did not stop")
		}
		if t.Failed() {
			t.Logf("controller log:\n%s", e.logs.String())
		}
	})
	var _ manager.Manager = mgr
	return e
}

// addNode announces a fake node with a 2 s lease renewed every 300 ms.
func (e *env) addNode(name string, free int64, def string, runtimes ...fleet.RuntimeInfo) *fakeNode {
	e.t.Helper()
	return e.addFakeNode(newFakeNode(name), free, def, runtimes...)
}

func (e *env) addFakeNode(n *fakeNode, free int64, def string, runtimes ...fleet.RuntimeInfo) *fakeNode {
	e.t.Helper()
	name := n.name
	endpoint := "https://" + name + ".test:7443"
	e.fleet.mu.Lock()
	e.fleet.nodes[endpoint] = n
	e.fleet.mu.Unlock()
	l := &nodeLease{node: n, runtimes: runtimes, def: def, free: free}
	e.mu.Lock()
	e.leases[name] = l
	e.mu.Unlock()
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: fleet.LeaseName(name), Namespace: fleet.DefaultNamespace,
			Labels:      map[string]string{fleet.NodeLabel: name},
			Annotations: map[string]string{fleet.AnnEndpoint: endpoint, fleet.AnnIngress: name + ".test:8443"},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To(int32(2))},
	}
	e.renew(lease, l)
	if err := e.c.Create(e.ctx, lease); err != nil {
		e.t.Fatal(err)
	}
	e.resume(name)
	return n
}

func (e *env) renew(lease *coordinationv1.Lease, l *nodeLease) {
	lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	lease.Annotations[fleet.AnnCapacity] = l.node.capacity(l.runtimes, l.def, l.free).Encode()
}

// resume (re)starts renewing name's lease.
func (e *env) resume(name string) {
	e.mu.Lock()
	l := e.leases[name]
	l.stop, l.stopped = make(chan struct{}), false
	stop := l.stop
	e.mu.Unlock()
	renewOnce := func() {
		var lease coordinationv1.Lease
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: fleet.DefaultNamespace, Name: fleet.LeaseName(name)}, &lease); err != nil {
			return
		}
		e.renew(&lease, l)
		if err := e.c.Update(e.ctx, &lease); err != nil && !apierrors.IsConflict(err) && e.ctx.Err() == nil {
			e.t.Logf("renew %s: %v", name, err)
		}
	}
	renewOnce()
	go func() {
		tk := time.NewTicker(300 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-e.ctx.Done():
				return
			case <-tk.C:
				renewOnce()
			}
		}
	}()
}

// kill stops renewing name's lease: it expires within 2 s.
func (e *env) kill(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if l := e.leases[name]; !l.stopped {
		close(l.stop)
		l.stopped = true
	}
}

// eventually polls cond every 100 ms until it holds or within passes.
func (e *env) eventually(within time.Duration, what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
