package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/agentproto"
)

// Syscall audit in a VM guest (`--audit`, see agentproto/audit.go). The
// netlink messages are written by hand: the agent may link only the
// standard library, x/sys and yamux (TestDependencies), and the audit
// protocol needs three messages of fixed layout (linux/audit.h), which no
// library of that set offers.

// Kernel audit constants (linux/audit.h).
const (
	auditSet         = 1001
	auditAddRule     = 1011
	auditStatusEn    = 0x01
	auditStatusPID   = 0x04
	auditStatusBLim  = 0x10
	auditStatusBWait = 0x20
	auditFilterExit  = 0x04
	auditAlways      = 2
	auditBitmaskSize = 64
	auditMaxFields   = 64
	// auditBacklog is the kernel's queue of records for us; records over
	// it are dropped at once (backlog_wait_time 0), never making a guest
	// process wait.
	auditBacklog = 8192
)

// openAudit opens the audit netlink socket, and makes this process (the
// VM's init, with every capability) the audit daemon with auditing on.
// New tasks get an audit context from now on.
func openAudit() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT)
	if err != nil {
		return -1, fmt.Errorf("audit netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind audit socket: %w", err)
	}
	// struct audit_status: mask, enabled, failure, pid, rate_limit,
	// backlog_limit, lost, backlog, version, backlog_wait_time.
	st := make([]byte, 10*4)
	le := binary.LittleEndian
	le.PutUint32(st[0:], auditStatusEn|auditStatusPID|auditStatusBLim|auditStatusBWait)
	le.PutUint32(st[4:], 1)
	le.PutUint32(st[12:], uint32(os.Getpid()))
	le.PutUint32(st[20:], auditBacklog)
	le.PutUint32(st[36:], 0)
	if err := auditRequest(fd, auditSet, st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("enable audit (AUDIT_SET): %w", err)
	}
	return fd, nil
}

// addAuditRules adds one syscall-exit rule for nrs (x86_64 numbers) that
// leaves out the agent's own pid.
func addAuditRules(fd int, nrs []int) error {
	// struct audit_rule_data: flags, action, field_count,
	// mask[64], fields[64], values[64], fieldflags[64], buflen. No
	// fields: this kernel (Debian 6.1) refused an arch or pid field
	// (EINVAL) in every form tried; the agent drops its own records
	// (parent pid 1) and the host those of other ABIs.
	b := make([]byte, 4*(3+auditBitmaskSize+3*auditMaxFields+1))
	le := binary.LittleEndian
	le.PutUint32(b[0:], auditFilterExit)
	le.PutUint32(b[4:], auditAlways)
	const mask = 12
	for _, nr := range nrs {
		if nr < 0 || nr >= 32*auditBitmaskSize {
			return fmt.Errorf("audit: syscall number %d out of range", nr)
		}
		off := mask + 4*(nr/32)
		le.PutUint32(b[off:], le.Uint32(b[off:])|1<<(uint(nr)%32))
	}
	// Right after AUDIT_SET this kernel refused the rule (EINVAL) for up
	// to a few hundred milliseconds of a TCG boot, then took the same
	// request: retry for up to 3 s.
	var err error
	for i := 0; i < 150; i++ {
		if err = auditRequest(fd, auditAddRule, b); err == nil || errors.Is(err, unix.EEXIST) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("add audit rule: %w", err)
}

// auditSeq numbers requests: an ack is matched to its request by it.
var auditSeq uint32 = 100

// auditRequest sends one request and waits for its ack.
func auditRequest(fd int, typ uint16, payload []byte) error {
	auditSeq++
	seq := auditSeq
	msg := make([]byte, unix.NLMSG_HDRLEN+len(payload))
	le := binary.LittleEndian
	le.PutUint32(msg[0:], uint32(len(msg)))
	le.PutUint16(msg[4:], typ)
	le.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	le.PutUint32(msg[8:], seq)
	copy(msg[unix.NLMSG_HDRLEN:], payload)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for i := 0; i < 64; i++ {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq != seq || len(m.Data) < 4 {
				continue
			}
			if e := int32(le.Uint32(m.Data)); e != 0 {
				return unix.Errno(-e)
			}
			return nil
		}
	}
	return errors.New("no ack from the kernel")
}

// auditRing buffers the assembled records until the host subscribes; it
// keeps the newest and counts what it drops.
type auditRing struct {
	mu   sync.Mutex
	buf  []*agentproto.AuditRecord
	lost uint64
	wake chan struct{}
}

const auditRingSize = 4096

// startAuditReader reads the audit socket fd (passed by the init) into a
// ring and returns the server's AuditSource.
func startAuditReader(fd int, log *slog.Logger) func(context.Context, func(*agentproto.AuditRecord) error) error {
	// No process the agent starts may inherit the audit socket.
	unix.CloseOnExec(fd)
	ring := &auditRing{wake: make(chan struct{}, 1)}
	go func() {
		asm := agentproto.NewAuditAssembler()
		buf := make([]byte, 1<<16)
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOBUFS) {
				continue
			}
			if err != nil {
				log.Warn("audit socket", "err", err)
				return
			}
			// The kernel sends one audit record per datagram and does not
			// always set nlmsg_len right (EOE, CWD and EXECVE records
			// came cut short by it here, as auditd and go-libaudit know):
			// the payload is the whole datagram after the header.
			if n < unix.NLMSG_HDRLEN {
				continue
			}
			typ := binary.LittleEndian.Uint16(buf[4:6])
			for _, r := range asm.Add(typ, buf[unix.NLMSG_HDRLEN:n]) {
				if r.PPID == 1 {
					continue // the agent's own (its parent is the init)
				}
				ring.push(r)
			}
		}
	}()
	var subMu sync.Mutex // one subscriber at a time
	return func(ctx context.Context, emit func(*agentproto.AuditRecord) error) error {
		if !subMu.TryLock() {
			return fmt.Errorf("another audit subscriber is attached: %w", agentproto.ErrInvalid)
		}
		defer subMu.Unlock()
		for {
			recs, lost := ring.take()
			for i, r := range recs {
				if i == 0 {
					r.Lost = lost
				}
				if err := emit(r); err != nil {
					return err
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-ring.wake:
			}
		}
	}
}

func (r *auditRing) push(rec *agentproto.AuditRecord) {
	r.mu.Lock()
	if len(r.buf) >= auditRingSize {
		r.buf = r.buf[1:]
		r.lost++
	}
	r.buf = append(r.buf, rec)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *auditRing) take() ([]*agentproto.AuditRecord, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out, lost := r.buf, r.lost
	r.buf, r.lost = nil, 0
	return out, lost
}
