package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/kube/fleet"
)

const testNS = "agents"

// The real value of the credential: it must appear at the upstream and
// nowhere else (guest, objects, events, logs).
const realToken = "ghp_FleetR3alT0kenNeverInTheGuest0000001"

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// cli runs the real CLI against a node's API as the fleet admin.
func (c *cluster) cli(n *node, args ...string) (string, string, int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "cagebox"), args...)
	cmd.Env = append(os.Environ(), "CAGEBOX_HOST="+n.endpoint, "CAGEBOX_API_KEY="+c.key, "CAGEBOX_CA_CERT="+c.caFile)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("cagebox %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func (c *cluster) nodeByName(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no node %q", name)
	return nil
}

// waitReady waits until the Sandbox is Ready (on a node other than
// notOn, when given) and returns it.
func (c *cluster) waitReady(name string, d time.Duration, notOn string) *sandboxv1beta1.Sandbox {
	c.t.Helper()
	deadline := time.Now().Add(d)
	var sb sandboxv1beta1.Sandbox
	for {
		err := c.k.Get(context.Background(), types.NamespacedName{Namespace: testNS, Name: name}, &sb)
		if err == nil && meta.IsStatusConditionTrue(sb.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady)) &&
			sb.Status.NodeName != "" && sb.Annotations[fleet.AnnSandboxID] != "" && sb.Status.NodeName != notOn {
			return &sb
		}
		if time.Now().After(deadline) {
			js, _ := json.MarshalIndent(sb.Status, "", "  ")
			c.t.Fatalf("sandbox %s not ready after %v (get: %v); status %s annotations %v", name, d, err, js, sb.Annotations)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cluster) create(obj ctrlclient.Object) {
	c.t.Helper()
	if err := c.k.Create(context.Background(), obj); err != nil {
		c.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

func podTemplate(img string, ann map[string]string, env ...corev1.EnvVar) sandboxv1beta1.PodTemplate {
	return sandboxv1beta1.PodTemplate{
		ObjectMeta: sandboxv1beta1.PodMetadata{Annotations: ann},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "agent", Image: img, Env: env,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}},
		}}},
	}
}

// nodeSandboxes lists the controller-made sandboxes on a node.
func (c *cluster) nodeSandboxes(n *node) []api.Sandbox {
	c.t.Helper()
	l, err := c.api(n).ListLabeled(ctxT(c.t, 30*time.Second), map[string]string{fleet.LabelManagedBy: fleet.ManagedBy})
	if err != nil {
		c.t.Fatalf("node %s list: %v", n.name, err)
	}
	return l
}

