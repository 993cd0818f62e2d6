package agentproto

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
)

// HandshakeTimeout bounds how long the agent waits for a connection's hello.
const HandshakeTimeout = 5 * time.Second

var handshakeTimeout = HandshakeTimeout // tests shorten it

// requestTimeout bounds how long the agent waits for the request frame of
// a new stream.
const requestTimeout = 30 * time.Second

// DefaultEnv is the base environment of processes when Server.BaseEnv is nil.
var DefaultEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LANG=C.UTF-8",
}

var startTime = time.Now()

// Server is the guest side: it serves connections from the host. One Server
// may serve many connections, one after the other or at once; it must not be
// copied after first use.
type Server struct {
	// Token is the per-sandbox secret the host must present. A server
	// without a token refuses every connection.
	Token string
	// BaseEnv is the environment processes start with (KEY=VALUE); nil
	// means DefaultEnv. The agent's own environment is never passed on.
	BaseEnv []string
	// Logger receives the server's logs; nil means slog.Default().
	Logger *slog.Logger
	// Reaper, if set, is the process-wide reaper of orphans (the agent is
	// PID 1 or a child subreaper): exec'd processes are then started through
	// it so it can hand their exit status back instead of swallowing it.
	// Without a Reaper, each process is waited for directly.
	Reaper *Reaper
	// StartProcess, if set, starts exec'd processes instead of
	// os.StartProcess (the agent starts them from a thread whose
	// capabilities it has dropped).
	StartProcess func(name string, argv []string, attr *os.ProcAttr) (*os.Process, error)
	// Refused, if set, is why the server refuses to run anything (the
	// agent's check found that the processes it starts would keep
	// capabilities): the handshake announces it and every exec and file
	// operation fails with it (ErrRefused). Set it before serving.
	Refused string
	// AwaitClaim makes the agent wait to be claimed (Claim): until then it
	// answers health checks and the claim and refuses everything else.
	AwaitClaim bool
	// OnClaim applies a claim's guest-side effects (files, network,
	// entropy, clock) before the server switches to the claim's token and
	// environment. Without it, claims are refused.
	OnClaim func(*Claim) error
	// AuditSource, if set, streams the guest's syscall audit records to
	// emit until ctx ends (an audit operation; see audit.go).
	AuditSource func(ctx context.Context, emit func(*AuditRecord) error) error

	// claimMu serialises claims.
	claimMu sync.Mutex

	// mu guards procs, closing, claimed, and Token and BaseEnv once the
	// server serves (a claim changes them).
	mu      sync.Mutex
	procs   map[*process]struct{}
	closing bool
	claimed bool
}

// token is the token connections must present now.
func (s *Server) token() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Token
}

// baseEnv is the base environment of processes now.
func (s *Server) baseEnv() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.BaseEnv
}

// unclaimed reports whether the server waits for its claim.
func (s *Server) unclaimed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.AwaitClaim && !s.claimed
}

func (s *Server) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

// ServeConn serves one connection: the handshake, then a yamux session
// whose streams are operations. It returns when the connection ends, after
// the processes it started have been killed and reaped; it closes conn.
func (s *Server) ServeConn(conn net.Conn) error {
	defer conn.Close()
	if s.token() == "" {
		return errors.New("agentproto: server has no token")
	}
	timer := time.AfterFunc(handshakeTimeout, func() { conn.Close() })
	err := s.handshake(conn)
	if !timer.Stop() {
		return fmt.Errorf("agentproto: handshake: timed out after %v", handshakeTimeout)
	}
	if err != nil {
		return fmt.Errorf("agentproto: handshake: %w", err)
	}
	sess, err := yamux.Server(conn, yamuxConfig())
	if err != nil {
		return fmt.Errorf("agentproto: start session: %w", err)
	}
	defer sess.Close()
	c := &serverConn{s: s, log: s.logger(), execs: make(map[uint64]*process)}
	var wg sync.WaitGroup
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.handle(st)
		}()
	}
	sess.Close()
	wg.Wait()
	return nil
}

