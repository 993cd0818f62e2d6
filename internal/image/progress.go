package image

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// progress writes concise, human progress lines for a build:
//
//	[1/4] fetching and unpacking 121 packages… (4s)
//	      retrieving libc6 2.36-9+deb12u10 (12/121)
//	[2/4] installing the base system (31s)
//	[3/4] cleaning (97s)
//	[4/4] digest (98s)
type progress struct {
	w     io.Writer // nil: discard
	start time.Time

	// Only the debootstrap parser goroutine touches these while it runs;
	// the build reads lastError after it has finished.
	sized, total, retrieved int
	lastError               string
}

func newProgress(w io.Writer) *progress { return &progress{w: w, start: time.Now()} }

func (p *progress) elapsed() int { return int(time.Since(p.start).Seconds()) }

func (p *progress) linef(format string, args ...any) {
	if p.w != nil {
		fmt.Fprintf(p.w, format+"\n", args...)
	}
}

func (p *progress) stage(n int, format string, args ...any) {
	p.linef("[%d/4] %s (%ds)", n, fmt.Sprintf(format, args...), p.elapsed())
}

func (p *progress) detail(format string, args ...any) {
	p.linef("      "+format, args...)
}

// parseDebootstrap reads debootstrap's --debian-installer protocol until EOF.
// Records look like
//
//	P: NOW END NAME      progress (END is a count or a byte total)
//	PA: arg / PF: fmt
//	I: NAME  IA: arg  IF: fmt     information
//	W: ... / E: ...               warnings and errors (WA/WF, EA/EF)
//
// and a record is complete at its xF line.
func (p *progress) parseDebootstrap(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var kind, name string
	var args []string
	for sc.Scan() {
		tag, rest, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		switch tag {
		case "P":
			f := strings.Fields(rest)
			kind, name, args = "P", "", nil
			if len(f) >= 3 {
				name = f[2]
				end, _ := strconv.ParseInt(f[1], 10, 64)
				switch {
				case name == "SIZEDEBS":
					// The first record's END is wrong (debootstrap counts its
					// arguments before splitting them); the last one is right.
					p.sized = int(end)
				case name == "DOWNDEBS" && p.total == 0 && p.sized > 0:
					p.total = p.sized
					p.stage(1, "fetching and unpacking %d packages (%.1f MB)…", p.total, float64(end)/1e6)
				}
			}
		case "I", "W", "E":
			kind, name, args = tag, rest, nil
		case "PA", "IA", "WA", "EA":
			args = append(args, rest)
		case "PF", "IF", "WF", "EF":
			if tag[:1] != kind {
				continue
			}
			p.event(kind, name, expand(rest, args))
			kind, name, args = "", "", nil
		}
	}
}

func (p *progress) event(kind, name, msg string) {
	msg = strings.TrimSuffix(strings.TrimSpace(msg), "...")
	switch kind {
	case "E":
		p.lastError = msg
		p.detail("error: %s", msg)
	case "W":
		p.detail("warning: %s", msg)
	case "I":
		switch name {
		case "RETRIEVING":
			pkg := strings.TrimPrefix(msg, "Retrieving ")
			if p.total > 0 { // packages; before that, indices (InRelease, Packages)
				p.retrieved++
				// The first, every 20th and the last: a pulse, not a flood.
				if p.retrieved == 1 || p.retrieved%20 == 0 || p.retrieved == p.total {
					p.detail("retrieving %s (%d/%d)", pkg, p.retrieved, p.total)
				}
			} else {
				p.detail("retrieving %s", pkg)
			}
		case "RESOLVEREQ":
			p.detail("resolving dependencies")
		case "VALIDRELSIG":
			p.detail("release signature valid")
		case "INSTCORE":
			p.stage(2, "installing the base system")
		case "UNPACKREQ", "CONFREQ", "UNPACKBASE", "CONFBASE":
			p.detail("%s", strings.ToLower(msg[:1])+msg[1:])
		}
	}
}

// expand substitutes args for the %s verbs of a debootstrap format string.
func expand(format string, args []string) string {
	var b strings.Builder
	for {
		i := strings.Index(format, "%s")
		if i < 0 || len(args) == 0 {
			b.WriteString(format)
			return b.String()
		}
		b.WriteString(format[:i])
		b.WriteString(args[0])
		format, args = format[i+2:], args[1:]
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int

	mu  sync.Mutex // guards buf
	buf []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(b), nil
}

// tail returns the last n lines written.
func (t *tailBuffer) tail(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimRight(string(t.buf), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
