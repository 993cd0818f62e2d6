package qemu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cagebox/cagebox/internal/kvm"
)

// probeMarker is what the pinned guest kernel prints at the very end of its
// boot when it has no initramfs and no root device: proof that it ran to
// the point where it would start init, under the accelerator probed.
const probeMarker = "VFS: Unable to mount root fs"

// probes caches KVM verdicts per host boot, shared by every Runtime (a
// daemon has one; tests make many).
var probes = kvm.Cache{Dir: kvm.DefaultStateDir}

// kvmState is a verdict plus the group VMMs need for the device.
type kvmState struct {
	kvm.Verdict
	gid int
}

// kvmStates remembers the gid found by each probe key.
var kvmStates sync.Map // key → kvmState

// KVM is the host's verdict on running this runtime's guests under KVM,
// proven by booting the pinned guest kernel under QEMU with KVM, as a VMM
// uid, to its last line (bounded by the probe timeout), once per daemon
// start, QEMU binary and kernel digest. Firecracker uses the same verdict.
func (rt *Runtime) KVM() kvm.Verdict { return rt.kvmState().Verdict }

func (rt *Runtime) kvmState() kvmState {
	if err := kvm.Open(rt.device); err != nil {
		return kvmState{Verdict: kvm.Unusable("no usable " + rt.device + ": " + errText(err)), gid: -1}
	}
	k, err := rt.cache.Kernel()
	if err != nil {
		return kvmState{Verdict: kvm.Unusable("KVM not probed: " + err.Error()), gid: -1}
	}
	key := "qemu|" + kvm.BinaryID(rt.binary) + "|" + rt.device + "|" + k.VmlinuzSHA256
	v := probes.Do(key, rt.probeTimeout, func(ctx context.Context) kvm.Verdict {
		st := rt.probeKVM(ctx, k.Vmlinuz)
		kvmStates.Store(key, st)
		if st.Usable {
			rt.log.Info("kvm probe: guest kernel booted under KVM", "took", st.Took.Round(time.Millisecond))
		} else {
			rt.log.Warn("kvm probe failed; qemu uses TCG", "reason", st.Reason, "probe", st.Evidence)
		}
		return st.Verdict
	})
	if st, ok := kvmStates.Load(key); ok {
		return st.(kvmState)
	}
	st := kvmState{Verdict: v, gid: -1}
	if v.Usable {
		// Kept from this boot's probe: the device's group again (nothing
		// to change when the probe already did).
		gid, _, err := kvm.VMMAccess(rt.device)
		if err != nil {
			return kvmState{Verdict: kvm.Unusable("KVM not used: " + err.Error()), gid: -1}
		}
		st.gid = gid
	}
	kvmStates.Store(key, st)
	return st
}

func errText(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// probeArgs is QEMU's command line for the probe: the sandboxes' machine,
// accelerator, CPU model and hardening, the kernel alone (fd 3), the
// console on stdout, nothing else.
func probeArgs() []string {
	vc := &vmConfig{KVM: true, MemoryMiB: 128, CPUs: 1}
	args := machineArgs(vc)
	return append(args, "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", "/proc/self/fd/3",
		"-append", kernelCmdline(0, nil),
		"-chardev", "stdio,id=console,signal=off",
		"-serial", "chardev:console")
}

// probeKVM boots the kernel under KVM and reports whether it reached its
// end. QEMU runs exactly as a sandbox's would (a VMM uid, the kvm group,
// no capabilities, -sandbox), so permissions are proven too.
func (rt *Runtime) probeKVM(ctx context.Context, kernel string) (st kvmState) {
	start := time.Now()
	st.gid = -1
	fail := func(reason, evidence string) kvmState {
		st.Verdict = kvm.Verdict{Reason: reason, Evidence: evidence, Took: time.Since(start), Probed: st.Probed}
		return st
	}
	gid, note, err := kvm.VMMAccess(rt.device)
	if err != nil {
		return fail("KVM not used: "+err.Error(), "")
	}
	if note != "" {
		rt.log.Info("kvm device access", "change", note)
	}
	uid, err := rt.uids.Pick("kvm-probe")
	if err != nil {
		return fail("KVM not probed: "+err.Error(), "")
	}
	defer rt.uids.Release(uid)
	kf, err := os.Open(kernel)
	if err != nil {
		return fail("KVM not probed: "+err.Error(), "")
	}
	defer kf.Close()

	cmd := vmmCommand(rt.binary, probeArgs(), uid, gid, true)
	cmd.ExtraFiles = []*os.File{kf}
	pr, pw, err := os.Pipe()
	if err != nil {
		return fail("KVM not probed: "+err.Error(), "")
	}
	defer pr.Close()
	cmd.Stdout, cmd.Stderr = pw, pw
	// It dies with this process, whatever kills it, and is recorded while
	// it runs (kvm.StartProbe): on a KVM that cannot run the guest, QEMU
	// spins forever.
	vmm, err := kvm.StartProbe(cmd, probes.Dir)
	if err != nil {
		pw.Close()
		return fail("KVM not probed: start "+rt.binary+": "+err.Error(), "")
	}
	pw.Close()
	// QEMU leaves on its own once the guest panics (-no-reboot, panic=-1);
	// whatever is left of its session goes now.
	defer vmm.Kill()

	// The console, read line by line: the marker proves the boot; the
	// last lines are the evidence when there is none.
	found := make(chan bool, 1)
	var mu sync.Mutex // guards tail
	var tail bytes.Buffer
	go func() {
		sc := bufio.NewScanner(io.LimitReader(pr, 4<<20))
		sc.Buffer(make([]byte, 64<<10), 64<<10)
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			tail.WriteString(line + "\n")
			if tail.Len() > 8<<10 {
				b := append([]byte(nil), tail.Bytes()[tail.Len()-4<<10:]...)
				tail.Reset()
				tail.Write(b)
			}
			mu.Unlock()
			if strings.Contains(line, probeMarker) {
				found <- true
				return
			}
		}
		found <- false
	}()
	evidence := func() string {
		mu.Lock()
		defer mu.Unlock()
		lines := strings.Split(strings.TrimSpace(tail.String()), "\n")
		if len(lines) > 6 {
			lines = lines[len(lines)-6:]
		}
		return strings.Join(lines, "\n")
	}
	select {
	case ok := <-found:
		if ok {
			st.Verdict = kvm.Verdict{Usable: true, Reason: fmt.Sprintf("the guest kernel booted under KVM in %v (probe)", time.Since(start).Round(time.Millisecond)), Took: time.Since(start), Probed: true}
			st.gid = gid
			return st
		}
		// The console ended without the marker: QEMU exited (or closed
		// its console and goes on; the probe's bound still holds).
		why := "QEMU could not boot the guest kernel under KVM"
		select {
		case <-vmm.Done():
			if werr := vmm.Err(); werr != nil {
				why += " (" + werr.Error() + ")"
			}
		case <-ctx.Done():
		}
		st.Probed = true
		return fail("KVM probe failed: "+why, evidence())
	case <-ctx.Done():
		st.Probed = true
		return fail(fmt.Sprintf("KVM probe failed: the guest kernel did not finish booting under KVM within %v", rt.probeTimeout), evidence())
	}
}
