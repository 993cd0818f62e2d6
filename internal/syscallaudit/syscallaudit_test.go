package syscallaudit

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
		err  string
	}{
		{in: nil, want: nil},
		{in: []string{"exec"}, want: []string{"exec"}},
		{in: []string{"priv,exec", "net"}, want: []string{"exec", "net", "priv"}},
		{in: []string{" FILE "}, want: []string{"file"}},
		{in: []string{"all"}, want: []string{"exec", "net", "file", "priv"}},
		{in: []string{"exec,bogus"}, err: `unknown audit class "bogus": use exec, net, file, priv`},
		{in: []string{""}, err: `unknown audit class ""`},
		{in: []string{"exec,"}, err: `unknown audit class ""`},
	} {
		s, err := Parse(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Parse(%q) = %v, want error %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(s.Strings(), tc.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, s.Strings(), err, tc.want)
		}
	}
	s, _ := Parse([]string{"exec,priv"})
	got := SyscallsOf(s)
	for _, want := range []string{"execve", "execveat", "mount", "unshare", "ptrace", "bpf"} {
		if !contains(got, want) {
			t.Errorf("SyscallsOf(exec,priv) lacks %s: %v", want, got)
		}
	}
	if contains(got, "connect") || contains(got, "openat") {
		t.Errorf("SyscallsOf(exec,priv) has syscalls of other classes: %v", got)
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func TestBounded(t *testing.T) {
	long := strings.Repeat("a", 1000)
	many := make([]string, 100)
	for i := range many {
		many[i] = "x"
	}
	r := Record{Argv: []string{"/bin/echo", long, "ok"}}.Bounded()
	if len(r.Argv[1]) != MaxArgBytes || !r.ArgvTruncated {
		t.Errorf("long arg: len %d truncated %v", len(r.Argv[1]), r.ArgvTruncated)
	}
	r = Record{Argv: many}.Bounded()
	if len(r.Argv) != MaxArgs || !r.ArgvTruncated {
		t.Errorf("many args: %d truncated %v", len(r.Argv), r.ArgvTruncated)
	}
	big := make([]string, 30)
	for i := range big {
		big[i] = strings.Repeat("b", 200)
	}
	r = Record{Argv: big}.Bounded()
	sum := 0
	for _, a := range r.Argv {
		sum += len(a)
	}
	if sum > MaxArgvSum || !r.ArgvTruncated {
		t.Errorf("argv sum %d > %d or not marked", sum, MaxArgvSum)
	}
	r = Record{Argv: []string{"/bin/echo", "hi"}}.Bounded()
	if r.ArgvTruncated || !reflect.DeepEqual(r.Argv, []string{"/bin/echo", "hi"}) {
		t.Errorf("small argv changed: %+v", r)
	}
	r = Record{Path: "/tmp/\xff\xfe" + long}.Bounded()
	if len(r.Path) > MaxPath || strings.Contains(r.Path, "\xff") {
		t.Errorf("path not bounded/valid: %q", r.Path[:20])
	}
}

func TestSensitiveOpen(t *testing.T) {
	for _, tc := range []struct {
		path  string
		write bool
		want  bool
	}{
		{"/etc/shadow", false, true},
		{"/etc/../etc/shadow", false, true},
		{"/etc/passwd", false, false},
		{"/etc/passwd", true, true},
		{"/etc/ld.so.cache", false, false},
		{"/etc/hosts", true, true},
		{"/proc/self/mem", false, true},
		{"/proc/12/mem", true, true},
		{"/proc/sys/kernel/core_pattern", true, true},
		{"/proc/sys/kernel/ngroups_max", false, false},
		{"/sys/fs/cgroup/cpu/cpu.cfs_quota_us", false, false},
		{"/sys/fs/cgroup/cpu/cpu.cfs_quota_us", true, true},
		{"/sys/kernel/debug/tracing/trace", false, true},
		{"/proc/self/status", false, false},
		{"/proc/1/environ", false, true},
		{"/sys/firmware/efi/efivars/x", false, true},
		{"/dev/null", true, false},
		{"/dev/urandom", false, false},
		{"/dev/pts/0", true, false},
		{"/dev/mem", false, true},
		{"/dev/sda", false, true},
		{"/lib/x86_64-linux-gnu/libc.so.6", false, false},
		{"/tmp/x", true, false},
		{"shadow", false, true},
		{"notes.txt", true, false},
		{"/.cagebox/run/token", false, true},
		{"", false, false},
	} {
		if got := SensitiveOpen(tc.path, tc.write); got != tc.want {
			t.Errorf("SensitiveOpen(%q, %v) = %v, want %v", tc.path, tc.write, got, tc.want)
		}
	}
}

func TestLimiter(t *testing.T) {
	l := NewLimiter(10, 5)
	now := time.Unix(1000, 0)
	ok := 0
	for i := 0; i < 20; i++ {
		if l.Allow(now) {
			ok++
		}
	}
	if ok != 5 {
		t.Fatalf("burst: %d allowed, want 5", ok)
	}
	st := l.Stats()
	if st.Recorded != 5 || st.Dropped != 15 {
		t.Fatalf("stats %+v", st)
	}
	n, total, rep := l.Report(now, false)
	if !rep || n != 15 || total != 15 {
		t.Fatalf("first report: %d %d %v", n, total, rep)
	}
	// Refills at 10/s: half a second later, 5 more pass.
	now = now.Add(500 * time.Millisecond)
	ok = 0
	for i := 0; i < 20; i++ {
		if l.Allow(now) {
			ok++
		}
	}
	if ok != 5 {
		t.Fatalf("after refill: %d allowed, want 5", ok)
	}
	if _, _, rep := l.Report(now.Add(100*time.Millisecond), false); rep {
		t.Fatal("reported twice within a second")
	}
	n, total, rep = l.Report(now.Add(100*time.Millisecond), true)
	if !rep || n != 15 || total != 30 {
		t.Fatalf("forced report: %d %d %v", n, total, rep)
	}
	if _, _, rep := l.Report(now.Add(5*time.Second), false); rep {
		t.Fatal("report with no new drops")
	}
	l.Drop(7)
	if n, total, rep := l.Report(now.Add(10*time.Second), false); !rep || n != 7 || total != 37 {
		t.Fatalf("report of lost records: %d %d %v", n, total, rep)
	}
}

func jsonLine(msg string) []byte {
	b, _ := json.Marshal(map[string]string{"msg": msg, "level": "info", "time": "2026-11-24T23:06:05Z"})
	return b
}

func TestParseStrace(t *testing.T) {
	all, _ := Parse([]string{"all"})
	traced := map[string]bool{}
	for _, s := range SyscallsOf(all) {
		traced[s] = true
	}
	for _, tc := range []struct {
		name string
		msg  string
		want *Record
	}{
		{"exec", `[   3:   3] sh X execve(0x55ecaf428598 /bin/echo, 0x55ecaf4285d8 ["/bin/echo", "hi"], 0x55ecaf4285f0 ["HOME=/root", "PWD=/"]) = 0 (0x0) (1.024434ms)`,
			&Record{Class: Exec, Syscall: "execve", PID: 3, Path: "/bin/echo", Argv: []string{"/bin/echo", "hi"}, Result: ResultOK}},
		{"exec entry ignored", `[   3:   3] sh E execve(0x55ecaf428598 /bin/echo, 0x55ecaf4285d8 ["/bin/echo", "hi"], 0x55ecaf4285f0 ["HOME=/root"])`, nil},
		{"exec quoted args", `[   2:   2] sh X execve(0x1 /usr/bin/cat, 0x2 ["cat", "/etc/x\nI1124 fake", "a\"] = 0 (0x0) (1ms)"], 0x3 ["A=\"]\""]) = 0 (0x0) (855.177µs)`,
			&Record{Class: Exec, Syscall: "execve", PID: 2, Path: "/usr/bin/cat", Argv: []string{"cat", "/etc/x\nI1124 fake", "a\"] = 0 (0x0) (1ms)"}, Result: ResultOK}},
		{"exec failed", `[   7:   7] sh X execve(0x1 /nope, 0x2 ["/nope"], 0x3 []) = 0 (0x0) errno=2 (no such file or directory) (20µs)`,
			&Record{Class: Exec, Syscall: "execve", PID: 7, Path: "/nope", Argv: []string{"/nope"}, Result: ResultError, Errno: 2}},
		{"exec comm look-alike", `[   9:   9] a X execve(0x1 X execve(0x1 /bin/sh, 0x2 ["/bin/sh"], 0x3 []) = 0 (0x0) (1ms)`,
			&Record{Class: Exec, Syscall: "execve", PID: 9, Path: "/bin/sh", Argv: []string{"/bin/sh"}, Result: ResultOK}},
		{"exec filename fakes argv", `[   9:   9] sh X execve(0x1 /x, 0x2 ["/fake"], 0x3 [], 0x4 ["/real", "arg"], 0x5 ["E=1"]) = 0 (0x0) (1ms)`,
			&Record{Class: Exec, Syscall: "execve", PID: 9, Path: "/x, 0x2 [\"/fake\"], 0x3 []", Argv: []string{"/real", "arg"}, Result: ResultOK}},
		{"connect", `[   4:   4] python3 X connect(0x3 socket:[1], 0x7ff05bce07d0 {Family: AF_INET, Addr: 10.0.0.1, Port: 443}, 0x10) = 0 (0x0) errno=113 (no route to host) (16.464µs)`,
			&Record{Class: Net, Syscall: "connect", PID: 4, Family: "inet", Address: "10.0.0.1", Port: 443, Result: ResultError, Errno: 113}},
		{"connect6", `[   4:   5] curl X connect(0x3 socket:[1], 0x7f {Family: AF_INET6, Addr: fd00::1, Port: 80}, 0x1c) = 0 (0x0) (16µs)`,
			&Record{Class: Net, Syscall: "connect", PID: 4, Family: "inet6", Address: "fd00::1", Port: 80, Result: ResultOK}},
		{"open shadow", `[   3:   3] cat X openat(AT_FDCWD /, 0x7fc301681f76 /etc/shadow, O_RDONLY|0x0, 0o0) = 3 (0x3) (159.918µs)`,
			&Record{Class: File, Syscall: "openat", PID: 3, Path: "/etc/shadow", Result: ResultOK}},
		{"open write", `[   1:   1] sh X openat(AT_FDCWD /, 0x55 /etc/foo, O_WRONLY|O_CREAT|O_TRUNC, 0o666) = 0 (0x0) errno=30 (read-only file system) (135.562µs)`,
			&Record{Class: File, Syscall: "openat", PID: 1, Path: "/etc/foo", Write: true, Result: ResultError, Errno: 30}},
		{"open relative", `[   1:   1] sh X openat(AT_FDCWD /etc, 0x55 shadow, O_RDONLY, 0o0) = 3 (0x3) (1µs)`,
			&Record{Class: File, Syscall: "openat", PID: 1, Path: "/etc/shadow", Result: ResultOK}},
		{"open crafted cwd", `[   1:   1] sh X openat(AT_FDCWD /tmp/x, 0x1 /ok, 0x55 /etc/shadow, O_RDONLY, 0o0) = 3 (0x3) (1µs)`,
			&Record{Class: File, Syscall: "openat", PID: 1, Path: "/etc/shadow", Result: ResultOK}},
		{"priv denied", `[   5:   5] unshare X unshare(CLONE_NEWUSER) = 0 (0x0) errno=1 (operation not permitted) (4.9µs)`,
			&Record{Class: Priv, Syscall: "unshare", PID: 5, Result: ResultDenied, Errno: 1}},
		{"untraced", `[   5:   5] x X read(0x3, 0x1, 0x10) = 16 (0x10) (1µs)`, nil},
		{"not strace", `Args: [runsc-sandbox --root=/x]`, nil},
		{"truncated", `[   3:   3] sh X execve(0x1 /bin/echo, 0x2 ["/bin/echo", "hi`, nil},
		{"bad quote", `[   3:   3] sh X execve(0x1 /bin/echo, 0x2 ["/bin/echo", "h"i"], 0x3 []) = 0 (0x0) (1ms)`, nil},
		{"no header", `sh X execve(0x1 /bin/echo, 0x2 ["/bin/echo"], 0x3 []) = 0 (0x0) (1ms)`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseStraceLine(jsonLine(tc.msg), traced)
			if tc.want == nil {
				if ok {
					t.Fatalf("parsed %+v, want nothing", got)
				}
				return
			}
			if !ok {
				t.Fatalf("did not parse")
			}
			if !reflect.DeepEqual(got, *tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, *tc.want)
			}
		})
	}
	// A line of the log is one JSON object; a newline in a guest's path
	// is escaped inside it, never the start of another record.
	lines := strings.Split(string(jsonLine(`[   2:   2] cat X openat(AT_FDCWD /, 0x1 /x
[   1:   1] sh X execve(0x1 /forged, 0x2 ["/forged"], 0x3 []) = 0 (0x0) (1ms), O_RDONLY, 0o0) = 3 (0x3) (1µs)`)), "\n")
	if len(lines) != 1 {
		t.Fatalf("json line split: %d", len(lines))
	}
	r, ok := ParseStraceLine([]byte(lines[0]), traced)
	if !ok || r.Syscall != "openat" {
		t.Fatalf("crafted path: %+v %v, want the openat record", r, ok)
	}
	if _, ok := ParseStraceLine([]byte(`{"msg": 12}`), traced); ok {
		t.Fatal("non-string msg parsed")
	}
	huge := jsonLine(`[   3:   3] sh X execve(0x1 /bin/echo, 0x2 ["` + strings.Repeat("a", maxLine) + `"], 0x3 []) = 0 (0x0) (1ms)`)
	if _, ok := ParseStraceLine(huge, traced); ok {
		t.Fatal("over-long line parsed")
	}
}
