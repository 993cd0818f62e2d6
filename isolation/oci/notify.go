package oci

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/syscallaudit"
)

// Syscall audit for containers: seccomp user notification.
//
// The profile (AuditProfile) sends the audited syscalls to a listener
// (SCMP_ACT_NOTIFY). runc, when it loads the filter, connects to the
// profile's listenerPath — a unix socket in the sandbox's state dir that
// the daemon listens on (Notifier) — and passes the filter's notification
// fd (SCM_RIGHTS, with runc's container-process-state JSON). The daemon
// then receives each notification, reads the arguments it records from
// /proc/PID/mem, checks with SECCOMP_IOCTL_NOTIF_ID_VALID that the
// notification is still live (the pid was not reused while it read), and
// answers:
//
//   - exec, net, file (syscalls the profile allows): CONTINUE — the kernel
//     runs the syscall as if the filter had allowed it. The daemon only
//     records; it never makes an allow decision from memory the guest can
//     change after it was read (that would be a TOCTOU hole).
//   - priv (every one refused by the profile): EPERM, as the profile's
//     ERRNO rule would; a refusal is never a TOCTOU risk.
//   - a syscall the daemon cannot name (an unexpected ABI): EPERM.
//
// If the daemon's end goes away (daemon restart, listener stopped), the
// kernel fails every notified syscall with ENOSYS: audited syscalls fail
// closed, they are never run unrecorded and never hang.

// AuditListener is the socket below the state dir that runc passes the
// notification fd to.
const AuditListener = "seccomp.sock"

// AuditProfile changes sp's seccomp profile to notify the audited
// syscalls of set to the listener at listener: the priv syscalls leave
// the profile's ERRNO rule for a NOTIFY rule (the listener answers EPERM),
// and the syscalls of the other classes get a NOTIFY rule of their own
// (none of them has a rule in the profile).
func AuditProfile(sp *specs.Spec, set syscallaudit.Set, listener string) {
	if set.Empty() || sp.Linux == nil || sp.Linux.Seccomp == nil {
		return
	}
	sc := sp.Linux.Seccomp
	notify := syscallaudit.SyscallsOf(set)
	moved := map[string]bool{}
	for _, n := range notify {
		moved[n] = true
	}
	rules := make([]specs.LinuxSyscall, 0, len(sc.Syscalls)+1)
	for _, r := range sc.Syscalls {
		if len(r.Args) == 0 {
			var keep []string
			for _, n := range r.Names {
				if !moved[n] {
					keep = append(keep, n)
				}
			}
			if len(keep) == 0 {
				continue
			}
			r.Names = keep
		}
		rules = append(rules, r)
	}
	rules = append(rules, specs.LinuxSyscall{Names: notify, Action: specs.ActNotify})
	sc.Syscalls = rules
	sc.ListenerPath = listener
}

