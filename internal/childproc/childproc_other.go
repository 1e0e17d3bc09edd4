//go:build !linux

// Package childproc ties the processes the bench and the tests start to
// their parent's life.
package childproc

import "syscall"

// Attr: only Linux can tie a child's life to its parent's; elsewhere an
// interrupted run may leave node processes to stop by hand.
func Attr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
