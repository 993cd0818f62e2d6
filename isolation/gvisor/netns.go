package gvisor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// checkNetNS refuses a network namespace that is the host's own: runsc's
// netstack takes the addresses off every interface of the namespace it is
// given.
func checkNetNS(path string) error {
	var ns unix.Stat_t
	if err := unix.Stat(path, &ns); err != nil {
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	for _, host := range []string{"/proc/1/ns/net", "/proc/self/ns/net"} {
		var st unix.Stat_t
		if err := unix.Stat(host, &st); err == nil && st.Dev == ns.Dev && st.Ino == ns.Ino {
			return fmt.Errorf("network namespace %s is the host's (%s): give the sandbox its own", path, host)
		}
	}
	return nil
}

// runWithNetNSCheckMasked runs cmd (runsc run) in a mount namespace of its
// own in which netns's view of /proc/sys/net/core is an empty read-only
// tmpfs.
//
// runsc releases before 2024 tell the host's network namespace from others
// by /proc/sys/net/core/rmem_default existing only there; since Linux 6.x
// every namespace has it, so they refuse every namespace ("cannot run with
// network enabled in root network namespace", gVisor issue 10704).
// /proc/sys/net entries are looked up per network namespace, so the mask is
// mounted from inside netns, where runsc looks. checkNetNS makes the check
// this hides; the mask is harmless to runsc releases that check otherwise.
//
// The namespaces are the calling thread's, which cmd's process inherits:
// the work runs on a locked OS thread that is never unlocked, so Go ends the
// thread (and drops its namespaces) when the goroutine returns. The mount
// namespace is a slave of the host's, so unmounts on the host (a sandbox's
// netns file, its overlay) propagate into it.
func runWithNetNSCheckMasked(netns string, cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("new mount namespace for runsc: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("make runsc's mounts slaves: %w", err)
			}
			if err := maskInNetNS(netns); err != nil {
				return err
			}
			return cmd.Run()
		}()
	}()
	return <-errc
}

// maskInNetNS mounts the mask from inside netns and returns the thread to
// its own network namespace.
func maskInNetNS(netns string) (err error) {
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return fmt.Errorf("open own network namespace: %w", err)
	}
	defer self.Close()
	target, err := os.Open(netns)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", netns, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter network namespace %s: %w", netns, err)
	}
	defer func() {
		if rerr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); rerr != nil {
			err = errors.Join(err, fmt.Errorf("return to own network namespace: %w", rerr))
		}
	}()
	if err := unix.Mount("cagebox-mask", "/proc/sys/net/core", "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555"); err != nil {
		return fmt.Errorf("mask /proc/sys/net/core for runsc: %w", err)
	}
	return nil
}
