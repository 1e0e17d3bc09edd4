package cputime

import (
	"syscall"
	"time"
)

// Thread returns the CPU time the calling thread has used. The caller
// locks its goroutine to its thread (runtime.LockOSThread) around what it
// measures, or the goroutine may move and the difference of two reads
// mean nothing.
func Thread() time.Duration { return rusage(syscall.RUSAGE_THREAD) }
