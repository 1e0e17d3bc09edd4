//go:build linux

package registry

import (
	"syscall"
	"time"
)

// processCPU is the CPU time the test process has used, user and system:
// with etcd in the process, what a benchmark's transactions cost both
// ends, readable on a machine whose other work leaves wall time not.
func processCPU() time.Duration {
	var r syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &r) != nil {
		return 0
	}
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}
