package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
)

// repo is the module's root, from this package's directory.
const repo = "../.."

// docRow is one row of the kinds table of docs/events.md.
type docRow struct {
	kind, class, emitter string
	fields               map[string]string // name → JSON type; nil for "none"
}

var fieldItem = regexp.MustCompile("^`([a-z_]+)` (string|integer|number|boolean|object|string\\[\\]): \\S")

// docKinds parses the table under "## Kinds" in docs/events.md.
func docKinds(t *testing.T) []docRow {
	t.Helper()
	f, err := os.Open(filepath.Join(repo, "docs", "events.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []docRow
	in := false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Kinds"
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 4 {
			t.Errorf("docs/events.md: row %q has %d cells, want 4 (kind, class, emitted by, data)", line, len(cells))
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		r := docRow{kind: strings.Trim(cells[0], "`"), class: cells[1], emitter: cells[2]}
		if cells[3] != "none" {
			r.fields = map[string]string{}
			for _, item := range strings.Split(cells[3], "<br>") {
				m := fieldItem.FindStringSubmatch(item)
				if m == nil {
					t.Errorf("docs/events.md: %s: field %q is not \"`name` type: meaning\"", r.kind, item)
					continue
				}
				if _, dup := r.fields[m[1]]; dup {
					t.Errorf("docs/events.md: %s: field %s listed twice", r.kind, m[1])
				}
				r.fields[m[1]] = m[2]
			}
		}
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// fill sets every field of v (and of what it holds) to a value that is
// not empty, so that no omitempty field is left out. Floats get a
// fraction, so they encode as JSON numbers that are not integers.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem())
		v.Set(p)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)))
			return
		}
		for i := range v.NumField() {
			fill(v.Field(i))
		}
	}
}

// jsonType is the type docs/events.md gives a decoded JSON value.
func jsonType(v any) string {
	switch x := v.(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	case json.Number:
		if strings.ContainsAny(string(x), ".eE") {
			return "number"
		}
		return "integer"
	case []any:
		if len(x) > 0 {
			if _, ok := x[0].(string); ok {
				return "string[]"
			}
		}
		return "list"
	case map[string]any:
		return "object"
	}
	return "null"
}

func decodeObject(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return m
}

// TestCatalogDocumented: every kind of the catalog has its row in
// docs/events.md, with its class, who emits it, and exactly the fields its
// payload encodes to (each with its JSON type) — as stored (Bound) and as
// encoding/json gives them; and the table lists nothing else.
func TestCatalogDocumented(t *testing.T) {
	rows := docKinds(t)
	byKind := map[api.EventKind]docRow{}
	for _, r := range rows {
		if _, dup := byKind[api.EventKind(r.kind)]; dup {
			t.Errorf("docs/events.md: %s has two rows", r.kind)
		}
		byKind[api.EventKind(r.kind)] = r
	}
	var order []string
	for _, p := range api.EventPayloads() {
		kind := p.EventKind()
		order = append(order, string(kind))
		r, ok := byKind[kind]
		if !ok {
			t.Errorf("%s (%T) has no row in docs/events.md", kind, p)
			continue
		}
		delete(byKind, kind)
		if r.class != string(kind.Class()) {
			t.Errorf("docs/events.md: %s is %q, its class is %q", kind, r.class, kind.Class())
		}
		if r.emitter == "" {
			t.Errorf("docs/events.md: %s: who emits it?", kind)
		}

		v := reflect.New(reflect.TypeOf(p)).Elem()
		fill(v)
		filled := v.Interface().(api.EventPayload)
		if empty(filled) {
			if r.fields != nil {
				t.Errorf("docs/events.md: %s lists fields %v; its payload %T has none (its data is absent)", kind, r.fields, p)
			}
			continue
		}
		stored, err := Bound(filled)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		encoded, err := json.Marshal(filled)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		got := decodeObject(t, stored)
		if enc := decodeObject(t, encoded); !reflect.DeepEqual(got, enc) {
			t.Errorf("%s: stored as %s, encoding/json gives %s", kind, stored, encoded)
		}
		var names []string
		for name, val := range got {
			names = append(names, name)
			want, ok := r.fields[name]
			switch {
			case !ok:
				t.Errorf("docs/events.md: %s: field %s (in %s) is not documented", kind, name, stored)
			case want != jsonType(val):
				t.Errorf("docs/events.md: %s: field %s is documented as %s, it encodes as %s (%s)", kind, name, want, jsonType(val), stored)
			}
		}
		for name := range r.fields {
			if !slices.Contains(names, name) {
				t.Errorf("docs/events.md: %s: field %s is documented; %T has no such field (it encodes as %s)", kind, name, p, stored)
			}
		}
	}
	for kind := range byKind {
		t.Errorf("docs/events.md documents %s, which is not in the catalog (api.EventPayloads)", kind)
	}
	var docOrder []string
	for _, r := range rows {
		docOrder = append(docOrder, r.kind)
	}
	if len(byKind) == 0 && !slices.Equal(order, docOrder) {
		t.Errorf("docs/events.md lists the kinds in the order\n%v\nthe catalog has\n%v", docOrder, order)
	}
}

