package store

import (
	"errors"
	"fmt"
	"io/fs"
)

// minFree is the free space below which writes are refused (see
// Config.MinFreeBytes); negative: no check.
func (c Config) minFree() int64 {
	if c.MinFreeBytes == 0 {
		return 4 * c.MemTableSize
	}
	return c.MinFreeBytes
}

// checkRoom returns an error matching ErrDirDeleted when the data
// directory is gone, and one matching ErrDiskFull when the filesystem of
// the data directory has less free space than Config.MinFreeBytes. Why:
// Badger writes its log into a file it made with ftruncate (sparse) and
// maps into memory; on a full disk the kernel cannot back a page of it,
// and the write is a SIGBUS that kills the process rather than an error.
// Refusing writes while some room is left turns a full disk into errors
// the callers count and survive. A data directory deleted under the store
// refuses writes too. A filesystem whose free space cannot be read is
// written to, as without the check.
func (s *Store) checkRoom() error {
	min := s.cfg.minFree()
	if min < 0 {
		return nil
	}
	free, err := freeBytes(s.cfg.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		// Deleted under a running node: Badger's open files live on, but
		// the next file it makes (a memtable, a table) fails, and writes
		// would stall once its memtables are full.
		return fmt.Errorf("%w: %s, while the store is open; restart the node to start a new cache "+
			"(tasks reload from etcd)", ErrDirDeleted, s.cfg.Dir)
	}
	if err != nil || free < 0 || free >= min {
		return nil
	}
	return fmt.Errorf("%w: %s has %d KiB free, less than the %d KiB kept free (MinFreeBytes); "+
		"writes resume once there is room", ErrDiskFull, s.cfg.Dir, free>>10, min>>10)
}