// TestFleet runs the whole story on three node agents: registration, a
// Sandbox with egress policy and a credential swap through its node's
// gateway, warm-pool claims, the fleet ingress, a node lost and its
// claims placed again, and deletion with nothing left on any node.
func TestFleet(t *testing.T) {
	c := newCluster(t, 3)
	ctx := context.Background()
	if err := c.k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}); err != nil {
		t.Fatal(err)
	}

	t.Run("nodes register", func(t *testing.T) {
		var l coordinationv1.LeaseList
		if err := c.k.List(ctx, &l, ctrlclient.InNamespace(fleetNS), ctrlclient.HasLabels{fleet.NodeLabel}); err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, ls := range l.Items {
			n := ls.Labels[fleet.NodeLabel]
			got[n] = true
			if ls.Name != fleet.LeaseName(n) || ls.Spec.HolderIdentity == nil || *ls.Spec.HolderIdentity != n {
				t.Errorf("lease %s: holder %v label %s", ls.Name, ls.Spec.HolderIdentity, n)
			}
			capa, err := fleet.ParseCapacity(ls.Annotations[fleet.AnnCapacity])
			if err != nil || !capa.Offers(kubeRuntime(), 0) || capa.MemoryAvailable <= 0 {
				t.Errorf("lease %s capacity %+v: %v", ls.Name, capa, err)
			}
			if want := c.nodeByName(n).endpoint; ls.Annotations[fleet.AnnEndpoint] != want {
				t.Errorf("lease %s endpoint %q, want %q", ls.Name, ls.Annotations[fleet.AnnEndpoint], want)
			}
		}
		if len(got) != 3 {
			t.Fatalf("node leases: %v", got)
		}
	})

	// A Sandbox with a credential from a Kubernetes Secret, bound to the
	// upstream host, and an egress policy allowing two hosts.
	if err := c.k.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "gh"},
		Data: map[string][]byte{"token": []byte(realToken)}}); err != nil {
		t.Fatal(err)
	}
	ann := map[string]string{
		fleet.AnnAllow: upHost + "," + otherHost,
		fleet.AnnSecretHostsPrefix + "GITHUB_TOKEN": upHost,
	}
	secretEnv := corev1.EnvVar{Name: "GITHUB_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "gh"}, Key: "token"}}}
	c.create(&sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "sb1"},
		Spec: sandboxv1beta1.SandboxSpec{SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{
			PodTemplate: podTemplate("default", ann, secretEnv, corev1.EnvVar{Name: "GREETING", Value: "hi"})}}})

	t.Run("sandbox with a credential swap", func(t *testing.T) {
		sb := c.waitReady("sb1", 90*time.Second, "")
		if !controllerutilContains(sb.Finalizers, fleet.Finalizer) {
			t.Errorf("finalizers %v: want %s", sb.Finalizers, fleet.Finalizer)
		}
		n := c.nodeByName(sb.Status.NodeName)
		id := sb.Annotations[fleet.AnnSandboxID]
		out, errs, code := c.cli(n, "exec", id, "--", "sh", "-c", `printf '%s %s' "$GREETING" "$GITHUB_TOKEN"`)
		if code != 0 {
			t.Fatalf("exec through the node API: %d %s %s", code, out, errs)
		}
		f := strings.Fields(out)
		if len(f) != 2 || f[0] != "hi" || !strings.HasPrefix(f[1], "ghp_") || f[1] == realToken || len(f[1]) != len(realToken) {
			t.Fatalf("guest env %q: want hi and a placeholder of the token's shape", out)
		}
		out, errs, code = c.cli(n, "exec", id, "--", "sh", "-c", `curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://`+upHost+`/swap`)
		if code != 0 || !strings.Contains(out, "hello from upstream") {
			t.Fatalf("curl to the bound host: %d %q %q", code, out, errs)
		}
		reqs := c.up.requests()
		if len(reqs) == 0 || !strings.Contains(reqs[len(reqs)-1], "auth=Bearer "+realToken) {
			t.Fatalf("upstream saw %q: want the real token swapped in", reqs)
		}
		// The placeholder to another allowed host is refused; a host the
		// policy does not name is refused.
		n0 := len(c.up.requests())
		out, _, _ = c.cli(n, "exec", id, "--", "sh", "-c", `curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://`+otherHost+`/leak`)
		if !strings.Contains(out, "denied") {
			t.Errorf("placeholder to another host: %q", out)
		}
		out, _, _ = c.cli(n, "exec", id, "--", "sh", "-c", `curl -sS https://example.com/ 2>&1; echo rc=$?`)
		if strings.Contains(out, "rc=0") && !strings.Contains(out, "denied") {
			t.Errorf("a host outside the policy: %q", out)
		}
		if len(c.up.requests()) != n0 {
			t.Errorf("the upstream got a refused request: %v", c.up.requests()[n0:])
		}
	})

	t.Run("bad template refused with a reason", func(t *testing.T) {
		c.create(&sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "nohosts"},
			Spec: sandboxv1beta1.SandboxSpec{SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{
				PodTemplate: podTemplate("busybox", nil, secretEnv)}}})
		deadline := time.Now().Add(30 * time.Second)
		for {
			var sb sandboxv1beta1.Sandbox
			if err := c.k.Get(ctx, types.NamespacedName{Namespace: testNS, Name: "nohosts"}, &sb); err != nil {
				t.Fatal(err)
			}
			cond := meta.FindStatusCondition(sb.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady))
			if cond != nil && cond.Status == metav1.ConditionFalse && strings.Contains(cond.Message, fleet.AnnSecretHostsPrefix+"GITHUB_TOKEN") {
				if sb.Annotations[fleet.AnnSandboxID] != "" {
					t.Errorf("a sandbox was made for a refused template: %v", sb.Annotations)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no Ready=False condition naming the missing annotation: %+v", sb.Status.Conditions)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := c.k.Delete(ctx, &sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "nohosts"}}); err != nil {
			t.Fatal(err)
		}
	})

	// A warm pool of 3 busybox sandboxes, a published public port.
	tplAnn := map[string]string{fleet.AnnPublicPorts: "8080"}
	tpl := podTemplate("busybox", tplAnn)
	tpl.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}}
	c.create(&extv1beta1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "bb"},
		Spec: extv1beta1.SandboxTemplateSpec{SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{PodTemplate: tpl},
			EnvVarsInjectionPolicy: extv1beta1.EnvVarsInjectionPolicyAllowed}})
	three := int32(3)
	c.create(&extv1beta1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "warm"},
		Spec: extv1beta1.SandboxWarmPoolSpec{Replicas: &three, TemplateRef: extv1beta1.SandboxTemplateRef{Name: "bb"}}})

	t.Run("warm pool fills across nodes", func(t *testing.T) {
		deadline := time.Now().Add(90 * time.Second)
		for {
			var wp extv1beta1.SandboxWarmPool
			if err := c.k.Get(ctx, types.NamespacedName{Namespace: testNS, Name: "warm"}, &wp); err != nil {
				t.Fatal(err)
			}
			if wp.Status.ReadyReplicas >= 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("warm pool status %+v after 90 s", wp.Status)
			}
			time.Sleep(200 * time.Millisecond)
		}
		spread := 0
		for _, n := range c.nodes {
			p, err := c.api(n).Pools(ctxT(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range p.Pools {
				if s.Ready > 0 {
					spread++
				}
			}
		}
		if spread < 2 {
			t.Errorf("the pool's sandboxes are on %d node(s): want them spread", spread)
		}
	})

	var claimNode string
	t.Run("claim served from the pool", func(t *testing.T) {
		start := time.Now()
		c.create(&extv1beta1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "c1"},
			Spec: extv1beta1.SandboxClaimSpec{WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: "warm"},
				Env: []extv1beta1.EnvVar{{Name: "JOB", Value: "42"}}}})
		sb := c.waitReady("c1", 60*time.Second, "")
		n := c.nodeByName(sb.Status.NodeName)
		out, errs, code := c.cli(n, "exec", sb.Annotations[fleet.AnnSandboxID], "--", "sh", "-c", `echo job=$JOB`)
		took := time.Since(start)
		if code != 0 || strings.TrimSpace(out) != "job=42" {
			t.Fatalf("exec in the claim's sandbox: %d %q %q", code, out, errs)
		}
		t.Logf("claim → first exec (pool hit): %v", took.Round(time.Millisecond))
		if sb.Annotations[fleet.AnnLaunch] != "warm" {
			t.Errorf("launch %q: want warm (the pool had ready sandboxes)", sb.Annotations[fleet.AnnLaunch])
		}
		var cl extv1beta1.SandboxClaim
		if err := c.k.Get(ctx, types.NamespacedName{Namespace: testNS, Name: "c1"}, &cl); err != nil {
			t.Fatal(err)
		}
		if cl.Status.SandboxStatus.Name != "c1" {
			t.Errorf("claim status %+v", cl.Status)
		}
		claimNode = sb.Status.NodeName
	})

	t.Run("fleet ingress routes to the node", func(t *testing.T) {
		var sb sandboxv1beta1.Sandbox
		if err := c.k.Get(ctx, types.NamespacedName{Namespace: testNS, Name: "c1"}, &sb); err != nil {
			t.Fatal(err)
		}
		id := sb.Annotations[fleet.AnnSandboxID]
		n := c.nodeByName(sb.Status.NodeName)
		if _, errs, code := c.cli(n, "exec", id, "--", "sh", "-c", `mkdir -p /tmp/www && echo "served by $HOSTNAME" > /tmp/www/index.html && httpd -p 8080 -h /tmp/www`); code != 0 {
			t.Fatalf("start httpd: %s", errs)
		}
		host := fmt.Sprintf("8080-%s.%s", id, domain)
		if !strings.Contains(sb.Annotations[fleet.AnnURLs], host) {
			t.Errorf("urls annotation %q: want %s", sb.Annotations[fleet.AnnURLs], host)
		}
		hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: c.pki.Pool},
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", c.ingress)
			}}}
		var body []byte
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp, err := hc.Get("https://" + host + "/index.html")
			if err == nil {
				body, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
				err = fmt.Errorf("status %d: %s", resp.StatusCode, body)
			}
			if time.Now().After(deadline) {
				t.Fatalf("through the fleet ingress: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !strings.Contains(string(body), "served by") {
			t.Fatalf("body %q", body)
		}
		// An unknown sandbox gets nothing.
		if resp, err := hc.Get("https://8080-sb_nosuch." + domain + "/"); err == nil {
			resp.Body.Close()
			t.Errorf("unknown sandbox answered %d", resp.StatusCode)
		}
	})

	t.Run("a lost node's claims are placed again", func(t *testing.T) {
		lost := c.nodeByName(claimNode)
		var before sandboxv1beta1.Sandbox
		if err := c.k.Get(ctx, types.NamespacedName{Namespace: testNS, Name: "c1"}, &before); err != nil {
			t.Fatal(err)
		}
		oldID := before.Annotations[fleet.AnnSandboxID]
		start := time.Now()
		lost.stop(syscall.SIGKILL)
		sb := c.waitReady("c1", 60*time.Second, lost.name)
		t.Logf("node %s killed: claim c1 ready again on %s after %v (lease 4 s)", lost.name, sb.Status.NodeName, time.Since(start).Round(time.Millisecond))
		if sb.Annotations[fleet.AnnSandboxID] == oldID {
			t.Errorf("same sandbox id %s after re-placement", oldID)
		}
		n := c.nodeByName(sb.Status.NodeName)
		if out, errs, code := c.cli(n, "exec", sb.Annotations[fleet.AnnSandboxID], "--", "sh", "-c", "echo job=$JOB"); code != 0 || strings.TrimSpace(out) != "job=42" {
			t.Fatalf("exec after re-placement: %d %q %q", code, out, errs)
		}
		// The lost node comes back: its stale copy is removed.
		lost.start(t)
		deadline := time.Now().Add(60 * time.Second)
		for {
			left := 0
			if l, err := c.api(lost).ListLabeled(ctxT(t, 10*time.Second), map[string]string{fleet.LabelUID: string(sb.UID)}); err == nil {
				left = len(l)
			} else {
				left = -1
			}
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the returned node still has the re-placed claim's old sandbox (%d)", left)
			}
			time.Sleep(250 * time.Millisecond)
		}
	})

	t.Run("no secret in objects, events or logs", func(t *testing.T) {
		var dump bytes.Buffer
		for _, l := range []ctrlclient.ObjectList{&sandboxv1beta1.SandboxList{}, &extv1beta1.SandboxClaimList{},
			&extv1beta1.SandboxTemplateList{}, &extv1beta1.SandboxWarmPoolList{}, &corev1.EventList{}, &coordinationv1.LeaseList{}} {
			if err := c.k.List(ctx, l); err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(l)
			dump.Write(b)
		}
		var events corev1.EventList
		_ = c.k.List(ctx, &events)
		if len(events.Items) == 0 {
			t.Errorf("the controller recorded no Events")
		}
		for _, n := range c.nodes {
			dump.WriteString(n.logText())
		}
		dump.WriteString(c.ctrlLog.String())
		if bytes.Contains(dump.Bytes(), []byte(realToken)) {
			t.Fatalf("the real token is in an object, an event or a log")
		}
	})

	t.Run("delete leaves nothing on any node", func(t *testing.T) {
		for _, o := range []ctrlclient.Object{
			&extv1beta1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "c1"}},
			&sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "sb1"}},
			&extv1beta1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "warm"}},
		} {
			if err := c.k.Delete(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			var l sandboxv1beta1.SandboxList
			if err := c.k.List(ctx, &l, ctrlclient.InNamespace(testNS)); err != nil {
				t.Fatal(err)
			}
			left := len(l.Items)
			for _, n := range c.nodes {
				left += len(c.nodeSandboxes(n))
				if p, err := c.api(n).Pools(ctxT(t, 10*time.Second)); err == nil {
					for _, s := range p.Pools {
						left += s.Ready
					}
				}
			}
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d sandboxes (objects, node sandboxes, pooled) left 60 s after delete", left)
			}
			time.Sleep(250 * time.Millisecond)
		}
		var cl extv1beta1.SandboxClaim
		if err := c.k.Get(ctx, types.NamespacedName{Namespace: testNS, Name: "c1"}, &cl); !apierrors.IsNotFound(err) {
			t.Errorf("claim still there: %v", err)
		}
		// No sandbox link is left in any node's namespace.
		for i, n := range c.nodes {
			out, _ := exec.Command("ip", "-n", n.netns, "-o", "link").CombinedOutput()
			if strings.Contains(string(out), fmt.Sprintf("ck%d", i+1)) {
				t.Errorf("node %s has links left:\n%s", n.name, out)
			}
		}
	})
}

func controllerutilContains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func readyTrue(sb *sandboxv1beta1.Sandbox) bool {
	return meta.IsStatusConditionTrue(sb.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady))
}
