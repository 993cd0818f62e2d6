package main

import (
	"fmt"
	"io"
)

// probeArg makes the agent print the confinement of its own process and
// exit (`cagebox-agent --probe-confinement`). The conformance suite copies
// the agent into a guest and runs it there like any guest process: what it
// prints comes from system calls, so it holds for every kernel a runtime
// puts under the guest (Linux, gVisor's sentry, a VM's), whether or not
// that kernel's /proc/[pid]/status shows every field.
const probeArg = "--probe-confinement"

// confinement is what the probe reports: the five capability sets as bit
// masks, no_new_privs, and the seccomp mode.
type confinement struct {
	Inh, Prm, Eff, Bnd, Amb uint64
	NoNewPrivs              int
	Seccomp                 int
}

// format writes c in /proc/[pid]/status's own format, one field a line.
func (c *confinement) format(w io.Writer) error {
	_, err := fmt.Fprintf(w, "CapInh:\t%016x\nCapPrm:\t%016x\nCapEff:\t%016x\nCapBnd:\t%016x\nCapAmb:\t%016x\nNoNewPrivs:\t%d\nSeccomp:\t%d\n",
		c.Inh, c.Prm, c.Eff, c.Bnd, c.Amb, c.NoNewPrivs, c.Seccomp)
	return err
}

// probeConfinement prints the calling process's confinement to stdout. A
// value it cannot read is an error (exit 1), never a reassuring zero.
func probeConfinement(stdout, stderr io.Writer) int {
	c, err := readConfinement()
	if err != nil {
		fmt.Fprintf(stderr, "cagebox-agent: %s: %v\n", probeArg, err)
		return 1
	}
	if err := c.format(stdout); err != nil {
		fmt.Fprintf(stderr, "cagebox-agent: %s: %v\n", probeArg, err)
		return 1
	}
	return 0
}
