//go:build !linux

package bench

import "syscall"

// procAttr: only Linux can tie a child's life to its parent's; elsewhere
// an interrupted run may leave node processes to stop by hand.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
