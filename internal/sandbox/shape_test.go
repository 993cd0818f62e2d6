package sandbox

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"strings"
	"testing"
)

// TestManagerStaysSmall: the Manager keeps the lifecycle; what is keyed
// by a sandbox but is not its lifecycle (guest I/O, pools, secrets,
// snapshots, ports, volumes, tools, image references, audit) is a service
// of its own. A Manager that grows past maxManagerMethods again is a sign
// that a new service belongs in its own type.
func TestManagerStaysSmall(t *testing.T) {
	const maxManagerMethods = 60
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Recv == nil || len(fd.Recv.List) != 1 {
					continue
				}
				if st, ok := fd.Recv.List[0].Type.(*ast.StarExpr); ok {
					if id, ok := st.X.(*ast.Ident); ok && id.Name == "Manager" {
						names = append(names, fd.Name.Name)
					}
				}
			}
		}
	}
	if len(names) > maxManagerMethods {
		t.Errorf("Manager has %d methods (at most %d): move what is not the lifecycle into a service: %v", len(names), maxManagerMethods, names)
	}
}
