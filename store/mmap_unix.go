//go:build unix

package store

import (
	"errors"
	"os"
	"syscall"
)

// mmapFile maps path read-only. The caller must not touch data after
// calling unmap.
func mmapFile(path string) (data []byte, unmap func(), err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	// A table holds at least its footer: two lengths and a checksum.
	if fi.Size() < 16 {
		return nil, nil, errors.New("truncated")
	}
	if int64(int(fi.Size())) != fi.Size() {
		return nil, nil, errors.New("too large to map")
	}
	data, err = syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return data, func() { _ = syscall.Munmap(data) }, nil
}
