//go:build linux

package agentproto

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startPair connects a Client to a Server over transport ("pipe" or "unix").
func startPair(t testing.TB, transport string) (*Client, *Server) {
	t.Helper()
	srv := &Server{Token: testToken, Logger: testLogger(t)}
	var clientConn net.Conn
	var wg sync.WaitGroup
	switch transport {
	case "pipe":
		a, b := net.Pipe()
		clientConn = a
		wg.Add(1)
		go func() { defer wg.Done(); srv.ServeConn(b) }()
	case "unix":
		sock := filepath.Join(t.TempDir(), "agent.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := ln.Accept()
			ln.Close()
			if err != nil {
				return
			}
			srv.ServeConn(conn)
		}()
		if clientConn, err = net.Dial("unix", sock); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("unknown transport %q", transport)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := NewClient(ctx, clientConn, testToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		wg.Wait()
	})
	return c, srv
}

var transports = []string{"pipe", "unix"}

func forTransports(t *testing.T, fn func(t *testing.T, c *Client)) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			t.Parallel()
			c, _ := startPair(t, tr)
			fn(t, c)
		})
	}
}

func execOut(t *testing.T, c *Client, req *ExecRequest, stdin io.Reader) (*ExecResult, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := c.Exec(ctxT(t), req, stdin, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return res, out.String(), errb.String()
}

func TestExec(t *testing.T) {
	dir := t.TempDir()
	forTransports(t, func(t *testing.T, c *Client) {
		tests := []struct {
			name           string
			req            ExecRequest
			stdin          io.Reader
			want           ExecResult
			stdout, stderr string
		}{
			{
				name:   "argv env cwd",
				req:    ExecRequest{Argv: []string{"sh", "-c", `echo "$FOO $(pwd) $0"; echo oops >&2; exit 3`, "zero"}, Env: []string{"FOO=bar"}, Cwd: dir},
				want:   ExecResult{ExitCode: 3},
				stdout: "bar " + dir + " zero\n", stderr: "oops\n",
			},
			{
				name:   "base env",
				req:    ExecRequest{Argv: []string{"sh", "-c", `echo "$HOME $LANG $(pwd)"`}},
				stdout: "/root C.UTF-8 /\n",
			},
			{
				name:   "env override",
				req:    ExecRequest{Argv: []string{"sh", "-c", `echo "$LANG"`}, Env: []string{"LANG=fr_FR.UTF-8"}},
				stdout: "fr_FR.UTF-8\n",
			},
			{
				name: "not found",
				req:  ExecRequest{Argv: []string{"no-such-cmd-cagebox"}},
				want: ExecResult{ExitCode: 127, Error: "executable file not found: no-such-cmd-cagebox"},
			},
			{
				name: "not found path",
				req:  ExecRequest{Argv: []string{"/no/such/cmd"}},
				want: ExecResult{ExitCode: 127, Error: "exec /no/such/cmd: no such file or directory"},
			},
			{
				name: "bad cwd",
				req:  ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"},
				want: ExecResult{ExitCode: 126, Error: "chdir /no/such/dir: no such file or directory"},
			},
			{
				name:   "stdin",
				req:    ExecRequest{Argv: []string{"cat"}},
				stdin:  strings.NewReader("hello\nworld\n"),
				stdout: "hello\nworld\n",
			},
			{
				name: "stdin attached but nil",
				req:  ExecRequest{Argv: []string{"cat"}, Stdin: true},
			},
			{
				name: "stdin not attached",
				req:  ExecRequest{Argv: []string{"cat"}},
			},
			{
				name: "killed by signal",
				req:  ExecRequest{Argv: []string{"sh", "-c", "kill -9 $$"}},
				want: ExecResult{ExitCode: 137, Signal: "SIGKILL"},
			},
			{
				name: "terminated",
				req:  ExecRequest{Argv: []string{"sh", "-c", "kill -TERM $$"}},
				want: ExecResult{ExitCode: 143, Signal: "SIGTERM"},
			},
			{
				name:   "background child keeps stdout",
				req:    ExecRequest{Argv: []string{"sh", "-c", "sleep 5 & echo done"}},
				stdout: "done\n",
			},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				res, out, errOut := execOut(t, c, &tt.req, tt.stdin)
				if *res != tt.want {
					t.Errorf("result = %+v, want %+v", *res, tt.want)
				}
				if out != tt.stdout || errOut != tt.stderr {
					t.Errorf("stdout %q stderr %q, want %q %q", out, errOut, tt.stdout, tt.stderr)
				}
			})
		}
	})
}

