package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// hostPTY opens a pseudo-terminal pair on the host, for driving the CLI as
// a person at a terminal would.
func hostPTY(t *testing.T, rows, cols uint16) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(int(m.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// screen collects what the CLI writes to its terminal.
type screen struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitFor waits until the output after from matches re and returns the
// end of the match.
func (s *screen) waitFor(t *testing.T, from int, re string, d time.Duration) int {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(d)
	for {
		out := s.String()
		if loc := rx.FindStringIndex(out[from:]); loc != nil {
			return from + loc[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q on the terminal after %v; it shows %q", re, d, out[from:])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestExecTTY drives `cagebox exec -it ID -- sh` from a host terminal:
// the prompt, the size after a resize, Ctrl-C, the exit code.
func TestExecTTY(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()
	r := e.cli("", "create")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)

	master, slave := hostPTY(t, 30, 100)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "cagebox"), "--home", e.home, "exec", "-it", "-e", "PS1=cbx$ ", id, "--", "sh")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	err := cmd.Start()
	if err != nil {
		t.Fatal(err)
	}
	// The test keeps its slave open, to read the terminal's modes after
	// the CLI has gone.
	var scr screen
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := master.Read(b)
			scr.mu.Lock()
			scr.buf.Write(b[:n])
			scr.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	pos := scr.waitFor(t, 0, `cbx\$ `, time.Minute)
	start := time.Now()
	master.WriteString("stty size\r")
	pos = scr.waitFor(t, pos, `30 100`, 30*time.Second)
	t.Logf("first command answered in %v", time.Since(start))

	// The window grows: SIGWINCH reaches the CLI, which resizes the
	// sandbox's terminal.
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: 160}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(scr.String()[pos:], "50 160") {
		if time.Now().After(deadline) {
			t.Fatalf("stty size never showed 50 160 after the resize: %q", scr.String()[pos:])
		}
		master.WriteString("stty size\r")
		time.Sleep(500 * time.Millisecond)
	}
	pos = len(scr.String())

	// Ctrl-C interrupts sleep 100; the shell (and the CLI) carry on.
	master.WriteString("sleep 100\r")
	time.Sleep(time.Second)
	start = time.Now()
	master.WriteString("\x03")
	master.WriteString("echo alive$((40+2))\r")
	// Any answer before sleep 100 would have ended on its own proves the
	// Ctrl-C: a busy machine may take long, never 90 s.
	scr.waitFor(t, pos, `alive42`, 90*time.Second)
	if el := time.Since(start); el > 90*time.Second {
		t.Fatalf("Ctrl-C took %v", el)
	}

	master.WriteString("exit 3\r")
	err = cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code != 3 {
		t.Fatalf("cagebox exec -it exited %d, want 3; terminal: %q", code, scr.String())
	}

	// The CLI left the terminal as it found it: cooked mode, echo on.
	tio, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if tio.Lflag&unix.ICANON == 0 || tio.Lflag&unix.ECHO == 0 {
		t.Fatalf("the terminal was left in raw mode (lflag %#x)", tio.Lflag)
	}
	// The WebSocket route keeps coder/websocket's Origin check: a page of
	// another site cannot drive a user's terminal; a plain GET gets a JSON
	// 400 saying what the route wants.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", filepath.Join(e.home, "cagebox.sock"))
	}}}
	upgrade := map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
	for _, tc := range []struct {
		name, query, origin string
		upgrade             bool
		code                int
		body                string
	}{
		{"cross-origin", "", "http://evil.example", true, 403, `"kind": "denied"`},
		{"same origin", "?argv=true", "http://cagebox", true, 101, ""},
		{"no upgrade", "", "", false, 400, "WebSocket"},
		{"bad size", "?rows=0", "", true, 400, "rows"},
		{"no such sandbox", "", "", true, 404, "no sandbox"},
	} {
		sbID := id
		if tc.name == "no such sandbox" {
			sbID = "sb-nope"
		}
		req, _ := http.NewRequest("GET", "http://cagebox/v1/sandboxes/"+sbID+"/pty"+tc.query, nil)
		if tc.upgrade {
			for k, v := range upgrade {
				req.Header.Set(k, v)
			}
		}
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(b), tc.body) {
			t.Errorf("%s: %d %q, want %d with %q", tc.name, resp.StatusCode, b, tc.code, tc.body)
		}
	}

	// -t without a terminal says what to do instead.
	r = e.cli("", "exec", "-t", id, "--", "sh")
	if r.code != 125 || !strings.Contains(r.stderr, "stdin is not a terminal") {
		t.Fatalf("exec -t without a terminal: code %d stderr %q", r.code, r.stderr)
	}
}
