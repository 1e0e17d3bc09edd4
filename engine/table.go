package engine

import (
	"fmt"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/engine/schedule"
)

// The task table keeps an owner's tasks in pointer-free records, so that a
// heap of ten million tasks gives the garbage collector almost nothing to
// scan (docs/design.md, facts measured): records live in fixed pages, task ids
// in append-only byte chunks, and the id index maps a 64-bit hash to a
// record, with collisions chained through the records. The records of a
// partition are linked in a list of their own, so that releasing or
// replacing a partition costs its tasks, not the node's.
//
// The table belongs to the dispatch loop: it is not safe for concurrent use.

const (
	recPageBits = 12
	recPageSize = 1 << recPageBits
	idChunkSize = 1 << 20
	nilRec      = ^uint32(0)
	// maxRecords keeps record indexes below the wheel ids used for retries.
	maxRecords = retryBase
)

// Record flags.
const (
	flagLive     = 1 << iota // the slot holds a task
	flagPaused               // the task is paused: not in the wheel
	flagOK                   // okAt is a fire that succeeded, not when the staleness clock started
	flagLate                 // the last fire released was a misfire (health.go, lateness)
	flagDeleting             // ended with delete_after_fire: handed to the deleter (window.go)
	flagEdited               // delete_after_fire: the definition changed while a fire ran or waited to retry, so it was not the one fired
	flagEndWaits             // delete_after_fire: a fire ended while the task was paused, or a pause alone came before the deleter's delete, here or on the owner that released it here (checkpoint.EndWaits) or crashed or fenced (watermarkValue.EndWaits); its resume looks whether the task ended (checkEnded)
)

// record is one task on its owner: 80 bytes, no pointers.
type record struct {
	next     int64 // scheduled time of the next fire, unix ns; 0 when none
	lastFire int64 // scheduled time of the last fire dispatched
	idRef    uint32
	idLen    uint16
	part     uint16
	sched    schedule.Handle
	prof     uint32 // index into the profile table
	hnext    uint32 // next record whose id has the same hash, or nilRec
	pnext    uint32 // next record of the same partition, or nilRec
	pprev    uint32 // previous record of the same partition, or nilRec
	gen      uint32 // bumped when the slot is freed: stale completions are ignored
	fires    uint32 // counters since the owner took the partition
	failures uint32
	misfires uint32
	skipped  uint32
	running  uint16 // executions in flight
	status   uint8  // status of the last finished attempt
	flags    uint8
	jitter   uint32 // the task's jitter bound, in milliseconds
	// okAt is, in unix seconds, the scheduled time of the last fire that
	// succeeded (flagOK), or else when the owner started to watch the task
	// for staleness (it took the task, or the task was resumed or
	// rescheduled). Seconds keep the record at 80 bytes: cron and @every
	// times are whole seconds.
	okAt uint32
	// failStreak counts the fires in a row whose last attempt failed; a
	// success resets it.
	failStreak uint32
}

type taskTable struct {
	pages   [][]record
	free    []uint32 // freed record indexes
	n       int      // live records
	index   map[uint64]uint32
	parts   []uint32 // first record of each partition, or nilRec
	chunks  [][]byte // task ids; a chunk is never rewritten, only appended to
	garbage int      // bytes of freed ids
}

func newTaskTable(partitions int) *taskTable {
	t := &taskTable{index: make(map[uint64]uint32), parts: make([]uint32, partitions)}
	for i := range t.parts {
		t.parts[i] = nilRec
	}
	return t
}

func (t *taskTable) rec(i uint32) *record {
	return &t.pages[i>>recPageBits][i&(recPageSize-1)]
}

// id returns the task id of record i. The string points into an id chunk,
// which is never rewritten, so it stays valid after the record is freed:
// workers hold it without a copy.
func (t *taskTable) id(r *record) string {
	c := t.chunks[r.idRef>>20]
	off := r.idRef & (idChunkSize - 1)
	return unsafe.String(&c[off], int(r.idLen))
}

