// Package kubetest starts a real Kubernetes control plane for tests: the
// kube-apiserver and etcd binaries that scripts/kube-testbin.sh builds,
// run by controller-runtime's envtest, with the agent-sandbox CRDs of
// deploy/crds installed (v1beta1 only, without the conversion webhook:
// deploy/crdgen makes them from the pinned module).
//
// A test that needs it calls Start; without KUBEBUILDER_ASSETS the test
// is skipped with the reason, unless CAGEBOX_REQUIRE_KUBE=1 (CI), where
// it fails.
package kubetest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cagebox/cagebox/internal/kube/kubetypes"
)

// Assets is the directory of the kube-apiserver and etcd binaries
// (KUBEBUILDER_ASSETS), or "" with why there is none.
func Assets() (dir, why string) {
	dir = os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return "", "KUBEBUILDER_ASSETS is not set (run scripts/kube-testbin.sh and export KUBEBUILDER_ASSETS to the directory it prints)"
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Sprintf("KUBEBUILDER_ASSETS=%s has no %s (run scripts/kube-testbin.sh)", dir, bin)
		}
	}
	return dir, ""
}

// Require skips t when there is no control plane to start, or fails it
// when CAGEBOX_REQUIRE_KUBE=1; it returns the assets directory.
func Require(t testing.TB) string {
	t.Helper()
	dir, why := Assets()
	if dir != "" {
		return dir
	}
	if os.Getenv("CAGEBOX_REQUIRE_KUBE") == "1" {
		t.Fatalf("CAGEBOX_REQUIRE_KUBE=1 but %s", why)
	}
	t.Skip(why)
	return ""
}

// Env starts a control plane for t (stopped when t ends) with the CRDs of
// deploy/crds installed; configure, if not nil, adjusts the environment
// first (an apiserver address, a scheme). It returns the started
// environment (AddUser for more identities) and an admin config.
func Env(t testing.TB, configure func(*envtest.Environment)) (*envtest.Environment, *rest.Config) {
	t.Helper()
	assets := Require(t)
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		Scheme:                kubetypes.Scheme,
		CRDDirectoryPaths:     []string{CRDDir(t)},
		ErrorIfCRDPathMissing: true,
	}
	if configure != nil {
		configure(env)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start the control plane (%s): %v", assets, err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stop the control plane: %v", err)
		}
	})
	return env, cfg
}

// Start is Env with the defaults, and a client with kubetypes.Scheme.
func Start(t testing.TB) (*rest.Config, client.Client) {
	t.Helper()
	_, cfg := Env(t, nil)
	c, err := client.New(cfg, client.Options{Scheme: kubetypes.Scheme})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return cfg, c
}

// CRDDir is the repository's deploy/crds.
func CRDDir(t testing.TB) string {
	t.Helper()
	root := repoRoot()
	if root == "" {
		t.Fatal("kubetest: the repository's source is not at hand (deploy/crds)")
	}
	return filepath.Join(root, "deploy", "crds")
}

// repoRoot is the directory of go.mod above this file ("" when the
// source is not at hand).
func repoRoot() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return ""
	}
	dir := filepath.Dir(file)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// WriteKubeconfig writes a kubeconfig file for cfg (a control plane from
// Start) into t's temporary directory and returns its path, for commands
// that take --kubeconfig.
func WriteKubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("write kubeconfig: %v", err)
	}
	return path
}
