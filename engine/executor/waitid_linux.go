package executor

import (
	"syscall"
	"unsafe"
)

// waitExited blocks until the process pid has exited, without reaping it
// (waitid with WNOWAIT), and reports whether it could. The caller still
// reaps it with Wait.
func waitExited(pid int) bool {
	const pPID = 1      // idtype_t P_PID
	var info [16]uint64 // siginfo_t: 128 bytes
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info)), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return true
		case syscall.EINTR:
			continue
		default:
			return false
		}
	}
}