// TestCatalogComplete: every EventKind constant of api/events.go has
// exactly one payload in the catalog, and no two payloads share a kind.
func TestCatalogComplete(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(repo, "api", "events.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[api.EventKind]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "EventKind" {
				continue
			}
			for i, n := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok {
					t.Fatalf("%s is not a string literal", n.Name)
				}
				k, _ := strconv.Unquote(lit.Value)
				consts[api.EventKind(k)] = n.Name
			}
		}
	}
	if len(consts) < 27 {
		t.Fatalf("found %d EventKind constants in api/events.go: the parse is broken", len(consts))
	}
	seen := map[api.EventKind]string{}
	for _, p := range api.EventPayloads() {
		k := p.EventKind()
		if other, dup := seen[k]; dup {
			t.Errorf("%T and %s both are %s", p, other, k)
		}
		seen[k] = reflect.TypeOf(p).Name()
		if _, ok := consts[k]; !ok {
			t.Errorf("%T is %s, which no EventKind constant names", p, k)
		}
	}
	for k, name := range consts {
		if _, ok := seen[k]; !ok {
			t.Errorf("%s (%s) has no payload in the catalog (eventCatalog in api/events.go)", name, k)
		}
	}
}

// kindShaped is what a kind spelled as a string looks like.
var kindShaped = regexp.MustCompile(`^[a-z]+\.[a-z_]+$`)

// TestEmittersTyped: no call to an Emit or emit function in the daemon's
// code (the non-test .go files under internal/ and cmd/) passes a kind as
// a string literal or its data as a map literal, and no kind of the
// catalog is spelled as a string literal outside api (test helper
// packages, named *test, aside).
func TestEmittersTyped(t *testing.T) {
	kinds := map[string]bool{}
	for _, p := range api.EventPayloads() {
		kinds[string(p.EventKind())] = true
	}
	calls := 0
	for _, dir := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(repo, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			rel, _ := filepath.Rel(repo, path)
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			helper := strings.HasSuffix(filepath.Base(filepath.Dir(path)), "test")
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					var name string
					switch fn := n.Fun.(type) {
					case *ast.Ident:
						name = fn.Name
					case *ast.SelectorExpr:
						name = fn.Sel.Name
					}
					if name != "Emit" && name != "emit" {
						return true
					}
					calls++
					for _, arg := range n.Args {
						ast.Inspect(arg, func(a ast.Node) bool {
							switch a := a.(type) {
							case *ast.FuncLit:
								return false // a callback's body is its own business
							case *ast.BasicLit:
								if s, err := strconv.Unquote(a.Value); err == nil && a.Kind == token.STRING && (kinds[s] || kindShaped.MatchString(s)) {
									t.Errorf("%s:%d passes the kind %q as a string: use its payload struct (api/events.go)", rel, fset.Position(a.Pos()).Line, s)
								}
							case *ast.CompositeLit:
								if _, ok := a.Type.(*ast.MapType); ok {
									t.Errorf("%s:%d passes event data as a map literal: use the kind's payload struct (api/events.go)", rel, fset.Position(a.Pos()).Line)
								}
							}
							return true
						})
					}
				case *ast.BasicLit:
					if s, err := strconv.Unquote(n.Value); err == nil && n.Kind == token.STRING && kinds[s] && !helper {
						t.Errorf("%s:%d spells the kind %q: use its api.Event… constant", rel, fset.Position(n.Pos()).Line, s)
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if calls < 30 {
		t.Fatalf("found %d Emit/emit calls: the scan is broken", calls)
	}
}
