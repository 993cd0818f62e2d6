package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/kube/kubetypes"
)

// Condition reasons of a SandboxClaim. The refusals carry the names
// upstream's controller uses, which the official clients know: the
// Python client (k8s_agent_sandbox) stops waiting on TemplateNotFound,
// WarmPoolNotFound and its TERMINAL_CLAIM_READY_REASONS (InvalidMetadata,
// EnvVarsInjectionRejected, VolumeClaimTemplatesError, ClaimExpired,
// SandboxExpired); the Go client (clients/go/sandbox v1.0.3) stops on none
// of them, only on its timeout or a deleted claim.
const (
	ReasonWarmPoolNotFound          = "WarmPoolNotFound"
	ReasonTemplateNotFound          = "TemplateNotFound"
	ReasonInvalidMetadata           = "InvalidMetadata"
	ReasonEnvVarsInjectionRejected  = "EnvVarsInjectionRejected"
	ReasonVolumeClaimTemplatesError = "VolumeClaimTemplatesError"
	ReasonSandboxNameTaken          = "SandboxNameTaken"
	ReasonSandboxPending            = "SandboxPending"
)

const condReady = string(sandboxv1beta1.SandboxConditionReady)

func (c *Controller) reconcileClaim(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var cl extv1beta1.SandboxClaim
	if err := c.c.Get(ctx, req.NamespacedName, &cl); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !cl.DeletionTimestamp.IsZero() {
		return c.finalizeClaim(ctx, &cl)
	}
	if !controllerutil.ContainsFinalizer(&cl, fleet.Finalizer) {
		patch := client.MergeFromWithOptions(cl.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(&cl, fleet.Finalizer)
		if err := c.c.Patch(ctx, &cl, patch); err != nil {
			return reconcile.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}
	var res reconcile.Result
	if lc := cl.Spec.Lifecycle; lc != nil && lc.ShutdownTime != nil {
		if left := time.Until(lc.ShutdownTime.Time); left <= 0 {
			return reconcile.Result{}, c.expireClaim(ctx, &cl)
		} else {
			res.RequeueAfter = left + 50*time.Millisecond
		}
	}
	if meta.IsStatusConditionTrue(cl.Status.Conditions, string(sandboxv1beta1.SandboxConditionFinished)) {
		return reconcile.Result{}, nil
	}

	var sb sandboxv1beta1.Sandbox
	err := c.c.Get(ctx, req.NamespacedName, &sb)
	switch {
	case err == nil:
		if !metav1.IsControlledBy(&sb, &cl) {
			c.setClaimReady(ctx, &cl, metav1.ConditionFalse, ReasonSandboxNameTaken,
				fmt.Sprintf("a Sandbox %s/%s that this claim does not own exists: delete it or rename the claim", sb.Namespace, sb.Name))
			return res, nil
		}
		return res, c.mirrorClaim(ctx, &cl, &sb)
	case !apierrors.IsNotFound(err):
		return reconcile.Result{}, err
	}

	var wp extv1beta1.SandboxWarmPool
	if err := c.c.Get(ctx, client.ObjectKey{Namespace: cl.Namespace, Name: cl.Spec.WarmPoolRef.Name}, &wp); err != nil {
		if apierrors.IsNotFound(err) {
			c.setClaimReady(ctx, &cl, metav1.ConditionFalse, ReasonWarmPoolNotFound,
				fmt.Sprintf("SandboxWarmPool %s/%s does not exist: create it or fix spec.warmPoolRef.name", cl.Namespace, cl.Spec.WarmPoolRef.Name))
			return reconcile.Result{RequeueAfter: c.cfg.Resync}, nil
		}
		return reconcile.Result{}, err
	}
	var tpl extv1beta1.SandboxTemplate
	if err := c.c.Get(ctx, client.ObjectKey{Namespace: cl.Namespace, Name: wp.Spec.TemplateRef.Name}, &tpl); err != nil {
		if apierrors.IsNotFound(err) {
			c.setClaimReady(ctx, &cl, metav1.ConditionFalse, ReasonTemplateNotFound,
				fmt.Sprintf("SandboxTemplate %s/%s (of warm pool %s) does not exist: create it or fix the pool's sandboxTemplateRef", cl.Namespace, wp.Spec.TemplateRef.Name, wp.Name))
			return reconcile.Result{RequeueAfter: c.cfg.Resync}, nil
		}
		return reconcile.Result{}, err
	}
	bp, err := ClaimBlueprint(&tpl, &cl)
	if err != nil {
		reason := ReasonInvalidTemplate
		var se *SpecError
		if errors.As(err, &se) {
			reason = se.Reason
		}
		if c.setClaimReady(ctx, &cl, metav1.ConditionFalse, reason, err.Error()) {
			c.rec.Eventf(&cl, nil, corev1.EventTypeWarning, reason, "Claim", "%s", err.Error())
		}
		return res, nil
	}
	sb = sandboxv1beta1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{
			Name:       cl.Name,
			Namespace:  cl.Namespace,
			Finalizers: []string{fleet.Finalizer},
			Labels:     map[string]string{extv1beta1.SandboxIDLabel: string(cl.UID)},
			Annotations: map[string]string{
				fleet.AnnPool: cl.Namespace + "/" + wp.Name,
				sandboxv1beta1.SandboxTemplateRefAnnotation: tpl.Name,
			},
		},
		Spec: sandboxv1beta1.SandboxSpec{SandboxBlueprint: *bp},
	}
	if err := controllerutil.SetControllerReference(&cl, &sb, kubetypes.Scheme); err != nil {
		return reconcile.Result{}, err
	}
	if err := c.c.Create(ctx, &sb); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return reconcile.Result{Requeue: true}, nil
		}
		return reconcile.Result{}, fmt.Errorf("create Sandbox for claim: %w", err)
	}
	c.rec.Eventf(&cl, &sb, corev1.EventTypeNormal, "SandboxCreated", "Claim", "Sandbox %s created from template %s (warm pool %s)", sb.Name, tpl.Name, wp.Name)
	return res, c.mirrorClaim(ctx, &cl, &sb)
}

