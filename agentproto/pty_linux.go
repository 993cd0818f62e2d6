package agentproto

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

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
	for _, pr := range sessionProcs(sid) {
		if pr.pid != sid {
			syscall.Kill(pr.pid, sig)
		}
	}
}

type procIDs struct{ pid, pgrp int }

// sessionProcs lists the processes of session sid, from /proc.
func sessionProcs(sid int) []procIDs {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procIDs
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 {
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
		pgrp, err1 := strconv.Atoi(f[2])
		s, err2 := strconv.Atoi(f[3])
		if err1 == nil && err2 == nil && s == sid {
			out = append(out, procIDs{pid, pgrp})
		}
	}
	return out
}

// The line discipline of some kernels does not turn the interrupt, quit
// and suspend characters into signals: gVisor's before 2024
// (google/gvisor#9898, #422) passes a typed Ctrl-C to the program as a
// byte. There the agent does what the line discipline should: isigEmu.
var (
	ldSignalsOnce sync.Once
	ldSignals     bool
	emulateISIG   bool // tests set it to emulate where the kernel would not need it
)

// lineDisciplineSignals reports whether the kernel's pty line discipline
// consumes VINTR (and so signals for it); probed once, on a pty of its own
// that is no one's controlling terminal (so no signal can go anywhere).
func lineDisciplineSignals() bool {
	ldSignalsOnce.Do(func() { ldSignals = probeLineDiscipline() })
	return ldSignals
}

func probeLineDiscipline() bool {
	master, slave, err := openPTY(WinSize{Rows: 24, Cols: 80}, -1)
	if err != nil {
		return true // no pty at all: nothing to emulate
	}
	defer master.Close()
	defer slave.Close()
	sfd := int(slave.Fd())
	tio, err := unix.IoctlGetTermios(sfd, unix.TCGETS)
	if err != nil {
		return true
	}
	tio.Lflag &^= unix.ICANON | unix.ECHO
	tio.Lflag |= unix.ISIG
	if err := unix.IoctlSetTermios(sfd, unix.TCSETS, tio); err != nil {
		return true
	}
	if _, err := master.Write([]byte{tio.Cc[unix.VINTR], 'a'}); err != nil {
		return true
	}
	// The line discipline may take the input asynchronously: wait for the
	// 'a', then a little longer for anything still in flight.
	n := 0
	for i := 0; i < 100 && n == 0; i++ {
		n, _ = unix.IoctlGetInt(sfd, unix.TIOCINQ)
		if n == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(10 * time.Millisecond)
	n, _ = unix.IoctlGetInt(sfd, unix.TIOCINQ)
	return n <= 1
}

// isigEmu turns the terminal's interrupt, quit and suspend characters typed
// by the host into signals to the terminal's foreground job, as the line
// discipline would with ISIG set, for kernels whose line discipline does
// not (lineDisciplineSignals).
type isigEmu struct {
	slave  *os.File // a copy of the slave, to read the terminal's modes
	master *os.File
	leader func() int // the session leader's pid, the fallback group
}

// write writes b to w, signalling in place of each signal character.
func (e *isigEmu) write(w io.Writer, b []byte) error {
	tio, err := unix.IoctlGetTermios(int(e.slave.Fd()), unix.TCGETS)
	if err != nil || tio.Lflag&unix.ISIG == 0 {
		_, err := w.Write(b)
		return err
	}
	start := 0
	for i, c := range b {
		var sig syscall.Signal
		switch {
		case c == 0: // _POSIX_VDISABLE
		case c == tio.Cc[unix.VINTR]:
			sig = syscall.SIGINT
		case c == tio.Cc[unix.VQUIT]:
			sig = syscall.SIGQUIT
		case c == tio.Cc[unix.VSUSP]:
			sig = syscall.SIGTSTP
		}
		if sig == 0 {
			continue
		}
		if i > start {
			if _, err := w.Write(b[start:i]); err != nil {
				return err
			}
		}
		start = i + 1
		e.signal(sig)
	}
	if start < len(b) {
		_, err := w.Write(b[start:])
		return err
	}
	return nil
}

// signal sends sig to the terminal's foreground job. Where the kernel will
// not tell the agent which group that is (gVisor answers TIOCGPGRP only to
// the terminal's own session), it is every job of the session apart from
// the shell's own group, or the leader's group when there is no other (a
// shell with job control runs each job in a group of its own; a background
// job gets the signal too, the one difference from a real line discipline).
func (e *isigEmu) signal(sig syscall.Signal) {
	if g := foregroundGroup(e.master); g > 1 {
		syscall.Kill(-g, sig)
		return
	}
	sid := e.leader()
	if sid <= 1 {
		return
	}
	sent := map[int]bool{}
	for _, pr := range sessionProcs(sid) {
		if pr.pgrp != sid && pr.pgrp > 1 && !sent[pr.pgrp] {
			sent[pr.pgrp] = true
			syscall.Kill(-pr.pgrp, sig)
		}
	}
	if len(sent) == 0 {
		syscall.Kill(-sid, sig)
	}
}
