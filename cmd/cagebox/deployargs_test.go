//go:build !lite

package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The manifests in deploy/ start this binary: every flag their args pass
// must be one the commands take, with a value they accept (a renamed flag
// would otherwise surface only in a cluster, as a crash loop).
func TestDeployManifestsArgs(t *testing.T) {
	// $(VAR) is the kubelet's expansion of the container's env: a value
	// of the right shape stands in.
	vars := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	expand := func(args []string) []string {
		out := make([]string, len(args))
		for i, a := range args {
			out[i] = vars.ReplaceAllStringFunc(a, func(v string) string {
				switch v {
				case "$(HOST_IP)":
					return "192.0.2.10"
				case "$(INGRESS_DOMAIN)":
					return "sandboxes.example.com"
				default:
					return "x"
				}
			})
		}
		return out
	}
	container := func(spec corev1.PodSpec, name string) corev1.Container {
		for _, c := range spec.Containers {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no container %q", name)
		return corev1.Container{}
	}
	read := func(file string, into any) {
		b, err := os.ReadFile("../../deploy/" + file)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(firstDoc(b, into), into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	var ds appsv1.DaemonSet
	read("node-daemonset.yaml", &ds)
	var dep appsv1.Deployment
	read("controller-deployment.yaml", &dep)

	for _, c := range []struct {
		file string
		args []string // as the image's entrypoint passes them on
	}{
		// The node image's entrypoint is the binary: args name the command.
		{"node-daemonset.yaml", container(ds.Spec.Template.Spec, "node").Args},
		// The controller image's entrypoint is `cagebox controller`.
		{"controller-deployment.yaml", append([]string{"controller"}, container(dep.Spec.Template.Spec, "controller").Args...)},
	} {
		args := expand(c.args)
		root := newRoot()
		cmd, rest, err := root.Find(args)
		if err != nil || cmd == root {
			t.Fatalf("%s: args %q name no command: %v", c.file, args, err)
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Errorf("%s: %v (args %q)", c.file, err, strings.Join(args, " "))
		}
		if extra := cmd.Flags().Args(); len(extra) > 0 {
			t.Errorf("%s: stray arguments %q", c.file, extra)
		}
	}
}

// firstDoc is the document of a multi-document YAML file whose kind is
// into's (a DaemonSet or a Deployment).
func firstDoc(b []byte, into any) []byte {
	kind := "DaemonSet"
	if _, ok := into.(*appsv1.Deployment); ok {
		kind = "Deployment"
	}
	for _, d := range strings.Split(string(b), "\n---") {
		if regexp.MustCompile(`(?m)^kind:\s*` + kind + `\s*$`).MatchString(d) {
			return []byte(d)
		}
	}
	return nil
}
