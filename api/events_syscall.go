package api

// The syscall audit's events (`cagebox create --audit exec,net,file,priv`).
// Every string in them is the guest's and is bounded by the daemon.

// SyscallExec: a guest process ran execve or execveat.
type SyscallExec struct {
	// PID is the process id inside the guest (0 when unknown).
	PID int `json:"pid"`
	// Path is the program as the guest named it.
	Path string `json:"path,omitempty"`
	// Argv is the argument list, bounded (32 entries, 256 bytes each,
	// 2 KiB in all); ArgvTruncated says it was cut.
	Argv          []string `json:"argv"`
	ArgvTruncated bool     `json:"argv_truncated,omitempty"`
	// Result is "ok", "error" (Errno says why) or absent when the runtime
	// records at entry and cannot know (containers).
	Result string `json:"result,omitempty"`
	Errno  int    `json:"errno,omitempty"`
}

// EventKind implements EventPayload.
func (SyscallExec) EventKind() EventKind { return EventSyscallExec }

// SyscallConnect: a guest process called connect.
type SyscallConnect struct {
	PID int `json:"pid"`
	// Family is "inet", "inet6", "unix", or the family's number.
	Family  string `json:"family"`
	Address string `json:"address,omitempty"`
	Port    int    `json:"port,omitempty"`
	Result  string `json:"result,omitempty"`
	Errno   int    `json:"errno,omitempty"`
}

// EventKind implements EventPayload.
func (SyscallConnect) EventKind() EventKind { return EventSyscallConnect }

// SyscallOpen: a guest process opened a sensitive path.
type SyscallOpen struct {
	PID     int    `json:"pid"`
	Syscall string `json:"syscall"`
	Path    string `json:"path"`
	// Write: opened for writing, creating or truncating.
	Write  bool   `json:"write"`
	Result string `json:"result,omitempty"`
	Errno  int    `json:"errno,omitempty"`
}

// EventKind implements EventPayload.
func (SyscallOpen) EventKind() EventKind { return EventSyscallOpen }

// SyscallPriv: a guest process attempted a privileged syscall (mount,
// ptrace, bpf, unshare, setns, module loading, keyrings…).
type SyscallPriv struct {
	PID     int    `json:"pid"`
	Syscall string `json:"syscall"`
	// Result is "denied" (the sandbox's seccomp profile refused it),
	// "ok" or "error".
	Result string `json:"result"`
	Errno  int    `json:"errno,omitempty"`
}

// EventKind implements EventPayload.
func (SyscallPriv) EventKind() EventKind { return EventSyscallPriv }

// SyscallDropped: syscall records dropped over the sandbox's audit rate
// limit since the last such event (at most one a second).
type SyscallDropped struct {
	Count uint64  `json:"count"`
	Total uint64  `json:"total"`
	Rate  float64 `json:"rate"`
	Burst int     `json:"burst"`
}

// EventKind implements EventPayload.
func (SyscallDropped) EventKind() EventKind { return EventSyscallDropped }

// SandboxAudit is a sandbox's syscall audit, as GET /v1/sandboxes/{id}
// shows it.
type SandboxAudit struct {
	// Classes are the audited classes (exec, net, file, priv).
	Classes []string `json:"classes"`
	// Unrecorded are classes this runtime cannot record, and Note why.
	Unrecorded []string `json:"unrecorded,omitempty"`
	Note       string   `json:"note,omitempty"`
	// Recorded and Dropped count this daemon's records of the sandbox
	// (since it started): passed and dropped over the rate limit.
	Recorded uint64  `json:"recorded"`
	Dropped  uint64  `json:"dropped"`
	Rate     float64 `json:"rate"`
	Burst    int     `json:"burst"`
}
