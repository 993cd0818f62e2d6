// Command gen writes deploy/crds from the agent-sandbox module pinned in
// go.mod (see package crdgen). Run it with `go generate ./deploy/`.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cagebox/cagebox/deploy/crdgen"
)

func main() {
	out := flag.String("out", "crds", "directory to write the CRDs to (its *.yaml are replaced)")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(out string) error {
	dir, version, err := crdgen.Source()
	if err != nil {
		return err
	}
	files, err := crdgen.Generate(dir, version)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(out, "*.yaml"))
	for _, f := range old {
		if _, ok := files[filepath.Base(f)]; !ok {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("gen: %d CRDs from %s %s into %s\n", len(files), crdgen.Module, version, out)
	return nil
}
