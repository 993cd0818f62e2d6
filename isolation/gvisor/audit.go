package gvisor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/internal/syscallaudit"
	"github.com/cagebox/cagebox/isolation"
)

// Syscall audit for gVisor: runsc's strace.
//
// runsc's sentry can log every guest syscall of a list (--strace
// --strace-syscalls) to its debug log, or send them as protobuf events
// to an event channel (--strace-event). The log was chosen: this runsc
// (20221219) has no documented way to hand the event channel to a
// consumer of ours, while the log takes a path. The sentry's log goes to
// a FIFO in the sandbox's state dir (--debug-log=FIFO
// --debug-command=boot: only the sentry's process writes it), which the
// daemon reads as it is written: nothing lands on disk (the log holds
// every exec's environment), and a slow reader only slows the guest (the
// sentry blocks on the full pipe). The log is JSON (--debug-log-format=
// json): gVisor prints paths raw, and only JSON's escaping keeps a file
// name with a newline from forging a line (syscallaudit.ParseStraceLine).
// Records are read at syscall exit, so each has its result.

// Unrecorded implements isolation.AuditGaps: the priv class. The sentry
// applies the sandbox's seccomp profile (--oci-seccomp) before its strace
// sees a syscall, and the profile refuses every priv syscall, so their
// attempts never reach the log (they are still refused).
func (rt *Runtime) Unrecorded(set syscallaudit.Set) (syscallaudit.Set, string) {
	if set.Has(syscallaudit.Priv) {
		p, _ := syscallaudit.Parse([]string{string(syscallaudit.Priv)})
		return p, "gVisor refuses privileged syscalls by seccomp before its strace sees them: attempts are refused but not recorded"
	}
	return 0, ""
}

// auditFIFO is the FIFO below the state dir the sentry's log goes to.
const auditFIFO = "strace.fifo"

// straceArgBytes bounds what the sentry prints of one argument (an
// exec's argv entries, a path).
const straceArgBytes = 512

// straceSyscalls are set's syscalls that runsc can trace: this runsc
// (20221219) refuses to boot with a name its strace table lacks, and it
// lacks openat2 (which its sentry does not implement: ENOSYS, so there
// is nothing to trace).
func straceSyscalls(set syscallaudit.Set) []string {
	var out []string
	for _, n := range syscallaudit.SyscallsOf(set) {
		if n != "openat2" {
			out = append(out, n)
		}
	}
	return out
}

// straceFlags are runsc's global flags that send set's syscalls to fifo.
func straceFlags(set syscallaudit.Set, fifo string) []string {
	return []string{
		"--strace",
		"--strace-syscalls=" + strings.Join(straceSyscalls(set), ","),
		fmt.Sprintf("--strace-log-size=%d", straceArgBytes),
		"--debug-log=" + fifo,
		"--debug-log-format=json",
		"--debug-command=boot",
	}
}

// straceReader reads one sandbox's strace FIFO.
type straceReader struct {
	r, w   *os.File // w keeps the FIFO open, so r never sees EOF between writers
	set    syscallaudit.Set
	traced map[string]bool
	sink   func(syscallaudit.Record)
	log    *slog.Logger
	once   sync.Once
	done   chan struct{}
}

// startStrace makes the FIFO at path and starts reading it.
func startStrace(path string, a isolation.Audit, log *slog.Logger) (*straceReader, error) {
	_ = os.Remove(path)
	if err := unix.Mkfifo(path, 0o600); err != nil {
		return nil, fmt.Errorf("gvisor: audit fifo: %w", err)
	}
	r, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("gvisor: open audit fifo: %w", err)
	}
	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("gvisor: open audit fifo: %w", err)
	}
	s := &straceReader{r: r, w: w, set: a.Classes, sink: a.Sink, log: log, traced: map[string]bool{}, done: make(chan struct{})}
	for _, n := range syscallaudit.SyscallsOf(a.Classes) {
		s.traced[n] = true
	}
	go s.run()
	return s, nil
}

func (s *straceReader) run() {
	defer close(s.done)
	br := bufio.NewReaderSize(s.r, 64<<10)
	skipping := false
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			skipping = true // over-long: drop it to its end
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) {
				s.log.Debug("audit: strace fifo", "err", err)
			}
			return
		}
		if skipping {
			skipping = false
			continue
		}
		r, ok := syscallaudit.ParseStraceLine(line, s.traced)
		if !ok || !s.set.Has(r.Class) {
			continue
		}
		if r.Class == syscallaudit.File && !syscallaudit.SensitiveOpen(r.Path, r.Write) {
			continue
		}
		s.sink(r)
	}
}

// Close stops reading and removes the FIFO. Idempotent.
func (s *straceReader) Close(path string) {
	s.once.Do(func() {
		s.w.Close()
		s.r.Close()
		<-s.done
		_ = os.Remove(path)
	})
}

// withFlags returns run (nil: cmd.Run) with flags added as runsc's last
// global flags, just before the "run" command (so they win over the same
// flags given earlier, e.g. CAGEBOX_GVISOR_DEBUG's --debug-log).
func withFlags(run func(*exec.Cmd) error, flags []string) func(*exec.Cmd) error {
	if run == nil {
		run = (*exec.Cmd).Run
	}
	return func(cmd *exec.Cmd) error {
		at := len(cmd.Args)
		for i, a := range cmd.Args {
			if i > 0 && a == "run" {
				at = i
				break
			}
		}
		args := append(append(append([]string(nil), cmd.Args[:at]...), flags...), cmd.Args[at:]...)
		cmd.Args = args
		return run(cmd)
	}
}

// auditPath is the FIFO's path for a sandbox whose state dir is dir.
func auditPath(dir string) string { return filepath.Join(dir, auditFIFO) }
