package agentproto

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// openPTY allocates a pseudo-terminal pair on the guest's devpts (/dev/ptmx,
// or /dev/pts/ptmx where /dev/ptmx is missing) and sets its size. The master
// is non-blocking (so reads take deadlines); the slave is what the child
// gets as stdin, stdout and stderr. uid >= 0 makes the child's user own the
// slave, as a login would.
func openPTY(ws WinSize, uid int) (master, slave *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		fd, err = unix.Open("/dev/pts/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w (is devpts mounted on /dev/pts?)", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	ok := false
	defer func() {
		if !ok {
			master.Close()
			if slave != nil {
				slave.Close()
			}
		}
	}()
	// unlockpt(3)
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	// TIOCGPTPEER opens the slave through the master, with no path lookup
	// (Linux 4.13); where it is missing (older kernels, gVisor), ptsname(3)
	// and open.
	sfd, err := ptyPeer(fd)
	if err != nil {
		n, perr := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
		if perr != nil {
			return nil, nil, fmt.Errorf("ptsname: %w", perr)
		}
		name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
		sfd, err = unix.Open(name, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("open %s: %w", name, err)
		}
	}
	slave = os.NewFile(uintptr(sfd), "pty-slave")
	if err := unix.IoctlSetWinsize(sfd, unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols}); err != nil {
		return nil, nil, fmt.Errorf("set pty size: %w", err)
	}
	if uid > 0 {
		// The group stays devpts's tty group (gid=5 at mount).
		if err := unix.Fchown(sfd, uid, -1); err != nil {
			return nil, nil, fmt.Errorf("chown pty to uid %d: %w", uid, err)
		}
	}
	ok = true
	return master, slave, nil
}

// ptyPeer opens the slave of master fd through TIOCGPTPEER.
func ptyPeer(fd int) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(unix.TIOCGPTPEER), uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

// setWinSize resizes the pty whose master is f; the kernel sends SIGWINCH
// to the terminal's foreground process group.
func setWinSize(f *os.File, ws WinSize) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
	}); err != nil {
		return err
	}
	return ierr
}

// foregroundGroup is the foreground process group of the pty whose master
// is f (0 when unknown).
func foregroundGroup(f *os.File) int {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	pgrp := 0
	rc.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), unix.TIOCGPGRP); err == nil {
			pgrp = v
		}
	})
	return pgrp
}

// signalSession passes sig, sent to the process group of the session leader
// sid, on to the pty's foreground job; SIGKILL and SIGTERM (a timeout, the
// host gone, a shutdown) go to every process of the session, background
// jobs included. It is called with the process's lock held, while the
// leader has not been reaped, so sid is still its.
func signalSession(sid int, tty *os.File, sig syscall.Signal) {
	if g := foregroundGroup(tty); g > 1 && g != sid {
		syscall.Kill(-g, sig)
	}
	if sig != syscall.SIGKILL && sig != syscall.SIGTERM {
		return
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == sid || pid <= 1 {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session …; comm may hold anything.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 4 {
			continue
		}
		if s, err := strconv.Atoi(f[3]); err == nil && s == sid {
			syscall.Kill(pid, sig)
		}
	}
}
