package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/kube/kubetest"
)

// The control plane of these tests: a real kube-apiserver and etcd
// started by envtest from $KUBEBUILDER_ASSETS (scripts/kube-testbin.sh
// builds them), once for the package: kubetest.Env starts one per test,
// and these tests need no CRDs.
var (
	restCfg *rest.Config
	envErr  error
	noEnv   string // why there is none
)

func TestMain(m *testing.M) {
	var env *envtest.Environment
	dir, why := kubetest.Assets()
	noEnv = why
	if dir != "" {
		env = &envtest.Environment{BinaryAssetsDirectory: dir}
		restCfg, envErr = env.Start()
	}
	code := m.Run()
	if env != nil && envErr == nil {
		_ = env.Stop()
	}
	os.Exit(code)
}

// clientset gives a client of the test control plane (wrap, if set, wraps
// its transport) and a fresh namespace, or skips the test when there is no
// control plane (fails under CAGEBOX_REQUIRE_KUBE=1).
func clientset(t *testing.T, wrap func(http.RoundTripper) http.RoundTripper) (kubernetes.Interface, string) {
	t.Helper()
	if restCfg == nil && envErr == nil {
		kubetest.Require(t) // skips, or fails under CAGEBOX_REQUIRE_KUBE=1
		t.Fatal(noEnv)
	}
	if envErr != nil {
		t.Fatalf("start the control plane: %v", envErr)
	}
	cfg := rest.CopyConfig(restCfg)
	cfg.WrapTransport = wrap
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "nodeagent-"}}
	ns, err = cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cs, ns.Name
}

type running struct {
	cancel context.CancelFunc
	done   chan error
	ready  chan struct{}
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1), ready: make(chan struct{})}
	var once sync.Once
	cfg.Ready = func() { once.Do(func() { close(r.ready) }) }
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	go func() { r.done <- Run(ctx, cfg) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

func (r *running) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-r.ready:
	case err := <-r.done:
		t.Fatalf("Run returned before holding the lease: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the lease was not held within 20s")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func getLease(t *testing.T, cs kubernetes.Interface, ns, node string) *coordinationv1.Lease {
	t.Helper()
	l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), fleet.LeaseName(node), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func eventually(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLease: the lease is created with the contract's name, label, holder,
// duration, times and annotations; it is renewed (renewTime advances) with
// fresh capacity; a stopped agent leaves it in place; a restarted one
// takes it over (a new acquireTime).
func TestLease(t *testing.T) {
	cs, ns := clientset(t, nil)
	var n atomic.Int64
	cfg := Config{
		Client: cs, Namespace: ns, Node: "node-a", Endpoint: "https://10.0.0.1:7443", Ingress: "10.0.0.1:443",
		LeaseDuration: 3 * time.Second,
		Capacity: func(context.Context) fleet.Capacity {
			return fleet.Capacity{
				Runtimes:       []fleet.RuntimeInfo{{Name: "container", Class: "namespaces", Available: true}},
				DefaultRuntime: "container", MemoryTotal: 8 << 30, MemoryAvailable: 6 << 30,
				Sandboxes: int(n.Add(1)), Pools: []api.PoolStatus{{Class: "container:default", Ready: 2, Target: 2}},
			}
		},
	}
	before := time.Now().Add(-time.Second)
	r := start(t, cfg)
	r.waitReady(t)
	l := getLease(t, cs, ns, "node-a")
	if l.Labels[fleet.NodeLabel] != "node-a" {
		t.Errorf("label %s = %q", fleet.NodeLabel, l.Labels[fleet.NodeLabel])
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != "node-a" {
		t.Errorf("holder %v", h)
	}
	if d := l.Spec.LeaseDurationSeconds; d == nil || *d != 3 {
		t.Errorf("leaseDurationSeconds %v", d)
	}
	if l.Spec.AcquireTime == nil || l.Spec.RenewTime == nil || l.Spec.AcquireTime.Time.Before(before) {
		t.Fatalf("acquire %v renew %v", l.Spec.AcquireTime, l.Spec.RenewTime)
	}
	if l.Annotations[fleet.AnnEndpoint] != cfg.Endpoint || l.Annotations[fleet.AnnIngress] != cfg.Ingress {
		t.Errorf("annotations %v", l.Annotations)
	}
	c, err := fleet.ParseCapacity(l.Annotations[fleet.AnnCapacity])
	if err != nil {
		t.Fatal(err)
	}
	if !c.Offers("container", 0) || c.DefaultRuntime != "container" || c.MemoryAvailable != 6<<30 || c.PoolReady("container:default") != 2 || c.At.IsZero() {
		t.Errorf("capacity %+v", c)
	}
	acquired, renewed, first := l.Spec.AcquireTime.Time, l.Spec.RenewTime.Time, c.Sandboxes

	// Renewed every second (a third of 3s), with fresh capacity.
	eventually(t, "two renewals", 5*time.Second, func() bool {
		l := getLease(t, cs, ns, "node-a")
		c, _ := fleet.ParseCapacity(l.Annotations[fleet.AnnCapacity])
		return l.Spec.RenewTime.Time.Sub(renewed) >= 1500*time.Millisecond && c.Sandboxes >= first+2
	})
	if l := getLease(t, cs, ns, "node-a"); !l.Spec.AcquireTime.Time.Equal(acquired) {
		t.Errorf("a renewal moved acquireTime from %v to %v", acquired, l.Spec.AcquireTime.Time)
	}

	// Stopped: Run returns nil, the lease stays (to expire).
	r.cancel()
	if err := <-r.done; err != nil {
		t.Fatalf("Run after its context ended: %v", err)
	}
	r.done <- nil // for the cleanup
	stopped := getLease(t, cs, ns, "node-a")

	// Restarted within the lease's duration: taken over at once.
	r2 := start(t, cfg)
	r2.waitReady(t)
	l = getLease(t, cs, ns, "node-a")
	if !l.Spec.AcquireTime.Time.After(stopped.Spec.RenewTime.Time) || l.Annotations[AnnInstance] == stopped.Annotations[AnnInstance] {
		t.Errorf("restart: acquire %v (last renewal %v), instance %s (was %s)", l.Spec.AcquireTime, stopped.Spec.RenewTime, l.Annotations[AnnInstance], stopped.Annotations[AnnInstance])
	}
}

// TestLeaseHeldByAnother: a lease of the node's name held by another
// identity is refused with ErrHeld, and left as it was.
func TestLeaseHeldByAnother(t *testing.T) {
	cs, ns := clientset(t, nil)
	other, secs := "someone-else", int32(3600)
	now := metav1.NewMicroTime(time.Now())
	_, err := cs.CoordinationV1().Leases(ns).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: fleet.LeaseName("node-b")},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &other, LeaseDurationSeconds: &secs, RenewTime: &now},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, Config{Client: cs, Namespace: ns, Node: "node-b", Endpoint: "https://10.0.0.2:7443", LeaseDuration: 3 * time.Second})
	select {
	case err := <-r.done:
		if !errors.Is(err, ErrHeld) {
			t.Fatalf("Run: %v, want ErrHeld", err)
		}
		r.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("Run kept going on another holder's lease")
	}
	if l := getLease(t, cs, ns, "node-b"); *l.Spec.HolderIdentity != other || l.Annotations[fleet.AnnEndpoint] != "" {
		t.Fatalf("the other holder's lease was changed: %+v", l)
	}
}