func TestExecNotExecutable(t *testing.T) {
	c, _ := startPair(t, "unix")
	p := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, _, _ := execOut(t, c, &ExecRequest{Argv: []string{p}}, nil)
	if res.ExitCode != 126 || !strings.Contains(res.Error, "permission denied") {
		t.Errorf("result = %+v, want 126 permission denied", res)
	}
	res, _, _ = execOut(t, c, &ExecRequest{Argv: []string{"script"}, Env: []string{"PATH=" + filepath.Dir(p)}}, nil)
	if res.ExitCode != 126 {
		t.Errorf("PATH lookup: result = %+v, want 126", res)
	}
}

func TestExecLargeStdin(t *testing.T) {
	forTransports(t, func(t *testing.T, c *Client) {
		in := make([]byte, 3<<20)
		rand.Read(in)
		res, out, _ := execOut(t, c, &ExecRequest{Argv: []string{"cat"}}, bytes.NewReader(in))
		if res.ExitCode != 0 || out != string(in) {
			t.Fatalf("exit %d, got %d bytes back, want %d identical", res.ExitCode, len(out), len(in))
		}
	})
}

// notifyWriter reports its first write.
type notifyWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	first chan struct{}
}

func (w *notifyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() == 0 {
		close(w.first)
	}
	return w.buf.Write(p)
}

func (w *notifyWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func TestExecStreamsOutput(t *testing.T) {
	forTransports(t, func(t *testing.T, c *Client) {
		w := &notifyWriter{first: make(chan struct{})}
		type result struct {
			res *ExecResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := c.Exec(ctxT(t), &ExecRequest{Argv: []string{"sh", "-c", "echo a; sleep 2; echo b"}}, nil, w, nil)
			done <- result{res, err}
		}()
		select {
		case <-w.first:
			if got := w.String(); got != "a\n" {
				t.Errorf("first output %q, want %q", got, "a\n")
			}
		case <-time.After(time.Second):
			t.Fatal("no output within 1s")
		case r := <-done:
			t.Fatalf("exec returned before streaming: %+v %v", r.res, r.err)
		}
		r := <-done
		if r.err != nil || r.res.ExitCode != 0 || w.String() != "a\nb\n" {
			t.Fatalf("exec = %+v, %v, output %q", r.res, r.err, w.String())
		}
	})
}

// gone reports whether pid no longer runs (absent or a zombie).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] == 'Z'
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still running", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	forTransports(t, func(t *testing.T, c *Client) {
		start := time.Now()
		res, out, _ := execOut(t, c, &ExecRequest{
			Argv:    []string{"sh", "-c", "sleep 30 & echo $!; wait"},
			Timeout: 300 * time.Millisecond,
		}, nil)
		if !res.TimedOut || res.ExitCode != 137 || res.Signal != "SIGKILL" {
			t.Errorf("result = %+v, want timed out, 137, SIGKILL", res)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v", d)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("child pid %q: %v", out, err)
		}
		waitGone(t, pid)
	})
}

func TestExecCancelKills(t *testing.T) {
	forTransports(t, func(t *testing.T, c *Client) {
		w := &notifyWriter{first: make(chan struct{})}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			_, err := c.Exec(ctx, &ExecRequest{Argv: []string{"sh", "-c", "sleep 30 & echo $!; wait"}}, nil, w, nil)
			errc <- err
		}()
		select {
		case <-w.first:
		case <-time.After(5 * time.Second):
			t.Fatal("no pid printed")
		}
		cancel()
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("exec error %v, want context.Canceled", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("exec did not return after cancel")
		}
		pid, err := strconv.Atoi(strings.TrimSpace(w.String()))
		if err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid)
	})
}

