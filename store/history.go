package store

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	badger "github.com/dgraph-io/badger/v4"
	"github.com/shardcron/shardcron/task"
)

// class is what a record counts against: the success limit (status "ok")
// or the failure limit (every other status).
type class uint8

const (
	classSuccess class = iota
	classFailure
	numClasses
)

// classLetters are the class bytes of slot keys.
var classLetters = [numClasses]byte{'s', 'f'}

func classOf(status string) class {
	if status == task.ExecutionOK {
		return classSuccess
	}
	return classFailure
}

// maxSampling bounds Sampling: at worst one success in 1024 is kept.
const maxSampling = 1024

// record is an accepted execution with the sequence number that orders it
// among the records of its task and the limit of its class.
type record struct {
	e    task.Execution
	seq  uint64
	keep uint8 // 0 to MaxHistoryLimit; 0 deletes the class's records and is not written
	prev int32 // in a recordList: index of the record before it in its chain; if none, -1 - the chain's index
}

// recordList is a batch of buffered records chained by task, so that
// History finds a task's records under the buffer's lock in about as many
// steps as it has records, not one per record buffered: a read must not
// hold up Record, the fire path, for the whole buffer. Each record is
// linked to the one before it of its chain; heads holds, per chain, the
// index of its last record plus one (0: none). A chain is picked by a
// hash of the task id, and there are at least as many chains as the
// buffer holds records, so a task's chain holds one record of another
// task on average, which the reader tells apart by id. Appending costs a
// store into heads, no hashing under the lock and no allocation. The
// first record of each chain holds the chain's index, so that reset
// clears the heads that were set rather than all of them: 64 MiB a batch
// at MaxHistoryBuffer. Not safe for concurrent use.
type recordList struct {
	recs  []record
	heads []uint32
}

// newRecordList makes a list for up to n records (at most
// MaxHistoryBuffer, so that an index fits in an int32); recs grows as
// needed, heads is made for n at once.
func newRecordList(n int) recordList {
	chains := 1
	for chains < n {
		chains <<= 1
	}
	return recordList{recs: make([]record, 0, min(n, 1024)), heads: make([]uint32, chains)}
}

// add appends r, of a task whose id hashes to h. Once recs has grown
// (reset keeps its room), it allocates nothing.
func (l *recordList) add(r record, h uint64) {
	c := h & uint64(len(l.heads)-1)
	r.prev = int32(l.heads[c]) - 1
	if r.prev < 0 {
		r.prev = -1 - int32(c) // at most MaxHistoryBuffer chains: fits
	}
	l.recs = append(l.recs, r)
	l.heads[c] = uint32(len(l.recs))
}

// appendOf appends to dst the records of id, which hashes to h, newest
// first, and returns how many records it looked at.
func (l *recordList) appendOf(dst []record, id string, h uint64) ([]record, int) {
	if len(l.heads) == 0 {
		return dst, 0
	}
	looked := 0
	for i := int32(l.heads[h&uint64(len(l.heads)-1)]) - 1; i >= 0; i = l.recs[i].prev {
		looked++
		if l.recs[i].e.TaskID == id {
			dst = append(dst, l.recs[i])
		}
	}
	return dst, looked
}

// reset empties l, keeping its room, and drops the records' strings so
// the GC can have them.
func (l *recordList) reset() {
	for i := range l.recs {
		if p := l.recs[i].prev; p < 0 {
			l.heads[-1-p] = 0
		}
	}
	clear(l.recs)
	l.recs = l.recs[:0]
}

