package agentproto

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// termBuf collects a terminal's output and lets a test wait for a pattern.
type termBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
	ch  chan struct{} // signalled on each write
}

func newTermBuf() *termBuf { return &termBuf{ch: make(chan struct{}, 1)} }

func (b *termBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	b.buf.Write(p)
	b.mu.Unlock()
	select {
	case b.ch <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (b *termBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor waits until the output after offset from matches re; it returns
// the end of the match.
func (b *termBuf) waitFor(t *testing.T, from int, re string, d time.Duration) int {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.After(d)
	for {
		s := b.String()
		if loc := rx.FindStringIndex(s[from:]); loc != nil {
			return from + loc[1]
		}
		select {
		case <-b.ch:
		case <-deadline:
			t.Fatalf("no %q in terminal output after %v; output: %q", re, d, s[from:])
		}
	}
}

type ptyRun struct {
	in     *io.PipeWriter
	out    *termBuf
	resize chan WinSize
	done   chan struct{}
	res    *ExecResult
	err    error
}

func startPTY(t *testing.T, c *Client, req *ExecRequest) *ptyRun {
	t.Helper()
	pr, pw := io.Pipe()
	r := &ptyRun{in: pw, out: newTermBuf(), resize: make(chan WinSize, 4), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.res, r.err = c.ExecPTY(ctxT(t), req, pr, r.out, r.resize)
	}()
	t.Cleanup(func() { pw.Close() })
	return r
}

func (r *ptyRun) wait(t *testing.T, d time.Duration) *ExecResult {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(d):
		t.Fatalf("pty exec still running after %v; output: %q", d, r.out.String())
	}
	if r.err != nil {
		t.Fatalf("pty exec: %v", r.err)
	}
	return r.res
}

func TestPTYExecSizeAndTerminal(t *testing.T) {
	c, _ := startPair(t, "unix")
	r := startPTY(t, c, &ExecRequest{Argv: []string{"/bin/sh", "-c", "stty size; test -t 0 && test -t 1 && test -t 2 && tty; printf 'err\\n' >&2; exit 7"}, TTY: &WinSize{Rows: 30, Cols: 100}})
	res := r.wait(t, 10*time.Second)
	out := r.out.String()
	if !strings.Contains(out, "30 100\r\n") {
		t.Errorf("stty size on a 30x100 pty: output %q", out)
	}
	if !regexp.MustCompile(`/dev/pts/\d+\r\n`).MatchString(out) {
		t.Errorf("stdin, stdout and stderr should all be the pty: output %q", out)
	}
	if !strings.Contains(out, "err\r\n") {
		t.Errorf("stderr should come through the one output stream: %q", out)
	}
	if res.ExitCode != 7 {
		t.Errorf("exit code %d, want 7 (%+v)", res.ExitCode, res)
	}
}

func TestPTYInteractiveShell(t *testing.T) { testInteractiveShell(t) }

// TestPTYInteractiveShellISIGEmulated runs the same with the agent doing
// the line discipline's signalling (as it does on gVisor): Ctrl-C must
// interrupt the job exactly as the kernel's would.
func TestPTYInteractiveShellISIGEmulated(t *testing.T) {
	emulateISIG = true
	defer func() { emulateISIG = false }()
	testInteractiveShell(t)
}

func testInteractiveShell(t *testing.T) {
	c, _ := startPair(t, "unix")
	r := startPTY(t, c, &ExecRequest{Argv: []string{"/bin/sh"}, Env: []string{"PS1=cbx$ "}, TTY: &WinSize{Rows: 24, Cols: 80}})
	pos := r.out.waitFor(t, 0, `cbx\$ `, 10*time.Second)

	// Resize, then ask the shell until it sees the new size (the resize
	// and the typed line travel on separate goroutines).
	r.resize <- WinSize{Rows: 40, Cols: 132}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.out.String()[pos:], "40 132") {
		if time.Now().After(deadline) {
			t.Fatalf("stty size never showed 40 132 after a resize: %q", r.out.String()[pos:])
		}
		io.WriteString(r.in, "stty size\n")
		time.Sleep(200 * time.Millisecond)
	}
	pos = len(r.out.String())

	// Ctrl-C interrupts the foreground job; the shell survives.
	io.WriteString(r.in, "sleep 100\n")
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	io.WriteString(r.in, "\x03")
	// Any answer before sleep 100 would have ended on its own proves the
	// Ctrl-C: a busy machine may take long, never 90 s.
	pos = r.out.waitFor(t, pos, `cbx\$ `, 90*time.Second)
	io.WriteString(r.in, "echo alive$((40+2))\n")
	r.out.waitFor(t, pos, `alive42`, 90*time.Second)
	if el := time.Since(start); el > 90*time.Second {
		t.Fatalf("Ctrl-C took %v to end sleep 100", el)
	}

	io.WriteString(r.in, "exit 3\n")
	res := r.wait(t, 10*time.Second)
	if res.ExitCode != 3 || res.Signal != "" {
		t.Errorf("shell exit: %+v, want exit code 3", res)
	}
}

func TestPTYTimeoutKillsForegroundJob(t *testing.T) {
	c, srv := startPair(t, "unix")
	pidFile := t.TempDir() + "/pid"
	// The shell runs sleep as a job in a process group of its own: the
	// timeout must reach it too, not only the shell's group.
	r := startPTY(t, c, &ExecRequest{Argv: []string{"/bin/sh", "-i"}, Env: []string{"PS1=cbx$ "}, TTY: &WinSize{Rows: 24, Cols: 80}, Timeout: 2 * time.Second})
	r.out.waitFor(t, 0, `cbx\$ `, 10*time.Second)
	io.WriteString(r.in, "sleep 100 & echo $! > "+pidFile+"; wait\n")
	res := r.wait(t, 15*time.Second)
	if !res.TimedOut || res.Signal != "SIGKILL" {
		t.Errorf("result %+v, want timed out by SIGKILL", res)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := os.ReadFile("/proc/" + pid + "/stat")
		if errors.Is(err, os.ErrNotExist) || (err == nil && strings.Contains(string(st), ") Z ")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shell's background job %s survived the timeout", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The agent unregisters the process just after sending its result.
	for deadline := time.Now().Add(5 * time.Second); srv.Procs() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes still registered", srv.Procs())
		}
	}
}

func TestPTYBadSize(t *testing.T) {
	c, _ := startPair(t, "pipe")
	for _, ws := range []WinSize{{0, 80}, {24, 0}, {MaxWinSize + 1, 80}} {
		_, err := c.ExecPTY(ctxT(t), &ExecRequest{Argv: []string{"true"}, TTY: &ws}, nil, io.Discard, nil)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("size %v: err %v, want ErrInvalid", ws, err)
		}
	}
	if _, err := c.Exec(ctxT(t), &ExecRequest{Argv: []string{"true"}, TTY: &WinSize{24, 80}}, nil, nil, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Exec with a TTY: err %v, want ErrInvalid", err)
	}
}

