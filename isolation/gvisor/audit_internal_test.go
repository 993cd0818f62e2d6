package gvisor

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/syscallaudit"
)

func TestWithFlags(t *testing.T) {
	var got []string
	run := withFlags(func(cmd *exec.Cmd) error { got = cmd.Args; return nil }, []string{"--strace", "--debug-log=/x"})
	cmd := exec.Command("runsc", "--root", "/r", "--debug-log=/dbg/", "run", "--detach", "--bundle", "/b", "id")
	if err := run(cmd); err != nil {
		t.Fatal(err)
	}
	want := []string{"runsc", "--root", "/r", "--debug-log=/dbg/", "--strace", "--debug-log=/x", "run", "--detach", "--bundle", "/b", "id"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("args %q, want %q", got, want)
	}
}

func TestStraceFlags(t *testing.T) {
	all, _ := syscallaudit.Parse([]string{"all"})
	f := strings.Join(straceFlags(all, "/s/strace.fifo"), " ")
	for _, want := range []string{"--strace ", "--debug-log=/s/strace.fifo", "--debug-log-format=json", "--debug-command=boot", "execve", "connect", "openat", "mount"} {
		if !strings.Contains(f, want) {
			t.Errorf("flags %q lack %q", f, want)
		}
	}
	if strings.Contains(f, "openat2") {
		t.Errorf("flags %q name openat2, which this runsc refuses", f)
	}
}