// ClaimBlueprint is the blueprint of the Sandbox a claim gets: the
// template's, with the claim's env (as the template's
// envVarsInjectionPolicy permits; never over a credential) and its
// additional pod metadata (never cagebox's own annotations, which are the
// template author's: egress policy, credential hosts, isolation floor).
func ClaimBlueprint(tpl *extv1beta1.SandboxTemplate, cl *extv1beta1.SandboxClaim) (*sandboxv1beta1.SandboxBlueprint, error) {
	bp := tpl.Spec.SandboxBlueprint.DeepCopy()
	if len(cl.Spec.VolumeClaimTemplates) > 0 {
		return nil, specErr(ReasonVolumeClaimTemplatesError, "spec.volumeClaimTemplates: cagebox sandboxes have no persistent volumes; drop them")
	}
	if len(bp.PodTemplate.Spec.Containers) == 0 {
		return nil, specErr(ReasonInvalidTemplate, "template %s has no container", tpl.Name)
	}
	ctr := &bp.PodTemplate.Spec.Containers[0]
	tplAnn := bp.PodTemplate.ObjectMeta.Annotations
	if len(cl.Spec.Env) > 0 {
		policy := tpl.Spec.EnvVarsInjectionPolicy
		if policy == "" {
			policy = extv1beta1.EnvVarsInjectionPolicyDisallowed
		}
		if policy == extv1beta1.EnvVarsInjectionPolicyDisallowed {
			return nil, specErr(ReasonEnvVarsInjectionRejected, "template %s does not let claims set env (envVarsInjectionPolicy %s): drop spec.env or set the template's policy to Allowed or Overrides", tpl.Name, policy)
		}
		for _, e := range cl.Spec.Env {
			if e.ContainerName != "" && e.ContainerName != ctr.Name {
				return nil, specErr(ReasonEnvVarsInjectionRejected, "env %s: container %q is not the sandbox's container %q", e.Name, e.ContainerName, ctr.Name)
			}
			if _, bound := tplAnn[fleet.AnnSecretHostsPrefix+e.Name]; bound {
				return nil, specErr(ReasonEnvVarsInjectionRejected, "env %s is a credential of template %s; a claim cannot set it", e.Name, tpl.Name)
			}
			i := envIndex(ctr.Env, e.Name)
			switch {
			case i < 0:
				ctr.Env = append(ctr.Env, corev1.EnvVar{Name: e.Name, Value: e.Value})
			case ctr.Env[i].ValueFrom != nil:
				return nil, specErr(ReasonEnvVarsInjectionRejected, "env %s is a credential of template %s; a claim cannot set it", e.Name, tpl.Name)
			case policy == extv1beta1.EnvVarsInjectionPolicyOverrides:
				ctr.Env[i].Value = e.Value
			default:
				return nil, specErr(ReasonEnvVarsInjectionRejected, "env %s is set by template %s and its envVarsInjectionPolicy %s does not let a claim override it (Overrides would)", e.Name, tpl.Name, policy)
			}
		}
	}
	md := cl.Spec.AdditionalPodMetadata
	for k, v := range md.Annotations {
		if reservedAnnotation(k) {
			return nil, specErr(ReasonInvalidMetadata, "spec.additionalPodMetadata annotation %s is the template's to set (cagebox.dev/ and secrets.cagebox.dev/ annotations)", k)
		}
		if bp.PodTemplate.ObjectMeta.Annotations == nil {
			bp.PodTemplate.ObjectMeta.Annotations = map[string]string{}
		}
		bp.PodTemplate.ObjectMeta.Annotations[k] = v
	}
	for k, v := range md.Labels {
		if bp.PodTemplate.ObjectMeta.Labels == nil {
			bp.PodTemplate.ObjectMeta.Labels = map[string]string{}
		}
		bp.PodTemplate.ObjectMeta.Labels[k] = v
	}
	return bp, nil
}