func (s *Server) handshake(conn net.Conn) error {
	fw := newFrameWriter(conn)
	fail := func(msg string) error {
		p, _ := json.Marshal(wireError{Error: msg, Kind: kindHandshake})
		fw.write(frameError, p)
		return errors.New(msg)
	}
	t, p, err := newFrameReader(conn).next()
	if err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	if t != frameHello {
		return fail(fmt.Sprintf("expected hello frame, got %s", t))
	}
	var h hello
	if err := json.Unmarshal(p, &h); err != nil {
		return fail("malformed hello")
	}
	if h.Proto != ProtocolVersion {
		return fail(fmt.Sprintf("unsupported protocol version %d (agent speaks %d)", h.Proto, ProtocolVersion))
	}
	if !tokenEqual(h.Token, s.token()) {
		return fail("bad token")
	}
	p, err = json.Marshal(helloOK{Proto: ProtocolVersion, Version: Version, Refused: s.Refused})
	if err != nil {
		return err
	}
	return fw.write(frameHelloOK, p)
}

// tokenEqual compares in constant time, without leaking the length.
func tokenEqual(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// Shutdown sends sig to the process group of every running process, waits
// until they are gone and their results sent, or until ctx is done, then
// SIGKILLs what is left. New execs
// are refused from the moment it is called. It returns ctx.Err() if it had
// to kill.
func (s *Server) Shutdown(ctx context.Context, sig syscall.Signal) error {
	s.mu.Lock()
	s.closing = true
	procs := make([]*process, 0, len(s.procs))
	for p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		p.signal(sig)
	}
	for _, p := range procs {
		select {
		case <-p.finished:
		case <-ctx.Done():
			for _, p := range procs {
				p.signal(syscall.SIGKILL)
			}
			return ctx.Err()
		}
	}
	return nil
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// Procs is the number of running processes started by Exec.
func (s *Server) Procs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.procs)
}

func (s *Server) addProc(p *process) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return errors.New("agent is shutting down")
	}
	if s.procs == nil {
		s.procs = make(map[*process]struct{})
	}
	s.procs[p] = struct{}{}
	return nil
}

func (s *Server) removeProc(p *process) {
	s.mu.Lock()
	delete(s.procs, p)
	s.mu.Unlock()
}

// process is a running exec'd process, the leader of its process group.
type process struct {
	done     chan struct{} // closed once the process has exited (or failed to start)
	finished chan struct{} // closed once its result has been sent

	// mu guards pid, exited and timedOut; signals are sent under it so
	// that none is sent before the process exists or once its pid may have
	// been reused.
	mu       sync.Mutex
	pid      int // 0 until started
	exited   bool
	timedOut bool
	// also, for a process on a pty, passes a signal on to the rest of its
	// session: a shell with job control runs each job in a process group
	// of its own.
	also func(sig syscall.Signal)
}

func (p *process) setPID(pid int) {
	p.mu.Lock()
	p.pid = pid
	p.mu.Unlock()
}

// signal sends sig to the process group, unless the process is gone.
func (p *process) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.signalLocked(sig)
}

func (p *process) signalLocked(sig syscall.Signal) {
	if p.exited || p.pid <= 0 { // pid 0 would signal our own group
		return
	}
	if err := syscall.Kill(-p.pid, sig); err != nil {
		// The leader may have moved to another group.
		syscall.Kill(p.pid, sig)
	}
	if p.also != nil {
		p.also(sig)
	}
}

// timeout kills the group for exceeding its time limit.
func (p *process) timeout() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		p.timedOut = true
		p.signalLocked(syscall.SIGKILL)
	}
}

// setExited records that the process has exited; it must be called before
// the pid is released (reaped), so no signal can hit a reused pid.
func (p *process) setExited() {
	p.mu.Lock()
	p.exited = true
	p.mu.Unlock()
}

