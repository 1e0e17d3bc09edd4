package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	badger "github.com/dgraph-io/badger/v4"
)

// KV is one cached task: its id and its value, opaque to the store (the
// engine's: the task JSON as read from etcd, or its shape, engine/shape.go).
type KV struct {
	ID    string
	Value []byte
}

// Partition calls fn for every cached task of p, in id byte order, and
// returns the revision the cache of p is synced to: every change of p in
// etcd up to and including rev is reflected, so the caller resumes its
// watch at rev+1. It returns (0, nil) without calling fn when p was never
// synced, or when a Reset or Drop of p was interrupted; the caller then
// reads p from etcd and calls Reset.
//
// The tasks and the revision come from one consistent snapshot, taken when
// Partition is called. value is valid only until fn returns: copy it to
// keep it. fn may be nil to read only the revision. An error from fn stops
// the scan and is returned wrapped. fn must not call Close.
func (s *Store) Partition(p uint32, fn func(id string, value []byte) error) (rev int64, err error) {
	if err := s.acquire(); err != nil {
		return 0, err
	}
	defer s.ops.Done()
	err = s.db.View(func(txn *badger.Txn) error {
		r, err := readRevision(txn, p)
		if err != nil || r == 0 || fn == nil {
			rev = r
			return err
		}
		prefix := taskPrefix(p)
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			item := it.Item()
			id := string(item.Key()[len(prefix):])
			if err := item.Value(func(v []byte) error { return fn(id, v) }); err != nil {
				return err
			}
		}
		rev = r
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: partition %d: %w", p, err)
	}
	return rev, nil
}

