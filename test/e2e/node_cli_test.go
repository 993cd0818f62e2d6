package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/kube/kubetest"
)

// TestNodeCLI: `cagebox node` against a real apiserver (envtest): it
// announces the node in its Lease (endpoint, capacity) and serves the
// fleet key at that endpoint; SIGTERM stops it cleanly and leaves the
// lease to expire; a node name whose lease another holder owns stops the
// node — daemon included — with the reason. (The multi-node fleet e2e is
// the lead's harness.)
func TestNodeCLI(t *testing.T) {
	cp, cfg := kubetest.Env(t, nil)
	u, err := cp.AddUser(envtest.User{Name: "cagebox-node", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kcFile, keyFile := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "admin.key")
	const key = "fleet-admin-key-node-cli-0123456789abcdef"
	if err := os.WriteFile(kcFile, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	leases := cs.CoordinationV1().Leases("default")

	e := newEnv(t)
	addr := freePort(t)
	node := func(name string) (*exec.Cmd, *bytes.Buffer) {
		t.Helper()
		var out bytes.Buffer
		cmd := exec.Command(filepath.Join(binDir, "cagebox"), "--home", e.home, "node",
			"--agent", filepath.Join(binDir, "cagebox-agent"), "--default-runtime", e2eRuntime(),
			"--listen", addr, "--admin-key-file", keyFile, "--kubeconfig", kcFile,
			"--namespace", "default", "--node-name", name, "--lease-duration", "3s")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, &out
	}
	wait := func(cmd *exec.Cmd, d time.Duration) (int, bool) {
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
			return cmd.ProcessState.ExitCode(), true
		case <-time.After(d):
			_ = cmd.Process.Kill()
			<-done
			return -1, false
		}
	}

	// A lease of that name held by another: the node stops, daemon too.
	other, secs, now := "someone-else", int32(3600), metav1.NewMicroTime(time.Now())
	if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: fleet.LeaseName("taken")},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &other, LeaseDurationSeconds: &secs, RenewTime: &now}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cmd, out := node("taken")
	code, exited := wait(cmd, 60*time.Second)
	if !exited || code == 0 || !strings.Contains(out.String(), "held by another holder") {
		t.Fatalf("node on another's lease: exited %v code %d:\n%s", exited, code, out.String())
	}
	if _, err := os.Stat(filepath.Join(e.home, "cagebox.sock")); err == nil {
		t.Fatalf("the daemon's socket is left after the node stopped:\n%s", out.String())
	}

	// A node of its own name: announced, served, stopped cleanly.
	t0 := time.Now()
	cmd, out = node("n1")
	var l *coordinationv1.Lease
	var capy fleet.Capacity
	deadline := time.Now().Add(60 * time.Second)
	for {
		l, err = leases.Get(ctx, fleet.LeaseName("n1"), metav1.GetOptions{})
		if err == nil {
			capy, err = fleet.ParseCapacity(l.Annotations[fleet.AnnCapacity])
			if err == nil && capy.Offers(e2eRuntime(), 0) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lease with the runtime %s offered within 60s (%v):\n%s", e2eRuntime(), err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("lease with capacity %s after start", time.Since(t0).Round(time.Millisecond))
	if l.Labels[fleet.NodeLabel] != "n1" || *l.Spec.HolderIdentity != "n1" || *l.Spec.LeaseDurationSeconds != 3 {
		t.Errorf("lease %+v", l)
	}
	endpoint := l.Annotations[fleet.AnnEndpoint]
	if endpoint != "http://"+addr {
		t.Errorf("endpoint %q, want http://%s", endpoint, addr)
	}
	if capy.MemoryTotal <= 0 || capy.Sandboxes != 0 || capy.DefaultRuntime != e2eRuntime() {
		t.Errorf("capacity %+v", capy)
	}
	c, err := client.NewTCP(endpoint, key, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if h, err := c.Health(ctx); err != nil || h.Tenant != "admin" {
		t.Fatalf("the fleet key at the advertised endpoint: %+v, %v", h, err)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if code, exited := wait(cmd, 30*time.Second); !exited || code != 0 {
		t.Fatalf("node after SIGTERM: exited %v code %d:\n%s", exited, code, out.String())
	}
	if _, err := leases.Get(ctx, fleet.LeaseName("n1"), metav1.GetOptions{}); err != nil {
		t.Fatalf("the lease after a clean stop: %v (it is left to expire)", err)
	}
}