// serverConn is the state of one connection.
type serverConn struct {
	s   *Server
	log *slog.Logger

	// mu guards execs.
	mu    sync.Mutex
	execs map[uint64]*process // by client-chosen id
}

func (c *serverConn) handle(st *yamux.Stream) {
	defer st.Close()
	fr, fw := newFrameReader(st), newFrameWriter(st)
	st.SetReadDeadline(time.Now().Add(requestTimeout))
	t, p, err := fr.next()
	if err != nil {
		c.log.Debug("read request", "err", err)
		return
	}
	st.SetReadDeadline(time.Time{})
	if t != frameRequest {
		sendError(fw, fmt.Errorf("expected request frame, got %s: %w", t, ErrInvalid))
		return
	}
	var req request
	if err := json.Unmarshal(p, &req); err != nil {
		sendError(fw, fmt.Errorf("malformed request: %v: %w", err, ErrInvalid))
		return
	}
	if c.s.Refused != "" && req.Op != opHealth {
		sendError(fw, fmt.Errorf("%w: %s", ErrRefused, c.s.Refused))
		return
	}
	if c.s.unclaimed() && req.Op != opHealth && req.Op != opClaim {
		sendError(fw, fmt.Errorf("%w: the agent waits to be claimed", ErrRefused))
		return
	}
	switch req.Op {
	case opClaim:
		c.claim(fw, req.Claim)
	case opHealth:
		sendReply(fw, &Health{Version: Version, PID: os.Getpid(), Uptime: time.Since(startTime), Procs: c.s.Procs()})
	case opExec:
		c.exec(st, fr, fw, &req)
	case opSignal:
		c.signal(fw, &req)
	case opWriteFile:
		if err := writeFile(fr, &req); err != nil {
			sendError(fw, err)
			return
		}
		sendReply(fw, struct{}{})
	case opReadFile:
		if err := readFile(fw, &req); err != nil {
			sendError(fw, err)
		}
	case opAudit:
		c.audit(fr, fw)
	case opListDir:
		if err := listDir(fw, &req); err != nil {
			sendError(fw, err)
		}
	case opSync:
		syncFS()
		sendReply(fw, struct{}{})
	case opArchiveGet:
		if err := archiveGet(fw, &req); err != nil {
			sendError(fw, err)
		}
	case opArchivePut:
		if err := archivePut(fr, &req); err != nil {
			sendError(fw, err)
			return
		}
		sendReply(fw, struct{}{})
	default:
		sendError(fw, fmt.Errorf("unknown operation %q: %w", req.Op, ErrInvalid))
	}
}

func (c *serverConn) signal(fw *frameWriter, req *request) {
	if req.Signal < 1 || req.Signal > 64 {
		sendError(fw, fmt.Errorf("bad signal %d: %w", req.Signal, ErrInvalid))
		return
	}
	c.mu.Lock()
	p := c.execs[req.ID]
	c.mu.Unlock()
	if p != nil {
		p.signal(syscall.Signal(req.Signal))
	}
	sendReply(fw, struct{}{})
}

// register records an exec under its client-chosen id (0: none).
func (c *serverConn) register(id uint64, p *process) error {
	if id == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.execs[id]; dup {
		return fmt.Errorf("duplicate exec id %d: %w", id, ErrInvalid)
	}
	c.execs[id] = p
	return nil
}

func (c *serverConn) unregister(id uint64) {
	c.mu.Lock()
	delete(c.execs, id)
	c.mu.Unlock()
}

func sendReply(fw *frameWriter, v any) error {
	p, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return fw.write(frameReply, p)
}

func sendError(fw *frameWriter, err error) error {
	p, _ := json.Marshal(newWireError(err))
	return fw.write(frameError, p)
}

func cleanPath(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("path %q is not absolute: %w", p, ErrInvalid)
	}
	return filepath.Clean(p), nil
}