// seccompData, seccompNotif and seccompNotifResp are the kernel's struct
// seccomp_data, seccomp_notif and seccomp_notif_resp (linux/seccomp.h;
// golang.org/x/sys has the ioctl numbers but not the structs).
type seccompData struct {
	Nr   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

type seccompNotif struct {
	ID    uint64
	PID   uint32
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// Notifier is the daemon's end of one container's seccomp notifications.
type Notifier struct {
	path string
	set  syscallaudit.Set
	sink func(syscallaudit.Record)
	log  *slog.Logger
	ln   *net.UnixListener

	done chan struct{}
	stop chan struct{}
	once sync.Once
	// mu guards fd.
	mu sync.Mutex
	fd int // -1 until runc passes it
}

// StartNotifier listens at path for the notification fd of a container
// whose profile AuditProfile made, and serves its notifications until
// Close, or until no task of the container is left.
func StartNotifier(path string, set syscallaudit.Set, sink func(syscallaudit.Record), log *slog.Logger) (*Notifier, error) {
	if log == nil {
		log = slog.Default()
	}
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("audit: listen for the seccomp notification fd: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("audit: chmod listener: %w", err)
	}
	n := &Notifier{path: path, set: set, sink: sink, log: log, ln: ln, fd: -1,
		done: make(chan struct{}), stop: make(chan struct{})}
	go n.run()
	return n, nil
}

// Close stops serving and closes the notification fd: from then on the
// container's audited syscalls fail with ENOSYS. Idempotent.
func (n *Notifier) Close() {
	n.once.Do(func() {
		close(n.stop)
		n.ln.Close()
		<-n.done
		_ = os.Remove(n.path)
	})
}

// Done is closed when the notifier stops.
func (n *Notifier) Done() <-chan struct{} { return n.done }

func (n *Notifier) run() {
	defer close(n.done)
	fd, err := n.receiveFD()
	n.ln.Close()
	if err != nil {
		select {
		case <-n.stop:
		default:
			n.log.Warn("audit: no seccomp notification fd", "err", err)
		}
		return
	}
	defer unix.Close(fd)
	n.serve(fd)
}

// receiveFD accepts runc's connection and takes the notification fd from
// it (the first SCM_RIGHTS fd; any other is closed).
func (n *Notifier) receiveFD() (int, error) {
	conn, err := n.ln.AcceptUnix()
	if err != nil {
		return -1, err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*8))
	nb, noob, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return -1, fmt.Errorf("read process state: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:noob])
	if err != nil {
		return -1, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	// runc's state names each fd; "seccompFd" is ours.
	var st specs.ContainerProcessState
	_ = json.Unmarshal(buf[:nb], &st)
	idx := -1
	for i, name := range st.Fds {
		if name == specs.SeccompFdName && i < len(fds) {
			idx = i
		}
	}
	if idx < 0 && len(fds) > 0 {
		idx = 0
	}
	for i, f := range fds {
		if i != idx {
			unix.Close(f)
		}
	}
	if idx < 0 {
		return -1, errors.New("runc passed no fd")
	}
	unix.CloseOnExec(fds[idx])
	return fds[idx], nil
}

// serve answers notifications until stop, or until the fd hangs up (no
// task uses the filter any more).
func (n *Notifier) serve(fd int) {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		select {
		case <-n.stop:
			return
		default:
		}
		pfd[0].Revents = 0
		k, err := unix.Poll(pfd, 200)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			n.log.Warn("audit: poll seccomp fd", "err", err)
			return
		}
		if k == 0 {
			continue
		}
		if pfd[0].Revents&unix.POLLIN == 0 {
			return // POLLHUP: the container is gone
		}
		var req seccompNotif
		if err := ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&req)); err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOENT) {
				continue // the task was killed before we took it
			}
			n.log.Warn("audit: receive seccomp notification", "err", err)
			return
		}
		n.handle(fd, &req)
	}
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

// handle reads what one notification records, answers it, and hands the
// record to the sink.
func (n *Notifier) handle(fd int, req *seccompNotif) {
	name := syscallName(req.Data.Arch, req.Data.Nr)
	class := syscallaudit.ClassOf(name)
	resp := seccompNotifResp{ID: req.ID}
	rec := syscallaudit.Record{Class: class, Syscall: name}
	switch class {
	case syscallaudit.Exec, syscallaudit.Net, syscallaudit.File:
		resp.Flags = unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE
		rec = readArgs(int(req.PID), name, &req.Data)
		rec.Class, rec.Syscall = class, name
	default:
		// priv, or a syscall number of an ABI we do not name: refused.
		resp.Error = -int32(unix.EPERM)
		rec.Class, rec.Result, rec.Errno = syscallaudit.Priv, syscallaudit.ResultDenied, int(unix.EPERM)
		if name == "" {
			rec.Syscall = fmt.Sprintf("arch %#x nr %d", req.Data.Arch, req.Data.Nr)
		}
	}
	emit := n.set.Has(rec.Class)
	if rec.Class == syscallaudit.File && !syscallaudit.SensitiveOpen(rec.Path, rec.Write) {
		emit = false
	}
	if emit {
		rec.PID = guestPID(int(req.PID))
	}
	// What was read is trusted only if the notification is still live
	// (the task is still in this syscall: its pid was not reused).
	id := req.ID
	valid := ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_ID_VALID, unsafe.Pointer(&id)) == nil
	if err := ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp)); err != nil && !errors.Is(err, unix.ENOENT) {
		n.log.Warn("audit: answer seccomp notification", "syscall", name, "err", err)
	}
	if emit && valid {
		n.sink(rec.Bounded())
	}
}