// lookup returns the record of a task id.
func (t *taskTable) lookup(id string) (uint32, *record, bool) {
	i, ok := t.index[xxhash.Sum64String(id)]
	for ok && i != nilRec {
		r := t.rec(i)
		if t.id(r) == id {
			return i, r, true
		}
		i = r.hnext
	}
	return 0, nil, false
}

// add creates a record for a task id of partition part that is not in the
// table. hash is xxhash64 of the id.
func (t *taskTable) add(id string, hash uint64, part int) (uint32, *record, error) {
	var i uint32
	if n := len(t.free); n > 0 {
		i = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		i = uint32(len(t.pages) * recPageSize)
		if i >= maxRecords {
			return 0, nil, fmt.Errorf("engine: task table full (%d records)", maxRecords)
		}
		t.pages = append(t.pages, make([]record, recPageSize))
		for j := recPageSize - 1; j > 0; j-- {
			t.free = append(t.free, i+uint32(j))
		}
	}
	r := t.rec(i)
	gen := r.gen
	*r = record{gen: gen, flags: flagLive, hnext: nilRec, part: uint16(part), pnext: t.parts[part], pprev: nilRec}
	r.idRef, r.idLen = t.storeID(id)
	if head, ok := t.index[hash]; ok {
		r.hnext = head
	}
	t.index[hash] = i
	if r.pnext != nilRec {
		t.rec(r.pnext).pprev = i
	}
	t.parts[part] = i
	t.n++
	return i, r, nil
}

// remove frees record i.
func (t *taskTable) remove(i uint32, hash uint64) {
	r := t.rec(i)
	if head := t.index[hash]; head == i {
		if r.hnext == nilRec {
			delete(t.index, hash)
		} else {
			t.index[hash] = r.hnext
		}
	} else {
		for p := t.rec(head); p.hnext != nilRec; p = t.rec(p.hnext) {
			if p.hnext == i {
				p.hnext = r.hnext
				break
			}
		}
	}
	if r.pprev == nilRec {
		t.parts[r.part] = r.pnext
	} else {
		t.rec(r.pprev).pnext = r.pnext
	}
	if r.pnext != nilRec {
		t.rec(r.pnext).pprev = r.pprev
	}
	t.garbage += int(r.idLen)
	*r = record{gen: r.gen + 1}
	t.free = append(t.free, i)
	t.n--
	t.maybeCompactIDs()
}

func (t *taskTable) storeID(id string) (uint32, uint16) {
	if len(id) == 0 {
		return 0, 0
	}
	last := len(t.chunks) - 1
	if last < 0 || len(t.chunks[last])+len(id) > idChunkSize {
		t.chunks = append(t.chunks, make([]byte, 0, idChunkSize))
		last++
	}
	c := t.chunks[last]
	off := len(c)
	t.chunks[last] = append(c, id...)
	return uint32(last)<<20 | uint32(off), uint16(len(id))
}

// maybeCompactIDs copies live ids into fresh chunks once freed ids take
// more than half of the chunks. Old chunks stay alive only as long as a
// worker still holds a string into them.
func (t *taskTable) maybeCompactIDs() {
	total := len(t.chunks) * idChunkSize
	if t.garbage < idChunkSize || t.garbage < total/2 {
		return
	}
	old := t.chunks
	t.chunks = nil
	for pi := range t.pages {
		page := t.pages[pi]
		for j := range page {
			r := &page[j]
			if r.flags&flagLive == 0 || r.idLen == 0 {
				continue
			}
			c := old[r.idRef>>20]
			off := r.idRef & (idChunkSize - 1)
			r.idRef, r.idLen = t.storeID(string(c[off : off+uint32(r.idLen)]))
		}
	}
	t.garbage = 0
}

// eachIn calls fn for every record of partition part; fn may remove the
// record it is given.
func (t *taskTable) eachIn(part int, fn func(i uint32, r *record)) {
	for i := t.parts[part]; i != nilRec; {
		r := t.rec(i)
		next := r.pnext
		fn(i, r)
		i = next
	}
}
