//go:build !lite

package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cagebox/cagebox/internal/kube/controller"
	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/kube/kubetest"
)

func writeKey(t *testing.T, key string) string {
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestControllerFlags(t *testing.T) {
	good := writeKey(t, strings.Repeat("k", 40))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--node-key-file is required"},
		{[]string{"--node-key-file", writeKey(t, "short")}, "at least 32"},
		{[]string{"--node-key-file", good, "--best-of", "0"}, "--best-of 0"},
		{[]string{"--node-key-file", good, "--resync", "1ms"}, "--resync"},
		{[]string{"--node-key-file", good, "--ingress", ":8443"}, "needs --ingress-domain"},
		{[]string{"--node-key-file", good, "--node-ca", "/nonexistent/ca.pem"}, "--node-ca"},
		{[]string{"--node-key-file", good, "--kubeconfig", "/nonexistent/kubeconfig"}, "--kubeconfig /nonexistent/kubeconfig"},
	} {
		root := newRoot()
		root.SetArgs(append([]string{"controller"}, c.args...))
		err := root.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}

// `cagebox controller` against a real apiserver: /readyz answers, and a
// Sandbox with no node to run it is marked Unschedulable with a message.
func TestControllerCommandReconciles(t *testing.T) {
	rc, c := kubetest.Start(t)
	kubeconfig := kubetest.WriteKubeconfig(t, rc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	health := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	for _, ns := range []string{fleet.DefaultNamespace, "team"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	root := newRoot()
	root.SetArgs([]string{"controller", "--kubeconfig", kubeconfig, "--node-key-file", writeKey(t, strings.Repeat("x", 48)),
		"--health", health, "--resync", "500ms", "--log-level", "warn"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("controller exited: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("controller did not stop")
		}
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + health + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not OK: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sb := &sandboxv1beta1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "team"},
		Spec: sandboxv1beta1.SandboxSpec{SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{PodTemplate: sandboxv1beta1.PodTemplate{
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}},
		}}},
	}
	if err := c.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	for {
		var got sandboxv1beta1.Sandbox
		if err := c.Get(ctx, client.ObjectKeyFromObject(sb), &got); err != nil {
			t.Fatal(err)
		}
		r := meta.FindStatusCondition(got.Status.Conditions, "Ready")
		if r != nil && r.Reason == controller.ReasonUnschedulable {
			if !strings.Contains(r.Message, "no live cagebox node") || len(got.Finalizers) != 1 {
				t.Errorf("Ready %+v finalizers %v", r, got.Finalizers)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Unschedulable condition: %+v", got.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