// endless is an infinite stdin.
type endless struct{}

func (endless) Read(p []byte) (int, error) { return len(p), nil }

func TestExecCancelWithStdinBackpressure(t *testing.T) {
	c, srv := startPair(t, "unix")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	// sleep never reads stdin: the pipe, the stream window and the
	// connection all fill up, yet cancel must still kill it.
	_, err := c.Exec(ctx, &ExecRequest{Argv: []string{"sleep", "30"}}, endless{}, nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exec error %v, want deadline exceeded", err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for srv.Procs() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes still running", srv.Procs())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecConcurrent(t *testing.T) {
	forTransports(t, func(t *testing.T, c *Client) {
		const n = 20
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var out bytes.Buffer
				res, err := c.Exec(ctxT(t), &ExecRequest{Argv: []string{"sh", "-c", `echo "$0"; sleep 0.2; exit $(($0 % 7))`, strconv.Itoa(i)}}, nil, &out, nil)
				switch {
				case err != nil:
					errs <- err
				case res.ExitCode != i%7 || out.String() != fmt.Sprintf("%d\n", i):
					errs <- fmt.Errorf("exec %d: result %+v output %q", i, res, out.String())
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func TestExecUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch users")
	}
	c, _ := startPair(t, "unix")
	tests := []struct {
		user, want string
	}{
		{"65534", "65534 65534 65534"},
		{"65534:123", "65534 123 123"},
		{"nobody", "65534 65534 65534"},
		{"0", "0 0 0"},
	}
	for _, tt := range tests {
		res, out, errOut := execOut(t, c, &ExecRequest{Argv: []string{"sh", "-c", `echo $(id -u) $(id -g) $(id -G)`}, User: tt.user}, nil)
		if res.ExitCode != 0 || strings.TrimSpace(out) != tt.want {
			t.Errorf("user %q: %+v %q %q, want %q", tt.user, res, out, errOut, tt.want)
		}
	}
	res, _, _ := execOut(t, c, &ExecRequest{Argv: []string{"true"}, User: "no-such-user-cagebox"}, nil)
	if res.ExitCode != 126 || !strings.Contains(res.Error, "unknown user") {
		t.Errorf("unknown user: %+v", res)
	}
}

func TestHealth(t *testing.T) {
	forTransports(t, func(t *testing.T, c *Client) {
		h, err := c.Health(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if h.PID != os.Getpid() || h.Version != Version || h.Uptime <= 0 || h.Procs != 0 {
			t.Errorf("health = %+v", h)
		}
		if c.AgentVersion() != Version {
			t.Errorf("agent version %q", c.AgentVersion())
		}
	})
}

func TestWrongToken(t *testing.T) {
	a, b := net.Pipe()
	srv := &Server{Token: testToken, Logger: testLogger(t)}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeConn(b) }()
	_, err := NewClient(ctxT(t), a, "wrong")
	if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), "bad token") {
		t.Fatalf("NewClient with wrong token: %v", err)
	}
	if err := <-errc; err == nil {
		t.Fatal("server accepted a wrong token")
	}
}

func TestHandshakeTimeout(t *testing.T) {
	old := handshakeTimeout
	handshakeTimeout = 200 * time.Millisecond
	t.Cleanup(func() { handshakeTimeout = old })
	a, b := net.Pipe()
	defer a.Close()
	srv := &Server{Token: testToken, Logger: testLogger(t)}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeConn(b) }()
	a.Write([]byte{byte(frameHello), 0, 0}) // a partial header, then silence
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "timed out") {
			t.Fatalf("ServeConn = %v, want timeout", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("server waited for the handshake forever")
	}
}

func TestNewClientContext(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	go io.Copy(io.Discard, b) // an "agent" that never answers
	_, err := NewClient(ctx, a, testToken)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("NewClient = %v, want deadline exceeded", err)
	}
}

func TestEmptyServerToken(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	if err := (&Server{}).ServeConn(b); err == nil {
		t.Fatal("server without token served")
	}
}

