package agentproto

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Syscall audit in a VM guest (`--audit`): the guest's init opens the
// kernel's audit netlink socket with its capabilities, registers it as the
// audit daemon, adds syscall-exit rules for the audited syscalls and hands
// the socket to the agent, which parses the kernel's records
// (AuditAssembler) and streams them to the host on an audit operation
// (Client.Audit). The host treats every record as untrusted: each is
// bounded here and again by the host.

const opAudit = "audit"

// Kernel audit record types (linux/audit.h) the assembler reads.
const (
	AuditTypeSyscall  = 1300
	AuditTypePath     = 1302
	AuditTypeSockaddr = 1306
	AuditTypeCwd      = 1307
	AuditTypeExecve   = 1309
	AuditTypeEOE      = 1320
)

// Bounds of one AuditRecord.
const (
	auditMaxArgs     = 32
	auditMaxArgBytes = 256
	auditMaxPaths    = 4
	auditMaxPath     = 512
	auditMaxSaddr    = 128
	auditMaxPending  = 64 // events being assembled at once
)

// AuditRecord is one audited syscall as the guest kernel reported it.
type AuditRecord struct {
	// Syscall is the x86_64 syscall number.
	Syscall int `json:"syscall"`
	// PID and PPID are the process's and its parent's ids in the guest
	// kernel's initial namespace; Arch its AUDIT_ARCH.
	PID  int    `json:"pid"`
	PPID int    `json:"ppid,omitempty"`
	Arch uint32 `json:"arch,omitempty"`
	// Exited: Success and Exit are known.
	Exited  bool  `json:"exited"`
	Success bool  `json:"success"`
	Exit    int64 `json:"exit"`
	// Args are the first four syscall arguments.
	Args          [4]uint64 `json:"args"`
	Argv          []string  `json:"argv,omitempty"`
	ArgvTruncated bool      `json:"argv_truncated,omitempty"`
	// Paths are the PATH records' names, in item order; Cwd the CWD.
	Paths []string `json:"paths,omitempty"`
	Cwd   string   `json:"cwd,omitempty"`
	// Saddr is the connect's socket address (struct sockaddr bytes).
	Saddr []byte `json:"saddr,omitempty"`
	// Lost counts records the agent dropped before this one.
	Lost uint64 `json:"lost,omitempty"`
}

// AuditAssembler groups the kernel's audit records (several per syscall,
// one serial number each event) into AuditRecords.
type AuditAssembler struct {
	pending map[uint64]*AuditRecord
	order   []uint64
	execve  map[uint64]*execveState
}

type execveState struct {
	chunks map[int]*strings.Builder
	argc   int
}

// NewAuditAssembler returns an empty assembler.
func NewAuditAssembler() *AuditAssembler {
	return &AuditAssembler{pending: map[uint64]*AuditRecord{}, execve: map[uint64]*execveState{}}
}

// Add takes one record (its netlink type and text) and returns the
// AuditRecords it completes: on an EOE, or events evicted when too many
// are open. Malformed records are ignored.
func (a *AuditAssembler) Add(typ uint16, text []byte) []*AuditRecord {
	serial, body, ok := auditHeader(string(text))
	if !ok {
		return nil
	}
	var out []*AuditRecord
	if typ == AuditTypeEOE {
		if r := a.finish(serial); r != nil {
			out = append(out, r)
		}
		return out
	}
	r := a.pending[serial]
	if r == nil {
		if typ != AuditTypeSyscall && typ != AuditTypePath && typ != AuditTypeSockaddr && typ != AuditTypeCwd && typ != AuditTypeExecve {
			return nil
		}
		for len(a.order) >= auditMaxPending {
			if old := a.finish(a.order[0]); old != nil {
				out = append(out, old)
			}
		}
		r = &AuditRecord{Syscall: -1}
		a.pending[serial] = r
		a.order = append(a.order, serial)
	}
	f := auditFields(body)
	switch typ {
	case AuditTypeSyscall:
		r.Syscall, _ = strconv.Atoi(f["syscall"])
		r.PID, _ = strconv.Atoi(f["pid"])
		r.PPID, _ = strconv.Atoi(f["ppid"])
		if arch, err := strconv.ParseUint(f["arch"], 16, 32); err == nil {
			r.Arch = uint32(arch)
		}
		if s, ok := f["success"]; ok {
			r.Exited, r.Success = true, s == "yes"
			r.Exit, _ = strconv.ParseInt(f["exit"], 10, 64)
		}
		for i := range r.Args {
			r.Args[i], _ = strconv.ParseUint(f["a"+strconv.Itoa(i)], 16, 64)
		}
	case AuditTypeExecve:
		st := a.execve[serial]
		if st == nil {
			st = &execveState{chunks: map[int]*strings.Builder{}}
			a.execve[serial] = st
		}
		if n, err := strconv.Atoi(f["argc"]); err == nil {
			st.argc = n
		}
		// In the order written: a long argument comes in chunks
		// a1[0], a1[1], ... that concatenate in that order.
		for _, w := range strings.Fields(body) {
			k, v, ok := strings.Cut(w, "=")
			if !ok {
				continue
			}
			i, ok := argIndex(k)
			if !ok || i >= auditMaxArgs {
				if ok {
					r.ArgvTruncated = true
				}
				continue
			}
			b := st.chunks[i]
			if b == nil {
				b = &strings.Builder{}
				st.chunks[i] = b
			}
			if b.Len() < auditMaxArgBytes {
				b.WriteString(untrusted(v))
			}
		}
	case AuditTypePath:
		if len(r.Paths) < auditMaxPaths {
			if n, ok := f["name"]; ok && n != "(null)" {
				r.Paths = append(r.Paths, bound(untrusted(n), auditMaxPath))
			}
		}
	case AuditTypeCwd:
		r.Cwd = bound(untrusted(f["cwd"]), auditMaxPath)
	case AuditTypeSockaddr:
		if b, err := hex.DecodeString(f["saddr"]); err == nil {
			r.Saddr = b[:min(len(b), auditMaxSaddr)]
		}
	}
	return out
}

