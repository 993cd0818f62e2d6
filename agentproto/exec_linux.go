package agentproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"
)

// drainGrace is how long output is still collected after a process has
// exited, for when a background child keeps its stdout or stderr open.
const drainGrace = 100 * time.Millisecond

var (
	devNullOnce sync.Once
	devNull     *os.File
	devNullErr  error
)

func openDevNull() (*os.File, error) {
	devNullOnce.Do(func() { devNull, devNullErr = os.Open(os.DevNull) })
	return devNull, devNullErr
}

// startFailure is an ExecResult for a process that could not be started.
func startFailure(code int, err error) *ExecResult {
	return &ExecResult{ExitCode: code, Error: err.Error()}
}

// plan is a checked, ready-to-start exec.
type plan struct {
	path string
	argv []string
	attr *os.ProcAttr
}

// prepare resolves user, environment, working directory and executable. A
// failure is returned as a result to send back (exit code 126 or 127).
func (s *Server) prepare(er *ExecRequest) (*plan, *ExecResult) {
	for _, e := range er.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, startFailure(126, fmt.Errorf("bad environment entry %q: want KEY=VALUE", e))
		}
	}
	var u *userInfo
	var userEnv []string
	if er.User != "" {
		var err error
		if u, err = lookupUser(er.User); err != nil {
			return nil, startFailure(126, err)
		}
		if u.Home != "" {
			userEnv = append(userEnv, "HOME="+u.Home)
		}
		if u.Name != "" {
			userEnv = append(userEnv, "USER="+u.Name, "LOGNAME="+u.Name)
		}
	}
	base := s.baseEnv()
	if base == nil {
		base = DefaultEnv
	}
	env := MergeEnv(base, userEnv, er.Env)

	cwd := er.Cwd
	if cwd == "" {
		cwd = "/"
		if u != nil && u.Home != "" {
			if fi, err := os.Stat(u.Home); err == nil && fi.IsDir() {
				cwd = u.Home
			}
		}
	} else if fi, err := os.Stat(cwd); err != nil {
		return nil, startFailure(126, fmt.Errorf("chdir %s: %w", cwd, errors.Unwrap(err)))
	} else if !fi.IsDir() {
		return nil, startFailure(126, fmt.Errorf("chdir %s: not a directory", cwd))
	}

	argv := er.Argv
	if len(argv) == 0 { // a pty with no command: the user's login shell
		argv = []string{loginShell(u)}
	}
	path, err := lookPath(argv[0], envValue(env, "PATH"), cwd)
	if err != nil {
		code := 126
		if errors.Is(err, fs.ErrNotExist) {
			code = 127
		}
		return nil, startFailure(code, err)
	}

	sys := &syscall.SysProcAttr{Setpgid: true}
	if u != nil {
		sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
		if sys.Credential.Groups == nil {
			sys.Credential.Groups = []uint32{}
		}
	}
	return &plan{
		path: path,
		argv: argv,
		attr: &os.ProcAttr{Dir: cwd, Env: env, Sys: sys},
	}, nil
}

// loginShell is u's login shell (root's when u is nil) from the guest's
// passwd when it is an executable file, else /bin/sh.
func loginShell(u *userInfo) string {
	if u == nil {
		u, _ = lookupUser("0")
	}
	if u != nil && strings.HasPrefix(u.Shell, "/") {
		if fi, err := os.Stat(u.Shell); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return u.Shell
		}
	}
	return "/bin/sh"
}

// errNotFound mimics exec.ErrNotFound's message.
type errNotFound struct{ name string }

func (e *errNotFound) Error() string   { return "executable file not found: " + e.name }
func (e *errNotFound) Is(t error) bool { return t == fs.ErrNotExist }