// TestPTYLoginShell: a pty exec with no command runs the user's login
// shell from the guest's passwd, or /bin/sh when that is not executable.
func TestPTYLoginShell(t *testing.T) {
	c, _ := startPair(t, "unix")
	dir := t.TempDir()
	old := etcDir
	etcDir = dir
	defer func() { etcDir = old }()
	script := filepath.Join(dir, "myshell")
	os.WriteFile(script, []byte("#!/bin/sh\necho login-shell-ran as $0\n"), 0o755)
	for _, tc := range []struct{ shell, want string }{
		{script, "login-shell-ran as " + script},
		{"/no/such/shell", "sh-fallback"},
	} {
		os.WriteFile(filepath.Join(dir, "passwd"), []byte("root:x:0:0:root:/root:"+tc.shell+"\n"), 0o644)
		r := startPTY(t, c, &ExecRequest{TTY: &WinSize{Rows: 24, Cols: 80}})
		if tc.shell != script {
			io.WriteString(r.in, "echo sh-fallback; exit 0\n")
		}
		res := r.wait(t, 10*time.Second)
		if !strings.Contains(r.out.String(), tc.want) || res.ExitCode != 0 {
			t.Errorf("shell %s: %+v, output %q, want %q", tc.shell, res, r.out.String(), tc.want)
		}
	}
}