// historyBuffer holds execution records between Record and the writer.
// Record appends under mu into pending; the writer swaps pending for the
// list of the previous batch, writes the batch without holding mu, then
// empties it, still without mu, as the next spare. After warm-up no call
// allocates.
type historyBuffer struct {
	mode   string            // Config.History; immutable
	limits [numClasses]uint8 // Config.HistorySuccessLimit, HistoryFailureLimit; immutable
	max    int               // Config.HistoryBuffer; immutable
	wakeAt int               // len(pending) at which Record wakes the writer; immutable
	kick   chan struct{}     // capacity 1: wakes the writer before its tick

	dropped  atomic.Uint64 // records refused (buffer full, closed) or whose write failed
	failed   atomic.Uint64 // records whose write failed (disk full, I/O error); also in dropped
	sampled  atomic.Uint64 // successes left out by sampling
	sampling atomic.Uint32 // k: one success in k is kept; 1 keeps all. Set by the writer at each swap

	mu       sync.Mutex    // guards the fields below
	closed   bool          // set by Close: Record drops from then on
	refused  int           // records refused for room since the last swap
	pending  recordList    // accepted, not yet taken by the writer
	inflight recordList    // the batch being written; read-only until written
	seq      uint64        // last sequence number handed out
	accepted uint64        // records accepted since Open
	written  uint64        // accepted records the writer is done with (written or failed)
	progress chan struct{} // closed and replaced whenever written advances
	err      error         // first write error not yet returned by Flush or Close

	spare recordList // empty list to become pending at the next swap; the writer's, outside mu
}

// init sets the buffer up; mark is the highest sequence number written
// before (readSeqMark).
func (h *historyBuffer) init(cfg Config, mark uint64) {
	h.mode = cfg.History
	h.limits = [numClasses]uint8{uint8(cfg.HistorySuccessLimit), uint8(cfg.HistoryFailureLimit)}
	h.max = cfg.HistoryBuffer
	h.wakeAt = max(1, cfg.HistoryBuffer/4)
	h.kick = make(chan struct{}, 1)
	h.sampling.Store(1)
	h.pending = newRecordList(cfg.HistoryBuffer)
	h.spare = newRecordList(cfg.HistoryBuffer)
	// Sequence numbers order the records of a task by when they were
	// recorded, and the slot ring relies on them increasing across
	// restarts (slotTable.load): start past the highest one written, even
	// when the clock is behind it (stepped back, a VM restored). The clock
	// still counts for a directory written before the mark was kept.
	now := time.Now
	if cfg.now != nil {
		now = cfg.now
	}
	h.seq = max(uint64(now().UnixNano()), mark)
	h.progress = make(chan struct{})
}

func (h *historyBuffer) close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
}

func (h *historyBuffer) takeErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.err
	h.err = nil
	return err
}

// adapt sets the sampling for the next batch from the size n of the one
// just taken and the records refused for room meanwhile (called by the
// writer under mu). Successes are sampled while the records offered
// between two batches reach half the buffer, which happens only when they
// arrive faster than Badger writes them: k is multiplied at once by the
// factor that brings the next batch down to a quarter of the buffer, so a
// sudden flood drops less than by doubling, and halved per batch under an
// eighth of the buffer once the flood is over.
func (h *historyBuffer) adapt(n int) {
	k := h.sampling.Load()
	offered := n + h.refused
	switch {
	case h.refused > 0 || (h.max >= 8 && offered >= h.max/2):
		quarter := max(1, h.max/4)
		k = uint32(min(uint64(k)*uint64(max(2, (offered+quarter-1)/quarter)), maxSampling))
	case k > 1 && n < h.max/8:
		k /= 2
	}
	h.sampling.Store(k)
	h.refused = 0
}

// sampledOut reports whether a success of (id, scheduledAt) is left out
// under sampling k: a hash of both decides, so which fires are kept is
// spread evenly over tasks and over time.
func sampledOut(id string, scheduledAt time.Time, k uint32) bool {
	x := xxhash.Sum64String(id) ^ uint64(scheduledAt.UnixNano())
	// splitmix64's finalizer, so that consecutive times spread.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x%uint64(k) != 0
}

// Record is RecordKeep(e, -1): it keeps as many of e's task's records as
// the Config's limits say.
func (s *Store) Record(e task.Execution) { s.RecordKeep(e, -1) }

