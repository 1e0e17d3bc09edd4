//go:build linux

package engine

import (
	"syscall"
	"time"
)

// threadCPU returns the CPU time the calling thread has used, user and
// system: on a machine shared with other work, a benchmark's wall time is
// mostly its waits for a core. The caller locks its goroutine to its
// thread (runtime.LockOSThread) around what it measures.
func threadCPU() time.Duration {
	var r syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_THREAD, &r) != nil {
		return 0
	}
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}
