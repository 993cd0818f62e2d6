package credentials

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// openers are this package's functions that open a real value, one per
// kind of place the host writes (or uses) it.
var openers = []string{"OpenToward", "OpenToVerify", "openForRequest", "openToBind"}

// TestRealValueOpeners enumerates every place in the code that opens a
// secret's real value and checks it against the table of docs/security.md
// ("Where the host uses a real value"): a new place cannot be added
// without being documented with its rule. It also checks that nothing but
// this package's openers opens a value from the vault (Vault.Value, the
// only three-argument method named Value in the module), outside the
// vault itself, tests and the benchmarks.
func TestRealValueOpeners(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var found []string
	var stray []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "testdata" || rel == "bench" || rel == "internal/vault" || rel == "sdk" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		pkg := f.Name.Name
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			caller := pkg + "." + fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				typ := fd.Recv.List[0].Type
				if st, ok := typ.(*ast.StarExpr); ok {
					typ = st.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					caller = pkg + "." + id.Name + "." + fd.Name.Name
				}
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				var name string
				switch fn := call.Fun.(type) {
				case *ast.Ident:
					if pkg == "credentials" {
						name = fn.Name
					}
				case *ast.SelectorExpr:
					if x, ok := fn.X.(*ast.Ident); ok && x.Name == "credentials" {
						name = fn.Sel.Name
					}
					if fn.Sel.Name == "Value" && len(call.Args) == 3 && !(rel == "internal/credentials/open.go") {
						stray = append(stray, fset.Position(call.Pos()).String())
					}
				}
				if slices.Contains(openers, name) {
					entry := name + " " + caller
					if !slices.Contains(found, entry) {
						found = append(found, entry)
					}
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(stray) > 0 {
		t.Errorf("a real value opened outside credentials/open.go (use an opener of this package, and document it): %v", stray)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	// Rows of the table: | place | `OPENER` | `CALLER` | rule |
	row := regexp.MustCompile("(?m)^\\| [^|]+ \\| `(\\w+)` \\| `([\\w.]+)` \\|")
	var documented []string
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		documented = append(documented, m[1]+" "+m[2])
	}
	slices.Sort(found)
	slices.Sort(documented)
	if len(found) < 4 {
		t.Fatalf("found only %v: the walk is broken", found)
	}
	if !slices.Equal(found, documented) {
		t.Errorf("the places that open a real value and docs/security.md's table differ:\ncode: %q\ndocs: %q", found, documented)
	}
}
