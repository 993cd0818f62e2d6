package agentproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// ProtocolVersion is the version of the wire protocol. The agent rejects a
// hello with another version.
const ProtocolVersion = 1

// Version is the agent's version, reported by Health. Set it at link time
// with -ldflags "-X github.com/cagebox/cagebox/agentproto.Version=…".
var Version = "dev"

// DefaultReadMax is the limit ReadFile applies when it is given max <= 0.
const DefaultReadMax = 64 << 20

// maxListEntries bounds how many entries ListDir accepts from the agent.
const maxListEntries = 1 << 20

// Health is the agent's answer to a health check.
type Health struct {
	Version string        `json:"version"`
	PID     int           `json:"pid"`
	Uptime  time.Duration `json:"uptime"`
	Procs   int           `json:"procs"` // processes started by Exec that are still running
}

// ExecRequest describes a process to run in the guest.
type ExecRequest struct {
	Argv    []string      `json:"argv"`
	Env     []string      `json:"env,omitempty"`     // KEY=VALUE; merged over the agent's base env
	Cwd     string        `json:"cwd,omitempty"`     // default: the user's home when User is set and it exists, else "/"
	User    string        `json:"user,omitempty"`    // "name", "uid", "name:group" or "uid:gid"; empty = the agent's user (root)
	Timeout time.Duration `json:"timeout,omitempty"` // 0 = none; on expiry the process group is SIGKILLed and TimedOut is set
	Stdin   bool          `json:"stdin,omitempty"`   // whether stdin is attached (implied by a non-nil stdin reader)
	// TTY, when set, runs the process on a pseudo-terminal of this size: a
	// new session whose controlling terminal is the pty, stdin, stdout and
	// stderr all on it, one output stream (stdout), stdin always attached.
	TTY *WinSize `json:"tty,omitempty"`
}

// WinSize is a terminal's size in character cells.
type WinSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// MaxWinSize bounds a terminal's rows and columns: a terminal larger than
// this is a mistake, and curses programs allocate by it.
const MaxWinSize = 4096

// Valid reports whether ws is a usable terminal size (1..MaxWinSize each).
func (ws WinSize) Valid() bool {
	return ws.Rows >= 1 && ws.Cols >= 1 && ws.Rows <= MaxWinSize && ws.Cols <= MaxWinSize
}

// ExecResult is how a process ended.
type ExecResult struct {
	ExitCode int    `json:"exit_code"`        // 128+signal when killed by a signal
	Signal   string `json:"signal,omitempty"` // e.g. "SIGKILL"
	TimedOut bool   `json:"timed_out,omitempty"`
	Error    string `json:"error,omitempty"` // start failure; ExitCode 127 not found, 126 cannot execute
}

// FileInfo describes one directory entry (not following symlinks).
type FileInfo struct {
	Name    string      `json:"name"`
	Size    int64       `json:"size"`
	Mode    os.FileMode `json:"mode"`
	ModTime time.Time   `json:"mod_time"`
	IsDir   bool        `json:"is_dir"`
}

// Sentinel errors that RemoteError matches with errors.Is, besides the
// io/fs ones (fs.ErrNotExist, fs.ErrExist, fs.ErrPermission).
var (
	// ErrTooLarge: a file is larger than the limit given to ReadFile.
	ErrTooLarge = errors.New("too large")
	// ErrInvalid: the agent refused a malformed request.
	ErrInvalid = errors.New("invalid request")
	// ErrHandshake: the agent refused the handshake (wrong token or version).
	ErrHandshake = errors.New("handshake rejected")
	// ErrRefused: the agent refuses to run anything because processes it
	// starts would not be confined (Server.Refused says why).
	ErrRefused = errors.New("refusing to run processes")
)

// Error kinds on the wire.
const (
	kindNotExist   = "not_exist"
	kindExist      = "exist"
	kindPermission = "permission"
	kindTooLarge   = "too_large"
	kindInvalid    = "invalid"
	kindHandshake  = "handshake"
	kindRefused    = "refused"
)

