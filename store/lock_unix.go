//go:build unix

package store

import (
	"errors"
	"os"
	"syscall"
)

// ownLock is true where lockDir takes the lock itself; Badger's own lock
// guard is then bypassed (it would conflict with ours, and its error can
// only be recognised by its text).
const ownLock = true

// lockDir takes an exclusive flock on dir, the same lock Badger takes, so a
// Badger opened elsewhere on dir and another Store exclude each other. The
// lock belongs to the open file description, so a second Store in the same
// process is refused too. It returns errLockHeld when the lock is taken.
// Closing the returned file releases the lock.
func lockDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errLockHeld
		}
		return nil, err
	}
	return f, nil
}
