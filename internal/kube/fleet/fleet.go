// Package fleet is the contract between cagebox node agents (`cagebox
// node`) and the fleet controller (`cagebox controller`) on Kubernetes:
// how a node announces itself (a coordination.k8s.io Lease per node, with
// its API endpoint, ingress address and capacity in annotations), the
// labels the controller puts on the sandboxes it makes, and the
// annotations of the agent-sandbox objects that carry cagebox's own
// fields (egress policy, credential hosts, isolation floor).
//
// It holds names and small value types only, no client code, so both
// sides and the tests agree on one spelling.
package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/isolation"
)

// DefaultNamespace is where node Leases live (and the controller runs).
const DefaultNamespace = "cagebox-system"

// Lease of a node: name LeasePrefix+node, label NodeLabel=node, holder
// identity the node's name. A lease whose renewTime+leaseDurationSeconds
// has passed means the node is gone: its sandboxes are placed again.
const (
	LeasePrefix = "cagebox-node-"
	NodeLabel   = "cagebox.dev/node"
	// AnnEndpoint is the node API's base URL (https://ADDR:PORT), served
	// to the fleet's admin key (the node's --admin-key-file).
	AnnEndpoint = "cagebox.dev/endpoint"
	// AnnIngress is the node's ingress listener (ADDR:PORT, TLS; empty
	// when the node runs none): the fleet router forwards PORT-ID.domain
	// connections there.
	AnnIngress = "cagebox.dev/ingress"
	// AnnCapacity is the node's Capacity as JSON, refreshed with every
	// renewal.
	AnnCapacity = "cagebox.dev/capacity"
)

// LeaseName is the Lease of node.
func LeaseName(node string) string { return LeasePrefix + node }

// Labels the controller sets on the sandboxes it creates on a node (the
// node API's sandbox labels), so it can find them again after a crash
// and remove those whose object is gone.
const (
	LabelManagedBy = "cagebox.dev/managed-by" // = ManagedBy
	ManagedBy      = "cagebox-controller"
	LabelUID       = "cagebox.dev/uid"       // the Sandbox object's UID
	LabelNamespace = "cagebox.dev/namespace" // its namespace
	LabelName      = "cagebox.dev/name"      // its name
)

// Annotations read from a SandboxTemplate's (or a Sandbox's) pod template
// metadata, or from the object's own metadata; cagebox's fields that the
// agent-sandbox API has no place for.
const (
	// AnnPolicy is the sandbox's egress policy document (YAML or JSON,
	// docs/policy.md). Absent: deny everything.
	AnnPolicy = "cagebox.dev/egress-policy"
	// AnnAllow is a comma-separated host list: one allow rule each
	// (ports 443 and 80), like `cagebox create --allow`.
	AnnAllow = "cagebox.dev/allow"
	// AnnSecretHostsPrefix+ENV lists the hosts (comma-separated) the
	// credential in env var ENV is bound to. Every env var taken from a
	// Kubernetes Secret (valueFrom.secretKeyRef) needs one: the guest
	// sees a placeholder, the node's gateway swaps the real value in for
	// those hosts only. An env var set to "vault:KEY" with such an
	// annotation binds the node vault's secret ns_NAMESPACE__KEY instead
	// (controller.VaultName: each namespace its own share of the vault).
	AnnSecretHostsPrefix = "secrets.cagebox.dev/"
	// AnnIsolationFloor is the weakest isolation class the sandbox may get
	// (namespaces, app-kernel, hypervisor).
	AnnIsolationFloor = "cagebox.dev/isolation-floor"
	// AnnPublicPorts lists container ports (comma-separated) published
	// without an access token; other containerPorts get one.
	AnnPublicPorts = "cagebox.dev/public-ports"
)

// Annotations the controller writes on a Sandbox object (status has no
// free-form fields).
const (
	// AnnSandboxID is the cagebox sandbox's id on its node.
	AnnSandboxID = "cagebox.dev/sandbox-id"
	// AnnURLs lists the published ports' fleet URLs, comma-separated.
	AnnURLs = "cagebox.dev/urls"
	// AnnLaunch is "warm" (claimed from a node pool) or "cold".
	AnnLaunch = "cagebox.dev/launch"
	// AnnPool names the SandboxWarmPool a Sandbox was claimed through
	// (namespace/name), for its pool class.
	AnnPool = "cagebox.dev/warm-pool"
)

// Finalizer keeps a Sandbox object until its node sandbox is destroyed.
const Finalizer = "cagebox.dev/node-sandbox"

// RuntimeInfo is one runtime a node offers.
type RuntimeInfo struct {
	Name      string `json:"name"`
	Class     string `json:"class"`
	Available bool   `json:"available"`
	// Reason is why it is not available.
	Reason string `json:"reason,omitempty"`
}

// Capacity is what a node reports with each lease renewal.
type Capacity struct {
	Runtimes []RuntimeInfo `json:"runtimes"`
	// DefaultRuntime is what "auto" resolves to on the node.
	DefaultRuntime string `json:"default_runtime,omitempty"`
	// MemoryTotal and MemoryAvailable are the host's (bytes).
	MemoryTotal     int64 `json:"memory_total"`
	MemoryAvailable int64 `json:"memory_available"`
	// Sandboxes is how many sandboxes the node runs (pooled ones apart).
	Sandboxes int `json:"sandboxes"`
	// Pools is the node's warm pools.
	Pools []api.PoolStatus `json:"pools,omitempty"`
	// Version is the node's cagebox version.
	Version string `json:"version,omitempty"`
	// At is when the report was made.
	At time.Time `json:"at"`
}

// Encode is the annotation form of c.
func (c Capacity) Encode() string {
	b, _ := json.Marshal(c)
	return string(b)
}

// ParseCapacity reads an AnnCapacity value.
func ParseCapacity(s string) (Capacity, error) {
	var c Capacity
	if s == "" {
		return c, errors.New("no capacity reported")
	}
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return c, fmt.Errorf("capacity annotation: %w", err)
	}
	return c, nil
}

// Offers reports whether the node can run a sandbox of runtime (a name,
// or "" / "auto" for any available one) at or above floor.
func (c Capacity) Offers(runtime string, floor isolation.Class) bool {
	for _, r := range c.Runtimes {
		if !r.Available {
			continue
		}
		if runtime != "" && runtime != "auto" && r.Name != runtime {
			continue
		}
		cl, err := isolation.ParseClass(r.Class)
		if err != nil {
			continue
		}
		if floor == 0 || cl >= floor {
			return true
		}
	}
	return false
}

// PoolReady is how many sandboxes of pool class cls are ready.
func (c Capacity) PoolReady(cls string) int {
	for _, p := range c.Pools {
		if p.Class == cls {
			return p.Ready
		}
	}
	return 0
}

// SplitList splits a comma-separated annotation value, dropping blanks.
func SplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
