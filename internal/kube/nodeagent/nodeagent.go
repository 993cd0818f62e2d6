// Package nodeagent announces a cagebox node to the fleet on Kubernetes:
// it keeps a coordination.k8s.io Lease per node (fleet.LeaseName) with the
// node's API endpoint, ingress address and capacity in annotations, and
// renews it every third of its duration. The fleet controller places
// sandboxes on nodes whose lease is live and re-places those of a node
// whose lease has expired.
//
// When Run returns (its context ends) the lease is left to expire rather
// than deleted: an agent restarted within the lease's duration takes it
// over and the node's sandboxes, which outlive the daemon, are recovered
// in place without the controller re-placing them.
package nodeagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cagebox/cagebox/internal/kube/fleet"
)

// AnnInstance names the agent process that last renewed the lease (a
// random id per Run): an agent that finds another instance's renewal
// after its own is one of two agents started with one node name.
const AnnInstance = "cagebox.dev/agent-instance"

// ErrHeld means the node's lease is another holder's: another agent runs
// with this node name, or something else owns a lease of that name.
var ErrHeld = errors.New("node lease held by another holder")

// Config configures Run.
type Config struct {
	// Client talks to the apiserver.
	Client kubernetes.Interface
	// Namespace holds the lease (default fleet.DefaultNamespace).
	Namespace string
	// Node is the node's name: the lease's name suffix, its NodeLabel
	// and its holder identity.
	Node string
	// Endpoint is the node API's base URL (https://ADDR:PORT); Ingress
	// its ingress listener (ADDR:PORT, "" for none).
	Endpoint, Ingress string
	// LeaseDuration is how long the lease lives without renewal (default
	// 15s); it is renewed every third of it.
	LeaseDuration time.Duration
	// Capacity reports the node's capacity (nil: none reported). It is
	// called in the background every third of the lease's duration, never
	// on a renewal's path (a slow report must not let the lease lapse):
	// each renewal carries the latest report.
	Capacity func(ctx context.Context) fleet.Capacity
	Logger   *slog.Logger
	// Ready, if set, is called after the first successful renewal.
	Ready func()
}

// Run keeps the node's lease until ctx ends (then it returns nil and the
// lease is left to expire). Apiserver errors are logged and retried; an
// error is returned only for a lease another holder owns (ErrHeld) or a
// configuration the apiserver refuses outright.
func Run(ctx context.Context, cfg Config) error {
	a, err := newAgent(cfg)
	if err != nil {
		return err
	}
	every := a.cfg.LeaseDuration / 3
	retry := min(time.Second, every)
	if a.cfg.Capacity != nil {
		done := make(chan struct{})
		defer func() { <-done }()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { defer close(done); a.reportCapacity(ctx, every) }()
		// The first announcement waits a little for the first report.
		t := time.NewTimer(every)
		select {
		case <-a.firstCap:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	wait := time.Duration(0)
	ready := false
	failing := false
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				a.log.Info("node agent stopped; the lease is left to expire", "lease", a.name)
				return nil
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		err := a.renew(ctx)
		switch {
		case err == nil:
			if failing {
				a.log.Info("node lease renewed again", "lease", a.name)
				failing = false
			}
			if !ready {
				ready = true
				a.log.Info("node lease held", "lease", a.name, "namespace", a.cfg.Namespace, "endpoint", a.cfg.Endpoint, "duration", a.cfg.LeaseDuration)
				if a.cfg.Ready != nil {
					a.cfg.Ready()
				}
			}
			wait = every
		case errors.Is(err, ErrHeld), isPermanent(err):
			return err
		case ctx.Err() != nil:
			return nil
		default:
			a.log.Warn("renew node lease failed; retrying", "lease", a.name, "err", err, "retry_in", retry)
			failing = true
			wait = retry
		}
	}
}

// isPermanent reports apiserver answers that retrying cannot change: the
// lease (its name, labels or annotations) is invalid.
func isPermanent(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)
}

type agent struct {
	cfg      Config
	log      *slog.Logger
	name     string
	instance string
	// renewed is the renewTime this agent last wrote (zero before).
	renewed time.Time
	// capacity is the latest capacity report (an encoded fleet.Capacity;
	// nil before the first); firstCap is closed with the first.
	capacity atomic.Pointer[string]
	firstCap chan struct{}
}