// lookPath finds an executable like a shell would, using the PATH of the
// process being started. A name with a slash is used as is.
func lookPath(name, pathEnv, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	if name == "" {
		return "", &errNotFound{name}
	}
	var denied string
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			continue
		}
		if fi.Mode()&0o111 != 0 {
			return p, nil
		}
		if denied == "" {
			denied = p
		}
	}
	if denied != "" {
		return "", fmt.Errorf("exec %s: permission denied", denied)
	}
	return "", &errNotFound{name}
}

// startError maps an error from starting a process to a result.
func startError(path string, err error) *ExecResult {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		err = fmt.Errorf("exec %s: %w", path, errno)
		if errno == syscall.ENOENT || errno == syscall.ENOTDIR {
			return startFailure(127, err)
		}
	}
	return startFailure(126, err)
}

// exec runs one process for the stream st and reports its end.
func (c *serverConn) exec(st *yamux.Stream, fr *frameReader, fw *frameWriter, req *request) {
	er := req.Exec
	if er == nil || (len(er.Argv) == 0 && er.TTY == nil) {
		sendError(fw, fmt.Errorf("exec: empty argv: %w", ErrInvalid))
		return
	}
	// The process stays registered until its result is sent, so Shutdown
	// returns only once the host has been told.
	p := &process{done: make(chan struct{}), finished: make(chan struct{})}
	defer close(p.finished)
	if err := c.s.addProc(p); err != nil {
		close(p.done)
		sendExit(fw, startFailure(126, err))
		return
	}
	defer c.s.removeProc(p)
	sendExit(fw, c.run(st, fr, fw, req.ID, er, p))
}

func sendExit(fw *frameWriter, res *ExecResult) {
	if b, err := json.Marshal(res); err == nil {
		fw.write(frameExit, b)
	}
}

