package vmproc

import (
	"strings"
	"testing"
)

func TestUIDPool(t *testing.T) {
	const base, count = 1 << 30, 4
	p := NewUIDPool(base, count)
	a, err := p.Pick("sandbox-a")
	if err != nil || a < base || a >= base+count || !p.Reserved(a) {
		t.Fatalf("uid %d %v (reserved %v)", a, err, p.Reserved(a))
	}
	// The same id again while the first is reserved gets another uid.
	b, err := p.Pick("sandbox-a")
	if err != nil || b == a {
		t.Fatalf("reserved uid handed out again: %d (first %d) %v", b, a, err)
	}
	p.Pick("c")
	p.Pick("d")
	if _, err := p.Pick("x"); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("no error with every uid taken: %v", err)
	}
	p.Release(b)
	if p.Reserved(b) {
		t.Fatal("released uid still reserved")
	}
	if c, err := p.Pick("x"); err != nil || c != b {
		t.Fatalf("after release got %d %v, want %d", c, err, b)
	}
	// A recovered sandbox's uid is taken again.
	p2 := NewUIDPool(base, 1)
	p2.Reserve(base)
	if _, err := p2.Pick("y"); err == nil {
		t.Fatal("a reserved uid was handed out")
	}
	// A uid that a process uses is skipped: root's, with a range of one.
	if _, err := NewUIDPool(0, 1).Pick("x"); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("uid 0 (in use by this process) picked: %v", err)
	}
}