// finish completes and removes the event of serial (nil if it has no
// SYSCALL record).
func (a *AuditAssembler) finish(serial uint64) *AuditRecord {
	r := a.pending[serial]
	delete(a.pending, serial)
	for i, s := range a.order {
		if s == serial {
			a.order = append(a.order[:i], a.order[i+1:]...)
			break
		}
	}
	if st := a.execve[serial]; st != nil && r != nil {
		n := min(st.argc, auditMaxArgs)
		if st.argc > auditMaxArgs {
			r.ArgvTruncated = true
		}
		for i := 0; i < n; i++ {
			v := ""
			if b := st.chunks[i]; b != nil {
				v = b.String()
			}
			if len(v) > auditMaxArgBytes {
				v, r.ArgvTruncated = v[:auditMaxArgBytes], true
			}
			r.Argv = append(r.Argv, v)
		}
	}
	delete(a.execve, serial)
	if r == nil || r.Syscall < 0 {
		return nil
	}
	return r
}

// auditHeader splits "audit(1700000000.123:45): rest" into serial 45 and rest.
func auditHeader(s string) (uint64, string, bool) {
	s = strings.TrimRight(s, "\x00\n")
	rest, ok := strings.CutPrefix(s, "audit(")
	if !ok {
		return 0, "", false
	}
	// "audit(STAMP): body"; an EOE record is "audit(STAMP):" with
	// nothing after the colon.
	i := strings.Index(rest, "):")
	if i < 0 {
		return 0, "", false
	}
	stamp, body := rest[:i], strings.TrimPrefix(rest[i+2:], " ")
	_, ser, ok := strings.Cut(stamp, ":")
	if !ok {
		return 0, "", false
	}
	n, err := strconv.ParseUint(ser, 10, 64)
	if err != nil {
		return 0, "", false
	}
	return n, body, true
}

// auditFields reads the space-separated key=value pairs of a record. The
// kernel writes guest-chosen strings either "quoted" (with no quote, space
// or control byte inside) or hex-encoded, so a value never contains a
// space; a key appearing twice keeps its first value.
func auditFields(body string) map[string]string {
	f := map[string]string{}
	for _, w := range strings.Fields(body) {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			continue
		}
		if _, dup := f[k]; !dup {
			f[k] = v
		}
	}
	return f
}

// argIndex reads an EXECVE argument key: "a3" or "a3[0]" (a chunk of a
// long argument); "a3_len" is not one.
func argIndex(k string) (int, bool) {
	rest, ok := strings.CutPrefix(k, "a")
	if !ok {
		return 0, false
	}
	if i := strings.IndexByte(rest, '['); i >= 0 {
		rest = rest[:i]
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// untrusted decodes a kernel-written untrusted string: "quoted" as is, or
// hex.
func untrusted(v string) string {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		return v[1 : len(v)-1]
	}
	if b, err := hex.DecodeString(v); err == nil {
		return string(b)
	}
	return v
}

func bound(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// audit serves an audit stream: records from the server's AuditSource
// until the host closes the stream.
func (c *serverConn) audit(fr *frameReader, fw *frameWriter) {
	if c.s.AuditSource == nil {
		sendError(fw, fmt.Errorf("this agent has no audit source (only VM guests audit through the agent): %w", ErrInvalid))
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// The host ends the subscription by closing the stream.
		for {
			if _, _, err := fr.next(); err != nil {
				cancel()
				return
			}
		}
	}()
	if err := sendReply(fw, struct{}{}); err != nil {
		return
	}
	err := c.s.AuditSource(ctx, func(r *AuditRecord) error {
		p, err := json.Marshal(r)
		if err != nil {
			return err
		}
		return fw.write(frameReply, p)
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		sendError(fw, err)
	}
}

// Audit subscribes to the guest's syscall audit records and calls fn for
// each until ctx ends or the stream fails. Records are untrusted.
func (c *Client) Audit(ctx context.Context, fn func(*AuditRecord)) error {
	s, err := c.open(ctx, &request{Op: opAudit})
	if err != nil {
		return err
	}
	defer s.close()
	var ok struct{}
	if err := s.reply(&ok); err != nil {
		return s.err(ctx, err)
	}
	for {
		var r AuditRecord
		if err := s.reply(&r); err != nil {
			return s.err(ctx, err)
		}
		if len(r.Argv) > auditMaxArgs {
			r.Argv, r.ArgvTruncated = r.Argv[:auditMaxArgs], true
		}
		fn(&r)
	}
}
