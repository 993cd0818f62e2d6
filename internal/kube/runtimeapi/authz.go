package runtimeapi

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ErrAuthUnavailable is an Authorize answer when the apiserver could
// not be asked (a 503, not kept).
var ErrAuthUnavailable = errors.New("cannot check the token now")

// authzTTL is how long a decision is kept.
const authzTTL = 30 * time.Second

// KubeAuthorizer authenticates a bearer token with a TokenReview and
// allows it for a namespace if a SubjectAccessReview says its user may
// create SandboxClaims there (extensions.agents.x-k8s.io): whoever may
// claim a sandbox in a namespace may drive the sandboxes of that
// namespace. Decisions are kept for 30 s.
func KubeAuthorizer(cs kubernetes.Interface) func(ctx context.Context, token, ns, name string) error {
	type decision struct {
		err error
		at  time.Time
	}
	var (
		// mu guards cache.
		mu    sync.Mutex
		cache = map[[32]byte]decision{}
	)
	return func(ctx context.Context, token, ns, _ string) error {
		key := sha256.Sum256([]byte(ns + "\x00" + token))
		mu.Lock()
		d, ok := cache[key]
		mu.Unlock()
		if ok && time.Since(d.at) < authzTTL {
			return d.err
		}
		err := kubeAuthorize(ctx, cs, token, ns)
		if ctx.Err() != nil || errors.Is(err, ErrAuthUnavailable) {
			return err
		}
		mu.Lock()
		if len(cache) > 10000 {
			clear(cache)
		}
		cache[key] = decision{err: err, at: time.Now()}
		mu.Unlock()
		return err
	}
}

func kubeAuthorize(ctx context.Context, cs kubernetes.Interface, token, ns string) error {
	tr, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("%w: token review: %v", ErrAuthUnavailable, err)
	}
	if !tr.Status.Authenticated {
		return fmt.Errorf("%w: the bearer token is not a valid Kubernetes token", ErrUnauthenticated)
	}
	u := tr.Status.User
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: "create", Group: "extensions.agents.x-k8s.io", Resource: "sandboxclaims",
		},
	}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("%w: subject access review: %v", ErrAuthUnavailable, err)
	}
	if !sar.Status.Allowed {
		return fmt.Errorf("%s may not create sandboxclaims in namespace %s, so may not drive its sandboxes", u.Username, ns)
	}
	return nil
}