func (c *serverConn) run(st *yamux.Stream, fr *frameReader, fw *frameWriter, id uint64, er *ExecRequest, p *process) *ExecResult {
	s := c.s
	pl, fail := s.prepare(er)
	if fail != nil {
		close(p.done)
		return fail
	}

	// Pipes or a pty; the child's ends are closed once it has started.
	sio, err := openStdio(er, pl)
	if err != nil {
		close(p.done)
		return startFailure(126, err)
	}
	pl.attr.Files = sio.child
	if sio.tty != nil {
		tty := sio.tty
		p.also = func(sig syscall.Signal) { signalSession(p.pid, tty, sig) }
		if sio.isig != nil {
			sio.isig.leader = func() int {
				p.mu.Lock()
				defer p.mu.Unlock()
				if p.exited {
					return 0
				}
				return p.pid
			}
		}
	}

	exitCh := make(chan syscall.WaitStatus, 1)
	startProcess := os.StartProcess
	if s.StartProcess != nil {
		startProcess = s.StartProcess
	}
	start := func() (int, error) {
		proc, err := startProcess(pl.path, pl.argv, pl.attr)
		if err != nil {
			return 0, err
		}
		pid := proc.Pid
		proc.Release()
		return pid, nil
	}
	var pid int
	if s.Reaper != nil {
		pid, err = s.Reaper.start(start, func(ws syscall.WaitStatus) {
			p.setExited()
			exitCh <- ws
		})
	} else {
		pid, err = start()
	}
	sio.closeChild()
	if err != nil {
		sio.closeParent()
		close(p.done)
		return startError(pl.path, err)
	}
	p.setPID(pid)
	if s.Reaper == nil {
		go waitPID(p, pid, exitCh)
	}
	if s.isClosing() { // Shutdown may have missed it
		p.signal(syscall.SIGTERM)
	}
	if err := c.register(id, p); err != nil {
		p.signal(syscall.SIGKILL)
	}
	defer c.unregister(id)

	if er.Timeout > 0 {
		t := time.AfterFunc(er.Timeout, p.timeout)
		defer t.Stop()
	}

	var pumps sync.WaitGroup
	pumps.Add(len(sio.out))
	for i, r := range sio.out {
		go pump(&pumps, r, fw, []frameType{frameStdout, frameStderr}[i])
	}

	// Frames from the host: stdin, stdin-close, signal, resize. The end of
	// the stream before the process exits means the host is gone: kill.
	go func() {
		stdin := sio.stdin
		// A pty's master is also its output: never closed here.
		closeStdin := func() {
			if stdin != nil && sio.tty == nil {
				stdin.Close()
			}
			stdin = nil
		}
		defer closeStdin()
		for {
			t, b, err := fr.next()
			if err != nil {
				p.signal(syscall.SIGKILL)
				return
			}
			switch t {
			case frameStdin:
				if stdin != nil {
					var err error
					if sio.isig != nil {
						err = sio.isig.write(stdin, b)
					} else {
						_, err = stdin.Write(b)
					}
					if err != nil {
						closeStdin()
					}
				}
			case frameStdinClose:
				// On a pty the terminal stays: end of input is the
				// line discipline's business (a ^D byte).
				if sio.tty == nil {
					closeStdin()
				}
			case frameResize:
				if sio.tty != nil && len(b) == 4 {
					ws := WinSize{Rows: uint16(b[0])<<8 | uint16(b[1]), Cols: uint16(b[2])<<8 | uint16(b[3])}
					if ws.Valid() {
						setWinSize(sio.tty, ws)
					}
				}
			case frameSignal:
				if len(b) == 1 && b[0] >= 1 && b[0] <= 64 {
					p.signal(syscall.Signal(b[0]))
				}
			default:
				c.log.Debug("exec: unexpected frame from host", "type", t)
				p.signal(syscall.SIGKILL)
				return
			}
		}
	}()

	ws := <-exitCh
	close(p.done)
	// Unblock a stdin write the process will never read, and stop waiting
	// for output that a background child may hold open.
	if sio.tty != nil {
		sio.tty.SetWriteDeadline(time.Unix(1, 0))
	} else if sio.stdin != nil {
		sio.stdin.Close()
	}
	deadline := time.Now().Add(drainGrace)
	for _, r := range sio.out {
		r.SetReadDeadline(deadline)
	}
	pumps.Wait()
	for _, r := range sio.out {
		r.Close()
	}
	if sio.isig != nil {
		sio.isig.slave.Close()
	}
	// Stop the host-frame reader.
	st.SetReadDeadline(time.Unix(1, 0))

	p.mu.Lock()
	res := &ExecResult{TimedOut: p.timedOut}
	p.mu.Unlock()
	switch {
	case ws.Signaled():
		res.ExitCode = 128 + int(ws.Signal())
		res.Signal = unix.SignalName(ws.Signal())
	default:
		res.ExitCode = ws.ExitStatus()
	}
	return res
}

// waitPID waits for a child that is not managed by a Reaper: it marks the
// process exited while it is still a zombie, so its pid cannot have been
// reused by then, and only then reaps it.
func waitPID(p *process, pid int, exitCh chan<- syscall.WaitStatus) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			break
		}
	}
	p.setExited()
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err != syscall.EINTR {
			break
		}
	}
	exitCh <- ws
}

// pump sends what r yields as frames of type t until EOF or its deadline.
// If the host stops taking frames it keeps draining r so the process never
// blocks on a full pipe.
func pump(wg *sync.WaitGroup, r *os.File, fw *frameWriter, t frameType) {
	defer wg.Done()
	buf, put := getChunk()
	broken := false
	defer func() { put(broken) }()
	send := func(n int) {
		if n > 0 && !broken {
			if fw.writeBuf(t, buf[:headerSize+n]) != nil {
				broken = true
				buf = make([]byte, headerSize+chunkSize) // the old one may still be queued
			}
		}
	}
	for {
		n, err := r.Read(buf[headerSize:])
		send(n)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The process has exited and the drain grace is over (a
			// background child holds the pipe open). What the process
			// wrote before it exited is still in the pipe — a pump
			// scheduled late (a loaded guest) must not lose it: read
			// what is there, without waiting for more.
			drainAvailable(r, buf, send)
			return
		}
		if err != nil {
			return
		}
	}
}