// RecordKeep accepts e for the execution history of e.TaskID, of which the
// store keeps the keep most recent records of e's class: successes
// (status "ok") and failures (any other status) are kept apart, as
// Kubernetes keeps successful and failed jobs. A negative keep means the
// Config's limit for that class (HistorySuccessLimit or
// HistoryFailureLimit); keep is capped at MaxHistoryLimit. A lowered
// limit deletes the task's extra records at its next write (HistoryKeep
// leaves them out at once); 0 keeps nothing and deletes all of the class
// then (e itself is buffered until the writer has done so, but never
// returned by History). A Config limit of 0 records nothing and deletes
// nothing: there is nothing to delete but what a restart with a higher
// limit wrote, which History no longer returns and which expires
// (HistoryTTL).
//
// It never blocks on I/O and never waits for the writer: it appends e to
// an in-memory buffer that a background goroutine writes every
// FlushInterval (or sooner when a quarter of the buffer is filled) in one
// Badger WriteBatch, with a TTL of HistoryTTL. It costs one uncontended
// mutex and no allocation once the buffer has grown.
//
// In mode HistoryNone, RecordKeep does nothing; in HistoryFailures it
// ignores successes. While records arrive faster than Badger takes them,
// successes are sampled (see Sampling) and the ones left out are counted
// in Sampled; failures are never sampled. When HistoryBuffer records are
// already waiting, or after Close, e is dropped and counted in Dropped.
// Records still buffered are lost if the process dies; Flush and Close
// write them.
func (s *Store) RecordKeep(e task.Execution, keep int) {
	h := &s.history
	c := classOf(e.Status)
	switch {
	case h.mode == HistoryNone:
		return
	case h.mode == HistoryFailures && c == classSuccess:
		return
	case keep < 0:
		keep = int(h.limits[c])
		if keep == 0 {
			return // the node keeps none of the class, so has none to delete
		}
	case keep > MaxHistoryLimit:
		keep = MaxHistoryLimit
	}
	if k := h.sampling.Load(); k > 1 && c == classSuccess && sampledOut(e.TaskID, e.ScheduledAt, k) {
		h.sampled.Add(1)
		return
	}
	hash := xxhash.Sum64String(e.TaskID)
	h.mu.Lock()
	if h.closed || len(h.pending.recs) >= h.max {
		if !h.closed {
			h.refused++
		}
		h.mu.Unlock()
		h.dropped.Add(1)
		return
	}
	h.seq++
	h.pending.add(record{e: e, seq: h.seq, keep: uint8(keep)}, hash)
	h.accepted++
	wake := len(h.pending.recs) == h.wakeAt
	h.mu.Unlock()
	if wake {
		select {
		case h.kick <- struct{}{}:
		default:
		}
	}
}

// Dropped returns how many records Record has dropped since Open: refused
// because the buffer was full or the store closed, or lost because their
// write failed.
func (s *Store) Dropped() uint64 { return s.history.dropped.Load() }

// WriteFailed returns how many records have been lost since Open because
// their write to disk failed (a full disk, an I/O error); Dropped counts
// them too. A batch the disk filled up in the middle of counts whole,
// though its first records may have been written. A failed write never
// blocks Record nor the fires recording: the writer logs it, counts the
// batch and takes the next one, so history is written again as soon as
// the disk takes it.
func (s *Store) WriteFailed() uint64 { return s.history.failed.Load() }

// KeepsSuccesses reports whether RecordKeep may keep a success: not in
// modes HistoryNone and HistoryFailures, where a caller can skip building
// the record of each of a million fires.
func (s *Store) KeepsSuccesses() bool { return s.history.mode == HistoryAll }

// Sampled returns how many successful execution records have been left
// out by sampling since Open.
func (s *Store) Sampled() uint64 { return s.history.sampled.Load() }

// Sampling returns k when one success in k is currently kept (1: all of
// them). It rises, up to 1024, while the records offered between two
// batches of the writer reach half the buffer, that is while they arrive
// faster than Badger writes them, and falls back to 1 once batches are
// small again. Which successes are kept is decided by a hash of task
// id and scheduled time, so every task keeps about one in k of its
// successes, the most recent of those kept always among them.
func (s *Store) Sampling() int { return int(s.history.sampling.Load()) }

// Flush waits until every record accepted by Record before the call is
// written to Badger (or its write failed), waking the writer at once. It
// returns the first write error since the previous Flush, ctx's error if
// ctx ends first (the records are still written later), or ErrClosed.
func (s *Store) Flush(ctx context.Context) error {
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.ops.Done()
	if err := s.history.wait(ctx); err != nil {
		return err
	}
	if err := s.history.takeErr(); err != nil {
		return fmt.Errorf("store: write history: %w", err)
	}
	return nil
}

