package bench

import "syscall"

// procAttr makes a node process die with the bench, so that an
// interrupted run leaves no node behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
