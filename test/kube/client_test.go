package kube

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/agent-sandbox/clients/go/sandbox"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/kube/fleet"
)

// The upstream sample template's image, which the controller maps to the
// nodes' default image (startController's --image-map).
const upstreamRuntimeImage = "us-central1-docker.pkg.dev/k8s-staging-images/agent-sandbox/python-runtime-sandbox:latest-main"

// bearer adds a Kubernetes token to every request of the official client
// (its Options.HTTPTransport): the router authenticates it.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// userToken makes service account sa in ns allowed to claim sandboxes
// there (as a user of the agent-sandbox clients needs) and returns its
// token and a rest config of it.
func (c *cluster) userToken(t *testing.T, ns, sa string, mayClaim bool) (string, *rest.Config) {
	t.Helper()
	ctx := context.Background()
	c.create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}})
	if mayClaim {
		c.create(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"extensions.agents.x-k8s.io"}, Resources: []string{"sandboxclaims"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
			{APIGroups: []string{"agents.x-k8s.io"}, Resources: []string{"sandboxes"}, Verbs: []string{"get", "list", "watch"}},
		}})
		c.create(&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: sa},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}})
	}
	cs, err := kubernetes.NewForConfig(c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(c.cfg)
	cfg.BearerToken = tr.Status.Token
	return tr.Status.Token, cfg
}