// wait waits until the writer is done with every record accepted before
// the call (written or failed), waking it at once, or until ctx ends.
func (h *historyBuffer) wait(ctx context.Context) error {
	h.mu.Lock()
	target := h.accepted
	for h.written < target {
		progress := h.progress
		h.mu.Unlock()
		select {
		case h.kick <- struct{}{}:
		default:
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return ctx.Err()
		}
		h.mu.Lock()
	}
	h.mu.Unlock()
	return nil
}

// writeLoop is the history writer. It owns the inflight batch and is the
// only goroutine that writes history to Badger.
func (s *Store) writeLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			// Record accepts nothing after Close, so this ends.
			for s.writeBatch() > 0 {
			}
			return
		case <-t.C:
		case <-s.history.kick:
		}
		// Keep going while Records arrive faster than a tick.
		for s.writeBatch() >= s.history.wakeAt {
		}
	}
}

// writeBatch writes what is pending and returns how many records that was.
// Called only from writeLoop.
func (s *Store) writeBatch() int {
	h := &s.history
	h.mu.Lock()
	batch := h.pending
	n := len(batch.recs)
	h.adapt(n)
	if n == 0 {
		h.mu.Unlock()
		return 0
	}
	h.pending, h.spare = h.spare, recordList{}
	h.inflight = batch
	h.mu.Unlock()

	err := s.writeRecords(batch.recs)

	h.mu.Lock()
	h.inflight = recordList{}
	h.written += uint64(n)
	if err != nil {
		h.dropped.Add(uint64(n))
		h.failed.Add(uint64(n))
		if h.err == nil {
			h.err = err
		}
	}
	close(h.progress)
	h.progress = make(chan struct{})
	h.mu.Unlock()
	// Out of the buffer, so emptied without the lock Record waits on.
	batch.reset()
	h.spare = batch
	switch {
	case err != nil:
		s.warnLost(n, err)
	case s.lostCause != "":
		s.log.Info("store: execution records are written again", "after", s.lostCause, "lost_since_open", h.failed.Load())
		s.lostCause = ""
	}
	return n
}

// lostWarnEvery is how often the writer logs batches lost to one cause:
// while the disk is full every batch fails, ten a second.
const lostWarnEvery = time.Minute

// warnLost logs a batch of n records whose write failed with err: the
// first of a cause at once, then one line a lostWarnEvery with the
// batches held back since and the records lost since Open (WriteFailed);
// the first batch written after is logged too. Called only from
// writeLoop.
func (s *Store) warnLost(n int, err error) {
	cause := "write failed"
	for _, c := range []error{ErrDiskFull, ErrDirDeleted} {
		if errors.Is(err, c) {
			cause = c.Error()
		}
	}
	s.lostCause = cause
	ok, held := s.lostWarns.Pass(cause, time.Now())
	if !ok {
		return
	}
	attrs := []any{"records", n, "lost_since_open", s.history.failed.Load(), "err", err}
	if held > 0 {
		attrs = append(attrs, "batches_not_logged", held)
	}
	s.log.Warn("store: execution records lost", attrs...)
}

