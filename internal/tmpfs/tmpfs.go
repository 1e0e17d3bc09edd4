//go:build linux

// Package tmpfs is a test fixture: a small filesystem of its own (a tmpfs
// mounted on a test's temporary directory) that a test can fill to the
// last byte, to see what a full disk does to the code under test. Mounting
// needs root (or CAP_SYS_ADMIN): elsewhere Mount skips the test. It holds
// no state and starts no goroutine.
package tmpfs

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
)

// Mount mounts a tmpfs of size bytes on a new temporary directory and
// returns it, or skips the test where mounting is not allowed. The
// filesystem is unmounted when the test ends, after the cleanups
// registered later (closing what was opened on it) have run. A test
// process that dies first leaves it mounted.
func Mount(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if os.Geteuid() != 0 {
		t.Skip("tmpfs: mounting a filesystem needs root")
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("tmpfs: cannot mount on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("tmpfs: unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes the file path until its filesystem has no byte left; removing
// the file frees the space again.
func Fill(t testing.TB, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("tmpfs: %v", err)
	}
	defer f.Close()
	for _, chunk := range []int{1 << 20, 4 << 10, 1} {
		buf := make([]byte, chunk)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("tmpfs: fill %s: %v", path, err)
				}
				break
			}
		}
	}
}
