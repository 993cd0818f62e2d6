package controller

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/pool"
	"github.com/cagebox/cagebox/isolation"
)

// Reasons of a Ready=False condition that the object's author must fix.
const (
	ReasonInvalidTemplate    = "InvalidTemplate"
	ReasonSecretNotFound     = "SecretNotFound"
	ReasonSecretKeyNotFound  = "SecretKeyNotFound"
	ReasonSecretHostsMissing = "SecretHostsMissing"
)

// SpecError is a sandbox spec the controller cannot run as written: the
// Ready condition shows Reason and Message (which names what to fix and
// never holds a secret value); no node is asked.
type SpecError struct {
	Reason  string
	Message string
}

func (e *SpecError) Error() string { return e.Message }

func specErr(reason, format string, args ...any) *SpecError {
	return &SpecError{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Spec is a Sandbox translated for a node: the create request (its
// Runtime still "auto" or a name; placement makes it concrete) and the
// isolation floor placement must honour.
type Spec struct {
	Req   *api.CreateSandboxRequest
	Floor isolation.Class
	// PullRef is the OCI reference the node pulls as Req.Image before
	// the create ("" when Req.Image is a cagebox image; see images.go).
	PullRef string
}

// PoolClass is the warm pool class a create of s with runtime (concrete)
// takes a sandbox from on a node: internal/pool's class string, which the
// node reports in its capacity.
func (s *Spec) PoolClass(runtime string) string {
	return pool.ClassOf(runtime, s.Req.Image, isolation.Resources{MemoryBytes: s.Req.MemoryBytes, CPUs: s.Req.CPUs}).String()
}

// Memory is the memory the sandbox will hold on its node.
func (s *Spec) Memory() int64 {
	return isolation.Resources{MemoryBytes: s.Req.MemoryBytes}.WithDefaults().MemoryBytes
}

// DefaultImage is the image of a container that names none.
const DefaultImage = "default"

// Translate reads sb's pod template (its first container, and the
// cagebox annotations of the pod template metadata, over those of the
// object's own metadata) into a node create request. The value of an env
// var from a Kubernetes Secret (valueFrom.secretKeyRef, in sb's
// namespace) is read with secrets and sent inline as a credential bound
// to the hosts of its secrets.cagebox.dev/ENV annotation; "vault:KEY"
// with such an annotation binds the node vault's secret KEY. A spec the
// controller cannot run is a *SpecError.
func Translate(ctx context.Context, secrets client.Reader, sb *sandboxv1beta1.Sandbox) (*Spec, error) {
	pt := &sb.Spec.PodTemplate
	ann := map[string]string{}
	for k, v := range sb.Annotations {
		if reservedAnnotation(k) {
			ann[k] = v
		}
	}
	for k, v := range pt.ObjectMeta.Annotations {
		ann[k] = v
	}
	if n := len(pt.Spec.Containers); n != 1 {
		return nil, specErr(ReasonInvalidTemplate, "the pod template has %d containers; a cagebox sandbox runs exactly one (spec.podTemplate.spec.containers[0])", n)
	}
	ctr := &pt.Spec.Containers[0]
	req := &api.CreateSandboxRequest{
		Runtime: "auto",
		Image:   ctr.Image,
		Labels: map[string]string{
			fleet.LabelManagedBy: fleet.ManagedBy,
			fleet.LabelUID:       string(sb.UID),
			fleet.LabelNamespace: labelValue(sb.Namespace),
			fleet.LabelName:      labelValue(sb.Name),
		},
	}
	if req.Image == "" {
		req.Image = DefaultImage
	}
	if rc := pt.Spec.RuntimeClassName; rc != nil && *rc != "" {
		req.Runtime = *rc
	}
	if q, ok := quantity(ctr.Resources, corev1.ResourceMemory); ok {
		if q.Value() <= 0 {
			return nil, specErr(ReasonInvalidTemplate, "resources memory %s: want a positive size such as 512Mi", q.String())
		}
		req.MemoryBytes = q.Value()
	}
	if q, ok := quantity(ctr.Resources, corev1.ResourceCPU); ok {
		if q.MilliValue() <= 0 {
			return nil, specErr(ReasonInvalidTemplate, "resources cpu %s: want a positive amount such as 500m or 2", q.String())
		}
		req.CPUs = float64(q.MilliValue()) / 1000
	}
	if len(ctr.EnvFrom) > 0 {
		return nil, specErr(ReasonInvalidTemplate, "envFrom is not supported: list each variable under env (valueFrom.secretKeyRef for a credential)")
	}
	for _, e := range ctr.Env {
		hosts := fleet.SplitList(ann[fleet.AnnSecretHostsPrefix+e.Name])
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			b, skip, err := secretBinding(ctx, secrets, sb.Namespace, e, hosts)
			if err != nil {
				return nil, err
			}
			if !skip {
				req.Secrets = append(req.Secrets, b)
			}
		case e.ValueFrom != nil:
			return nil, specErr(ReasonInvalidTemplate, "env %s: only value and valueFrom.secretKeyRef are supported", e.Name)
		case len(hosts) > 0 && strings.HasPrefix(e.Value, "vault:"):
			key := strings.TrimPrefix(e.Value, "vault:")
			if !validVaultKey(key) {
				return nil, specErr(ReasonInvalidTemplate, "env %s: vault:%s: write vault:KEY with KEY letters, digits and single underscores, not starting with one (the node vault's secret ns_NAMESPACE__KEY)", e.Name, key)
			}
			// A namespace reaches only its own share of the node vault:
			// the nodes are one tenant (the fleet admin), so KEY alone
			// would let any namespace that may create a Sandbox use every
			// credential an operator stored there.
			req.Secrets = append(req.Secrets, api.SecretBinding{Name: e.Name, Secret: VaultName(sb.Namespace, key), Hosts: hosts})
		case len(hosts) > 0:
			return nil, specErr(ReasonInvalidTemplate, "env %s has annotation %s%s but is neither valueFrom.secretKeyRef nor vault:KEY: a plain value is no credential (drop the annotation, or take the value from a Secret)", e.Name, fleet.AnnSecretHostsPrefix, e.Name)
		default:
			req.Env = append(req.Env, e.Name+"="+e.Value)
		}
	}
	public := map[int]bool{}
	for _, p := range fleet.SplitList(ann[fleet.AnnPublicPorts]) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return nil, specErr(ReasonInvalidTemplate, "annotation %s: %q is no port number (want e.g. \"8080,3000\")", fleet.AnnPublicPorts, p)
		}
		public[n] = true
	}
	for _, p := range ctr.Ports {
		port := int(p.ContainerPort)
		req.Publish = append(req.Publish, api.PortSpec{Port: port, Public: public[port]})
		delete(public, port)
	}
	if len(public) > 0 {
		var extra []string
		for p := range public {
			extra = append(extra, strconv.Itoa(p))
		}
		sort.Strings(extra)
		return nil, specErr(ReasonInvalidTemplate, "annotation %s lists %s, which are not containerPorts of the container: add them to ports", fleet.AnnPublicPorts, strings.Join(extra, ","))
	}
	if doc := strings.TrimSpace(ann[fleet.AnnPolicy]); doc != "" {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return nil, specErr(ReasonInvalidTemplate, "annotation %s: not a YAML or JSON policy document: %v", fleet.AnnPolicy, err)
		}
		req.Policy = j
	}
	req.Allow = fleet.SplitList(ann[fleet.AnnAllow])
	s := &Spec{Req: req}
	if f := strings.TrimSpace(ann[fleet.AnnIsolationFloor]); f != "" {
		c, err := isolation.ParseClass(f)
		if err != nil {
			return nil, specErr(ReasonInvalidTemplate, "annotation %s: %q: want namespaces, app-kernel or hypervisor", fleet.AnnIsolationFloor, f)
		}
		s.Floor = c
	}
	return s, nil
}