// RemoteError is an error reported by the agent. Its message is the agent's
// and is prefixed with "agent: ". It matches fs.ErrNotExist, fs.ErrExist,
// fs.ErrPermission, ErrTooLarge, ErrInvalid, ErrHandshake or ErrRefused
// according to its kind.
type RemoteError struct {
	Kind    string
	Message string
}

func (e *RemoteError) Error() string { return "agent: " + e.Message }

// Is reports whether the error is of the kind target stands for.
func (e *RemoteError) Is(target error) bool {
	switch e.Kind {
	case kindNotExist:
		return target == fs.ErrNotExist
	case kindExist:
		return target == fs.ErrExist
	case kindPermission:
		return target == fs.ErrPermission
	case kindTooLarge:
		return target == ErrTooLarge
	case kindInvalid:
		return target == ErrInvalid
	case kindHandshake:
		return target == ErrHandshake
	case kindRefused:
		return target == ErrRefused
	}
	return false
}

// wireError is the payload of an error frame.
type wireError struct {
	Error string `json:"error"`
	Kind  string `json:"kind,omitempty"`
}

// maxErrorMessage bounds the message the agent sends in an error frame.
const maxErrorMessage = 4 << 10

func newWireError(err error) wireError {
	msg := err.Error()
	if len(msg) > maxErrorMessage {
		msg = msg[:maxErrorMessage]
	}
	we := wireError{Error: msg}
	var re *RemoteError
	switch {
	case errors.As(err, &re):
		we.Kind = re.Kind
	case errors.Is(err, fs.ErrNotExist):
		we.Kind = kindNotExist
	case errors.Is(err, fs.ErrExist):
		we.Kind = kindExist
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		we.Kind = kindPermission
	case errors.Is(err, ErrTooLarge):
		we.Kind = kindTooLarge
	case errors.Is(err, ErrInvalid):
		we.Kind = kindInvalid
	case errors.Is(err, ErrRefused):
		we.Kind = kindRefused
	}
	return we
}

// decodeError turns an error frame's payload into a *RemoteError.
func decodeError(p []byte) error {
	var we wireError
	if err := json.Unmarshal(p, &we); err != nil {
		return fmt.Errorf("%w: bad error frame: %v", ErrProtocol, err)
	}
	if we.Error == "" {
		we.Error = "unspecified error"
	}
	return &RemoteError{Kind: we.Kind, Message: we.Error}
}

// hello is the payload of the hello frame.
type hello struct {
	Proto int    `json:"proto"`
	Token string `json:"token"`
}

// helloOK is the payload of the hello-ok frame.
type helloOK struct {
	Proto   int    `json:"proto"`
	Version string `json:"version"`
	// Refused is set when the agent refuses to run anything (see
	// Server.Refused): the host learns it at connect time.
	Refused string `json:"refused,omitempty"`
}

// Operations.
const (
	opExec      = "exec"
	opHealth    = "health"
	opWriteFile = "write_file"
	opReadFile  = "read_file"
	opListDir   = "list_dir"
	opSignal    = "signal"
	opClaim     = "claim"
	// opSync flushes the guest's filesystems (sync(2)) before the host
	// snapshots them: under gVisor written data can sit in the sentry's
	// page cache until then.
	opSync = "sync"
	// opArchiveGet sends a directory (or file) as a tar stream in data
	// frames, then EOF; opArchivePut receives one and extracts it.
	opArchiveGet = "archive_get"
	opArchivePut = "archive_put"
)

// request is the first frame of every stream.
type request struct {
	Op   string       `json:"op"`
	ID   uint64       `json:"id,omitempty"`   // exec: client-chosen id; signal: the exec to signal
	Exec *ExecRequest `json:"exec,omitempty"` // exec
	Path string       `json:"path,omitempty"` // file operations
	Mode uint32       `json:"mode,omitempty"` // write_file: os.FileMode
	Max  int64        `json:"max,omitempty"`  // read_file; archive_put: bytes of files
	// MaxEntries bounds archive_put's entries.
	MaxEntries int `json:"max_entries,omitempty"`
	Signal     int `json:"signal,omitempty"` // signal
	// Claim is the claim operation's Claim.
	Claim json.RawMessage `json:"claim,omitempty"`
}
