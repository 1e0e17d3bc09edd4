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
	// Created is the revision at which the task was created in etcd (a
	// put after a delete creates it again); 0: not known, as for every
	// task a cache written before creations were kept holds.
	Created int64
}

// Partition calls fn for every cached task of p, in id byte order, with
// its value and the revision it was created at (KV.Created: 0 when not
// known), and returns the revision the cache of p is synced to: every
// change of p in etcd up to and including rev is reflected, so the caller
// resumes its watch at rev+1. It returns (0, nil) without calling fn when
// p was never synced, or when a Reset or Drop of p was interrupted; the
// caller then reads p from etcd and calls Reset.
//
// The revision is kept with the number of tasks p holds, and a scan that
// reads another number fails with an error wrapping ErrCorrupt: Badger's
// iterators end silently at a block that fails its checksum, which would
// drop the tasks after it while keeping the revision (the caller then reads
// p from etcd). Open checks every block, so this is damage done to a table
// after Open. A crash between the writes of a split Apply that added or
// removed tasks does the same, at the cost of one more read of p. A
// revision written before counts were kept reads as never synced: one
// read of p from etcd after the upgrade, and p is counted from then on.
//
// The tasks and the revision come from one consistent snapshot, taken when
// Partition is called. value is valid only until fn returns: copy it to
// keep it. fn may be nil to read only the revision. An error from fn stops
// the scan and is returned wrapped. fn must not call Close.
func (s *Store) Partition(p uint32, fn func(id string, value []byte, created int64) error) (rev int64, err error) {
	if err := s.acquire(); err != nil {
		return 0, err
	}
	defer s.ops.Done()
	err = s.db.View(func(txn *badger.Txn) error {
		r, err := readRevision(txn, p)
		if err != nil || r.rev == 0 || fn == nil {
			rev = r.rev
			return err
		}
		prefix := taskPrefix(p)
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		var n int64
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			item := it.Item()
			id := string(item.Key()[len(prefix):])
			err := item.Value(func(v []byte) error {
				created, v, err := decodeTask(item.UserMeta(), v)
				if err != nil {
					return fmt.Errorf("task %q: %w", id, err)
				}
				return fn(id, v, created)
			})
			if err != nil {
				return err
			}
			n++
		}
		if r.count != countUnknown && n != r.count {
			return fmt.Errorf("%w: %d tasks read where %d were written (a damaged block?)", ErrCorrupt, n, r.count)
		}
		rev = r.rev
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
// leaves the new tasks recorded under the old revision, never behind it:
// replaying the watch from the old revision reapplies the same changes,
// unless they changed how many tasks p holds, which the next Partition
// finds (ErrCorrupt) and the caller reads p from etcd. The store does not
// check that rev increases. Apply keeps no reference to puts after it
// returns.
//
// The count of tasks that Partition checks starts at a Reset, and Apply
// keeps it: on a p that reads as never synced, Apply records rev with no
// count, and Partition checks none until p's next Reset. So the caller
// reads such a p from etcd and Resets it first, as Partition says.
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
		count, err := countAfter(txn, p, puts, deletes)
		if err != nil {
			return err
		}
		if err := writeTasks(txn, p, puts, deletes); err != nil {
			return err
		}
		return txn.Set(revisionKey(p), synced{rev, count}.encode())
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
	var count int64
	err := s.db.View(func(txn *badger.Txn) (err error) {
		count, err = countAfter(txn, p, puts, deletes)
		return err
	})
	if err != nil {
		return err
	}
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	if err := writeTasks(s.roomChecked(wb), p, puts, deletes); err != nil {
		return err
	}
	return s.flushThenRevision(wb, p, synced{rev, count})
}

// countAfter returns how many tasks p will hold once puts and deletes are
// written (puts first, as writeTasks writes them), reading in txn which
// of their ids p holds now; countUnknown when p's count is.
func countAfter(txn *badger.Txn, p uint32, puts []KV, deletes []string) (int64, error) {
	r, err := readRevision(txn, p)
	if err != nil || r.count == countUnknown {
		return countUnknown, err
	}
	held := make(map[string]bool, len(puts)+len(deletes)) // by id, once known
	has := func(id string) (bool, error) {
		if h, ok := held[id]; ok {
			return h, nil
		}
		_, err := txn.Get(taskKey(p, id))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return false, nil
		}
		return err == nil, err
	}
	n := r.count
	for _, kv := range puts {
		h, err := has(kv.ID)
		if err != nil {
			return 0, err
		}
		if !h {
			n++
		}
		held[kv.ID] = true
	}
	for _, id := range deletes {
		h, err := has(id)
		if err != nil {
			return 0, err
		}
		if h {
			n--
		}
		held[id] = false
	}
	return n, nil
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
		return txn.Set(revisionKey(p), synced{rev, int64(len(tasks))}.encode())
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
	w := s.roomChecked(wb)
	prefix := taskPrefix(p)
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			key := it.Item().Key()
			if _, ok := keep[string(key[len(prefix):])]; ok {
				continue
			}
			if err := w.Delete(it.Item().KeyCopy(nil)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := writeTasks(w, p, tasks, nil); err != nil {
		return err
	}
	return s.flushThenRevision(wb, p, synced{rev, int64(len(tasks))})
}

// taskWriter is what Apply and Reset write tasks through: the one
// transaction when the changes fit in it, else a WriteBatch.
type taskWriter interface {
	SetEntry(e *badger.Entry) error
	Delete(key []byte) error
}

// writeTasks writes puts, then deletes deletes, all in p; puts first so
// that an id in both ends up deleted, as Apply promises.
func writeTasks(w taskWriter, p uint32, puts []KV, deletes []string) error {
	for _, kv := range puts {
		if err := w.SetEntry(taskEntry(p, kv)); err != nil {
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

// metaCreated marks, in a task entry's user meta, a value that begins with
// the task's creation revision (8 bytes, big-endian) before the caller's
// value. Entries written before creations were kept have no mark.
const metaCreated byte = 1

// taskEntry is the entry of kv, cached in p: with its creation revision
// when known.
func taskEntry(p uint32, kv KV) *badger.Entry {
	if kv.Created <= 0 {
		return badger.NewEntry(taskKey(p, kv.ID), kv.Value)
	}
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(kv.Value)), uint64(kv.Created))
	return badger.NewEntry(taskKey(p, kv.ID), append(v, kv.Value...)).WithMeta(metaCreated)
}

// decodeTask splits a task entry's value, with user meta meta, into the
// task's creation revision (0: not recorded) and the caller's value.
func decodeTask(meta byte, v []byte) (created int64, value []byte, err error) {
	if meta&metaCreated == 0 {
		return 0, v, nil
	}
	if len(v) < 8 {
		return 0, nil, fmt.Errorf("%w: a value of %d bytes marked with its creation revision", ErrCorrupt, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), v[8:], nil
}

// flushThenRevision ends a split Apply or Reset: the revision is written
// only once every change in wb is, so that a crash in between leaves p
// behind its tasks (replayed from the old revision), never ahead of them.
func (s *Store) flushThenRevision(wb *badger.WriteBatch, p uint32, r synced) error {
	if err := wb.Flush(); err != nil {
		return err
	}
	if s.cfg.beforeRevision != nil {
		if err := s.cfg.beforeRevision(); err != nil {
			return err
		}
	}
	return s.db.Update(func(txn *badger.Txn) error {
		return txn.Set(revisionKey(p), r.encode())
	})
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

// Origin returns what SetOrigin last recorded, or nil when nothing was:
// an empty store, or one written before origins were kept.
func (s *Store) Origin() ([]byte, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.ops.Done()
	var o []byte
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(originKey)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		o, err = item.ValueCopy(nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: read the origin: %w", err)
	}
	return o, nil
}

// SetOrigin records o as the origin of the cached partitions: the caller's
// name for the etcd cluster and prefix they were read from. A store's
// revisions mean nothing against another cluster's, so a caller that finds
// another origin calls DropTasks first.
func (s *Store) SetOrigin(o []byte) error {
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.ops.Done()
	if err := s.checkRoom(); err != nil {
		return fmt.Errorf("store: record the origin: %w", err)
	}
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Set(originKey, o) }); err != nil {
		return fmt.Errorf("store: record the origin: %w", err)
	}
	return nil
}

// DropTasks forgets every cached partition, as Drop does one: the
// revisions first, then the tasks. Execution history stays.
func (s *Store) DropTasks() error {
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.ops.Done()
	if err := s.checkRoom(); err != nil {
		return fmt.Errorf("store: drop the cached partitions: %w", err)
	}
	for _, prefix := range []string{nsRevision, nsTask} {
		if err := s.deletePrefix([]byte(prefix)); err != nil {
			return fmt.Errorf("store: drop the cached partitions: %w", err)
		}
	}
	return nil
}

func readRevision(txn *badger.Txn, p uint32) (r synced, err error) {
	item, err := txn.Get(revisionKey(p))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return synced{count: countUnknown}, nil // never synced: keys may be left from an interrupted Reset
	}
	if err != nil {
		return synced{}, err
	}
	err = item.Value(func(v []byte) error {
		r, err = decodeSynced(v)
		return err
	})
	return r, err
}

func (s *Store) deleteRevision(p uint32) error {
	return s.db.Update(func(txn *badger.Txn) error {
		return txn.Delete(revisionKey(p))
	})
}

// synced is the value of a partition's revision key: the revision the
// partition is synced to and how many tasks it holds.
type synced struct {
	rev   int64
	count int64 // countUnknown when p was not synced by a Reset
}

const countUnknown = -1

func (r synced) encode() []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(r.rev)), uint64(r.count))
}

// decodeSynced reads a revision value: 16 bytes. The 8 of the revision
// alone that caches kept before counts read as never synced, so that the
// partition is read from etcd once and counted from then on.
func decodeSynced(v []byte) (synced, error) {
	switch len(v) {
	case 8:
		return synced{count: countUnknown}, nil
	case 16:
		return synced{int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:]))}, nil
	}
	return synced{}, fmt.Errorf("%w: revision value of %d bytes", ErrCorrupt, len(v))
}