// maxFinalDrain bounds the output read after the drain grace, in case a
// background child keeps writing.
const maxFinalDrain = 4 << 20

// drainAvailable reads what the pipe r holds right now (FIONREAD), never
// blocking, at most maxFinalDrain bytes.
func drainAvailable(r *os.File, buf []byte, send func(int)) {
	if err := r.SetReadDeadline(time.Time{}); err != nil {
		return
	}
	rc, err := r.SyscallConn()
	if err != nil {
		return
	}
	for total := 0; total < maxFinalDrain; {
		avail := 0
		if cerr := rc.Control(func(fd uintptr) {
			avail, err = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD: bytes in the pipe
		}); cerr != nil || err != nil || avail <= 0 {
			return
		}
		n, rerr := r.Read(buf[headerSize : headerSize+min(avail, len(buf)-headerSize)])
		send(n)
		total += n
		if rerr != nil || n == 0 {
			return
		}
	}
}

// stdio is a process's standard streams, both ends.
type stdio struct {
	child []*os.File // stdin, stdout, stderr as the child gets them
	owned []*os.File // child ends to close once it has started (not the shared /dev/null)
	stdin *os.File   // where stdin frames go (nil: not attached)
	out   []*os.File // stdout then stderr; one for a pty
	tty   *os.File   // a pty's master (also stdin and out[0])
	isig  *isigEmu   // a pty whose kernel does not signal for Ctrl-C
}

func (s *stdio) closeChild() { closeAll(s.owned...) }

func (s *stdio) closeParent() {
	if s.tty == nil {
		closeAll(s.stdin)
	}
	closeAll(s.out...)
	if s.isig != nil {
		s.isig.slave.Close()
	}
}

// openStdio makes the streams for er: pipes, or a pty (then pl starts the
// child as a session leader with the pty as its controlling terminal).
func openStdio(er *ExecRequest, pl *plan) (*stdio, error) {
	if er.TTY != nil {
		if !er.TTY.Valid() {
			return nil, fmt.Errorf("pty size %dx%d: rows and cols must be 1..%d", er.TTY.Rows, er.TTY.Cols, MaxWinSize)
		}
		uid := -1
		if c := pl.attr.Sys.Credential; c != nil {
			uid = int(c.Uid)
		}
		master, slave, err := openPTY(*er.TTY, uid)
		if err != nil {
			return nil, err
		}
		var isig *isigEmu
		if emulateISIG || !lineDisciplineSignals() {
			fd, err := unix.FcntlInt(slave.Fd(), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				closeAll(master, slave)
				return nil, fmt.Errorf("dup pty: %w", err)
			}
			isig = &isigEmu{slave: os.NewFile(uintptr(fd), "pty-slave"), master: master, leader: func() int { return 0 }}
		}
		sys := pl.attr.Sys
		sys.Setpgid = false // setsid makes it a group leader
		sys.Setsid = true
		sys.Setctty = true
		sys.Ctty = 0 // the child's fd 0
		return &stdio{
			child: []*os.File{slave, slave, slave},
			owned: []*os.File{slave},
			stdin: master,
			out:   []*os.File{master},
			tty:   master,
			isig:  isig,
		}, nil
	}
	s := &stdio{}
	var stdinR *os.File
	var err error
	if er.Stdin {
		if stdinR, s.stdin, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
		s.owned = append(s.owned, stdinR)
	} else if stdinR, err = openDevNull(); err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		s.closeChild()
		closeAll(s.stdin)
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		s.closeChild()
		closeAll(s.stdin, outR, outW)
		return nil, fmt.Errorf("stderr pipe: %w", err)
	}
	s.child = []*os.File{stdinR, outW, errW}
	s.owned = append(s.owned, outW, errW)
	s.out = []*os.File{outR, errR}
	return s, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}
