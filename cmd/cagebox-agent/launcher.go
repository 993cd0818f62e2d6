package main

import (
	"os"
	"runtime"
)

// launcher starts every process of the agent from one OS thread whose own
// credentials it confined: a child inherits the credentials of the thread
// that forks it, and os.StartProcess forks from the calling thread. This
// makes the drop hold in a cgo build too, where dropCapabilities cannot
// reach the other threads. (The Go runtime never clones new threads from a
// locked thread, so the launcher's credentials stay its own.)
type launcher struct {
	reqs chan func()
}

// newLauncher starts the launcher's thread; with confineIt it confines the
// thread first (keeping the extra capabilities too in its own permitted
// and effective sets; see confineThread) and returns the errors of the
// steps that failed (the launcher runs regardless: the agent's check of
// its children decides).
func newLauncher(confineIt bool, extra uint64) (*launcher, error) {
	l := &launcher{reqs: make(chan func())}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: were the goroutine to end, its thread would end too.
		runtime.LockOSThread()
		var err error
		if confineIt {
			err = confineThread(extra)
		}
		errc <- err
		for fn := range l.reqs {
			fn()
		}
	}()
	return l, <-errc
}

// startProcess is os.StartProcess on the launcher's thread.
func (l *launcher) startProcess(name string, argv []string, attr *os.ProcAttr) (*os.Process, error) {
	type started struct {
		p   *os.Process
		err error
	}
	done := make(chan started, 1)
	l.reqs <- func() {
		p, err := os.StartProcess(name, argv, attr)
		done <- started{p, err}
	}
	r := <-done
	return r.p, r.err
}