// TestTwoAgentsOneName: a second agent with the same node name takes the
// lease over; the first sees the other's renewal and stops with ErrHeld.
func TestTwoAgentsOneName(t *testing.T) {
	cs, ns := clientset(t, nil)
	cfg := Config{Client: cs, Namespace: ns, Node: "node-c", Endpoint: "https://10.0.0.3:7443", LeaseDuration: 3 * time.Second}
	a := start(t, cfg)
	a.waitReady(t)
	b := start(t, cfg)
	b.waitReady(t)
	select {
	case err := <-a.done:
		if !errors.Is(err, ErrHeld) {
			t.Fatalf("first agent: %v, want ErrHeld", err)
		}
		a.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("two agents with one node name both kept running")
	}
	select {
	case err := <-b.done:
		t.Fatalf("the second agent stopped too: %v", err)
	case <-time.After(2 * time.Second):
	}
}

// TestApiserverHiccup: while every request to the apiserver fails, the
// agent logs and retries without stopping; once it answers again the
// lease is renewed.
func TestApiserverHiccup(t *testing.T) {
	var down atomic.Bool
	cs, ns := clientset(t, func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if down.Load() {
				return nil, fmt.Errorf("connection refused (test)")
			}
			return rt.RoundTrip(r)
		})
	})
	r := start(t, Config{Client: cs, Namespace: ns, Node: "node-d", Endpoint: "https://10.0.0.4:7443", LeaseDuration: 3 * time.Second})
	r.waitReady(t)
	down.Store(true)
	time.Sleep(4 * time.Second) // longer than the lease: several failed renewals
	select {
	case err := <-r.done:
		t.Fatalf("Run stopped during the outage: %v", err)
	default:
	}
	down.Store(false)
	stale := getLease(t, cs, ns, "node-d").Spec.RenewTime.Time
	eventually(t, "a renewal after the outage", 5*time.Second, func() bool {
		return getLease(t, cs, ns, "node-d").Spec.RenewTime.Time.After(stale)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestConfigRefusals(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Client: &kubernetes.Clientset{}, Endpoint: "https://x:1"},
		{Client: &kubernetes.Clientset{}, Node: "n"},
		{Client: &kubernetes.Clientset{}, Node: "n", Endpoint: "https://x:1", LeaseDuration: 1500 * time.Millisecond},
	} {
		if err := Run(context.Background(), cfg); err == nil {
			t.Errorf("%+v: accepted", cfg)
		}
	}
}

// TestSlowCapacity: a capacity report slower than the lease (the daemon
// probing its runtimes at start) never holds a renewal up; the report is
// carried by the renewal after it arrives.
func TestSlowCapacity(t *testing.T) {
	cs, ns := clientset(t, nil)
	r := start(t, Config{Client: cs, Namespace: ns, Node: "node-e", Endpoint: "https://10.0.0.5:7443", LeaseDuration: 3 * time.Second,
		Capacity: func(ctx context.Context) fleet.Capacity {
			select {
			case <-time.After(4 * time.Second):
			case <-ctx.Done():
			}
			return fleet.Capacity{DefaultRuntime: "container"}
		}})
	r.waitReady(t)
	l := getLease(t, cs, ns, "node-e")
	if _, ok := l.Annotations[fleet.AnnCapacity]; ok {
		t.Fatalf("capacity before any report: %q", l.Annotations[fleet.AnnCapacity])
	}
	first := l.Spec.RenewTime.Time
	eventually(t, "renewals while the report is slow", 3*time.Second, func() bool {
		return getLease(t, cs, ns, "node-e").Spec.RenewTime.Time.Sub(first) >= 1500*time.Millisecond
	})
	eventually(t, "the report", 8*time.Second, func() bool {
		c, err := fleet.ParseCapacity(getLease(t, cs, ns, "node-e").Annotations[fleet.AnnCapacity])
		return err == nil && c.DefaultRuntime == "container"
	})
}