// secretBinding reads the Secret an env var refers to. skip is true for
// an optional reference whose Secret or key is absent.
func secretBinding(ctx context.Context, secrets client.Reader, ns string, e corev1.EnvVar, hosts []string) (_ api.SecretBinding, skip bool, _ error) {
	ref := e.ValueFrom.SecretKeyRef
	optional := ref.Optional != nil && *ref.Optional
	if len(hosts) == 0 {
		return api.SecretBinding{}, false, specErr(ReasonSecretHostsMissing,
			"env %s comes from Secret %s (key %s) but names no hosts: add the pod template annotation %s%s: \"api.example.com\" (comma-separated hosts the credential may be sent to; the sandbox sees a placeholder)",
			e.Name, ref.Name, ref.Key, fleet.AnnSecretHostsPrefix, e.Name)
	}
	var sec corev1.Secret
	if err := secrets.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			if optional {
				return api.SecretBinding{}, true, nil
			}
			return api.SecretBinding{}, false, specErr(ReasonSecretNotFound, "env %s: Secret %s/%s does not exist: create it (or mark the reference optional)", e.Name, ns, ref.Name)
		}
		return api.SecretBinding{}, false, fmt.Errorf("read Secret %s/%s for env %s: %w", ns, ref.Name, e.Name, err)
	}
	v, ok := sec.Data[ref.Key]
	if !ok {
		if optional {
			return api.SecretBinding{}, true, nil
		}
		return api.SecretBinding{}, false, specErr(ReasonSecretKeyNotFound, "env %s: Secret %s/%s has no key %s: add it (or mark the reference optional)", e.Name, ns, ref.Name, ref.Key)
	}
	if len(v) == 0 {
		return api.SecretBinding{}, false, specErr(ReasonSecretKeyNotFound, "env %s: key %s of Secret %s/%s is empty", e.Name, ref.Key, ns, ref.Name)
	}
	return api.SecretBinding{Name: e.Name, Value: string(v), Hosts: hosts}, false, nil
}

