package store

import (
	"bytes"
	"encoding/binary"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
	badger "github.com/dgraph-io/badger/v4"
)

// slotState is where a task's next record of each class goes. The
// records of a class live in a ring of size slots (0 to size-1); the ones
// kept are the keep most recent: the slot written last and the keep-1
// before it, going backwards around the ring. next is the slot after the
// one written last (taken modulo size at the next write). The ring is
// larger than keep only after a limit was lowered, until it turns back
// to slot keep-1.
type slotState struct {
	next [numClasses]uint8
	size [numClasses]uint8
	keep [numClasses]uint8
}

// slotTable keeps the slot state of every task the store has written
// history for since Open, keyed by a 64-bit hash of the task id: about 20
// bytes per task and nothing for the GC to scan. A task not in it is read
// from disk once (load), so a restarted node continues each ring where it
// stopped and keeps exactly the last N records. Two ids whose hashes
// collide (about one chance in 10^7 among a million tasks) share a state:
// each may then overwrite one of its records other than the oldest.
type slotTable struct {
	mu    sync.Mutex // guards tasks; held by the writer for a whole batch, and by DeleteHistory
	tasks map[uint64]slotState
}

func (t *slotTable) init() { t.tasks = make(map[uint64]slotState) }

// next returns the slot the next record of class c of id goes to under
// limit keep (at least 1), and the slots to delete so that only the keep
// most recent records remain.
//
// A raised limit grows the ring; records are then written over the oldest
// of the old ring before the new slots, so up to the old limit's oldest
// records may be lost once. A lowered limit deletes, at the next write,
// every record but the keep-1 most recent, and from then on the record
// that falls out of the window at each write, until the ring has turned
// back into slots 0 to keep-1.
func (t *slotTable) next(id string, c class, keep uint8) (slot uint8, stale []uint8) {
	h := xxhash.Sum64String(id)
	st := t.tasks[h]
	size := max(st.size[c], keep)
	slot = st.next[c]
	if slot >= size {
		slot = 0
	}
	behind := func(j uint8) uint8 { return uint8((int(slot) - int(j) + int(size)) % int(size)) }
	switch {
	case size == keep:
	case st.keep[c] > keep:
		// Just lowered: the slots outside the new window may all be live.
		for j := keep; j < size; j++ {
			stale = append(stale, behind(j))
		}
	default:
		stale = append(stale, behind(keep))
	}
	if size > keep && slot == keep-1 {
		size = keep // the window is slots 0 to keep-1: the rest are deleted
	}
	st.next[c], st.size[c], st.keep[c] = slot+1, size, keep
	t.tasks[h] = st
	return slot, stale
}

// clear returns the slots of class c of id, every one to delete, and
// empties its ring: the next record of the class goes to slot 0.
func (t *slotTable) clear(id string, c class) (stale []uint8) {
	h := xxhash.Sum64String(id)
	st := t.tasks[h]
	for j := range st.size[c] {
		stale = append(stale, j)
	}
	st.next[c], st.size[c], st.keep[c] = 0, 0, 0
	t.tasks[h] = st
	return stale
}

func (t *slotTable) forget(id string) { delete(t.tasks, xxhash.Sum64String(id)) }

// load reads from db the slot state of the tasks of batch that are not in
// the table yet: one iterator, seeking to each task's prefix in key order.
// For each class, size becomes the ring size in use (the highest slot
// plus one) and next the slot after the one holding the newest record (by
// sequence number), which is where the ring stopped.
func (t *slotTable) load(db *badger.DB, batch []record) error {
	var ids []string
	for i := range batch {
		id := batch[i].e.TaskID
		if _, ok := t.tasks[xxhash.Sum64String(id)]; !ok {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	return db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(nsHistory)})
		defer it.Close()
		for _, id := range ids {
			prefix := historyPrefix(id)
			var st slotState
			var newest [numClasses]uint64
			for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
				item := it.Item()
				k := item.Key()
				if len(k) != len(prefix)+historySuffixLen {
					continue
				}
				c := class(bytes.IndexByte(classLetters[:], k[len(prefix)]))
				slot := k[len(prefix)+1]
				if c >= numClasses || slot >= MaxHistoryLimit {
					continue
				}
				var seq uint64
				if err := item.Value(func(v []byte) error {
					if len(v) >= 8 {
						seq = binary.BigEndian.Uint64(v)
					}
					return nil
				}); err != nil {
					return err
				}
				st.size[c] = max(st.size[c], slot+1)
				st.keep[c] = st.size[c] // unknown: a lower limit at the next write deletes the rest
				if seq >= newest[c] {
					newest[c], st.next[c] = seq, slot+1
				}
			}
			t.tasks[xxhash.Sum64String(id)] = st
		}
		return nil
	})
}
