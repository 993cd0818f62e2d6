// Package cleanup collects the undo steps of a multi-step setup so that a
// failure part-way releases everything already made, in reverse order.
package cleanup

// Stack is a LIFO of undo functions. The zero value is ready to use.
type Stack struct {
	fns []func()
}

// Add registers an undo step.
func (s *Stack) Add(fn func()) { s.fns = append(s.fns, fn) }

// Run runs every step, last added first, and empties the stack.
func (s *Stack) Run() {
	for i := len(s.fns) - 1; i >= 0; i-- {
		s.fns[i]()
	}
	s.fns = nil
}

// Release forgets every step (setup succeeded).
func (s *Stack) Release() { s.fns = nil }
