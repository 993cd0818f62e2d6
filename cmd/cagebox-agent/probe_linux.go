//go:build linux

package main

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// readConfinement reads the calling thread's confinement from system calls
// (credentials are per thread; the Go runtime keeps them equal on all
// threads of the agent, and the probe changes none).
func readConfinement() (*confinement, error) {
	var c confinement
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil, fmt.Errorf("capget: %w", err)
	}
	join := func(lo, hi uint32) uint64 { return uint64(hi)<<32 | uint64(lo) }
	c.Inh = join(data[0].Inheritable, data[1].Inheritable)
	c.Prm = join(data[0].Permitted, data[1].Permitted)
	c.Eff = join(data[0].Effective, data[1].Effective)

	// The bounding set: EINVAL marks a capability past the kernel's last
	// one. Capability 0 (CAP_CHOWN) exists in every kernel with bounding
	// sets, so EINVAL there is a failure, not an empty set.
	for cp := 0; cp < 64; cp++ {
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(cp), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) && cp > 0 {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("prctl(PR_CAPBSET_READ, %d): %w", cp, err)
		}
		if in == 1 {
			c.Bnd |= 1 << cp
		}
	}
	// The ambient set: EINVAL for a capability past the last one, and for
	// every capability where the kernel has no ambient capabilities at all
	// (nothing can be in a set that does not exist).
	for cp := 0; cp < 64; cp++ {
		in, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(cp), 0, 0)
		if errors.Is(err, unix.EINVAL) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("prctl(PR_CAP_AMBIENT_IS_SET, %d): %w", cp, err)
		}
		if in == 1 {
			c.Amb |= 1 << cp
		}
	}
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("prctl(PR_GET_NO_NEW_PRIVS): %w", err)
	}
	c.NoNewPrivs = nnp
	// In strict mode this call would be fatal, but a process in strict
	// mode could not have exec'd the probe in the first place.
	sec, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("prctl(PR_GET_SECCOMP): %w", err)
	}
	c.Seccomp = sec
	return &c, nil
}