// Apply records, atomically, that the tasks of puts were created or
// updated and the ids of deletes removed in p, and that p is now synced to
// rev (> 0). Puts are applied before deletes, so an id in both ends up
// deleted; the caller normally collapses its events per id. Deleting an
// id that is not cached is not an error.
//
// Atomicity: one Badger transaction when the changes fit in one (15% of a
// memtable, about 2.4 MiB by default). Larger changes are written in
// several transactions and the revision last, so a crash between them
// leaves the new tasks recorded under the old revision: replaying the
// watch from the old revision reapplies the same changes, so the cache is
// never behind the revision it reports. The store does not check that rev
// increases. Apply keeps no reference to puts after it returns.
func (s *Store) Apply(p uint32, rev int64, puts []KV, deletes []string) error {
	if rev <= 0 {
		return fmt.Errorf("store: apply partition %d: revision %d is not positive", p, rev)
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.ops.Done()
	if err := s.checkRoom(); err != nil {
		return fmt.Errorf("store: apply partition %d: %w", p, err)
	}
	err := s.db.Update(func(txn *badger.Txn) error {
		if err := writeTasks(txn, p, puts, deletes); err != nil {
			return err
		}
		return txn.Set(revisionKey(p), encodeRevision(rev))
	})
	if errors.Is(err, badger.ErrTxnTooBig) {
		err = s.applySplit(p, rev, puts, deletes)
	}
	if err != nil {
		return fmt.Errorf("store: apply partition %d at revision %d: %w", p, rev, err)
	}
	return nil
}

// applySplit is Apply for changes too big for one transaction: changes
// first (a WriteBatch commits its transactions in order and Flush waits
// for all of them), the revision after.
func (s *Store) applySplit(p uint32, rev int64, puts []KV, deletes []string) error {
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	if err := writeTasks(wb, p, puts, deletes); err != nil {
		return err
	}
	return s.flushThenRevision(wb, p, rev)
}

// Reset replaces everything cached for p by tasks (the result of a full
// read of p from etcd at rev, > 0) and records p as synced to rev. tasks
// must not hold an id twice.
//
// Atomicity: one transaction when it fits (see Apply). Otherwise p's
// revision is deleted first, so until the last write p reads as never
// synced (Partition returns 0) and a crash midway costs one more full read,
// never a stale cache; then stale tasks are deleted, tasks written, and the
// revision written last. Reset keeps no reference to tasks after it
// returns.
func (s *Store) Reset(p uint32, rev int64, tasks []KV) error {
	if rev <= 0 {
		return fmt.Errorf("store: reset partition %d: revision %d is not positive", p, rev)
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.ops.Done()
	if err := s.checkRoom(); err != nil {
		return fmt.Errorf("store: reset partition %d: %w", p, err)
	}
	err := s.db.Update(func(txn *badger.Txn) error {
		// Deleting every cached key then setting the new ones leaves one
		// pending write per key: the set replaces the delete.
		prefix := taskPrefix(p)
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			if err := txn.Delete(it.Item().KeyCopy(nil)); err != nil {
				it.Close()
				return err
			}
		}
		it.Close()
		if err := writeTasks(txn, p, tasks, nil); err != nil {
			return err
		}
		return txn.Set(revisionKey(p), encodeRevision(rev))
	})
	if errors.Is(err, badger.ErrTxnTooBig) {
		err = s.resetSplit(p, rev, tasks)
	}
	if err != nil {
		return fmt.Errorf("store: reset partition %d at revision %d: %w", p, rev, err)
	}
	return nil
}

func (s *Store) resetSplit(p uint32, rev int64, tasks []KV) error {
	if err := s.deleteRevision(p); err != nil {
		return err
	}
	keep := make(map[string]struct{}, len(tasks))
	for _, kv := range tasks {
		keep[kv.ID] = struct{}{}
	}
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	prefix := taskPrefix(p)
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			key := it.Item().Key()
			if _, ok := keep[string(key[len(prefix):])]; ok {
				continue
			}
			if err := wb.Delete(it.Item().KeyCopy(nil)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := writeTasks(wb, p, tasks, nil); err != nil {
		return err
	}
	return s.flushThenRevision(wb, p, rev)
}

// taskWriter is what Apply and Reset write tasks through: the one
// transaction when the changes fit in it, else a WriteBatch.
type taskWriter interface {
	Set(key, value []byte) error
	Delete(key []byte) error
}

// writeTasks writes puts, then deletes deletes, all in p; puts first so
// that an id in both ends up deleted, as Apply promises.
func writeTasks(w taskWriter, p uint32, puts []KV, deletes []string) error {
	for _, kv := range puts {
		if err := w.Set(taskKey(p, kv.ID), kv.Value); err != nil {
			return err
		}
	}
	for _, id := range deletes {
		if err := w.Delete(taskKey(p, id)); err != nil {
			return err
		}
	}
	return nil
}

// flushThenRevision ends a split Apply or Reset: the revision is written
// only once every change in wb is, so that a crash in between leaves p
// behind its tasks (replayed from the old revision), never ahead of them.
func (s *Store) flushThenRevision(wb *badger.WriteBatch, p uint32, rev int64) error {
	if err := wb.Flush(); err != nil {
		return err
	}
	if s.cfg.beforeRevision != nil {
		if err := s.cfg.beforeRevision(); err != nil {
			return err
		}
	}
	return s.setRevision(p, rev)
}

// Drop forgets p: its revision first (so an interrupted Drop leaves p
// unsynced, never stale), then its tasks. Dropping a partition that is not
// cached is not an error.
func (s *Store) Drop(p uint32) error {
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.ops.Done()
	if err := s.checkRoom(); err != nil {
		return fmt.Errorf("store: drop partition %d: %w", p, err)
	}
	if err := s.deleteRevision(p); err != nil {
		return fmt.Errorf("store: drop partition %d: %w", p, err)
	}
	if err := s.deletePrefix(taskPrefix(p)); err != nil {
		return fmt.Errorf("store: drop partition %d: %w", p, err)
	}
	return nil
}

// Revisions returns the synced revision of every partition that has one,
// so a restarted node knows which partitions it can resume with a watch.
func (s *Store) Revisions() (map[uint32]int64, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.ops.Done()
	revs := make(map[uint32]int64)
	prefix := []byte(nsRevision)
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			item := it.Item()
			key := item.Key()
			if len(key) != len(prefix)+4 {
				return fmt.Errorf("%w: revision key %x", ErrCorrupt, key)
			}
			p := binary.BigEndian.Uint32(key[len(prefix):])
			var rev int64
			if err := item.Value(func(v []byte) (err error) {
				rev, err = decodeRevision(v)
				return err
			}); err != nil {
				return err
			}
			revs[p] = rev
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: revisions: %w", err)
	}
	return revs, nil
}

func readRevision(txn *badger.Txn, p uint32) (rev int64, err error) {
	item, err := txn.Get(revisionKey(p))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	err = item.Value(func(v []byte) error {
		rev, err = decodeRevision(v)
		return err
	})
	return rev, err
}

func (s *Store) setRevision(p uint32, rev int64) error {
	return s.db.Update(func(txn *badger.Txn) error {
		return txn.Set(revisionKey(p), encodeRevision(rev))
	})
}

func (s *Store) deleteRevision(p uint32) error {
	return s.db.Update(func(txn *badger.Txn) error {
		return txn.Delete(revisionKey(p))
	})
}

func encodeRevision(rev int64) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(rev))
}

func decodeRevision(v []byte) (int64, error) {
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: revision value of %d bytes", ErrCorrupt, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}
