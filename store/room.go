package store

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	badger "github.com/dgraph-io/badger/v4"
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
// the data directory has less free space than Config.MinFreeBytes plus
// what Badger's compactions may write (compactionRoom). Why:
// Badger writes its log, and every table it flushes or compacts, into a
// file it made with ftruncate (sparse) and maps into memory; on a full
// disk the kernel cannot back a page of it, and the write is a SIGBUS
// that kills the process rather than an error.
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
	if err != nil || free < 0 {
		return nil
	}
	if free < min {
		return fmt.Errorf("%w: %s has %d KiB free, less than the %d KiB kept free (MinFreeBytes); "+
			"writes resume once there is room", ErrDiskFull, s.cfg.Dir, free>>10, min>>10)
	}
	// The compactions a write may set off need room too: no need to look
	// at the tables when there is room for the most they can need.
	opt := s.db.Opts()
	var tables int64
	for _, l := range s.db.Levels() {
		tables += l.Size
	}
	if free-min >= compactionBound(tables, int64(opt.NumMemtables+1)*opt.MemTableSize, opt.NumCompactors) {
		return nil
	}
	memtables, err := memtableBytes(s.cfg.Dir)
	if err != nil {
		return nil // as for free space that cannot be read
	}
	room := compactionRoom(s.db.Tables(), memtables, opt.MaxLevels-1, opt.NumCompactors)
	if free-min >= room {
		return nil
	}
	return fmt.Errorf("%w: %s has %d KiB free, less than the %d KiB kept free (MinFreeBytes) and the %d KiB "+
		"Badger's compactions may write before they free what they compacted; writes resume once there is room",
		ErrDiskFull, s.cfg.Dir, free>>10, min>>10, room>>10)
}

// roomCheckedBatch is a WriteBatch of a split Apply or Reset, of a
// prefix's deletes (Drop, DropTasks, DeleteHistory) or of a history
// batch, that checks the disk's room again (checkRoom) every quarter of a
// memtable it is given: such a write can take far more than MinFreeBytes
// after the check at its start, and Badger, which commits the batch's
// transactions as they fill, would write its log and flush its memtables
// into a full disk.
type roomCheckedBatch struct {
	wb    *badger.WriteBatch
	s     *Store
	since int64 // bytes given since the last check
}

func (s *Store) roomChecked(wb *badger.WriteBatch) *roomCheckedBatch {
	return &roomCheckedBatch{wb: wb, s: s}
}

func (b *roomCheckedBatch) check(n int) error {
	if b.since += int64(n); b.since < b.s.cfg.MemTableSize/4 {
		return nil
	}
	b.since = 0
	return b.s.checkRoom()
}

func (b *roomCheckedBatch) Set(key, value []byte) error {
	if err := b.check(len(key) + len(value)); err != nil {
		return err
	}
	return b.wb.Set(key, value)
}

func (b *roomCheckedBatch) SetEntry(e *badger.Entry) error {
	if err := b.check(len(e.Key) + len(e.Value)); err != nil {
		return err
	}
	return b.wb.SetEntry(e)
}

func (b *roomCheckedBatch) Delete(key []byte) error {
	if err := b.check(len(key)); err != nil {
		return err
	}
	return b.wb.Delete(key)
}

// memtableBytes returns what Badger's memtables hold, which flushes will
// make level-0 tables: what their logs (*.mem, sparse files of twice
// MemTableSize) take on disk.
func memtableBytes(dir string) (int64, error) {
	logs, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil {
		return 0, err
	}
	var n int64
	for _, f := range logs {
		b, err := allocatedBytes(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue // flushed meanwhile
		}
		if err != nil {
			return 0, err
		}
		n += b
	}
	return n, nil
}