// syscallName names a notified syscall; "" for one of an ABI other than
// x86_64 (i386, x32), which the listener refuses.
func syscallName(arch uint32, nr int32) string {
	if arch != unix.AUDIT_ARCH_X86_64 || nr&0x40000000 != 0 {
		return ""
	}
	return syscallaudit.NameOf(nr)
}

// readArgs reads the arguments of an exec, connect or open by pid (a host
// pid) from its memory. Failures leave fields empty: the record still
// says the syscall happened.
func readArgs(pid int, name string, d *seccompData) syscallaudit.Record {
	var r syscallaudit.Record
	mem, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mem")
	if err != nil {
		return r
	}
	defer mem.Close()
	switch name {
	case "execve", "execveat":
		pathArg, argvArg := d.Args[0], d.Args[1]
		if name == "execveat" {
			pathArg, argvArg = d.Args[1], d.Args[2]
		}
		r.Path = readString(mem, pathArg, syscallaudit.MaxPath+1)
		for i := 0; i <= syscallaudit.MaxArgs; i++ {
			var p [8]byte
			if _, err := mem.ReadAt(p[:], int64(argvArg)+int64(8*i)); err != nil {
				break
			}
			ptr := binary.LittleEndian.Uint64(p[:])
			if ptr == 0 {
				break
			}
			r.Argv = append(r.Argv, readString(mem, ptr, syscallaudit.MaxArgBytes+1))
		}
	case "connect":
		size := min(int(d.Args[2]), 128)
		if size < 2 {
			return r
		}
		sa := make([]byte, size)
		if n, _ := mem.ReadAt(sa, int64(d.Args[1])); n >= 2 {
			r = syscallaudit.ParseSockaddr(sa[:n])
		}
	case "open", "creat":
		r.Path = readString(mem, d.Args[0], syscallaudit.MaxPath+1)
		r.Write = name == "creat" || openWrites(d.Args[1])
		r.Path = resolve(pid, unix.AT_FDCWD, r.Path)
	case "openat", "openat2":
		r.Path = readString(mem, d.Args[1], syscallaudit.MaxPath+1)
		flags := d.Args[2]
		if name == "openat2" {
			var how [8]byte
			if _, err := mem.ReadAt(how[:], int64(d.Args[2])); err == nil {
				flags = binary.LittleEndian.Uint64(how[:])
			}
		}
		r.Write = openWrites(flags)
		r.Path = resolve(pid, int(int32(uint32(d.Args[0]))), r.Path)
	}
	return r
}

func openWrites(flags uint64) bool {
	return flags&unix.O_ACCMODE != unix.O_RDONLY || flags&(unix.O_CREAT|unix.O_TRUNC) != 0
}

// readString reads a NUL-terminated string of at most max bytes at addr,
// one page at most at a time (a string may end just before an unmapped
// page).
func readString(mem *os.File, addr uint64, max int) string {
	var out []byte
	for len(out) < max {
		chunk := min(4096-int(addr%4096), max-len(out))
		buf := make([]byte, chunk)
		n, _ := mem.ReadAt(buf, int64(addr))
		if n <= 0 {
			break
		}
		if i := indexNUL(buf[:n]); i >= 0 {
			return string(append(out, buf[:i]...))
		}
		out = append(out, buf[:n]...)
		addr += uint64(n)
	}
	return string(out)
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

// resolve makes a relative path absolute in the guest's view, from the
// task's cwd (dirfd AT_FDCWD) or the directory dirfd names, both seen
// below the task's root.
func resolve(pid, dirfd int, p string) string {
	if p == "" || strings.HasPrefix(p, "/") {
		return p
	}
	proc := "/proc/" + strconv.Itoa(pid)
	root, err := os.Readlink(proc + "/root")
	if err != nil {
		return p
	}
	link := proc + "/cwd"
	if dirfd != unix.AT_FDCWD {
		link = proc + "/fd/" + strconv.Itoa(dirfd)
	}
	dir, err := os.Readlink(link)
	if err != nil {
		return p
	}
	if root != "/" {
		rel, ok := strings.CutPrefix(dir, root)
		if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
			return p
		}
		dir = rel
	}
	return filepath.Join("/", dir, p)
}

// guestPID is pid's number in its innermost pid namespace (the last
// NSpid of /proc/PID/status); 0 when it cannot be read.
func guestPID(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				v, _ := strconv.Atoi(f[len(f)-1])
				return v
			}
		}
	}
	return 0
}
