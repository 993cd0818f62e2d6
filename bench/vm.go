package main

import (
	"context"
	"fmt"
	"time"

	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/qemu"
)

// bareVM is a VM runtime's baseline: a bare QEMU microvm boot of the same
// kernel and initramfs to init (which powers off at once).
func bareVM(rt isolation.Runtime, n, vmN int) (*baseline, error) {
	q, ok := rt.(*qemu.Runtime)
	if !ok {
		return nil, fmt.Errorf("no bare baseline for %s", rt.Name())
	}
	return &baseline{
		label: "bare QEMU microvm boot of the same kernel+initramfs to init",
		n:     vmN,
		run: func() time.Duration {
			d, err := qemu.BareBoot(context.Background(), "", bareKernel, bareInitrd, q.KVM().Usable)
			if err != nil {
				fail(err)
			}
			return d
		},
	}, prepareVM(q)
}

var bareKernel, bareInitrd string

// prepareVM fetches the kernel (if this home has none) and builds the
// busybox image's VM artifacts before anything is timed.
func prepareVM(q *qemu.Runtime) error {
	img, err := (&image.Cache{Dir: benchImages}).Get("default")
	if err != nil {
		return err
	}
	a, err := q.Cache().Prepare(context.Background(), img, benchAgent)
	if err != nil {
		return err
	}
	bareKernel, bareInitrd = a.Kernel, a.Initrd
	return nil
}
