package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/cagebox/cagebox/agentproto"
)

// BareBoot boots kernel and initrd (a base initramfs from package vmimage)
// in a bare QEMU microvm — the same machine, accelerator and kernel command
// line as a sandbox, but no disk, ports, network, uid or cgroup — with an
// init that powers off as soon as it runs, and returns the wall time from
// starting QEMU to its exit. It is the baseline for the runtime's cold
// create-to-first-exec time.
//
// useKVM is what the runtime's KVM probe decided (Runtime.KVM); BareBoot
// runs as root, so it needs no device access of its own.
func BareBoot(ctx context.Context, binary, kernel, initrd string, useKVM bool) (time.Duration, error) {
	if binary == "" {
		binary = "qemu-system-x86_64"
	}
	vc := &vmConfig{KVM: useKVM, MemoryMiB: 256, CPUs: 1}
	// The machine, accelerator, CPU, memory and hardening options; the
	// given files booted directly; no devices.
	args := append(machineArgs(vc), "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd,
		"-append", kernelCmdline(tscFor(vc.KVM), nil)+" "+agentproto.VMParamBare+"=1",
		"-serial", "none")
	cmd := exec.CommandContext(ctx, binary, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if err != nil {
		return d, fmt.Errorf("bare boot: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return d, nil
}

func tscFor(kvm bool) int {
	if kvm {
		return 0
	}
	return hostTSCkHz()
}