func quantity(r corev1.ResourceRequirements, name corev1.ResourceName) (q interface {
	Value() int64
	MilliValue() int64
	String() string
}, ok bool) {
	if v, ok := r.Limits[name]; ok {
		return &v, true
	}
	if v, ok := r.Requests[name]; ok {
		return &v, true
	}
	return nil, false
}

// reservedAnnotation reports whether k is one of cagebox's annotations
// (cagebox.dev/… or secrets.cagebox.dev/…).
func reservedAnnotation(k string) bool {
	return strings.HasPrefix(k, "cagebox.dev/") || strings.HasPrefix(k, fleet.AnnSecretHostsPrefix)
}

// labelValue fits s into a node label value (at most 63 characters of
// [A-Za-z0-9._-]); the uid label is what identifies the object.
func labelValue(s string) string {
	if len(s) > 63 {
		s = strings.TrimRight(s[:63], "-._")
	}
	return s
}

// VaultName is the node vault secret that "vault:KEY" in namespace ns
// names: ns_NAMESPACE__KEY, the namespace's dashes as underscores (vault
// names are like environment variables; a namespace has no underscore,
// so two namespaces never share a name). The operator stores it on the
// nodes with `cagebox secret add ns_NAMESPACE__KEY …`.
//
// KEY is checked by validVaultKey (no "__", not starting with "_"), so the
// last "__" of a name always separates the namespace from the key: two
// (namespace, key) pairs never give one name, even for namespaces with
// "--" in them.
func VaultName(ns, key string) string {
	return "ns_" + strings.ReplaceAll(ns, "-", "_") + "__" + key
}

func validVaultKey(k string) bool {
	if k == "" || k[0] == '_' || strings.Contains(k, "__") {
		return false
	}
	for _, c := range k {
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}
