package cleanup

import (
	"slices"
	"testing"
)

func TestStack(t *testing.T) {
	var got []int
	step := func(i int) func() { return func() { got = append(got, i) } }

	var s Stack // the zero value is ready
	s.Run()
	for i := range 3 {
		s.Add(step(i))
	}
	s.Run()
	if want := []int{2, 1, 0}; !slices.Equal(got, want) {
		t.Fatalf("Run ran %v, want %v (last added first)", got, want)
	}
	s.Run()
	if len(got) != 3 {
		t.Fatalf("a second Run ran steps again: %v", got)
	}

	got = nil
	s.Add(step(7))
	s.Release()
	s.Run()
	if len(got) != 0 {
		t.Fatalf("Run after Release ran %v", got)
	}
}
