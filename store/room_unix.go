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

// allocatedBytes returns the bytes the filesystem holds for the file
// path: less than its size when it is sparse, as Badger's logs are until
// written to.
func allocatedBytes(path string) (int64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Blocks * 512, nil
}
