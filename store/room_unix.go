//go:build unix

package store

import "syscall"

// freeBytes returns the bytes an unprivileged process may still write on
// the filesystem of dir.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
