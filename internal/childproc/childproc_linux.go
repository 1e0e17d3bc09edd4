// Package childproc ties the processes the bench and the tests start to
// their parent's life.
package childproc

import "syscall"

// Attr makes a child process die with the process that started it, so that
// an interrupted bench, or a test go test's -timeout killed, leaves no node
// behind.
func Attr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
