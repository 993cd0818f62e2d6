// Package docs_test checks that the documentation keeps up with the tree.
package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// packageRoots are the folders whose every package must have a row in
// README.md's package table.
var packageRoots = []string{"agentproto", "api", "client", "cmd", "internal", "isolation"}

// tableRow matches a row of README.md's package table: | `path/` | ... |
var tableRow = regexp.MustCompile("(?m)^\\| `([^`]+)/` \\|")

// TestReadmeListsEveryPackage fails when a package (a folder holding a
// non-test .go file) under packageRoots has no row in README.md's table,
// or a row names a folder that does not exist.
func TestReadmeListsEveryPackage(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, m := range tableRow.FindAllStringSubmatch(string(readme), -1) {
		rows[m[1]] = true
	}
	if len(rows) == 0 {
		t.Fatal("README.md has no package table rows of the form | `path/` | … |")
	}

	var missing []string
	for _, root := range packageRoots {
		err := filepath.WalkDir(filepath.Join("..", root), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name := d.Name()
			if d.IsDir() && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				return nil
			}
			dir, err := filepath.Rel("..", filepath.Dir(path))
			if err != nil {
				return err
			}
			dir = filepath.ToSlash(dir)
			if !rows[dir] {
				missing = append(missing, dir)
				rows[dir] = true // report each folder once
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(missing)
	for _, dir := range missing {
		t.Errorf("README.md's package table has no row for %s/: add | `%s/` | what it is |", dir, dir)
	}

	for dir := range rows {
		if fi, err := os.Stat(filepath.Join("..", filepath.FromSlash(dir))); err != nil || !fi.IsDir() {
			t.Errorf("README.md's package table has a row for %s/, which is not a folder of the repository", dir)
		}
	}
}

// TestOptionalAbilitiesListed: every optional runtime or sandbox ability
// (an exported interface of isolation/isolation.go besides Runtime and
// Sandbox) is named in architecture.md's list, and the list names none
// that is gone.
func TestOptionalAbilitiesListed(t *testing.T) {
	src, err := os.ReadFile("../isolation/isolation.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(doc), "Optional abilities are small interfaces")
	if i < 0 {
		t.Fatal("architecture.md has no list of optional abilities (\"Optional abilities are small interfaces …\")")
	}
	para, _, _ := strings.Cut(string(doc[i:]), "\n\n")
	have := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^type ([A-Z][A-Za-z]*) interface").FindAllStringSubmatch(string(src), -1) {
		if m[1] == "Runtime" || m[1] == "Sandbox" {
			continue
		}
		have[m[1]] = true
		if !strings.Contains(para, "`"+m[1]+"`") {
			t.Errorf("architecture.md's optional abilities do not name isolation.%s", m[1])
		}
	}
	for _, m := range regexp.MustCompile("`([A-Z][A-Za-z]+)`").FindAllStringSubmatch(para, -1) {
		if !have[m[1]] && m[1] != "Destroy" {
			t.Errorf("architecture.md's optional abilities name %s, which isolation/isolation.go does not declare", m[1])
		}
	}
}