// writeFile receives a file into a temporary file next to its destination
// and renames it into place once complete.
func writeFile(fr *frameReader, req *request) error {
	path, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	mode := os.FileMode(req.Mode) & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
	if mode == 0 {
		mode = 0o644
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".cagebox-*")
	if err != nil {
		return fmt.Errorf("create %s: %w", path, errors.Unwrap(err))
	}
	committed := false
	defer func() {
		if !committed {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return err
	}
	for done := false; !done; {
		t, p, err := fr.next()
		if err != nil {
			return fmt.Errorf("receive %s: %w", path, err)
		}
		switch t {
		case frameData:
			if _, err := f.Write(p); err != nil {
				return fmt.Errorf("write %s: %w", path, errors.Unwrap(err))
			}
		case frameEOF:
			done = true
		default:
			return fmt.Errorf("unexpected %s frame while receiving %s: %w", t, path, ErrInvalid)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, errors.Unwrap(err))
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("rename into %s: %w", path, errors.Unwrap(err))
	}
	committed = true
	return nil
}

// readFile sends a regular file as data frames followed by EOF.
func readFile(fw *frameWriter, req *request) error {
	path, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	if req.Max <= 0 {
		return fmt.Errorf("read %s: max must be positive: %w", path, ErrInvalid)
	}
	// Refuse FIFOs, sockets and devices: opening or reading them may block.
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	switch {
	case fi.IsDir():
		return fmt.Errorf("read %s: is a directory: %w", path, ErrInvalid)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("read %s: not a regular file: %w", path, ErrInvalid)
	case fi.Size() > req.Max:
		return fmt.Errorf("read %s: file is %d bytes, over the limit of %d: %w", path, fi.Size(), req.Max, ErrTooLarge)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf, put := getChunk()
	writeFailed := false
	defer func() { put(writeFailed) }()
	var total int64
	for {
		n, err := f.Read(buf[headerSize:])
		if n > 0 {
			total += int64(n)
			if total > req.Max {
				return fmt.Errorf("read %s: more than the limit of %d bytes: %w", path, req.Max, ErrTooLarge)
			}
			if werr := fw.writeBuf(frameData, buf[:headerSize+n]); werr != nil {
				writeFailed = true
				return werr
			}
		}
		if err == io.EOF {
			return fw.write(frameEOF, nil)
		}
		if err != nil {
			return err
		}
	}
}

// listBatch is the size at which a listing batch is sent; an entry's JSON is
// at most a few KiB, so a batch stays well under MaxJSONSize.
const listBatch = 32 << 10

// listDir sends a directory listing as JSON arrays of FileInfo, then EOF.
func listDir(fw *frameWriter, req *request) error {
	path, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var buf bytes.Buffer
	flush := func() error {
		if buf.Len() == 0 {
			return nil
		}
		buf.WriteByte(']')
		err := fw.write(frameReply, buf.Bytes())
		buf.Reset()
		return err
	}
	for {
		ents, rerr := f.ReadDir(256)
		for _, e := range ents {
			info, err := e.Info()
			if err != nil {
				continue // removed meanwhile
			}
			p, err := json.Marshal(FileInfo{Name: e.Name(), Size: info.Size(), Mode: info.Mode(), ModTime: info.ModTime(), IsDir: info.IsDir()})
			if err != nil {
				return err
			}
			if buf.Len() == 0 {
				buf.WriteByte('[')
			} else {
				buf.WriteByte(',')
			}
			buf.Write(p)
			if buf.Len() >= listBatch {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			var pe *fs.PathError
			if errors.As(rerr, &pe) {
				return rerr
			}
			return fmt.Errorf("list %s: %w", path, rerr)
		}
	}
	if err := flush(); err != nil {
		return err
	}
	return fw.write(frameEOF, nil)
}

// MergeEnv merges KEY=VALUE lists; later layers win, order of first
// appearance is kept, entries without "=" are dropped.
func MergeEnv(layers ...[]string) []string {
	idx := make(map[string]int)
	var out []string
	for _, layer := range layers {
		for _, kv := range layer {
			k, _, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			if i, seen := idx[k]; seen {
				out[i] = kv
				continue
			}
			idx[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}