// writeRecords writes batch in one WriteBatch (which Badger splits into
// transactions of at most 15% of a memtable), each record into the next
// slot of its task and class. Keys and values are encoded into one buffer
// sized up front.
func (s *Store) writeRecords(batch []record) (err error) {
	if err := s.checkRoom(); err != nil {
		return err
	}
	t := &s.slots
	t.mu.Lock()
	defer t.mu.Unlock()
	defer func() {
		// The batch's records took their slots, which the disk does not
		// hold: the rings of its tasks are read again at their next write,
		// which then overwrites the oldest record kept, not a newer one.
		if err != nil {
			for i := range batch {
				t.forget(batch[i].e.TaskID)
			}
		}
	}()
	if err := t.load(s.db, batch); err != nil {
		return fmt.Errorf("read history slots: %w", err)
	}
	size := 0
	var top uint64 // the highest sequence number of the batch
	for i := range batch {
		e := &batch[i].e
		size += len(nsHistory) + len(e.TaskID) + 1 + historySuffixLen + 8 + recordSize(e)
		top = max(top, batch[i].seq)
	}
	buf := make([]byte, 0, size)
	entries := make([]badger.Entry, len(batch))
	expiresAt := uint64(time.Now().Add(s.cfg.HistoryTTL).Unix())

	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	w := s.roomChecked(wb) // a batch may take far more than MinFreeBytes
	// The mark goes first: Badger replays its log in order, so a crash
	// that keeps any record of the batch keeps the mark too.
	if err := w.Set(seqKey, binary.BigEndian.AppendUint64(nil, top)); err != nil {
		return err
	}
	for i := range batch {
		r := &batch[i]
		c := classOf(r.e.Status)
		if r.keep == 0 {
			for _, old := range t.clear(r.e.TaskID, c) {
				if err := w.Delete(appendSlotKey(nil, r.e.TaskID, c, old)); err != nil {
					return err
				}
			}
			continue
		}
		slot, stale := t.next(r.e.TaskID, c, r.keep)
		for _, old := range stale {
			if err := w.Delete(appendSlotKey(nil, r.e.TaskID, c, old)); err != nil {
				return err
			}
		}
		start := len(buf)
		buf = appendSlotKey(buf, r.e.TaskID, c, slot)
		mid := len(buf)
		buf = binary.BigEndian.AppendUint64(buf, r.seq)
		buf = appendRecord(buf, &r.e)
		end := len(buf)
		entries[i] = badger.Entry{Key: buf[start:mid:mid], Value: buf[mid:end:end], ExpiresAt: expiresAt}
		if err := w.SetEntry(&entries[i]); err != nil {
			return err
		}
	}
	if s.cfg.writeHook != nil {
		if err := s.cfg.writeHook(); err != nil {
			return err
		}
	}
	return wb.Flush()
}

// readSeqMark returns the highest sequence number of the execution
// records written (seqKey), 0 when none was kept or it does not decode.
func readSeqMark(db *badger.DB) (mark uint64, err error) {
	err = db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(seqKey)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if len(v) == 8 {
				mark = binary.BigEndian.Uint64(v)
			}
			return nil
		})
	})
	return mark, err
}

// decodeSlot decodes a slot's value: the record's sequence number, then
// the record.
func decodeSlot(v []byte, e *task.Execution) (uint64, error) {
	if len(v) < 8 {
		return 0, errBadRecord
	}
	return binary.BigEndian.Uint64(v), decodeRecord(v[8:], e)
}

// History is HistoryKeep(taskID, limit, -1, -1): the records of a task
// kept under the Config's limits, as Record keeps them.
func (s *Store) History(taskID string, limit int) ([]task.Execution, error) {
	return s.HistoryKeep(taskID, limit, -1, -1)
}

