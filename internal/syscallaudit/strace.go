package syscallaudit

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
)

// gVisor's strace log. runsc (--strace --strace-syscalls=LIST
// --debug-log-format=json) writes one JSON object per line; its "msg" is
// the strace text of one syscall, e.g.
//
//	[   3:   3] sh X execve(0x55.. /bin/echo, 0x55.. ["/bin/echo", "hi"], 0x55.. ["HOME=/root"]) = 0 (0x0) (1.02ms)
//	[   4:   4] python3 X connect(0x3 socket:[1], 0x7f.. {Family: AF_INET, Addr: 10.0.0.1, Port: 443}, 0x10) = 0 (0x0) errno=113 (no route to host) (16µs)
//
// Everything in it the guest chose is hostile. The JSON framing is what
// makes the log safe to read: gVisor prints paths raw (a newline in a
// file name would start a forged line in the text format), but JSON
// escapes them, so one line is always one log entry of the sentry's. Inside
// an entry, the task name (≤ 15 bytes, any bytes) and raw paths may
// imitate the syntax around them; the parser reads each syscall's
// arguments from the right, where the sentry's own text (result, flags,
// the quoted argv and envp lists) is, so a guest can at worst garble the
// path of its own record, never hide an exec's argv or make a record of a
// syscall it did not make.

// maxLine bounds a strace log line the parser looks at; longer ones are
// cut (runsc's --strace-log-size already bounds each argument).
const maxLine = 64 << 10

var (
	headerRE = regexp.MustCompile(`^\[ *(\d+): *(\d+)\] `)
	resultRE = regexp.MustCompile(`\) = (-?\d+) \(0x[0-9a-f]+\)(?: errno=(\d+) \([^()]*\))? \([^()]*\)$`)
	hexRE    = regexp.MustCompile(`^0x[0-9a-f]+ `)
)

// ParseStraceLine parses one line of runsc's JSON debug log. ok is false
// for a line that is not the exit record ("X") of one of the syscalls in
// traced (by name), or that does not parse.
func ParseStraceLine(line []byte, traced map[string]bool) (Record, bool) {
	if len(line) > maxLine {
		return Record{}, false
	}
	var entry struct {
		Msg string `json:"msg"`
	}
	if json.Unmarshal(line, &entry) != nil {
		return Record{}, false
	}
	return ParseStraceMsg(entry.Msg, traced)
}

// ParseStraceMsg parses the strace text of one log entry (see
// ParseStraceLine).
func ParseStraceMsg(msg string, traced map[string]bool) (Record, bool) {
	h := headerRE.FindStringSubmatch(msg)
	if h == nil {
		return Record{}, false
	}
	pid, _ := strconv.Atoi(h[1])
	rest := msg[len(h[0]):]
	res := resultRE.FindStringSubmatchIndex(rest)
	if res == nil {
		return Record{}, false
	}
	ret, _ := strconv.ParseInt(rest[res[2]:res[3]], 10, 64)
	errno := 0
	if res[4] >= 0 {
		errno, _ = strconv.Atoi(rest[res[4]:res[5]])
	}
	_ = ret
	body := rest[:res[0]] // "COMM X name(args"
	// The task name is at most 15 bytes, so the sentry's " X name(" starts
	// within the first 16 bytes; the guest may put look-alikes in its name
	// and in its arguments: try the candidates from the latest, keep the
	// first whose arguments parse.
	for start := min(16, len(body)-1); start >= 0; start-- {
		if !strings.HasPrefix(body[start:], " X ") {
			continue
		}
		call := body[start+3:]
		name, args, ok := strings.Cut(call, "(")
		if !ok || !traced[name] {
			continue
		}
		r, ok := parseArgs(name, args)
		if !ok {
			continue
		}
		r.Syscall, r.PID, r.Class = name, pid, ClassOf(name)
		r.Errno = errno
		switch {
		case errno == 0:
			r.Result = ResultOK
		case r.Class == Priv && errno == 1: // EPERM: the profile's answer
			r.Result = ResultDenied
		default:
			r.Result = ResultError
		}
		return r.Bounded(), true
	}
	return Record{}, false
}

