package main

import (
	"fmt"
	"strings"
)

// parseLabels reads KEY=VALUE flags into a map (the daemon checks the
// characters and lengths); a key given twice is an error.
func parseLabels(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE, e.g. --label team=web", flag, kv)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%s: %q is given twice", flag, k)
		}
		out[k] = v
	}
	return out, nil
}