// HistoryKeep returns up to limit execution records of taskID (all of
// them when limit <= 0), newest first: by scheduled time, then attempt,
// then the order they were recorded in. Of each class it returns at most
// the most recent successes (status "ok") or failures (any other status)
// recorded, a negative one meaning the Config's limit, as for RecordKeep:
// the records kept under a higher limit, before a restart lowered the
// Config's or the task's own was lowered, stay on disk until the task's
// next record of that class (which may never come on this node) or their
// TTL, and are not returned. Records still buffered are included, so a
// record is visible as soon as RecordKeep returns, within the limits of
// its task. Expired records are never returned, nor those that finished
// more than HistoryTTL ago under a longer HistoryTTL of an earlier Open.
// A record that cannot be decoded is skipped and logged.
func (s *Store) HistoryKeep(taskID string, limit, successes, failures int) ([]task.Execution, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.ops.Done()
	keep := [numClasses]int{successes, failures}
	for c := range keep {
		if keep[c] < 0 {
			keep[c] = int(s.history.limits[c])
		}
		keep[c] = min(keep[c], MaxHistoryLimit)
	}

	// Buffered records first: one that leaves the buffer afterwards has
	// been written by then, so the scan below sees it.
	h := &s.history
	hash := xxhash.Sum64String(taskID)
	h.mu.Lock()
	buffered, inflight := h.inflight.appendOf(nil, taskID, hash)
	buffered, pending := h.pending.appendOf(buffered, taskID, hash)
	h.mu.Unlock()
	if s.cfg.bufferRead != nil {
		s.cfg.bufferRead(inflight + pending)
	}

	var out []record
	prefix := historyPrefix(taskID)
	now := time.Now()
	// A record expiring later than one written now was written under a
	// longer HistoryTTL, before a restart lowered it: Badger keeps it until
	// then, History no longer than the TTL from when it finished.
	longest := uint64(now.Add(s.cfg.HistoryTTL).Unix()) + 1
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			item := it.Item()
			if len(item.Key()) != len(prefix)+historySuffixLen {
				continue
			}
			var r record
			err := item.Value(func(v []byte) (err error) {
				r.seq, err = decodeSlot(v, &r.e)
				return err
			})
			if errors.Is(err, errBadRecord) {
				s.log.Warn("store: skipping undecodable execution record", "task", taskID, "key", fmt.Sprintf("%x", item.Key()))
				continue
			}
			if err != nil {
				return err
			}
			if item.ExpiresAt() > longest && now.Sub(r.e.FinishedAt) > s.cfg.HistoryTTL {
				continue
			}
			r.e.TaskID = taskID
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: history of %q: %w", taskID, err)
	}
	out = keepNewest(out, buffered, keep)
	slices.SortFunc(out, func(a, b record) int {
		return cmp.Or(
			b.e.ScheduledAt.Compare(a.e.ScheduledAt),
			cmp.Compare(b.e.Attempt, a.e.Attempt),
			cmp.Compare(b.seq, a.seq))
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	res := make([]task.Execution, len(out))
	for i := range out {
		res[i] = out[i].e
	}
	return res, nil
}

// keepNewest adds to the records read from disk the buffered ones not
// written yet (sequence numbers tell), then keeps, per class with buffered
// records, the newest as many as the latest of them (by sequence number,
// whatever the order of buffered) says: what the disk will hold once they
// are written; and of each class c at most the newest keep[c].
func keepNewest(disk, buffered []record, keep [numClasses]int) []record {
	var seen map[uint64]bool // the records read from disk, if any is buffered
	if len(buffered) > 0 {
		seen = make(map[uint64]bool, len(disk))
		for _, r := range disk {
			seen[r.seq] = true
		}
	}
	var kept [numClasses]int      // the limit of the latest buffered record of the class
	var latest [numClasses]uint64 // 0: no buffered record of the class
	var cut [numClasses]uint64    // the latest record under a limit of 0, which deletes those before it
	for _, r := range buffered {
		c := classOf(r.e.Status)
		if r.seq > latest[c] {
			kept[c], latest[c] = int(r.keep), r.seq
		}
		if r.keep == 0 {
			cut[c] = max(cut[c], r.seq)
			continue
		}
		if !seen[r.seq] {
			disk = append(disk, r)
		}
	}
	slices.SortFunc(disk, func(a, b record) int { return cmp.Compare(b.seq, a.seq) })
	var n [numClasses]int
	return slices.DeleteFunc(disk, func(r record) bool {
		c := classOf(r.e.Status)
		if r.seq < cut[c] {
			return true
		}
		n[c]++
		return latest[c] > 0 && n[c] > kept[c] || n[c] > keep[c]
	})
}

// DeleteHistory waits for the buffer to be written, as Flush does, then
// deletes every record of taskID, for when the task itself is deleted.
// Records of taskID recorded after the call began may survive; they
// expire with their TTL. A batch whose write failed before does not stop
// it (nothing of it is on disk to delete), and its error is left for
// Flush or Close to return; ctx ending first does.
func (s *Store) DeleteHistory(ctx context.Context, taskID string) error {
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.ops.Done()
	if err := s.history.wait(ctx); err != nil {
		return err
	}
	if err := s.checkRoom(); err != nil {
		return fmt.Errorf("store: delete history of %q: %w", taskID, err)
	}
	s.slots.mu.Lock()
	defer s.slots.mu.Unlock()
	s.slots.forget(taskID)
	if err := s.deletePrefix(historyPrefix(taskID)); err != nil {
		return fmt.Errorf("store: delete history of %q: %w", taskID, err)
	}
	return nil
}

// deletePrefix deletes every key under prefix with one WriteBatch, reading
// the keys from a snapshot taken before the first delete.
func (s *Store) deletePrefix(prefix []byte) error {
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	w := s.roomChecked(wb)
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			if err := w.Delete(it.Item().KeyCopy(nil)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return wb.Flush()
}
