package agentproto

import (
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Reaper reaps every child of the process: the ones Server starts, whose
// exit status it hands back, and orphans re-parented to the process because
// it is PID 1 (or a child subreaper). There must be at most one Reaper per
// process, and nothing else in the process may wait for children.
type Reaper struct {
	log *slog.Logger

	// startMu is held for reading while a child is started and registered
	// and for writing while reaping, so a child cannot be reaped as an
	// orphan before it is registered.
	startMu sync.RWMutex

	// mu guards waiters and orphans.
	mu      sync.Mutex
	waiters map[int]func(syscall.WaitStatus)
	orphans int
}

// NewReaper starts reaping children on SIGCHLD.
func NewReaper(log *slog.Logger) *Reaper {
	if log == nil {
		log = slog.Default()
	}
	r := &Reaper{log: log, waiters: make(map[int]func(syscall.WaitStatus))}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for range ch {
			r.reap()
		}
	}()
	// Children may have exited before we asked for SIGCHLD.
	r.reap()
	return r
}

// Orphans is how many processes not started through the reaper it has reaped.
func (r *Reaper) Orphans() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.orphans
}

func (r *Reaper) reap() {
	r.startMu.Lock()
	defer r.startMu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.mu.Lock()
		fn := r.waiters[pid]
		delete(r.waiters, pid)
		if fn == nil {
			r.orphans++
		}
		r.mu.Unlock()
		if fn != nil {
			fn(ws)
		} else {
			r.log.Debug("reaped orphan", "pid", pid, "status", ws.ExitStatus())
		}
	}
}

// start runs fn, which starts a child and returns its pid, and registers
// onExit to receive the child's status once it has been reaped. onExit runs
// on the reaper's goroutine and must not block.
func (r *Reaper) start(fn func() (int, error), onExit func(syscall.WaitStatus)) (int, error) {
	r.startMu.RLock()
	defer r.startMu.RUnlock()
	pid, err := fn()
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	r.waiters[pid] = onExit
	r.mu.Unlock()
	return pid, nil
}