func envIndex(env []corev1.EnvVar, name string) int {
	for i, e := range env {
		if e.Name == name {
			return i
		}
	}
	return -1
}

// mirrorClaim copies the Sandbox's name, address and Ready condition to
// the claim's status.
func (c *Controller) mirrorClaim(ctx context.Context, cl *extv1beta1.SandboxClaim, sb *sandboxv1beta1.Sandbox) error {
	orig := cl.DeepCopy()
	cl.Status.SandboxStatus.Name = sb.Name
	cl.Status.SandboxStatus.PodIPs = sb.Status.PodIPs
	ready := meta.FindStatusCondition(sb.Status.Conditions, condReady)
	cond := metav1.Condition{Type: condReady, Status: metav1.ConditionFalse, Reason: ReasonSandboxPending, Message: "waiting for the Sandbox to be placed"}
	if ready != nil {
		cond.Status, cond.Reason, cond.Message = ready.Status, ready.Reason, ready.Message
	}
	cond.ObservedGeneration = cl.Generation
	meta.SetStatusCondition(&cl.Status.Conditions, cond)
	if equality.Semantic.DeepEqual(orig.Status, cl.Status) {
		return nil
	}
	if err := c.c.Status().Patch(ctx, cl, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("claim status: %w", err)
	}
	return nil
}

func (c *Controller) setClaimReady(ctx context.Context, cl *extv1beta1.SandboxClaim, status metav1.ConditionStatus, reason, msg string) (changed bool) {
	orig := cl.DeepCopy()
	meta.SetStatusCondition(&cl.Status.Conditions, metav1.Condition{Type: condReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: cl.Generation})
	if equality.Semantic.DeepEqual(orig.Status, cl.Status) {
		return false
	}
	if err := c.c.Status().Patch(ctx, cl, client.MergeFrom(orig)); err != nil {
		c.log.Error("write claim condition", "claim", cl.Namespace+"/"+cl.Name, "reason", reason, "err", err)
		return false
	}
	return true
}

// claimSandbox deletes the claim's Sandbox; done is true once it is gone.
func (c *Controller) deleteClaimSandbox(ctx context.Context, cl *extv1beta1.SandboxClaim) (done bool, err error) {
	var sb sandboxv1beta1.Sandbox
	if err := c.c.Get(ctx, client.ObjectKey{Namespace: cl.Namespace, Name: cl.Name}, &sb); err != nil {
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(&sb, cl) {
		return true, nil
	}
	if sb.DeletionTimestamp.IsZero() {
		if err := c.c.Delete(ctx, &sb); err != nil {
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		}
	}
	return false, nil
}

// finalizeClaim deletes the claim's Sandbox (there may be no garbage
// collector: envtest has none) and drops the finalizer once it is gone.
func (c *Controller) finalizeClaim(ctx context.Context, cl *extv1beta1.SandboxClaim) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(cl, fleet.Finalizer) {
		return reconcile.Result{}, nil
	}
	done, err := c.deleteClaimSandbox(ctx, cl)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !done {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	patch := client.MergeFromWithOptions(cl.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(cl, fleet.Finalizer)
	return reconcile.Result{}, client.IgnoreNotFound(c.c.Patch(ctx, cl, patch))
}

// expireClaim applies the claim's lifecycle once shutdownTime passed:
// Delete and DeleteForeground delete the claim (and so its Sandbox);
// Retain deletes the Sandbox and keeps the claim, Finished.
func (c *Controller) expireClaim(ctx context.Context, cl *extv1beta1.SandboxClaim) error {
	if p := cl.Spec.Lifecycle.ShutdownPolicy; p == extv1beta1.ShutdownPolicyDelete || p == extv1beta1.ShutdownPolicyDeleteForeground {
		return client.IgnoreNotFound(c.c.Delete(ctx, cl))
	}
	if _, err := c.deleteClaimSandbox(ctx, cl); err != nil {
		return err
	}
	msg := "spec.lifecycle.shutdownTime has passed; the sandbox is deleted (shutdownPolicy Retain keeps this claim)"
	orig := cl.DeepCopy()
	meta.SetStatusCondition(&cl.Status.Conditions, metav1.Condition{Type: condReady, Status: metav1.ConditionFalse, Reason: extv1beta1.ClaimExpiredReason, Message: msg, ObservedGeneration: cl.Generation})
	meta.SetStatusCondition(&cl.Status.Conditions, metav1.Condition{Type: string(sandboxv1beta1.SandboxConditionFinished), Status: metav1.ConditionTrue, Reason: extv1beta1.ClaimExpiredReason, Message: msg, ObservedGeneration: cl.Generation})
	cl.Status.SandboxStatus.PodIPs = nil
	if equality.Semantic.DeepEqual(orig.Status, cl.Status) {
		return nil
	}
	return c.c.Status().Patch(ctx, cl, client.MergeFrom(orig))
}