// parseArgs reads the arguments of syscall name from the strace text
// between "name(" and ") = ".
func parseArgs(name, args string) (Record, bool) {
	switch name {
	case "execve", "execveat":
		if name == "execveat" {
			// "DIRFD, 0xA PATH, 0xB [argv], 0xC [envp], FLAGS"
			i := strings.LastIndex(args, ", ")
			if i < 0 {
				return Record{}, false
			}
			args = args[:i]
		}
		envStart, ok := listStart(args)
		if !ok {
			return Record{}, false
		}
		before := args[:envStart] // "..., 0xB [argv], 0xC "
		before = strings.TrimRight(before, " ")
		i := strings.LastIndex(before, ", 0x")
		if i < 0 {
			return Record{}, false
		}
		argvText := before[:i] // "0xA PATH, 0xB [argv]"
		argvStart, ok := listStart(argvText)
		if !ok {
			return Record{}, false
		}
		argv, ok := parseList(argvText[argvStart:])
		if !ok {
			return Record{}, false
		}
		r := Record{Argv: argv}
		head := strings.TrimRight(argvText[:argvStart], " ")
		if j := strings.LastIndex(head, ", 0x"); j >= 0 {
			head = head[:j]
		}
		if name == "execveat" {
			if j := strings.LastIndex(head, ", 0x"); j >= 0 {
				head = head[j+2:]
			}
		}
		r.Path = stripAddr(head)
		return r, true
	case "connect":
		// "0x3 socket:[1], 0xADDR {Family: AF_INET, Addr: 1.2.3.4, Port: 443}, 0x10"
		i := strings.LastIndex(args, ", ")
		if i < 0 {
			return Record{}, false
		}
		sa := args[:i]
		j := strings.Index(sa, " {Family: ")
		if j < 0 || !strings.HasSuffix(sa, "}") {
			// An address the sentry could not read ("0x... (bad)"):
			// still a connect.
			return Record{Family: "unknown"}, true
		}
		return parseSockaddrText(sa[j+len(" {Family: ") : len(sa)-1]), true
	case "open", "openat", "openat2", "creat":
		r := Record{}
		text := args
		switch name {
		case "creat": // "0xA PATH, 0oMODE"
			i := strings.LastIndex(text, ", ")
			if i < 0 {
				return Record{}, false
			}
			text, r.Write = text[:i], true
		case "openat2": // "DIRFD, 0xA PATH, 0xH {...}, SIZE"
			i := strings.LastIndex(text, ", 0x")
			if i < 0 {
				return Record{}, false
			}
			text = text[:i]
			if k := strings.LastIndex(text, ", 0x"); k >= 0 && strings.HasPrefix(text[k+2:], "0x") && strings.Contains(text[k:], "{") {
				text = text[:k]
			}
		default: // "... 0xA PATH, FLAGS, 0oMODE"
			i := strings.LastIndex(text, ", ")
			if i < 0 {
				return Record{}, false
			}
			text = text[:i]
			k := strings.LastIndex(text, ", ")
			if k < 0 {
				return Record{}, false
			}
			r.Write = openWrites(text[k+2:])
			text = text[:k]
		}
		dir := ""
		if name == "openat" || name == "openat2" {
			k := strings.LastIndex(text, ", 0x")
			if k < 0 {
				return Record{}, false
			}
			dir, text = text[:k], text[k+2:]
			// "AT_FDCWD /cwd" or "3 /dir"
			if _, d, ok := strings.Cut(dir, " "); ok {
				dir = d
			} else {
				dir = ""
			}
		}
		r.Path = stripAddr(text)
		if r.Path != "" && !strings.HasPrefix(r.Path, "/") && strings.HasPrefix(dir, "/") {
			r.Path = strings.TrimSuffix(dir, "/") + "/" + r.Path
		}
		return r, true
	}
	if ClassOf(name) == Priv {
		return Record{}, true
	}
	return Record{}, false
}

// openWrites reads gVisor's symbolic open flags ("O_WRONLY|O_CREAT|0x0").
func openWrites(flags string) bool {
	for _, f := range strings.Split(flags, "|") {
		switch f {
		case "O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND":
			return true
		}
	}
	return false
}

// stripAddr takes "0x7f.. PATH" to PATH.
func stripAddr(s string) string {
	if loc := hexRE.FindStringIndex(s); loc != nil {
		return s[loc[1]:]
	}
	return ""
}

// parseSockaddrText reads "AF_INET, Addr: 1.2.3.4, Port: 443".
func parseSockaddrText(s string) Record {
	fam, rest, _ := strings.Cut(s, ", ")
	r := Record{Family: familyName(fam)}
	rest = strings.TrimPrefix(rest, "Addr: ")
	if r.Family == "inet" || r.Family == "inet6" {
		if i := strings.LastIndex(rest, ", Port: "); i >= 0 {
			r.Port, _ = strconv.Atoi(rest[i+len(", Port: "):])
			rest = rest[:i]
		}
	}
	if u, err := strconv.Unquote(rest); err == nil {
		rest = u
	}
	r.Address = rest
	return r
}

func familyName(f string) string {
	switch f {
	case "AF_INET":
		return "inet"
	case "AF_INET6":
		return "inet6"
	case "AF_UNIX":
		return "unix"
	}
	return strings.ToLower(strings.TrimPrefix(f, "AF_"))
}

// listStart finds the "[" that opens the list of Go-quoted strings at the
// end of s (scanning back over the quoted strings, whose quotes are
// escaped inside them).
func listStart(s string) (int, bool) {
	i := len(s) - 1
	if i < 0 || s[i] != ']' {
		return 0, false
	}
	i--
	for i >= 0 {
		switch {
		case s[i] == '[':
			return i, true
		case s[i] == ' ' || s[i] == ',' || s[i] == '.':
			i--
		case s[i] == '"':
			// Back to the opening quote: a quote preceded by an odd
			// number of backslashes is escaped.
			j := i - 1
			for ; j >= 0; j-- {
				if s[j] != '"' {
					continue
				}
				bs := 0
				for k := j - 1; k >= 0 && s[k] == '\\'; k-- {
					bs++
				}
				if bs%2 == 0 {
					break
				}
			}
			if j < 0 {
				return 0, false
			}
			i = j - 1
		default:
			return 0, false
		}
	}
	return 0, false
}

// parseList reads `["a", "b", ...]` (Go-quoted strings; a trailing "..."
// marks a list the sentry cut).
func parseList(s string) ([]string, bool) {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	var out []string
	for len(s) > 0 {
		s = strings.TrimLeft(s, ", ")
		if s == "" || strings.HasPrefix(s, "...") {
			break
		}
		q, err := strconv.QuotedPrefix(s)
		if err != nil {
			return nil, false
		}
		v, err := strconv.Unquote(q)
		if err != nil {
			return nil, false
		}
		out = append(out, v)
		if len(out) > MaxArgs {
			break
		}
		s = s[len(q):]
	}
	return out, true
}
