package main

import (
	"runtime"
	"sync"
)

// spareThreads is how many OS threads the agent starts at once and keeps.
const spareThreads = 16

// prewarmThreads makes the Go runtime start n OS threads now and keep them
// idle for later. The guest shares the sandbox's pids limit with the agent
// (threads count as tasks), and the Go runtime aborts the whole process
// when it needs a new thread and cannot make one ("failed to create new
// OS thread"): a guest at its limit would take the agent down with it.
// With threads made while the sandbox is empty, the agent serves from them.
// It runs before capabilities are dropped, so the drop reaches these
// threads too.
func prewarmThreads(n int) {
	var locked, release, done sync.WaitGroup
	locked.Add(n)
	release.Add(1)
	done.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer done.Done()
			// While these goroutines hold their threads, the scheduler must
			// make a new one for every other; unlocked, the threads stay
			// in the runtime's idle list (it never ends idle threads).
			runtime.LockOSThread()
			locked.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	release.Done()
	done.Wait()
}
