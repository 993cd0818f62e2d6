package runlog

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestOpenAndTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "agent.log")
	if got := Tail(p, 10); got != "" {
		t.Fatalf("tail of a missing log %q", got)
	}
	for _, s := range []string{"first line\n", strings.Repeat("x", 100) + "\n", "last words\n"} {
		f, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if got := Tail(p, 12); got != "last words" {
		t.Errorf("Tail(12) = %q", got)
	}
	if got := Tail(p, 1<<20); !strings.HasPrefix(got, "first line\n") || !strings.HasSuffix(got, "last words") {
		t.Errorf("Tail of the whole log = %q", got)
	}
}
