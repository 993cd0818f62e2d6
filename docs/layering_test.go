package docs_test

import (
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/cagebox/cagebox/"

// leaves import no cagebox package (hexdigit, the one shared atom, aside):
// anything may use them, and they can be read and tested alone.
var leaves = []string{
	"api",
	"internal/cgroups",
	"internal/cleanup",
	"internal/errdefs",
	"internal/hexdigit",
	"internal/hostname",
	"internal/image/unpack",
	"internal/kube/kubetypes",
	"internal/mounts",
	"internal/reserved",
	"internal/resign",
	"internal/rootfs",
	"internal/sniff",
	"internal/sqlitedb",
	"internal/statedir",
	"internal/store",
	"internal/syncbuf",
	"internal/tarx",
	"internal/testbin",
	"internal/testpki",
	"internal/vmproc",
	"internal/webhook",
}

// runtimeSupport are the packages the runtimes (isolation/...) are built
// from besides the leaves. They sit below isolation: none imports it, and
// none imports anything of the daemon's side.
var runtimeSupport = []string{
	"agentproto",
	"internal/image",
	"internal/kvm",
	"internal/syscallaudit",
	"internal/vmimage",
	"internal/vmnet",
}

// cliMustNotLink are what the CLI (cmd/cagebox built with -tags lite) must
// not link: the daemon's side, the runtimes and the Kubernetes code, whose
// initialisation made every `cagebox` start cost ~35 ms (issue 26). The CLI
// execs cagebox-server for the commands that need them.
var cliMustNotLink = []string{
	module + "internal/daemon",
	module + "internal/sandbox",
	module + "internal/gateway",
	module + "internal/egress",
	module + "internal/credentials",
	module + "internal/vault",
	module + "internal/store/sqlite",
	module + "internal/kube/",
	module + "isolation",
	"k8s.io/",
	"sigs.k8s.io/",
	// The MCP SDK: `cagebox mcp` is long-lived, it runs in cagebox-server.
	"github.com/modelcontextprotocol/",
	// CEL and the protobuf descriptors its packages register at init (~1
	// ms of every start): the daemon compiles policies' conditions
	// (internal/policy/cel_lite.go).
	"github.com/google/cel-go/",
	"google.golang.org/protobuf/",
}

// imports is every package of the module and the module's packages it
// imports directly (tests excluded), by path relative to the module.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	m := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		p := strings.TrimPrefix(f[0], module)
		m[p] = nil
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, module) {
				m[p] = append(m[p], strings.TrimPrefix(imp, module))
			}
		}
	}
	return m
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// TestLayering keeps the arrows pointing one way: leaves import nothing of
// ours; the runtimes and what they are built from never reach up into the
// daemon's side, and what sits below isolation does not import it.
func TestLayering(t *testing.T) {
	m := imports(t)
	for _, p := range append(append([]string{}, leaves...), runtimeSupport...) {
		if _, ok := m[p]; !ok {
			t.Errorf("%s is in the layering table but not a package of the module: update docs/layering_test.go", p)
		}
	}
	var bad []string
	for _, p := range leaves {
		for _, imp := range m[p] {
			if imp != "internal/hexdigit" {
				bad = append(bad, p+" → "+imp+" (a leaf imports no cagebox package)")
			}
		}
	}
	below := append(append([]string{}, leaves...), runtimeSupport...)
	for p, imps := range m {
		runtimeSide := under(p, "isolation") && !strings.HasSuffix(p, "test")
		support := slices.Contains(runtimeSupport, p)
		if !runtimeSide && !support {
			continue
		}
		for _, imp := range imps {
			switch {
			case support && under(imp, "isolation"):
				bad = append(bad, p+" → "+imp+" (runtime support sits below isolation)")
			case under(imp, "isolation") || slices.Contains(below, imp):
			default:
				bad = append(bad, p+" → "+imp+" (the runtimes never import the daemon's side)")
			}
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
}

// TestCLILinksNoServer: the CLI's start-up pays only for what its
// commands run (bench -only cli prints the figure).
func TestCLILinksNoServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "lite", "../cmd/cagebox").Output()
	if err != nil {
		t.Fatalf("go list -deps -tags lite ./cmd/cagebox: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, no := range cliMustNotLink {
			if dep == strings.TrimSuffix(no, "/") || strings.HasPrefix(dep, no) || strings.HasPrefix(dep, strings.TrimSuffix(no, "/")+"/") {
				t.Errorf("the CLI (-tags lite) links %s: move the command that needs it to the host-side commands (cmd/cagebox/hostcmds.go)", dep)
			}
		}
	}
}