// reportCapacity refreshes a.capacity every interval until ctx ends.
func (a *agent) reportCapacity(ctx context.Context, every time.Duration) {
	var once sync.Once
	for {
		cctx, cancel := context.WithTimeout(ctx, a.cfg.LeaseDuration)
		c := a.cfg.Capacity(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if c.At.IsZero() {
			c.At = time.Now().UTC()
		}
		enc := c.Encode()
		a.capacity.Store(&enc)
		once.Do(func() { close(a.firstCap) })
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func newAgent(cfg Config) (*agent, error) {
	if cfg.Client == nil {
		return nil, errors.New("nodeagent: no Kubernetes client")
	}
	if cfg.Node == "" {
		return nil, errors.New("nodeagent: no node name (--node-name, or $NODE_NAME in a pod)")
	}
	if cfg.Endpoint == "" {
		return nil, errors.New("nodeagent: no API endpoint to advertise (--advertise-url)")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = fleet.DefaultNamespace
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 15 * time.Second
	}
	if cfg.LeaseDuration < time.Second || cfg.LeaseDuration%time.Second != 0 {
		return nil, fmt.Errorf("nodeagent: lease duration %s: want whole seconds, at least 1s", cfg.LeaseDuration)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &agent{cfg: cfg, log: cfg.Logger.With("part", "nodeagent"), name: fleet.LeaseName(cfg.Node), instance: hex.EncodeToString(b), firstCap: make(chan struct{})}, nil
}

// renew creates or updates the lease once (bounded by a third of the
// lease's duration, at least a second).
func (a *agent) renew(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(time.Second, a.cfg.LeaseDuration/3))
	defer cancel()
	leases := a.cfg.Client.CoordinationV1().Leases(a.cfg.Namespace)
	for range 3 { // a lost update race is retried at once
		now := metav1.NewMicroTime(time.Now())
		l, err := leases.Get(ctx, a.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: a.name, Namespace: a.cfg.Namespace}}
			a.fill(l, now)
			l.Spec.AcquireTime = &now
			if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				return fmt.Errorf("create lease %s/%s: %w", a.cfg.Namespace, a.name, err)
			}
			a.renewed = now.Time
			return nil
		}
		if err != nil {
			return fmt.Errorf("get lease %s/%s: %w", a.cfg.Namespace, a.name, err)
		}
		if err := a.check(l); err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != a.cfg.Node || a.renewed.IsZero() {
			// Taken over (a restart within the lease's duration) or
			// first held by this agent: a new acquisition.
			l.Spec.AcquireTime = &now
		}
		a.fill(l, now)
		if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				continue
			}
			return fmt.Errorf("update lease %s/%s: %w", a.cfg.Namespace, a.name, err)
		}
		a.renewed = now.Time
		return nil
	}
	return fmt.Errorf("update lease %s/%s: it kept changing under this agent", a.cfg.Namespace, a.name)
}

// check refuses a lease that is not this node's agent's to renew.
func (a *agent) check(l *coordinationv1.Lease) error {
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if holder != "" && holder != a.cfg.Node {
		return fmt.Errorf("%w: lease %s/%s is held by %q, not node %q: another lease of that name exists; pick another --node-name or remove it",
			ErrHeld, a.cfg.Namespace, a.name, holder, a.cfg.Node)
	}
	if a.renewed.IsZero() {
		// The first renewal of this agent takes the lease over from a
		// stopped agent of the same node (its sandboxes are recovered).
		return nil
	}
	if inst := l.Annotations[AnnInstance]; inst != "" && inst != a.instance {
		return fmt.Errorf("%w: another agent (instance %s) renewed lease %s/%s: two node agents run with node name %q; stop one or give it another --node-name",
			ErrHeld, inst, a.cfg.Namespace, a.name, a.cfg.Node)
	}
	return nil
}

// fill sets the lease's labels, annotations and spec for a renewal at now.
func (a *agent) fill(l *coordinationv1.Lease, now metav1.MicroTime) {
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[fleet.NodeLabel] = a.cfg.Node
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[fleet.AnnEndpoint] = a.cfg.Endpoint
	if a.cfg.Ingress != "" {
		l.Annotations[fleet.AnnIngress] = a.cfg.Ingress
	} else {
		delete(l.Annotations, fleet.AnnIngress)
	}
	l.Annotations[AnnInstance] = a.instance
	if c := a.capacity.Load(); c != nil {
		l.Annotations[fleet.AnnCapacity] = *c
	} else {
		// None yet: not a previous run's, which may be stale.
		delete(l.Annotations, fleet.AnnCapacity)
	}
	holder := a.cfg.Node
	secs := int32(a.cfg.LeaseDuration / time.Second)
	l.Spec.HolderIdentity = &holder
	l.Spec.LeaseDurationSeconds = &secs
	l.Spec.RenewTime = &now
}
