// Package kubetest starts a real Kubernetes control plane for tests: the
// kube-apiserver and etcd binaries that scripts/kube-testbin.sh builds,
// run by controller-runtime's envtest, with the agent-sandbox CRDs
// installed (v1beta1 only, without the conversion webhook: cagebox
// serves v1beta1 and installs no webhook).
//
// A test that needs it calls Start; without KUBEBUILDER_ASSETS the test
// is skipped with the reason, unless CAGEBOX_REQUIRE_KUBE=1 (CI), where
// it fails.
package kubetest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cagebox/cagebox/internal/kube/kubetypes"
)

// AgentSandboxModule is the Go module whose CRD YAML (k8s/crds) the tests
// install when the repository has no deploy/crds yet.
const AgentSandboxModule = "sigs.k8s.io/agent-sandbox"

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

// Start runs a control plane for t (stopped when t ends) with the CRDs of
// crdDirs installed — by default the repository's deploy/crds, or the
// agent-sandbox module's own YAML when that directory does not exist —
// and returns its config and a client with kubetypes.Scheme.
func Start(t testing.TB, crdDirs ...string) (*rest.Config, client.Client) {
	t.Helper()
	assets := Require(t)
	if len(crdDirs) == 0 {
		crdDirs = []string{DefaultCRDDir(t)}
	}
	crds, err := LoadCRDs(crdDirs...)
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		Scheme:                kubetypes.Scheme,
		CRDs:                  crds,
		ErrorIfCRDPathMissing: true,
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
	c, err := client.New(cfg, client.Options{Scheme: kubetypes.Scheme})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return cfg, c
}

// DefaultCRDDir is deploy/crds of the repository t runs in when it
// exists, else the agent-sandbox module's k8s/crds.
func DefaultCRDDir(t testing.TB) string {
	t.Helper()
	if root := repoRoot(); root != "" {
		d := filepath.Join(root, "deploy", "crds")
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return d
		}
	}
	d, err := UpstreamCRDDir()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// UpstreamCRDDir is the agent-sandbox module's CRD directory in the
// module cache (the version go.mod pins).
func UpstreamCRDDir() (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", AgentSandboxModule)
	if root := repoRoot(); root != "" {
		cmd.Dir = root
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w: %s", AgentSandboxModule, err, strings.TrimSpace(stderr.String()))
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("go list -m %s: module not downloaded (run go mod download)", AgentSandboxModule)
	}
	return filepath.Join(dir, "k8s", "crds"), nil
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

// LoadCRDs reads every CustomResourceDefinition in the .yaml/.yml/.json
// files of dirs, each passed through ServeOnly.
func LoadCRDs(dirs ...string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("crd directory: %w", err)
		}
		for _, e := range entries {
			switch filepath.Ext(e.Name()) {
			case ".yaml", ".yml", ".json":
			default:
				continue
			}
			crds, err := readCRDs(filepath.Join(dir, e.Name()))
			if err != nil {
				return nil, err
			}
			out = append(out, crds...)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no CustomResourceDefinition in %s", strings.Join(dirs, ", "))
	}
	return out, nil
}

func readCRDs(path string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("crd: %w", err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []*apiextensionsv1.CustomResourceDefinition
	for {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := dec.Decode(crd); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("crd %s: %w", path, err)
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue
		}
		ServeOnly(crd, "v1beta1")
		out = append(out, crd)
	}
}

// ServeOnly keeps version (and drops the others) and the conversion
// webhook of crd: with one version there is nothing to convert. It is
// what cagebox installs (deploy/crds).
func ServeOnly(crd *apiextensionsv1.CustomResourceDefinition, version string) {
	var keep []apiextensionsv1.CustomResourceDefinitionVersion
	for _, v := range crd.Spec.Versions {
		if v.Name == version {
			v.Served, v.Storage = true, true
			keep = append(keep, v)
		}
	}
	crd.Spec.Versions = keep
	crd.Spec.Conversion = nil
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
