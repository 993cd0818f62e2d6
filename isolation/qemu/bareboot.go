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
func BareBoot(ctx context.Context, binary, kernel, initrd string) (time.Duration, error) {
	if binary == "" {
		binary = "qemu-system-x86_64"
	}
	vc := &vmConfig{KVM: kvmUsable(), MemoryMiB: 256, CPUs: 1}
	full := vc.args()
	// Keep the machine, accelerator, CPU, memory and hardening options;
	// boot the given files directly; no devices.
	var args []string
	for i := 0; i+1 < len(full); i++ {
		switch full[i] {
		case "-M", "-accel", "-cpu", "-smp", "-m", "-sandbox":
			args = append(args, full[i], full[i+1])
			i++
		}
	}
	args = append(args, "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
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