func TestFiles(t *testing.T) {
	forTransports(t, func(t *testing.T, c *Client) {
		ctx := ctxT(t)
		dir := t.TempDir()
		p := filepath.Join(dir, "a", "b", "c.txt")
		data := make([]byte, 200<<10+17)
		rand.Read(data)
		if err := c.WriteFile(ctx, p, 0o600, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != int64(len(data)) {
			t.Fatalf("stat after write: %v %v", fi, err)
		}
		// Overwrite, and an empty file.
		if err := c.WriteFile(ctx, p, 0o644, strings.NewReader("small")); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteFile(ctx, filepath.Join(dir, "a", "empty"), 0o755, strings.NewReader("")); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := c.ReadFile(ctx, p, &buf, 5); err != nil || buf.String() != "small" {
			t.Fatalf("read back %q, %v", buf.String(), err)
		}
		if err := c.WriteFile(ctx, p, 0o644, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		buf.Reset()
		if err := c.ReadFile(ctx, p, &buf, 1<<20); err != nil || !bytes.Equal(buf.Bytes(), data) {
			t.Fatalf("read back %d bytes, %v", buf.Len(), err)
		}
		err = c.ReadFile(ctx, p, io.Discard, int64(len(data)-1))
		if !errors.Is(err, ErrTooLarge) || !strings.HasPrefix(err.Error(), "agent: ") {
			t.Fatalf("read over max: %v", err)
		}
		err = c.ReadFile(ctx, filepath.Join(dir, "nope"), io.Discard, 10)
		if !errors.Is(err, fs.ErrNotExist) || err.Error() != "agent: stat "+filepath.Join(dir, "nope")+": no such file or directory" {
			t.Fatalf("read missing: %v", err)
		}
		if err := c.ReadFile(ctx, dir, io.Discard, 10); !errors.Is(err, ErrInvalid) {
			t.Fatalf("read dir: %v", err)
		}
		if err := c.ReadFile(ctx, "relative", io.Discard, 10); !errors.Is(err, ErrInvalid) {
			t.Fatalf("read relative: %v", err)
		}
		if err := c.WriteFile(ctx, filepath.Join(p, "under-a-file"), 0o644, strings.NewReader("x")); err == nil || !strings.HasPrefix(err.Error(), "agent: ") {
			t.Fatalf("write under a file: %v", err)
		}

		os.Symlink("a/b/c.txt", filepath.Join(dir, "link"))
		ents, err := c.ListDir(ctx, filepath.Join(dir))
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]FileInfo{}
		for _, e := range ents {
			got[e.Name] = e
		}
		if len(got) != 2 || !got["a"].IsDir || got["a"].Mode&fs.ModeDir == 0 || got["link"].Mode&fs.ModeSymlink == 0 {
			t.Fatalf("listing %+v", ents)
		}
		ents, err = c.ListDir(ctx, filepath.Join(dir, "a", "b"))
		if err != nil || len(ents) != 1 || ents[0].Name != "c.txt" || ents[0].Size != int64(len(data)) || ents[0].Mode != 0o644 || ents[0].IsDir || ents[0].ModTime.IsZero() {
			t.Fatalf("listing %+v %v", ents, err)
		}
		if _, err := c.ListDir(ctx, filepath.Join(dir, "nope")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("list missing: %v", err)
		}
	})
}

func TestListDirLarge(t *testing.T) {
	c, _ := startPair(t, "unix")
	dir := t.TempDir()
	const n = 3000
	for i := range n {
		name := fmt.Sprintf("%04d-%s", i, strings.Repeat("x", 200))
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := c.ListDir(ctxT(t), dir)
	if err != nil || len(ents) != n {
		t.Fatalf("got %d entries, %v", len(ents), err)
	}
}

func TestShutdown(t *testing.T) {
	c, srv := startPair(t, "unix")
	errc := make(chan error, 1)
	var res *ExecResult
	go func() {
		var err error
		res, err = c.Exec(ctxT(t), &ExecRequest{Argv: []string{"sleep", "30"}}, nil, nil, nil)
		errc <- err
	}()
	for srv.Procs() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil || res.Signal != "SIGTERM" {
		t.Fatalf("exec after shutdown: %+v %v", res, err)
	}
	res, _, _ = execOut(t, c, &ExecRequest{Argv: []string{"true"}}, nil)
	if res.ExitCode == 0 || !strings.Contains(res.Error, "shutting down") {
		t.Fatalf("exec during shutdown: %+v", res)
	}
}

func BenchmarkExecTrue(b *testing.B) {
	c, _ := startPair(b, "unix")
	ctx := context.Background()
	req := &ExecRequest{Argv: []string{"/bin/true"}}
	for b.Loop() {
		res, err := c.Exec(ctx, req, nil, io.Discard, io.Discard)
		if err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
	}
}

// BenchmarkExecNotFound is an exec round trip without the fork: the
// protocol's own cost (stream, request, PATH lookup, result).
func BenchmarkExecNotFound(b *testing.B) {
	c, _ := startPair(b, "unix")
	ctx := context.Background()
	req := &ExecRequest{Argv: []string{"no-such-cmd-cagebox"}}
	for b.Loop() {
		res, err := c.Exec(ctx, req, nil, io.Discard, io.Discard)
		if err != nil || res.ExitCode != 127 {
			b.Fatal(res, err)
		}
	}
}

func BenchmarkHealth(b *testing.B) {
	c, _ := startPair(b, "unix")
	ctx := context.Background()
	for b.Loop() {
		if _, err := c.Health(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkForkExecTrue is the baseline: starting /bin/true directly.
func BenchmarkForkExecTrue(b *testing.B) {
	for b.Loop() {
		p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{Sys: &syscall.SysProcAttr{Setpgid: true}})
		if err != nil {
			b.Fatal(err)
		}
		p.Wait()
	}
}

// TestRefused: a server that refuses announces it at the handshake, still
// answers health, and fails every exec and file operation with its reason;
// a server's StartProcess starts the processes it runs.
func TestRefused(t *testing.T) {
	srv := &Server{Token: testToken, Logger: testLogger(t), Refused: "processes the agent starts would hold CapBnd=0000000000000100 (CAP_SETPCAP)"}
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() { defer close(done); srv.ServeConn(b) }()
	c, err := NewClient(ctxT(t), a, testToken)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Close(); <-done }()
	if err := c.Refused(); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "CAP_SETPCAP") {
		t.Fatalf("Refused() = %v", err)
	}
	if _, err := c.Health(ctxT(t)); err != nil {
		t.Fatalf("health: %v", err)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	for name, op := range map[string]func() error{
		"exec": func() error {
			_, err := c.Exec(ctxT(t), &ExecRequest{Argv: []string{"touch", marker}}, nil, nil, nil)
			return err
		},
		"write": func() error { return c.WriteFile(ctxT(t), marker, 0o644, strings.NewReader("x")) },
		"read":  func() error { return c.ReadFile(ctxT(t), "/etc/hostname", io.Discard, 0) },
		"list": func() error {
			_, err := c.ListDir(ctxT(t), "/")
			return err
		},
	} {
		if err := op(); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "CAP_SETPCAP") {
			t.Errorf("%s: %v, want the refusal", name, err)
		}
	}
	if _, err := os.Stat(marker); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refusing server ran something: %v", err)
	}

	c2, srv2 := startPair(t, "pipe")
	if err := c2.Refused(); err != nil {
		t.Fatalf("Refused() of a server that runs processes: %v", err)
	}
	var started []string
	var mu sync.Mutex
	srv2.StartProcess = func(name string, argv []string, attr *os.ProcAttr) (*os.Process, error) {
		mu.Lock()
		started = append(started, name)
		mu.Unlock()
		return os.StartProcess(name, argv, attr)
	}
	if res, out, _ := execOut(t, c2, &ExecRequest{Argv: []string{"echo", "hi"}}, nil); res.ExitCode != 0 || out != "hi\n" {
		t.Fatalf("exec through StartProcess: %+v %q", res, out)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(started) != 1 || !strings.HasSuffix(started[0], "/echo") {
		t.Errorf("StartProcess started %v", started)
	}
}