// TestOfficialGoClient drives the agent-sandbox project's own Go client
// (sigs.k8s.io/agent-sandbox/clients/go/sandbox v1.0.3, unchanged) in
// Direct URL mode against the controller's sandbox router: upstream's
// sample template (its image mapped by the operator) and a warm pool,
// CreateSandbox, Run (stdout, exit codes), Write/Read/List/Exists, and
// Delete; a token that may not claim in the namespace is refused.
func TestOfficialGoClient(t *testing.T) {
	c := newCluster(t, 2)
	ctx := ctxT(t, 4*time.Minute)
	const ns = "client-go"
	c.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	tpl := &extv1beta1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "python-sandbox-template"},
		Spec: extv1beta1.SandboxTemplateSpec{SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{PodTemplate: podTemplate(upstreamRuntimeImage, nil)}}}
	tpl.Spec.PodTemplate.Spec.Containers[0].Name = "python-runtime"
	tpl.Spec.PodTemplate.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8888}}
	c.create(tpl)
	c.create(&extv1beta1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "python-pool"},
		Spec: extv1beta1.SandboxWarmPoolSpec{Replicas: ptr.To(int32(1)), TemplateRef: extv1beta1.SandboxTemplateRef{Name: tpl.Name}}})

	// The pool is filled before the client claims, so the claim is a
	// pool hit.
	for deadline := time.Now().Add(2 * time.Minute); ; {
		var wp extv1beta1.SandboxWarmPool
		if err := c.k.Get(ctx, ctrlclient.ObjectKey{Namespace: ns, Name: "python-pool"}, &wp); err != nil {
			t.Fatal(err)
		}
		if wp.Status.ReadyReplicas >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm pool not ready: %+v", wp.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}

	token, cfg := c.userToken(t, ns, "alice", true)
	cl, err := sandbox.NewClient(ctx, sandbox.Options{
		APIURL:              "http://" + c.router,
		RestConfig:          cfg,
		HTTPTransport:       bearer{token: token, next: http.DefaultTransport},
		SandboxReadyTimeout: 2 * time.Minute,
		Quiet:               true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	sb, err := cl.CreateSandbox(ctx, "python-pool", ns)
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	t.Logf("CreateSandbox from the warm pool: %v (claim %s, sandbox %s)", time.Since(t0).Round(time.Millisecond), sb.ClaimName(), sb.SandboxName())

	t1 := time.Now()
	res, err := sb.Run(ctx, "echo hello from cagebox")
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("first Run: %v", time.Since(t1).Round(time.Millisecond))
	if res.ExitCode != 0 || res.Stdout != "hello from cagebox\n" {
		t.Fatalf("Run echo: %+v", res)
	}
	res, err = sb.Run(ctx, `sh -c 'echo oops >&2; exit 3'`)
	if err != nil || res.ExitCode != 3 || res.Stderr != "oops\n" {
		t.Fatalf("failing command: %+v %v", res, err)
	}
	res, err = sb.Run(ctx, "no-such-command-here")
	if err != nil || res.ExitCode == 0 {
		t.Fatalf("missing command: %+v %v", res, err)
	}

	if err := sb.Write(ctx, "notes.txt", []byte("written by the official client\n")); err != nil {
		t.Fatalf("Write: %v", err)
	}
	b, err := sb.Read(ctx, "notes.txt")
	if err != nil || string(b) != "written by the official client\n" {
		t.Fatalf("Read: %q %v", b, err)
	}
	res, err = sb.Run(ctx, "cat notes.txt")
	if err != nil || res.Stdout != "written by the official client\n" {
		t.Fatalf("the command sees the written file in its working directory: %+v %v", res, err)
	}
	entries, err := sb.List(ctx, ".")
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if !slices.ContainsFunc(entries, func(e sandbox.FileEntry) bool {
		return e.Name == "notes.txt" && e.Size == int64(len("written by the official client\n")) && e.Type == "file"
	}) {
		t.Fatalf("List: %+v", entries)
	}
	for p, want := range map[string]bool{"notes.txt": true, "nope.txt": false} {
		if ok, err := sb.Exists(ctx, p); err != nil || ok != want {
			t.Fatalf("Exists(%s) = %v %v", p, ok, err)
		}
	}
	if _, err := sb.Read(ctx, "nope.txt"); err == nil {
		t.Fatal("Read of a missing file succeeded")
	}
	var herr *sandbox.HTTPError
	if _, err := sb.Read(ctx, "../etc/passwd"); !errors.As(err, &herr) || herr.StatusCode != http.StatusForbidden {
		t.Fatalf("Read outside the base directory: %v", err)
	}

	// Router overhead: the same command through the router and through
	// the node API directly (as the controller holds it), 20 times each.
	var got0 sandboxv1beta1.Sandbox
	if err := c.k.Get(ctx, ctrlclient.ObjectKey{Namespace: ns, Name: sb.SandboxName()}, &got0); err != nil {
		t.Fatal(err)
	}
	direct := c.api(c.nodeByName(got0.Status.NodeName))
	var viaRouter, viaNode []time.Duration
	for range 20 {
		t0 := time.Now()
		if res, err := sb.Run(ctx, "true"); err != nil || res.ExitCode != 0 {
			t.Fatalf("Run true: %+v %v", res, err)
		}
		viaRouter = append(viaRouter, time.Since(t0))
		t0 = time.Now()
		if f, err := direct.Exec(ctx, got0.Annotations[fleet.AnnSandboxID], &api.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard); err != nil || f.ExitCode == nil || *f.ExitCode != 0 {
			t.Fatalf("node exec true: %+v %v", f, err)
		}
		viaNode = append(viaNode, time.Since(t0))
	}
	pct := func(d []time.Duration, p int) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[(len(d)-1)*p/100].Round(100 * time.Microsecond)
	}
	t.Logf("Run true: via the router p50 %v p99 %v; node API directly p50 %v p99 %v",
		pct(viaRouter, 50), pct(viaRouter, 99), pct(viaNode, 50), pct(viaNode, 99))

	// It came from the pool: a warm launch on a node.
	var got sandboxv1beta1.Sandbox
	if err := c.k.Get(ctx, ctrlclient.ObjectKey{Namespace: ns, Name: sb.SandboxName()}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Annotations[fleet.AnnLaunch] != "warm" {
		t.Errorf("launch %q, want warm (served from the pool)", got.Annotations[fleet.AnnLaunch])
	}

	// A token of someone who may not claim sandboxes in the namespace
	// drives none of them; no token at all is a 401.
	other, _ := c.userToken(t, ns, "mallory", false)
	for tok, want := range map[string]int{other: http.StatusForbidden, "": http.StatusUnauthorized} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.router+"/execute", strings.NewReader(`{"command":"id"}`))
		req.Header.Set("X-Sandbox-ID", sb.SandboxName())
		req.Header.Set("X-Sandbox-Namespace", ns)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("execute with token %.8q: %d, want %d", tok, resp.StatusCode, want)
		}
	}

	claim := sb.ClaimName()
	if err := cl.DeleteSandbox(ctx, claim, ns); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var l sandboxv1beta1.SandboxList
		if err := c.k.List(ctx, &l, ctrlclient.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		gone := true
		for _, s := range l.Items {
			if s.Name == got.Name {
				gone = false
			}
		}
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still there after DeleteSandbox", got.Name)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cl.DeleteAll(ctx)
}
