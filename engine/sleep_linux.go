package engine

import (
	"syscall"
	"time"
)

// sleepPrecise blocks the calling goroutine's thread for d in nanosleep,
// which the kernel wakes within some 0.1 ms: a Go timer, whose poller
// waits in whole milliseconds, wakes up to a millisecond late. The
// runtime hands the processor to other goroutines meanwhile.
func sleepPrecise(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}
